"""The node's ROS parameters: the one place where they map onto ``config.py``.

Every parameter is declared here once, with its default (taken from the core's dataclasses so the
two cannot drift), its range or allowed values, the description ``ros2 param describe`` shows, and
when a change takes effect. ``validate_values`` gives every reason why a set of values cannot run,
so the node refuses to start, or refuses a ``ros2 param set``, with a message that names the
offending parameter instead of failing later inside the model.

Plain data and pure functions, no node state: the node declares its parameters from this table and
the tests check the launch and parameter files against the same table.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Optional

from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor

from ..core import config as cfgmod
from ..core.config import RuntimeConfig, StreamConfig


@dataclass(frozen=True)
class ParamSpec:
    """One ROS parameter: its default, what it means, its range, and when a change takes effect."""

    name: str
    default: Any
    description: str
    applies: str  # model | session | next_frame | subscription | timer | startup
    range: Optional[tuple] = None  # (low, high) inclusive, for int/float parameters
    choices: Optional[tuple] = None  # allowed strings

    @property
    def read_only(self) -> bool:
        return self.applies == "startup"


_D = StreamConfig()
_R = RuntimeConfig()

PARAMETERS: tuple[ParamSpec, ...] = (
    # --- model (a change builds a new model and starts a new session)
    ParamSpec("checkpoint", _R.checkpoint, "Path of an official LingBot-Map checkpoint (.pt/.pth/.safetensors). "
              "Empty: random weights of the tiny preset (demo only, poses are not meaningful).", "model"),
    ParamSpec("model_preset", _R.model_preset, "Model shapes: 'full' (the official checkpoint) or 'tiny' "
              "(small, CPU tests). Empty: full with a checkpoint, tiny without.", "model",
              choices=("", *sorted(cfgmod.MODEL_PRESETS))),
    ParamSpec("device", _R.device, "Torch device: auto (CUDA when available), cpu, cuda or cuda:N.", "model"),
    ParamSpec("dtype", _R.dtype, "Compute dtype: auto (bf16 on GPU, fp32 on CPU), float32, bfloat16, float16.",
              "model", choices=("auto", "float32", "bfloat16", "float16")),
    ParamSpec("attention_backend", _R.attention_backend, "Global attention over the paged KV cache: auto "
              "(FlashInfer when usable, else SDPA), flashinfer or sdpa.", "model",
              choices=("auto", "flashinfer", "sdpa")),
    ParamSpec("seed", _R.seed, "Seed of the random weights used when no checkpoint is given.", "model",
              range=(0, 2**31 - 1)),
    ParamSpec("allow_unsafe_checkpoint", _R.allow_unsafe_checkpoint, "Allow loading a pickled checkpoint with "
              "torch.load(weights_only=False) (runs code from the file). Read-only: set it at start only, "
              "never remotely.", "startup"),
    # --- stream / cache geometry (a change starts a new session: new world frame)
    ParamSpec("scale_frames", _D.scale_frames, "Frames processed together first; their tokens stay in the "
              "KV cache forever. Poses start after this many frames.", "session", range=(1, 256)),
    ParamSpec("sliding_window", _D.sliding_window, "Most recent stored frames kept in the KV cache with all "
              "tokens; older ones keep only their 6 special tokens.", "session", range=(1, 4096)),
    ParamSpec("camera_iterations", _D.camera_iterations, "Refinement iterations of the camera head.",
              "session", range=(1, 4)),
    ParamSpec("max_frame_num", _D.max_frame_num, "RoPE table size: the stored-frame index never reaches it.",
              "session", range=(3, 1_000_000)),
    ParamSpec("long_run_policy", _D.long_run_policy, "What happens before max_stored_frames stored frames: "
              "window (chain windows in one world frame), reset (new session) or stop (refuse frames "
              "until ~/reset).", "session", choices=cfgmod.LONG_RUN_POLICIES),
    ParamSpec("max_stored_frames", _D.max_stored_frames, "Stored frames per session before the long-run "
              "policy acts (the model was trained on ~320 views).", "session", range=(2, 1_000_000)),
    ParamSpec("overlap_frames", _D.overlap_frames, "Frames carried into the next window when "
              "long_run_policy is 'window'.", "session", range=(1, 4096)),
    # --- from the next frame, same session
    ParamSpec("keyframe_interval", _D.keyframe_interval, "Every N-th frame after the scale frames is stored "
              "in the KV cache; the others get a pose but are forgotten. Applies from the next frame.",
              "next_frame", range=(1, 100_000)),
    ParamSpec("publish_depth", False, "Run the depth head and publish ~/depth (32FC1, model input size). "
              "Applies from the next frame.", "next_frame"),
    ParamSpec("world_frame", "lingbot_world", "Frame id of the poses: the first camera's optical frame of "
              "the current session.", "next_frame"),
    ParamSpec("camera_frame", "", "Child frame id (camera optical frame). Empty: the image header's frame_id.",
              "next_frame"),
    ParamSpec("publish_tf", True, "Broadcast world_frame -> camera_frame on /tf.", "next_frame"),
    ParamSpec("path_max_length", 10000, "Poses kept in ~/path (oldest dropped first).", "next_frame",
              range=(1, 10_000_000)),
    ParamSpec("trajectory_path", "lingbot_trajectory.tum", "File ~/save_trajectory writes (TUM format: "
              "stamp tx ty tz qx qy qz qw).", "next_frame"),
    ParamSpec("trajectory_max_length", 100000, "Poses of the current session kept for ~/save_trajectory "
              "(oldest dropped first): bounds the node's memory on runs of hours (100000 = 2.8 h at 10 Hz).",
              "next_frame", range=(1, 10_000_000)),
    ParamSpec("fast_resize", False, "Resize with OpenCV (INTER_AREA/INTER_CUBIC, ~0.5 ms) instead of the "
              "official PIL bicubic (~3 ms at 640x480): faster, NOT bit-compatible with the official pipeline.",
              "next_frame"),
    # --- subscription (re-created on change)
    ParamSpec("image_transport", "raw", "raw: subscribe to 'image' (sensor_msgs/Image); compressed: to "
              "'image/compressed' (sensor_msgs/CompressedImage).", "subscription", choices=("raw", "compressed")),
    ParamSpec("qos_reliability", "best_effort", "Image subscription reliability: best_effort (sensor-data "
              "QoS) or reliable.", "subscription", choices=("best_effort", "reliable")),
    # --- diagnostics timer
    ParamSpec("diagnostics_period", 1.0, "Seconds between /diagnostics messages.", "timer", range=(0.05, 60.0)),
)
PARAMETER_NAMES = tuple(p.name for p in PARAMETERS)
SPECS: dict[str, ParamSpec] = {p.name: p for p in PARAMETERS}
RUNTIME_FIELDS = ("checkpoint", "model_preset", "device", "dtype", "attention_backend", "seed",
                  "allow_unsafe_checkpoint")
# The parameters that are StreamConfig fields of the same name (publish_depth maps onto with_depth).
STREAM_FIELDS = ("scale_frames", "sliding_window", "keyframe_interval", "camera_iterations", "max_frame_num",
                 "long_run_policy", "max_stored_frames", "overlap_frames")

_APPLIES_NOTE = {
    "model": "a change loads a new model and starts a new session",
    "session": "a change starts a new session (new world frame)",
    "next_frame": "applies from the next frame",
    "subscription": "a change re-creates the image subscription",
    "timer": "applies at once",
    "startup": "read-only",
}


def descriptor(spec: ParamSpec) -> ParameterDescriptor:
    """The descriptor ROS tools show for ``spec``; its range lets ROS refuse out-of-range values itself."""
    d = ParameterDescriptor(description=spec.description, read_only=spec.read_only)
    notes = []
    if spec.range is not None:
        lo, hi = spec.range
        if isinstance(spec.default, float):
            d.floating_point_range = [FloatingPointRange(from_value=float(lo), to_value=float(hi), step=0.0)]
        else:
            d.integer_range = [IntegerRange(from_value=int(lo), to_value=int(hi), step=1)]
    if spec.choices is not None:
        notes.append("one of: " + ", ".join(repr(c) for c in spec.choices))
    notes.append(_APPLIES_NOTE[spec.applies])
    d.additional_constraints = "; ".join(notes)
    return d


def configs_from_values(values: dict) -> tuple[RuntimeConfig, StreamConfig]:
    """Parameter values -> the core's dataclasses (one to one)."""
    runtime = RuntimeConfig(**{k: values[k] for k in RUNTIME_FIELDS})
    stream = StreamConfig(with_depth=bool(values["publish_depth"]), **{k: values[k] for k in STREAM_FIELDS})
    return runtime, stream


def validate_values(values: dict) -> list[str]:
    """Every reason why these parameter values cannot run (empty list: they can)."""
    problems: list[str] = []
    for spec in PARAMETERS:
        v = values[spec.name]
        if spec.choices is not None and v not in spec.choices:
            problems.append(f"{spec.name} must be one of {list(spec.choices)} (got {v!r})")
        if spec.range is not None and not (spec.range[0] <= v <= spec.range[1]):
            problems.append(f"{spec.name} must be in [{spec.range[0]}, {spec.range[1]}] (got {v})")
    runtime, stream = configs_from_values(values)
    problems += [p for p in cfgmod.validate_runtime(runtime) + cfgmod.validate_stream(stream) if p not in problems]
    if stream.long_run_policy == "window" and not problems:
        from ..core.long_run import validate_window  # late: long_run imports torch

        problems += validate_window(stream)
    if runtime.checkpoint and not os.path.isfile(os.path.expanduser(runtime.checkpoint)):
        problems.append(f"checkpoint {runtime.checkpoint!r} is not a readable file")
    if not values["world_frame"].strip():
        problems.append("world_frame must not be empty")
    if values["camera_frame"] and values["camera_frame"] == values["world_frame"]:
        problems.append("camera_frame must differ from world_frame")
    if not values["trajectory_path"].strip():
        problems.append("trajectory_path must not be empty")
    if not problems:
        try:  # device/dtype/backend combinations that cannot run here (e.g. cuda on a CPU machine)
            from ..core.runtime import resolve_runtime

            resolve_runtime(runtime)
        except (ValueError, RuntimeError) as exc:
            problems.append(str(exc))
    return problems
