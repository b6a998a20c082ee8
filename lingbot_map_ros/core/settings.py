"""Every user-facing setting of the package, once: the table the ROS parameters, the CLI options of the
tools, the parameter file and the validation all derive from.

A ``Setting`` holds the name (the ROS parameter; the CLI option is the same with dashes), the
default (taken from the core's dataclasses, so the two cannot drift; its Python type is the
parameter's type), the range or the allowed values, the description ``ros2 param describe`` and
``--help`` show, and ``applies``: what a change at runtime needs. ``SessionManager`` reads that
column to decide between a new model, a new session and "from the next frame"; the node reads it to
re-create its subscription or timer.

Plain data and pure functions; no rclpy (``ros/parameters.py`` turns a row into a
``ParameterDescriptor``, ``tools/common.py`` into an argparse option).
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from typing import Any, Optional

from .config import RuntimeConfig, StreamConfig, field_limits, validate_runtime, validate_stream
from .scale import SCALE_SOURCES

APPLIES = {
    "model": "a change loads a new model and starts a new session",
    "session": "a change starts a new session (new world frame)",
    "budget": "a change re-checks the memory budget; a new session only when the fitted sliding_window changes",
    "next_frame": "applies from the next frame",
    "subscription": "a change re-creates the image subscription",
    "timer": "applies at once",
    "startup": "read-only",
    "configure": "read at the next configure transition",
}


@dataclass(frozen=True)
class Setting:
    """One setting: its default, what it means, its range, and when a change takes effect."""

    name: str
    default: Any
    description: str
    applies: str  # a key of APPLIES
    range: Optional[tuple] = None  # (low, high) inclusive, for int/float settings
    choices: Optional[tuple] = None  # allowed strings

    @property
    def read_only(self) -> bool:
        return self.applies == "startup"

    @property
    def option(self) -> str:
        """The CLI option of the tools: ``--scale-frames`` for ``scale_frames``."""
        return "--" + self.name.replace("_", "-")


def _field(cls: type, name: str, description: str, applies: str) -> Setting:
    """The row of a field of a core dataclass: its default and its limits come from the dataclass
    (``config.limited``), so they are written once."""
    return Setting(name, getattr(cls(), name), description, applies, **field_limits(cls, name))


SETTINGS: tuple[Setting, ...] = (
    # --- model (a change builds a new model and starts a new session)
    _field(RuntimeConfig, "checkpoint", "Path of an official LingBot-Map checkpoint (.pt/.pth/.safetensors). "
            "Empty: random weights of the tiny preset (demo only, poses are not meaningful).", "model"),
    _field(RuntimeConfig, "model_preset", "Model shapes: 'full' (the official checkpoint) or 'tiny' "
            "(small, CPU tests). Empty: full with a checkpoint, tiny without.", "model"),
    _field(RuntimeConfig, "device", "Torch device: auto (CUDA when available), cpu, cuda or cuda:N.", "model"),
    _field(RuntimeConfig, "dtype", "Compute dtype: auto (bf16 on GPU, fp32 on CPU), float32, bfloat16, float16.",
            "model"),
    _field(RuntimeConfig, "attention_backend", "Global attention over the paged KV cache: auto "
            "(SDPA's split kernel on Hopper, else FlashInfer when usable, else SDPA), flashinfer or sdpa.", "model"),
    _field(RuntimeConfig, "flashinfer_kernel", "FlashInfer kernel (attention_backend flashinfer): auto "
            "(fa3 over exact token pages on Hopper, fa2 elsewhere), fa2 or fa3.", "model"),
    _field(RuntimeConfig, "sdpa_kernel", "One-frame kernel of attention_backend sdpa on CUDA: auto (split "
            "where cuDNN runs), split (the visible keys' contiguous runs in one call of our kernel, in Gluon "
            "on Hopper, in Triton where TMA runs, else cuDNN over the patch prefix + a masked tail, merged), cudnn "
            "(one masked call over all pages) or flash (gather + varlen flash).", "model"),
    _field(RuntimeConfig, "cuda_graphs", "Replay each one-frame step as a CUDA graph (CUDA, half precision "
            "only): removes thousands of kernel launches per frame.", "model"),
    _field(RuntimeConfig, "compile_blocks", "torch.compile the block bodies around the attention call "
            "inside the CUDA-graph step: auto (on with CUDA graphs), on or off. Costs seconds on the first "
            "one-frame step (cached on disk), then ~8 ms/frame less on an H200.", "model"),
    _field(RuntimeConfig, "autocast", "The official mixed-precision recipe (fp32 LayerNorm outputs and residual "
            "stream). false: the aggregator purely in dtype; opt-in, moves poses by ~4e-2 over 200 frames.",
            "model"),
    _field(RuntimeConfig, "seed", "Seed of the random weights used when no checkpoint is given.", "model"),
    _field(RuntimeConfig, "allow_unsafe_checkpoint", "Allow loading a pickled checkpoint with "
            "torch.load(weights_only=False) (runs code from the file). Read-only: set it at start only, "
            "never remotely.", "startup"),
    Setting("autostart", True, "Bring the managed node to active on its own at start (configure, then "
            "activate). false: it waits unconfigured for `ros2 lifecycle set` or a lifecycle manager.",
            "startup"),
    # --- stream / cache geometry (a change starts a new session: new world frame)
    _field(StreamConfig, "scale_frames", "Frames processed together first; their tokens stay in the "
            "KV cache forever. Poses start after this many frames.", "session"),
    _field(StreamConfig, "sliding_window", "Most recent stored frames kept in the KV cache with all "
            "tokens; older ones keep only their 6 special tokens.", "session"),
    _field(StreamConfig, "camera_iterations", "Refinement iterations of the camera head.",
            "session"),
    _field(StreamConfig, "max_frame_num", "RoPE table size: the stored-frame index never reaches it.",
            "session"),
    _field(StreamConfig, "long_run_policy", "What happens before max_stored_frames stored frames: "
            "window (chain windows in one world frame), reset (new session) or stop (refuse frames "
            "until ~/reset).", "session"),
    _field(StreamConfig, "max_stored_frames", "Stored frames per session before the long-run "
            "policy acts (the model was trained on ~320 views).", "session"),
    _field(StreamConfig, "overlap_frames", "Frames carried into the next window when "
            "long_run_policy is 'window'.", "session"),
    # --- memory (docs/memory.md): the footprint must fit the budget at configure and at every change
    _field(StreamConfig, "image_width", "Model input width in pixels (a multiple of 14, 224..518; 518 is the "
            "official size). Images are resized to it keeping their aspect, then centre-cropped to at most "
            "square.", "session"),
    _field(StreamConfig, "camera_aspect", "The camera's image height / width (0.75 for 640x480, 0.5625 for "
            "16:9): configure checks gpu_memory_budget at that frame's model input instead of the width's tallest "
            "(a square), and a taller camera is centre-cropped to it. 0: unknown (a square). Read-only: a camera "
            "keeps its aspect.", "startup"),
    _field(StreamConfig, "gpu_memory_budget", "GB the session may allocate (weights, caches, activations). 0: the "
            "free device memory at configure minus a margin; on the CPU 0 means no limit. Settings that do not "
            "fit are refused with the numbers.", "budget"),
    _field(StreamConfig, "fit_window", "Shrink sliding_window to the largest value that fits "
            "gpu_memory_budget (a WARN and the diagnostics say which), instead of refusing.", "budget"),
    # --- from the next frame, same session
    _field(StreamConfig, "keyframe_interval", "Every N-th frame after the scale frames is stored "
            "in the KV cache; the others get a pose but are forgotten. Applies from the next frame.",
            "next_frame"),
    Setting("publish_depth", False, "Run the depth head and publish ~/depth (32FC1, model input size). "
            "Applies from the next frame.", "next_frame"),
    _field(StreamConfig, "depth_every", "When the depth head runs (any depth output, or scale_source depth): on "
            "frames 0, N, 2N, ... of a session and on every scale frame; the frames between get a pose only "
            "(no ~/depth, points or map update; on a GPU they take the camera-only time). 1: every frame. "
            "Applies from the next frame.", "next_frame"),
    Setting("max_non_finite_frames", 3, "Frames in a row whose model output holds NaN/Inf before the node starts "
            "a new session (such values in the KV cache poison every later frame). Such frames are never "
            "published.", "next_frame", range=(1, 10_000)),
    Setting("world_frame", "lingbot_world", "Frame id of the poses: the first camera's optical frame of "
              "the current session (with base_frame: its first body pose).", "next_frame"),
    Setting("camera_frame", "", "Child frame id (camera optical frame). Empty: the image header's frame_id.",
              "next_frame"),
    Setting("publish_tf", True, "Broadcast world_frame -> camera_frame on /tf (with base_frame: -> base_frame, "
            "with odom_frame: -> odom_frame), unless that frame already has another parent.", "next_frame"),
    Setting("path_max_length", 10000, "Poses kept in ~/path (oldest dropped first).", "next_frame",
            range=(1, 10_000_000)),
    Setting("trajectory_path", "lingbot_trajectory.tum", "File ~/save_trajectory writes (TUM format: "
            "stamp tx ty tz qx qy qz qw).", "next_frame"),
    Setting("trajectory_max_length", 100000, "Poses of the current session kept for ~/save_trajectory "
            "(oldest dropped first): bounds the node's memory on runs of hours (100000 = 2.8 h at 10 Hz).",
            "next_frame", range=(1, 10_000_000)),
    Setting("fast_resize", False, "Resize with OpenCV (INTER_AREA/INTER_CUBIC, ~0.5 ms) instead of the "
            "official PIL bicubic (~3 ms at 640x480): faster, NOT bit-compatible with the official pipeline.",
            "next_frame"),
    # --- reconstruction outputs (all from the next frame; the depth head runs when any
    # of publish_depth / publish_points / publish_map is on, see DEPTH_OUTPUTS)
    Setting("publish_points", False, "Publish ~/points (PointCloud2 in world_frame: x y z, rgb, confidence): "
            "the frame's depth unprojected with its pose and intrinsics. Runs the depth head.", "next_frame"),
    Setting("points_stride", 4, "Unproject every N-th pixel in x and y for ~/points and the map "
            "(4 at 518x378: ~12 000 points per frame).", "next_frame", range=(1, 64)),
    Setting("points_min_confidence", 1.0, "Drop pixels whose depth confidence is below this (the head's "
            "confidence is 1 + exp(x) >= 1, so 1.0 keeps every valid pixel; raise it to drop sky and edges).",
            "next_frame", range=(0.0, 1.0e6)),
    Setting("publish_map", False, "Accumulate the session's points in a bounded voxel map and publish it on "
            "~/map_points every map_period s. Runs the depth head.", "next_frame"),
    Setting("map_voxel_size", 0.01, "Voxel edge of the map in the world's unit (the model's normalised one; "
            "metres with a metric scale_source); one fused point per voxel. A change empties the map.", "next_frame",
            range=(1.0e-4, 100.0)),
    Setting("map_max_points", 500000, "Voxels kept in the map; beyond it the voxels seen longest ago, then "
            "the least confident, are dropped first (memory stays bounded on runs of hours).", "next_frame",
            range=(1000, 50_000_000)),
    Setting("map_period", 1.0, "Seconds between ~/map_points messages (the map is merged then).",
            "next_frame", range=(0.1, 3600.0)),
    Setting("map_path", "lingbot_map.ply", "File ~/save_map writes (binary PLY: x y z, red green blue, "
            "confidence).", "next_frame"),
    # --- subscription (re-created on change)
    Setting("image_transport", "raw", "raw: subscribe to 'image' (sensor_msgs/Image); compressed: to "
            "'image/compressed' (sensor_msgs/CompressedImage).", "subscription", choices=("raw", "compressed")),
    Setting("qos_reliability", "best_effort", "Image subscription reliability: best_effort (sensor-data "
            "QoS) or reliable.", "subscription", choices=("best_effort", "reliable")),
    # --- diagnostics timer
    Setting("diagnostics_period", 1.0, "Seconds between /diagnostics messages.", "timer", range=(0.05, 60.0)),
)

# --- on a robot: its TF tree (REP 103 / REP 105) and a metric scale (core/scale.py). The frames and the
# scale source define the world the node publishes and the tree it joins: set at start (read-only).
ROBOT_SETTINGS: tuple[Setting, ...] = (
    Setting("base_frame", "", "Robot body frame (e.g. base_link). Set: base_frame -> camera frame is looked up "
            "in TF at each image stamp and the BODY pose is published; the world is the body pose of the "
            "session's first frame (x forward, z up on a level start). Empty: the camera pose.", "startup"),
    Setting("odom_frame", "", "With base_frame: publish world_frame -> odom_frame on /tf (REP 105's map -> "
            "odom), so that world -> odom -> base equals the estimate at each image stamp; the robot's odometry "
            "stays the only publisher of odom_frame -> base_frame.", "startup"),
    Setting("tf_timeout", 0.1, "Seconds to wait for a transform at an image stamp. A frame whose transform "
            "does not come is still processed by the model, publishes no pose and ends NO_TRANSFORM.",
            "next_frame", range=(0.0, 10.0)),
    Setting("scale_source", "model", "Unit of the published world: model (the model's own, not metres), "
            "depth (a depth camera registered to the colour image, topic 'depth'), odometry (travel of "
            "base_frame in odom_frame) or fixed (scale_factor). Until a depth/odometry scale locks, nothing "
            "metric is published.", "startup", choices=SCALE_SOURCES),
    Setting("scale_factor", 1.0, "Metres per model unit when scale_source is fixed.", "startup",
            range=(1.0e-6, 1.0e6)),
    Setting("depth_sync_slop", 0.02, "Seconds: the largest stamp difference of a colour/depth pair "
            "(message_filters ApproximateTimeSynchronizer), scale_source depth.", "startup", range=(0.0, 1.0)),
    Setting("scale_min_samples", 5, "Stored keyframes whose sensor/model depth ratios must agree (within 5 %) "
            "before a depth scale locks.", "next_frame", range=(1, 1000)),
    Setting("scale_min_travel", 0.5, "Metres the body must travel in odom_frame before an odometry scale "
            "locks.", "next_frame", range=(0.0, 1000.0)),
    Setting("transform_publish_period", 0.05, "Seconds between re-sends of the latest world_frame -> "
            "odom_frame (or -> base_frame; with base_frame only) correction, stamped now + transform_tolerance, "
            "as AMCL and slam_toolbox do, so tf2 consumers (nav2 costmaps) never extrapolate between frames. "
            "The correction changes only when a frame is placed; none exists before the first placed frame "
            "of a session (a reset forgets it). 0: sent only when a frame is placed, at the image stamp.", "startup",
            range=(0.0, 10.0)),
    Setting("transform_tolerance", 0.1, "Seconds: re-sent corrections are stamped this far ahead of now "
            "(AMCL's transform_tolerance).", "next_frame", range=(0.0, 10.0)),
    Setting("pose_covariance_diagonal", [-1.0] * 6, "~/odom pose covariance diagonal (x, y, z, roll, pitch, "
            "yaw; m^2 and rad^2), for a filter that fuses ~/odom (robot_localization cannot override an "
            "input's covariance). All six >= 0, or the default (-1: unknown, the first element -1 and the rest "
            "0, as REP 145 marks it).", "next_frame"),
    Setting("twist_covariance_diagonal", [-1.0] * 6, "~/odom twist covariance diagonal (vx, vy, vz, wx, wy, "
            "wz; (m/s)^2 and (rad/s)^2); same rules as pose_covariance_diagonal.", "next_frame"),
)
COVARIANCE_SETTINGS = ("pose_covariance_diagonal", "twist_covariance_diagonal")

# --- several cameras on one GPU (README "Several cameras"): one stream per camera over one model and one
# page pool; the names decide the topics, the per-camera outputs and the streams of a saved session.
MAX_CAMERAS = 8
CAMERA_SETTINGS: tuple[Setting, ...] = (
    Setting("cameras", [], "Camera names. Empty: one camera on 'image', as without this parameter. [front, rear]: "
            "one stream each on front/image and rear/image (/compressed with image_transport compressed; "
            "<name>/depth with scale_source depth), one model and one page pool for all, a tick batches the "
            "newest frame of each camera; per-camera outputs under ~/<name>/. At most 8; base_frame is required "
            "with more than one.", "configure"),
    Setting("primary_camera", "", "The camera whose estimate drives the body pose (~/pose, ~/odom, ~/path, /tf) "
            "while it tracks. Empty: the first of cameras.", "configure"),
    Setting("camera_timeout", 0.5, "Seconds without a processed frame after which a camera counts as stalled: "
            "the next camera that tracks drives the body pose (the offset at the hand-over is carried, never a "
            "jump) and /diagnostics WARNs naming the stalled camera.", "next_frame", range=(0.01, 60.0)),
)
_CAMERA_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")


def camera_problems(values: dict) -> list[str]:
    """Reasons why ``cameras`` / ``primary_camera`` cannot run (empty: they can)."""
    if "cameras" not in values:
        return []
    names = list(values.get("cameras") or [])
    problems: list[str] = []
    if len(names) > MAX_CAMERAS:
        problems.append(f"cameras: at most {MAX_CAMERAS} (got {len(names)})")
    bad = [n for n in names if not isinstance(n, str) or not _CAMERA_NAME.fullmatch(n)]
    if bad:
        problems.append(f"cameras: {bad} are not camera names (a letter, then letters, digits or _: the name "
                        "becomes the topics <name>/image and ~/<name>/pose)")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        problems.append(f"cameras: {repeated} given more than once")
    primary = str(values.get("primary_camera", ""))
    if primary and primary not in names:
        problems.append(f"primary_camera {primary!r} is not one of cameras {names}")
    if len(names) > 1 and not values.get("base_frame"):
        problems.append(f"cameras {names}: more than one camera needs base_frame (every camera's estimate becomes "
                        "the body pose through base_frame -> its camera frame in TF)")
    return problems


def camera_names(values: dict) -> list[str]:
    """The configured camera names ([] : the single camera on ``image``)."""
    return list(values.get("cameras") or [])


def primary_camera(values: dict) -> str:
    """The driving camera: ``primary_camera``, else the first of ``cameras`` ("" without cameras)."""
    names = camera_names(values)
    return str(values.get("primary_camera") or "") or (names[0] if names else "")

# --- saved sessions (docs/sessions.md): the map (the model's KV cache) kept across restarts
SESSION_STAGING = ("auto", "host")
SESSION_SETTINGS: tuple[Setting, ...] = (
    Setting("session_path", "lingbot_session", "Folder ~/save_session writes and ~/load_session reads (the KV "
            "cache's pages in use, the counters, the long-run chain, the trajectory: docs/sessions.md).",
            "next_frame"),
    Setting("initial_session", "", "A saved session loaded at configure: the node resumes in its world. A "
            "folder that is not a session, is damaged or was made with another checkpoint, model shape, cache "
            "geometry or dtype fails the configure transition with the reason. Empty: start a new session.",
            "configure"),
    Setting("session_staging", "auto", "Where ~/save_session's copy and ~/load_session's files wait: auto = in "
            "GPU memory when a copy of the session fits gpu_memory_budget and the free memory (the stream pauses "
            "milliseconds), else host memory; host = never a second copy on the GPU (a GPU shared with other "
            "processes): the save pauses the stream for a copy to host memory and the load copies from the "
            "mapped files (seconds for gigabytes: docs/sessions.md).", "next_frame", choices=SESSION_STAGING),
    Setting("mapping", True, "false: localization - every frame gets a pose in the current (e.g. loaded) "
            "map and nothing is stored, the KV cache stays as it is; true again: mapping continues. "
            "Applies from the next frame.", "next_frame"),
)
SETTINGS = SETTINGS + ROBOT_SETTINGS + CAMERA_SETTINGS + SESSION_SETTINGS


def robot_problems(values: dict) -> list[str]:
    """Reasons why the robot settings in ``values`` cannot work together (empty: they can)."""
    problems: list[str] = []
    world, base, odom = values.get("world_frame", ""), values.get("base_frame", ""), values.get("odom_frame", "")
    for name, frame in (("base_frame", base), ("odom_frame", odom)):
        if frame and frame == world:
            problems.append(f"{name} must differ from world_frame ({world!r})")
    if odom and not base:
        problems.append("odom_frame needs base_frame (the frame the robot's odometry moves: odom_frame -> base_frame)")
    if odom and odom == base:
        problems.append("odom_frame must differ from base_frame")
    for name in COVARIANCE_SETTINGS:
        if name in values:
            problem = covariance_problem(values[name])
            if problem:
                problems.append(f"{name}: {problem}")
    if values.get("scale_source") == "odometry" and not (base and odom):
        problems.append("scale_source odometry needs base_frame and odom_frame (the travel of base_frame in "
                        "odom_frame)")
    return problems


def covariance_problem(diagonal) -> str:
    """Why ``diagonal`` cannot be a covariance diagonal of ~/odom ("": it can): six finite values, all
    >= 0, or all negative (unknown)."""
    values = [float(v) for v in diagonal]
    if len(values) != 6:
        return f"needs 6 values (x, y, z, roll, pitch, yaw), got {len(values)}"
    if not all(math.isfinite(v) for v in values):
        return f"values must be finite (got {values})"
    if any(v < 0 for v in values) and not all(v < 0 for v in values):
        return f"all six >= 0, or all negative for unknown (got {values})"
    return ""


def covariance_matrix(diagonal) -> list[float]:
    """The 36 row-major values of a ~/odom covariance: ``diagonal`` on the diagonal, or unknown (-1 first,
    then zeros) when the diagonal is negative."""
    values = [float(v) for v in diagonal]
    matrix = [0.0] * 36
    if any(v < 0 for v in values):
        matrix[0] = -1.0
        return matrix
    for i, v in enumerate(values):
        matrix[7 * i] = v
    return matrix


SETTING_NAMES = tuple(s.name for s in SETTINGS)
SETTINGS_BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}
# The settings that are RuntimeConfig / StreamConfig fields of the same name. The depth head
# (StreamConfig.with_depth) runs when any output that needs depth is asked for.
RUNTIME_FIELDS = ("checkpoint", "model_preset", "device", "dtype", "attention_backend", "flashinfer_kernel",
                  "sdpa_kernel", "cuda_graphs", "compile_blocks", "autocast", "seed", "allow_unsafe_checkpoint")
STREAM_FIELDS = ("scale_frames", "sliding_window", "keyframe_interval", "camera_iterations", "max_frame_num",
                 "long_run_policy", "max_stored_frames", "overlap_frames",
                 "image_width", "camera_aspect", "gpu_memory_budget", "fit_window",  # memory (docs/memory.md)
                 "depth_every")
CORE_FIELDS = frozenset(RUNTIME_FIELDS + STREAM_FIELDS)
# The fields whose change starts a new session ("session" in the table): the cache geometry a session,
# and a saved session, is bound to. A "budget" field only changes the caches through the fitted window.
SESSION_FIELDS = tuple(s.name for s in SETTINGS if s.applies == "session")
DEPTH_OUTPUTS = ("publish_depth", "publish_points", "publish_map")


def defaults() -> dict[str, Any]:
    return {s.name: s.default for s in SETTINGS}


def applies_of_field(field_name: str) -> str:
    """What a change of a RuntimeConfig/StreamConfig field needs (``with_depth``: from the next frame)."""
    if field_name in ("with_depth", "depth_chunk"):
        return "next_frame"
    return SETTINGS_BY_NAME[field_name].applies


def configs_from_values(values: dict) -> tuple[RuntimeConfig, StreamConfig]:
    """Setting values -> the core's dataclasses (one to one)."""
    runtime = RuntimeConfig(**{k: values[k] for k in RUNTIME_FIELDS})
    # the depth head also runs for a depth-camera scale (the ratio is sensor depth over model depth)
    with_depth = any(bool(values.get(k, False)) for k in DEPTH_OUTPUTS) or values.get("scale_source") == "depth"
    stream = StreamConfig(with_depth=with_depth, **{k: values[k] for k in STREAM_FIELDS})
    return runtime, stream


def validate_values(values: dict, *, resolve: bool = True) -> list[str]:
    """Every reason why these setting values cannot run (empty list: they can).

    ``resolve``: also check that device/dtype/backend can run on this machine (imports torch).
    """
    problems: list[str] = []
    for s in SETTINGS:  # the node's own settings; the core dataclasses check theirs (validate_* below)
        if s.name not in values or s.name in CORE_FIELDS:
            continue
        v = values[s.name]
        if s.choices is not None and v not in s.choices:
            problems.append(f"{s.name} must be one of {list(s.choices)} (got {v!r})")
        if s.range is not None and not (s.range[0] <= v <= s.range[1]):
            problems.append(f"{s.name} must be in [{s.range[0]}, {s.range[1]}] (got {v})")
    runtime, stream = configs_from_values(values)
    problems += validate_runtime(runtime) + validate_stream(stream)
    if stream.long_run_policy == "window" and not problems:
        from .long_run import validate_window  # late: long_run imports torch

        problems += validate_window(stream)
    if runtime.checkpoint and not os.path.isfile(os.path.expanduser(runtime.checkpoint)):
        problems.append(f"checkpoint {runtime.checkpoint!r} is not a readable file")
    if "world_frame" in values:
        if not values["world_frame"].strip():
            problems.append("world_frame must not be empty")
        if values.get("camera_frame") and values["camera_frame"] == values["world_frame"]:
            problems.append("camera_frame must differ from world_frame")
    problems += robot_problems(values)
    problems += camera_problems(values)
    if "trajectory_path" in values and not values["trajectory_path"].strip():
        problems.append("trajectory_path must not be empty")
    if "session_path" in values and not values["session_path"].strip():
        problems.append("session_path must not be empty")
    if resolve and not problems:
        try:  # device/dtype/backend combinations that cannot run here (e.g. cuda on a CPU machine)
            from .runtime import resolve_runtime

            resolve_runtime(runtime)
        except (ValueError, RuntimeError) as exc:
            problems.append(str(exc))
    return problems


__all__ = ["APPLIES", "DEPTH_OUTPUTS", "RUNTIME_FIELDS", "SETTINGS", "SETTINGS_BY_NAME", "SETTING_NAMES",
           "SESSION_FIELDS", "STREAM_FIELDS", "Setting", "applies_of_field", "configs_from_values", "defaults",
           "validate_values", "ROBOT_SETTINGS", "SESSION_SETTINGS", "CAMERA_SETTINGS", "MAX_CAMERAS", "camera_names",
           "camera_problems", "primary_camera", "covariance_matrix", "covariance_problem", "robot_problems"]
