"""What the node's parts ask of the node, as objects: its lifecycle state, what configure built (and
the commands other threads send it), and the diagnostics timer a parameter change restarts.

The node's transitions are the only writers of ``NodeState`` and ``ConfiguredParts``; the image
callback, the services and the parameter callbacks read them. Each part takes these objects in its
constructor, so what it may ask of the node is named by their methods.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Optional

from .commands import Command, CommandResult
from .node_settings import SettingsSource
from .parameters import staging_choice

if TYPE_CHECKING:  # annotations only: these modules load torch
    from ..core.session_manager import SessionManager
    from .cameras import CameraSystem
    from .inference import InferenceWorker
    from .pipeline import PreprocessStage

LIFECYCLE_LABELS = ("unconfigured", "inactive", "active")


class NodeState:
    """The node's lifecycle state (REP 2002 primary states) for the parts that answer to it: frames are
    processed only while ``active``; a refusal names ``label``."""

    def __init__(self) -> None:
        self._label = "unconfigured"

    @property
    def label(self) -> str:
        return self._label

    @property
    def active(self) -> bool:
        return self._label == "active"

    def enter(self, label: str) -> None:
        """The node's transitions only."""
        if label not in LIFECYCLE_LABELS:
            raise ValueError(f"not a lifecycle state: {label!r}")
        self._label = label


class ConfiguredParts:
    """What configure built and cleanup frees: the session manager and the threads over it (one camera:
    ``worker`` and ``stage``; several: ``cameras``). Other threads send the inference thread their
    commands through ``submit``; ``~/load_session`` reads a saved session through ``prepare_load``."""

    def __init__(self, settings: SettingsSource) -> None:
        self._settings = settings
        self._manager: Optional["SessionManager"] = None
        self._follows_cameras = False
        self.worker: Optional["InferenceWorker"] = None
        self.stage: Optional["PreprocessStage"] = None  # its thread runs while active
        self.cameras: Optional["CameraSystem"] = None  # kept across cleanup while the names stay the same

    @property
    def manager(self) -> Optional["SessionManager"]:
        """The session manager; with several cameras the primary camera's at this moment (a change of
        model or stream settings rebuilds every camera's manager)."""
        if self._follows_cameras:
            cameras = self.cameras
            return cameras.primary_manager if cameras is not None else None
        return self._manager

    @manager.setter
    def manager(self, manager: Optional["SessionManager"]) -> None:
        self._manager = manager
        self._follows_cameras = False

    def follow_cameras(self) -> None:
        """From configure of the several-camera mode to cleanup: ``manager`` is the primary camera's."""
        self._manager = None
        self._follows_cameras = True

    @property
    def configured(self) -> bool:
        return self.manager is not None

    def session_id(self) -> int:
        manager = self.manager
        return manager.session_id if manager is not None else 0

    def device(self):
        """The model's device (None unconfigured): the per-pixel outputs follow the model."""
        manager = self.manager
        return manager.session.device if manager is not None else None

    def submit(self, command: Command, wait: float = 0.0) -> Optional[CommandResult]:
        """Queue ``command`` for the inference thread; with ``wait`` > 0 wait that long for its result
        (None: not run yet, or nothing configured to run it)."""
        if self.cameras is not None:
            return self.cameras.submit(command, wait)
        worker = self.worker
        return worker.submit(command, wait) if worker is not None else None

    def prepare_load(self, path: str):
        """``~/load_session``'s reading and checking (the session services' thread)."""
        if self.cameras is not None:
            return self.cameras.prepare_load(path)
        manager = self.manager
        if manager is None:
            raise RuntimeError("the node is not configured")
        return manager.prepare_load(path, on_device=staging_choice(self._settings.current))


class RestartableTimer:
    """A node timer whose period a parameter change replaces (``diagnostics_period``)."""

    def __init__(self, node, period: float, callback: Callable[[], None]) -> None:
        self._node = node
        self._callback = callback
        self._timer = node.create_timer(period, callback)

    def restart(self, period: float) -> None:
        self._node.destroy_timer(self._timer)
        self._timer = self._node.create_timer(period, self._callback)


__all__ = ["ConfiguredParts", "LIFECYCLE_LABELS", "NodeState", "RestartableTimer"]
