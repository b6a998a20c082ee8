"""The node's settings as one frozen, typed object, and the one owner of its current value.

``NodeSettings`` has one typed field per row of the settings table (``core/settings.py``), in the
table's order. It is written out by hand rather than generated from the table at import so that
``settings.world_frame`` is a ``str`` to a reader, an editor and a type checker; the table stays the
one source of names, defaults, ranges and validation, and ``test/test_node_settings.py`` fails when a
field's name, order or type differs from its row. Lists of the table (``cameras``, the covariance
diagonals) become tuples, so a settings object cannot be changed in place.

``LiveSettings`` owns the node's current ``NodeSettings``. A change builds a new object
(``dataclasses.replace``) and swaps the reference whole; a reader takes ``current`` once per frame,
tick or callback and reads attributes of that snapshot, so it never sees half of a change. Both
writers go through ``update`` under one lock: the post-set parameter callback (executor thread) and
the revert of a failed model build (``ParameterHandler.revert_model_parameters``, inference thread).
Readers take no lock: swapping a reference is atomic in Python.
"""
from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Protocol

from ..core.settings import SETTINGS, configs_from_values

_LIST_SETTINGS = frozenset(s.name for s in SETTINGS if isinstance(s.default, list))


@dataclass(frozen=True)
class NodeSettings:
    """Every setting of the node, typed; read-only (``LiveSettings.update`` makes the next one)."""

    # model
    checkpoint: str
    model_preset: str
    device: str
    dtype: str
    attention_backend: str
    flashinfer_kernel: str
    sdpa_kernel: str
    cuda_graphs: bool
    compile_blocks: str
    autocast: bool
    seed: int
    allow_unsafe_checkpoint: bool
    autostart: bool
    # stream and cache geometry
    scale_frames: int
    sliding_window: int
    camera_iterations: int
    max_frame_num: int
    long_run_policy: str
    max_stored_frames: int
    overlap_frames: int
    # memory
    image_width: int
    camera_aspect: float
    gpu_memory_budget: float
    fit_window: bool
    # from the next frame
    keyframe_interval: int
    publish_depth: bool
    depth_every: int
    max_non_finite_frames: int
    world_frame: str
    camera_frame: str
    publish_tf: bool
    path_max_length: int
    trajectory_path: str
    trajectory_max_length: int
    fast_resize: bool
    # reconstruction outputs
    publish_points: bool
    points_stride: int
    points_min_confidence: float
    publish_map: bool
    map_voxel_size: float
    map_max_points: int
    map_period: float
    map_path: str
    # subscription, diagnostics
    image_transport: str
    qos_reliability: str
    diagnostics_period: float
    # the robot
    base_frame: str
    odom_frame: str
    tf_timeout: float
    scale_source: str
    scale_factor: float
    depth_sync_slop: float
    scale_min_samples: int
    scale_min_travel: float
    transform_publish_period: float
    transform_tolerance: float
    pose_covariance_diagonal: tuple[float, ...]
    twist_covariance_diagonal: tuple[float, ...]
    # several cameras
    cameras: tuple[str, ...]
    primary_camera: str
    camera_timeout: float
    # saved sessions
    session_path: str
    initial_session: str
    session_staging: str
    mapping: bool

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> "NodeSettings":
        """The settings of ``values`` (one value per setting of the table; a missing one is a KeyError)."""
        return cls(**{s.name: frozen_value(s.name, values[s.name]) for s in SETTINGS})

    @classmethod
    def defaults(cls) -> "NodeSettings":
        return cls.from_values({s.name: s.default for s in SETTINGS})

    def values(self) -> dict[str, Any]:
        """Name -> value, for the table's functions (``validate_values``, ``configs_from_values``, ...)."""
        return {s.name: getattr(self, s.name) for s in SETTINGS}

    def configs(self):
        """The core's ``(RuntimeConfig, StreamConfig)`` of these settings."""
        return configs_from_values(self.values())

    def changed(self, changes: Mapping[str, Any]) -> tuple["NodeSettings", tuple[str, ...]]:
        """These settings with ``changes`` (names outside the table ignored), and the names whose value
        differs; the same object when none does."""
        new = {name: frozen_value(name, value) for name, value in changes.items() if name in _FIELD_NAMES}
        names = tuple(name for name, value in new.items() if getattr(self, name) != value)
        if not names:
            return self, ()
        return dataclasses.replace(self, **{name: new[name] for name in names}), names


_FIELD_NAMES = frozenset(f.name for f in dataclasses.fields(NodeSettings))


def frozen_value(name: str, value: Any) -> Any:
    """``value`` as a field of ``NodeSettings`` holds it: a list (or rclpy's ``array.array``) as a tuple."""
    return tuple(value) if name in _LIST_SETTINGS else value


class SettingsSource(Protocol):
    """Where a component reads the settings: ``current`` once per frame, tick or callback."""

    @property
    def current(self) -> NodeSettings: ...


class LiveSettings:
    """The node's current settings, owned here: swapped whole by ``update``, never changed in place."""

    def __init__(self, initial: NodeSettings):
        self._current = initial
        self._write = threading.Lock()  # the writers (executor thread, inference thread); readers take none

    @property
    def current(self) -> NodeSettings:
        return self._current

    def update(self, changes: Mapping[str, Any]) -> tuple[str, ...]:
        """Swap in the settings with ``changes``; the names that changed (none: nothing swapped)."""
        with self._write:
            self._current, names = self._current.changed(changes)
            return names


class FixedSettings:
    """Settings that never change (a tool's run, a test)."""

    def __init__(self, settings: NodeSettings):
        self._settings = settings

    @property
    def current(self) -> NodeSettings:
        return self._settings


class OverriddenSettings:
    """``source``'s current settings with some fields held fixed (e.g. ``publish_tf`` off for a camera
    of several, whose body edge the rig publishes). The derived object is rebuilt once per swap."""

    def __init__(self, source: SettingsSource, **fixed: Any):
        self._source = source
        self._fixed = {name: frozen_value(name, value) for name, value in fixed.items()}
        self._derived: Optional[tuple[NodeSettings, NodeSettings]] = None  # (source's, derived)

    @property
    def current(self) -> NodeSettings:
        base = self._source.current
        derived = self._derived
        if derived is None or derived[0] is not base:
            derived = (base, dataclasses.replace(base, **self._fixed))
            self._derived = derived  # one reference: a racing reader builds its own, equal one
        return derived[1]


__all__ = ["FixedSettings", "LiveSettings", "NodeSettings", "OverriddenSettings", "SettingsSource", "frozen_value"]
