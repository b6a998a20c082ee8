"""The ROS 2 node: camera topic in, camera pose + KV-cache diagnostics out.

The node is thin. It converts messages (``image_io``), preprocesses them (``preprocess``), hands the
tensor to a ``StreamingSession`` on its own inference thread and publishes what comes back. It owns
parameters, QoS, the latest-frame queue, publishers, services and diagnostics; it does no tensor work.

Threads
-------
* the executor thread runs the image callback (conversion + validation, cheap), services, the
  diagnostics timer and parameter callbacks;
* the inference thread takes the newest queued frame, preprocesses it, pushes it into the session
  and publishes the results. A frame that arrives while another one is still queued replaces it
  (the replaced one is counted as dropped), so the node never falls behind the camera.

Session changes (reset, parameter changes that need a new cache, a new model) are queued as commands
and applied by the inference thread between two frames, so the session is only ever touched by it.
"""
from __future__ import annotations

import collections
import math
import os
import statistics
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
import rclpy
import rclpy.exceptions
import rclpy.qos
from builtin_interfaces.msg import Time as TimeMsg
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from geometry_msgs.msg import PoseStamped, TransformStamped
from lingbot_map_msgs.msg import CacheStats, FrameStatus
from nav_msgs.msg import Odometry, Path
from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor, SetParametersResult
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
from rclpy.node import Node
from rclpy.qos import QoSDurabilityPolicy, QoSHistoryPolicy, QoSProfile, QoSReliabilityPolicy
from sensor_msgs.msg import CompressedImage, Image
from std_msgs.msg import Header
from std_srvs.srv import Trigger
from tf2_msgs.msg import TFMessage

from . import config as cfgmod
from .config import RuntimeConfig, StreamConfig

NODE_NAME = "lingbot_map"
DIAG_PREFIX = "lingbot_map: "
FALLBACK_CAMERA_FRAME = "lingbot_camera"
PATH_EVERY_FRAME = 1000  # ~/path is sent with every pose while it holds at most this many poses,
PATH_MIN_PERIOD = 0.5  # then at most every this many seconds

# --------------------------------------------------------------------------------------- parameters


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
    # --- subscription (re-created on change)
    ParamSpec("image_transport", "raw", "raw: subscribe to 'image' (sensor_msgs/Image); compressed: to "
              "'image/compressed' (sensor_msgs/CompressedImage).", "subscription", choices=("raw", "compressed")),
    ParamSpec("qos_reliability", "best_effort", "Image subscription reliability: best_effort (sensor-data "
              "QoS) or reliable.", "subscription", choices=("best_effort", "reliable")),
    # --- diagnostics timer
    ParamSpec("diagnostics_period", 1.0, "Seconds between /diagnostics messages.", "timer", range=(0.05, 60.0)),
)
PARAMETER_NAMES = tuple(p.name for p in PARAMETERS)
_SPECS = {p.name: p for p in PARAMETERS}
_RUNTIME_FIELDS = ("checkpoint", "model_preset", "device", "dtype", "attention_backend", "seed",
                   "allow_unsafe_checkpoint")
_STREAM_FIELDS = ("scale_frames", "sliding_window", "keyframe_interval", "camera_iterations", "max_frame_num",
                  "long_run_policy", "max_stored_frames", "overlap_frames")


def _descriptor(spec: ParamSpec) -> ParameterDescriptor:
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
    notes.append({
        "model": "a change loads a new model and starts a new session",
        "session": "a change starts a new session (new world frame)",
        "next_frame": "applies from the next frame",
        "subscription": "a change re-creates the image subscription",
        "timer": "applies at once",
        "startup": "read-only",
    }[spec.applies])
    d.additional_constraints = "; ".join(notes)
    return d


def configs_from_values(values: dict) -> tuple[RuntimeConfig, StreamConfig]:
    """Parameter values -> the core's dataclasses (one to one)."""
    runtime = RuntimeConfig(**{k: values[k] for k in _RUNTIME_FIELDS})
    stream = StreamConfig(with_depth=bool(values["publish_depth"]), **{k: values[k] for k in _STREAM_FIELDS})
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
        try:
            from .long_run import validate_window
        except ImportError:
            validate_window = None
        if validate_window is not None:
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
            from .runtime import resolve_runtime

            resolve_runtime(runtime)
        except (ValueError, RuntimeError) as exc:
            problems.append(str(exc))
    return problems


# --------------------------------------------------------------------------------------- frames


class InputRejected(ValueError):
    """A message the node cannot use; ``kind`` names the counter it goes to."""

    def __init__(self, kind: str, reason: str):
        super().__init__(reason)
        self.kind = kind


@dataclass
class _Frame:
    """A received, converted image waiting for (or inside) the session; the session's opaque stamp."""

    header: Header
    rgb: np.ndarray
    received: float  # perf_counter at the start of the callback
    convert_ms: float
    preprocess_ms: float = 0.0
    session_extra_ms: float = 0.0  # push() wall time beyond the model time (phase 2 only)
    handoff_ms: float = 0.0  # callback done -> inference thread starts on it (queue wait + thread wake-up)


@dataclass
class _Counters:
    received: int = 0
    processed: int = 0
    dropped_queue: int = 0
    rejected: int = 0
    refused: int = 0
    errors: int = 0
    rejected_by_kind: dict = field(default_factory=lambda: collections.Counter())
    sessions_started: int = 1
    parameter_sessions: int = 0  # new sessions caused by parameter changes
    resets: int = 0
    last_reject_reason: str = ""
    last_reject_time: float = -1e9
    last_drop_time: float = -1e9
    last_error: str = ""
    last_error_time: float = -1e9
    last_new_session_reason: str = "node started"
    dropped_since_diag: int = 0
    rejected_since_diag: int = 0


def _stamp_sec(stamp: TimeMsg) -> float:
    return stamp.sec + stamp.nanosec * 1e-9


def _check_image_message(msg) -> None:
    """Cheap structural checks before any conversion (reasons name the offending numbers)."""
    if isinstance(msg, CompressedImage):
        if len(msg.data) == 0:
            raise InputRejected("zero_size", "compressed image has no data")
        return
    if msg.width == 0 or msg.height == 0:
        raise InputRejected("zero_size", f"zero-sized image {msg.width}x{msg.height}")
    if len(msg.data) != msg.step * msg.height:
        raise InputRejected(
            "data_length",
            f"data length {len(msg.data)} != step {msg.step} x height {msg.height} = {msg.step * msg.height}",
        )


def _percentile(values, q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(math.ceil(q * len(s))) - 1))]


# --------------------------------------------------------------------------------------- the node


class LingBotMapNode(Node):
    """LingBot-Map streaming reconstruction on one camera topic (see INTERFACE.md)."""

    def __init__(self, node_name: str = NODE_NAME, **kwargs):
        super().__init__(node_name, **kwargs)
        for spec in PARAMETERS:
            self.declare_parameter(spec.name, spec.default, _descriptor(spec))
        self._values = {p.name: self.get_parameter(p.name).value for p in PARAMETERS}
        problems = validate_values(self._values)
        if problems:
            raise ValueError("invalid parameters: " + "; ".join(problems))

        # Late imports: torch-heavy modules load after parameters are known to be valid.
        from .image_io import UnsupportedImage, message_to_rgb
        from .preprocess import FramePreprocessor, ResolutionChanged
        from .geometry import quaternion_xyzw_from_matrix, write_tum
        from . import stream as streammod

        from .long_run import make_session  # the one factory that applies the long-run policy

        self._make_session = make_session

        self._message_to_rgb = message_to_rgb
        self._unsupported_image = UnsupportedImage
        self._make_preprocessor = FramePreprocessor
        self._resolution_changed = ResolutionChanged
        self._quat = quaternion_xyzw_from_matrix
        self._write_tum = write_tum
        self._streammod = streammod

        self._lock = threading.Lock()  # counters, trajectory, path, cached snapshot
        self._cond = threading.Condition()  # queue + commands
        self._pending: Optional[_Frame] = None
        self._commands: list = []
        self._stop = False
        self._c = _Counters()
        self._recv_times: collections.deque = collections.deque(maxlen=300)
        self._latencies: collections.deque = collections.deque(maxlen=200)
        self._overheads: collections.deque = collections.deque(maxlen=200)
        # per-part node overhead [convert, preprocess, publish, session bookkeeping] for diagnostics
        self._parts: collections.deque = collections.deque(maxlen=200)
        self._expected_wh: Optional[tuple[int, int]] = None  # first accepted frame's size in this session
        self._reject_log_times: dict = {}
        self._reject_log_suppressed: collections.Counter = collections.Counter()
        self._warned_no_frame_id = False
        self._t_start = time.monotonic()
        self._last_frame_time: Optional[float] = None

        runtime, stream = configs_from_values(self._values)
        self.get_logger().info(
            f"building model (preset {runtime.resolved_preset()}, device {runtime.device}, dtype {runtime.dtype}, "
            f"backend {runtime.attention_backend}); stream {stream}"
        )
        self._session = make_session(runtime, stream, log=self._session_log)
        self._active_runtime = runtime
        self._session_base = 0  # published session id = base + session.session_id (monotonic across models)
        self._preproc = self._make_preprocessor()
        self._published_session: Optional[int] = None
        self._snapshot = self._session.snapshot()
        self._session_warnings: list[str] = []
        self._last_result_info: dict = {}
        info = self._session.info
        if info.random_weights:
            self.get_logger().warning(
                "NO CHECKPOINT: random weights (preset %s) - poses are NOT meaningful" % info.model_preset
            )

        # Publishers
        reliable10 = QoSProfile(depth=10, reliability=QoSReliabilityPolicy.RELIABLE)
        self._pose_pub = self.create_publisher(PoseStamped, "~/pose", reliable10)
        self._odom_pub = self.create_publisher(Odometry, "~/odom", reliable10)
        self._path_pub = self.create_publisher(Path, "~/path", reliable10)
        self._stats_pub = self.create_publisher(CacheStats, "~/cache_stats", reliable10)
        self._status_pub = self.create_publisher(FrameStatus, "~/frame_status", QoSProfile(depth=50))
        self._depth_pub = self.create_publisher(Image, "~/depth", reliable10)
        self._tf_pub = self.create_publisher(
            TFMessage, "/tf", QoSProfile(depth=100, reliability=QoSReliabilityPolicy.RELIABLE)
        )
        self._diag_pub = self.create_publisher(DiagnosticArray, "/diagnostics", reliable10)
        self._path: collections.deque = collections.deque(maxlen=int(self._values["path_max_length"]))
        # (stamp seconds, c2w) of the current session, bounded: a window-policy session never ends
        self._trajectory: collections.deque = collections.deque(maxlen=int(self._values["trajectory_max_length"]))
        self._path_last_pub = -1e9

        # Services
        self.create_service(Trigger, "~/reset", self._on_reset)
        self.create_service(Trigger, "~/save_trajectory", self._on_save_trajectory)

        # Input and timers
        self._sub = None
        self._sub_topic = ""
        self._create_subscription()
        self._diag_timer = self.create_timer(float(self._values["diagnostics_period"]), self._publish_diagnostics)

        self.add_on_set_parameters_callback(self._on_set_parameters)
        self.add_post_set_parameters_callback(self._on_parameters_set)

        self._worker = threading.Thread(target=self._worker_loop, name="lingbot_map_inference", daemon=True)
        self._worker.start()
        self.get_logger().info(
            f"ready: {self._sub_topic} ({self._values['image_transport']}, {self._values['qos_reliability']}) "
            f"-> {self.resolve_topic_name('~/pose')}; backend {info.backend} ({info.backend_reason}), "
            f"dtype {info.dtype}, device {info.device}"
        )

    # ------------------------------------------------------------------ lifecycle
    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop the inference thread (finishes the frame in progress) and wait for it."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._worker.is_alive():
            self._worker.join(timeout)

    def _session_log(self, text: str) -> None:
        self.get_logger().info(text)

    # ------------------------------------------------------------------ subscription
    def _create_subscription(self) -> None:
        if self._sub is not None:
            self.destroy_subscription(self._sub)
            self._sub = None
        if self._values["qos_reliability"] == "reliable":
            qos = QoSProfile(depth=5, reliability=QoSReliabilityPolicy.RELIABLE,
                             history=QoSHistoryPolicy.KEEP_LAST, durability=QoSDurabilityPolicy.VOLATILE)
        else:
            qos = rclpy.qos.qos_profile_sensor_data
        if self._values["image_transport"] == "compressed":
            # image_transport convention: remapping 'image' also moves 'image/compressed', unless
            # 'image/compressed' is remapped itself.
            explicit = self.resolve_topic_name("image/compressed")
            if explicit != self.resolve_topic_name("image/compressed", only_expand=True):
                topic = explicit
            else:
                topic = self.resolve_topic_name("image") + "/compressed"
            self._sub = self.create_subscription(CompressedImage, topic, self._on_image, qos)
        else:
            topic = self.resolve_topic_name("image")
            self._sub = self.create_subscription(Image, topic, self._on_image, qos)
        self._sub_topic = topic

    def _on_image(self, msg) -> None:
        t0 = time.perf_counter()
        now = time.monotonic()
        with self._lock:
            self._c.received += 1
            self._recv_times.append(now)
            self._last_frame_time = now
        try:
            _check_image_message(msg)
            try:
                rgb = self._message_to_rgb(msg)
            except self._unsupported_image as exc:
                raise InputRejected("unsupported", str(exc)) from exc
            except (ValueError, TypeError) as exc:  # a decoder that fails in its own words
                raise InputRejected("unsupported", f"cannot convert: {exc}") from exc
            if rgb.ndim != 3 or rgb.shape[0] == 0 or rgb.shape[1] == 0:
                raise InputRejected("zero_size", f"converted image has shape {rgb.shape}")
            wh = (int(rgb.shape[1]), int(rgb.shape[0]))
            with self._lock:
                expected = self._expected_wh
                if expected is None:
                    self._expected_wh = wh
            if expected is not None and wh != expected:
                raise InputRejected(
                    "resolution_changed",
                    f"resolution changed from {expected[0]}x{expected[1]} to {wh[0]}x{wh[1]} mid-session; "
                    "call ~/reset to start a session at the new size",
                )
        except InputRejected as exc:
            self._reject(msg.header, exc.kind, str(exc))
            return
        frame = _Frame(header=msg.header, rgb=rgb, received=t0, convert_ms=(time.perf_counter() - t0) * 1e3)
        with self._cond:
            old, self._pending = self._pending, frame
            self._cond.notify()
        if old is not None:
            with self._lock:
                self._c.dropped_queue += 1
                self._c.dropped_since_diag += 1
                self._c.last_drop_time = time.monotonic()
            self._publish_status(old.header, FrameStatus.DROPPED_QUEUE, "replaced by a newer frame before inference")

    def _reject(self, header: Header, kind: str, reason: str) -> None:
        with self._lock:
            self._c.rejected += 1
            self._c.rejected_since_diag += 1
            self._c.rejected_by_kind[kind] += 1
            self._c.last_reject_reason = reason
            self._c.last_reject_time = time.monotonic()
        self._publish_status(header, FrameStatus.REJECTED_INPUT, reason)
        # Throttled per kind: a camera sending only bad frames must not flood the log.
        now = time.monotonic()
        if now - self._reject_log_times.get(kind, -1e9) >= 2.0:
            extra = self._reject_log_suppressed.pop(kind, 0)
            self._reject_log_times[kind] = now
            more = f" (+{extra} more like it not logged)" if extra else ""
            self.get_logger().warning(f"rejected frame (stamp {_stamp_sec(header.stamp):.3f}): {reason}{more}")
        else:
            self._reject_log_suppressed[kind] += 1

    # ------------------------------------------------------------------ inference thread
    def _worker_loop(self) -> None:
        while True:
            with self._cond:
                while not self._stop and self._pending is None and not self._commands:
                    self._cond.wait(0.5)
                if self._stop:
                    return
                commands, self._commands = self._commands, []
                frame = None
                if not commands:
                    frame, self._pending = self._pending, None
            for command in commands:
                self._run_command(command)
            if frame is not None:
                try:
                    self._process(frame)
                except Exception as exc:  # never let one frame kill the node
                    if not self.context.ok():
                        return  # shutting down: publishers are gone
                    self._record_error(f"inference failed: {type(exc).__name__}: {exc}", exc)
                    self._publish_status(frame.header, FrameStatus.REFUSED_POLICY, f"inference error: {exc}")

    def _record_error(self, text: str, exc: Optional[BaseException] = None) -> None:
        with self._lock:
            self._c.errors += 1
            self._c.last_error = text
            self._c.last_error_time = time.monotonic()
        detail = "".join(traceback.format_exception(exc)) if exc is not None else ""
        self.get_logger().error(text + ("\n" + detail if detail else ""), throttle_duration_sec=5.0)

    def _process(self, frame: _Frame) -> None:
        session = self._session
        t0 = time.perf_counter()
        frame.handoff_ms = (t0 - frame.received) * 1e3 - frame.convert_ms
        try:
            tensor = self._preproc(frame.rgb)
        except self._resolution_changed as exc:
            self._reject(frame.header, "resolution_changed", str(exc))
            return
        except ValueError as exc:
            self._reject(frame.header, "unsupported", f"preprocessing failed: {exc}")
            return
        frame.preprocess_ms = (time.perf_counter() - t0) * 1e3
        t_push = time.perf_counter()
        try:
            results = session.push(tensor, stamp=frame)
        except getattr(self._streammod, "FrameSizeChanged", ()) as exc:
            self._reject(frame.header, "resolution_changed", str(exc))
            return
        except self._streammod.SessionStopped as exc:
            with self._lock:
                self._c.refused += 1
            self.get_logger().warning(f"frame refused: {exc}", throttle_duration_sec=5.0)
            self._publish_status(frame.header, FrameStatus.REFUSED_POLICY, str(exc))
            self._refresh_session_state(session)
            return
        except self._streammod.SessionError as exc:
            with self._lock:
                self._c.refused += 1
            self.get_logger().warning(f"frame refused by the session: {exc}", throttle_duration_sec=5.0)
            self._publish_status(frame.header, FrameStatus.REFUSED_POLICY, str(exc))
            return
        if len(results) == 1:
            frame.session_extra_ms = max(0.0, (time.perf_counter() - t_push) * 1e3 - float(results[0].latency_ms))
        self._refresh_session_state(session)  # before publishing: diagnostics never lag the topics
        if not results:
            self._publish_status(
                frame.header, FrameStatus.BUFFERED,
                f"buffered for the joint scale-frame call ({session.buffered} of {session.stream_cfg.scale_frames})",
            )
        for result in results:
            self._publish_result(result)

    def _refresh_session_state(self, session) -> None:
        warnings = list(session.warnings())
        snapshot = session.snapshot()
        with self._lock:
            self._session_warnings = warnings
            self._snapshot = snapshot

    def _camera_frame(self, header: Header) -> str:
        if self._values["camera_frame"]:
            return self._values["camera_frame"]
        if header.frame_id:
            return header.frame_id
        if not self._warned_no_frame_id:
            self._warned_no_frame_id = True
            self.get_logger().warning(
                f"image header has no frame_id and camera_frame is empty: using '{FALLBACK_CAMERA_FRAME}'"
            )
        return FALLBACK_CAMERA_FRAME

    def _publish_result(self, r) -> None:
        t0 = time.perf_counter()
        note = (r.frame_extra or {}).get("window_switch")
        if note:
            self.get_logger().info(f"long-run window {r.window_index}: {note}")
        frame: _Frame = r.stamp
        header = frame.header
        values = self._values
        session_id = self._session_base + int(r.session_id)
        if session_id != self._published_session:
            with self._lock:
                self._path.clear()
                self._trajectory.clear()
            self._published_session = session_id
        world = values["world_frame"]
        child = self._camera_frame(header)
        c2w = np.asarray(r.c2w, dtype=np.float64)
        t = c2w[:3, 3]
        qx, qy, qz, qw = (float(v) for v in self._quat(c2w[:3, :3]))

        pose = PoseStamped()
        pose.header.stamp = header.stamp
        pose.header.frame_id = world
        pose.pose.position.x, pose.pose.position.y, pose.pose.position.z = float(t[0]), float(t[1]), float(t[2])
        o = pose.pose.orientation
        o.x, o.y, o.z, o.w = qx, qy, qz, qw
        self._pose_pub.publish(pose)

        odom = Odometry()
        odom.header = pose.header
        odom.child_frame_id = child
        odom.pose.pose = pose.pose
        # Scale-free model output: no covariance estimate, no twist (REP 105 users read pose only).
        odom.pose.covariance[0] = -1.0
        odom.twist.covariance[0] = -1.0
        self._odom_pub.publish(odom)

        with self._lock:
            if self._path.maxlen != int(values["path_max_length"]):
                self._path = collections.deque(self._path, maxlen=int(values["path_max_length"]))
            self._path.append(pose)
            if self._trajectory.maxlen != int(values["trajectory_max_length"]):
                self._trajectory = collections.deque(self._trajectory, maxlen=int(values["trajectory_max_length"]))
            self._trajectory.append((_stamp_sec(header.stamp), c2w.copy()))
            path_poses = None
            now = time.monotonic()
            # A long Path costs ~4 ms per 1000 poses to send: every frame up to PATH_EVERY_FRAME poses,
            # then at most every PATH_MIN_PERIOD seconds (and only when someone listens).
            if self._path_pub.get_subscription_count() > 0 and (
                    len(self._path) <= PATH_EVERY_FRAME or now - self._path_last_pub >= PATH_MIN_PERIOD):
                path_poses = list(self._path)
                self._path_last_pub = now
        if path_poses is not None:
            path = Path()
            path.header = pose.header
            path.poses = path_poses
            self._path_pub.publish(path)

        if values["publish_tf"]:
            tf = TransformStamped()
            tf.header = pose.header
            tf.child_frame_id = child
            tf.transform.translation.x, tf.transform.translation.y, tf.transform.translation.z = (
                pose.pose.position.x, pose.pose.position.y, pose.pose.position.z)
            tf.transform.rotation = pose.pose.orientation
            self._tf_pub.publish(TFMessage(transforms=[tf]))

        if values["publish_depth"] and r.depth is not None:
            depth = np.ascontiguousarray(r.depth, dtype=np.float32)
            img = Image(height=int(depth.shape[0]), width=int(depth.shape[1]), encoding="32FC1",
                        is_bigendian=0, step=int(depth.shape[1]) * 4)
            img.header.stamp = header.stamp
            img.header.frame_id = child
            img.data = depth.tobytes()
            self._depth_pub.publish(img)

        status = FrameStatus()
        status.header = header
        status.status = FrameStatus.PROCESSED
        status.session_id = session_id
        status.frame_index = int(r.frame_index)
        status.pose_enc = [float(v) for v in np.asarray(r.pose_enc, dtype=np.float64).reshape(9)]
        self._status_pub.publish(status)

        publish_ms = (time.perf_counter() - t0) * 1e3
        overhead_ms = frame.convert_ms + frame.preprocess_ms + publish_ms
        with self._lock:
            self._c.processed += 1
            self._latencies.append(float(r.latency_ms))
            self._overheads.append(overhead_ms)
            # in node, minus the model: callback entry -> all outputs published (phase 2 only)
            in_node = (time.perf_counter() - frame.received) * 1e3 - float(r.latency_ms)
            self._parts.append((frame.convert_ms, frame.handoff_ms, frame.preprocess_ms, publish_ms,
                                frame.session_extra_ms, in_node if not r.is_scale_frame else float("nan")))
            c = self._c
            counters = (c.received, c.processed, c.dropped_queue + c.rejected + c.refused, c.rejected)
            self._last_result_info = {"frame_index": int(r.frame_index), "rope_frame_index": int(r.rope_frame_index),
                                      "is_keyframe": bool(r.is_keyframe), "stamp": _stamp_sec(header.stamp)}
        s = r.cache
        stats = CacheStats()
        stats.header.stamp = header.stamp
        stats.header.frame_id = world
        stats.frames_received, stats.frames_processed, stats.frames_dropped, stats.frames_rejected = counters
        stats.frame_index = int(r.frame_index)
        stats.session_id = session_id
        stats.is_keyframe = bool(r.is_keyframe)
        stats.is_scale_frame = bool(r.is_scale_frame)
        stats.frames_stored = int(s.frames_stored)
        stats.scale_frames = int(s.scale_frames)
        stats.window_frames = int(s.window_frames)
        stats.frames_evicted = int(s.frames_evicted)
        stats.page_size = int(s.page_size)
        stats.patch_pages_total = int(s.patch_pages_total)
        stats.scale_pages = int(s.scale_pages)
        stats.window_pages = int(s.window_pages)
        stats.free_pages = int(s.free_pages)
        stats.special_pages = int(s.special_pages)
        stats.special_pages_capacity = int(s.special_pages_capacity)
        stats.special_tokens = int(s.special_tokens)
        stats.rope_frame_index = int(r.rope_frame_index)
        stats.max_frame_num = int(s.max_frame_num)
        stats.visible_keys = int(s.visible_keys)
        stats.camera_cache_frames = int(s.camera_cache_frames)
        stats.latency_ms = float(r.latency_ms)
        stats.node_overhead_ms = float(overhead_ms)
        stats.backend = self._session.info.backend
        stats.dtype = self._session.info.dtype
        self._stats_pub.publish(stats)

    def _publish_status(self, header: Header, status: int, reason: str) -> None:
        msg = FrameStatus()
        msg.header = header
        msg.status = status
        msg.reason = reason
        msg.session_id = self._session_base + int(self._session.session_id)
        self._status_pub.publish(msg)

    # ------------------------------------------------------------------ commands (inference thread)
    def _submit(self, command: tuple, wait: float = 0.0) -> Optional[str]:
        done = threading.Event()
        box: dict = {}
        with self._cond:
            self._commands.append((command, done, box))
            self._cond.notify()
        if wait > 0 and done.wait(wait):
            return box.get("result")
        return None

    def _run_command(self, item) -> None:
        (kind, arg), done, box = item
        try:
            if kind == "reset":
                self._new_session(arg)
                box["result"] = f"session {self._current_session_id()} started (new world frame)"
            elif kind == "apply":
                box["result"] = self._apply_parameters(arg)
        except Exception as exc:
            self._record_error(f"{kind} failed: {type(exc).__name__}: {exc}", exc)
            box["result"] = f"error: {exc}"
        finally:
            done.set()

    def _current_session_id(self) -> int:
        return self._session_base + int(self._session.session_id)

    def _new_session(self, reason: str) -> None:
        """~/reset: the session empties its caches and starts a new world frame."""
        self._session.reset()
        self._after_new_session(reason, False)

    def _after_new_session(self, reason: str, count_parameter: bool) -> None:
        self._preproc = self._make_preprocessor()
        with self._lock:
            self._expected_wh = None
            self._path.clear()
            self._trajectory.clear()
            self._c.sessions_started += 1
            self._c.last_new_session_reason = reason
            if count_parameter:
                self._c.parameter_sessions += 1
            else:
                self._c.resets += 1
        self._refresh_session_state(self._session)
        self.get_logger().info(f"new session {self._current_session_id()}: {reason}")

    def _apply_parameters(self, changed: list[str]) -> str:
        values = dict(self._values)
        runtime, stream = configs_from_values(values)
        session = self._session
        if runtime != self._active_runtime:
            self.get_logger().info(f"parameters {changed} need a new model: building it")
            try:
                new = self._make_session(runtime, stream, log=self._session_log)
            except Exception as exc:
                self._record_error(f"could not build the model for {changed}: {exc}; keeping the previous one", exc)
                return f"error: {exc}"
            self._session_base = self._current_session_id() + 1 - int(new.session_id)
            self._session = new
            self._active_runtime = runtime
            self._after_new_session(f"parameters {changed} changed (new model)", True)
            return "new model"
        old = session.stream_cfg
        geometry = [k for k in _STREAM_FIELDS if k != "keyframe_interval" and getattr(old, k) != getattr(stream, k)]
        if geometry:
            new = self._session_for_policy(session, stream)
            if new is not None:  # the long-run policy needs another session class: same model, new session
                self._session_base = self._current_session_id() + 1 - int(new.session_id)
                self._session = new
            else:
                session.reconfigure(stream)
            self._after_new_session(f"parameters {geometry} changed", True)
            return "new session"
        if stream.keyframe_interval != old.keyframe_interval:
            if hasattr(session, "set_keyframe_interval"):
                session.set_keyframe_interval(stream.keyframe_interval)
            else:
                session.stream_cfg = cfgmod.replace(session.stream_cfg, keyframe_interval=stream.keyframe_interval)
            self.get_logger().info(f"keyframe_interval {old.keyframe_interval} -> {stream.keyframe_interval} "
                                   "from the next frame")
        if stream.with_depth != session.stream_cfg.with_depth:
            # Depth is an extra head on the same tokens: no cache change, so no new session.
            session.stream_cfg = cfgmod.replace(session.stream_cfg, with_depth=stream.with_depth)
            if stream.with_depth and not session.info.depth_available:
                self.get_logger().warning("publish_depth: this model has no depth head; ~/depth stays silent")
        return "applied"

    def _session_for_policy(self, session, stream: StreamConfig):
        """A new session object when ``stream.long_run_policy`` needs another class than ``session``'s
        (the window policy lives in ``long_run.WindowedSession``); None when ``reconfigure`` will do.
        The model is shared, nothing is rebuilt."""
        from .long_run import WindowedSession

        cls = WindowedSession if stream.long_run_policy == "window" else self._streammod.StreamingSession
        if type(session) is cls:
            return None
        return cls(session.model, session.model_cfg, stream, device=session.device, dtype=session.dtype,
                   backend=session.backend, info=session.info, log=self._session_log)

    # ------------------------------------------------------------------ parameters (executor thread)
    def _on_set_parameters(self, params) -> SetParametersResult:
        values = dict(self._values)
        for p in params:
            if p.name not in _SPECS:
                continue
            spec = _SPECS[p.name]
            if spec.read_only:
                return SetParametersResult(successful=False, reason=f"{p.name} is read-only")
            values[p.name] = p.value
        problems = validate_values(values)
        if problems:
            return SetParametersResult(successful=False, reason="; ".join(problems))
        return SetParametersResult(successful=True)

    def _on_parameters_set(self, params) -> None:
        changed = [p.name for p in params if p.name in _SPECS and self._values.get(p.name) != p.value]
        if not changed:
            return
        for p in params:
            if p.name in _SPECS:
                self._values[p.name] = p.value
        self.get_logger().info("parameters changed: " + ", ".join(f"{n}={self._values[n]!r}" for n in changed))
        applies = {_SPECS[n].applies for n in changed}
        if "subscription" in applies:
            self._create_subscription()
            self.get_logger().info(f"image subscription re-created on {self._sub_topic}")
        if "timer" in applies:
            self.destroy_timer(self._diag_timer)
            self._diag_timer = self.create_timer(float(self._values["diagnostics_period"]), self._publish_diagnostics)
        if applies & {"model", "session"} or {"keyframe_interval", "publish_depth"} & set(changed):
            self._submit(("apply", changed))

    # ------------------------------------------------------------------ services
    def _on_reset(self, request, response):
        result = self._submit(("reset", "~/reset called"), wait=30.0)
        response.success = True
        response.message = result or "reset queued: applies before the next frame"
        return response

    def _on_save_trajectory(self, request, response):
        path = os.path.expanduser(self._values["trajectory_path"])
        with self._lock:
            trajectory = list(self._trajectory)
            session_id = self._published_session
        try:
            parent = os.path.dirname(os.path.abspath(path))
            os.makedirs(parent, exist_ok=True)
            self._write_tum(path, np.array([s for s, _ in trajectory], np.float64),
                            np.array([m for _, m in trajectory], np.float64).reshape(-1, 4, 4))
        except OSError as exc:
            response.success = False
            response.message = f"cannot write {path}: {exc}"
            return response
        response.success = True
        response.message = f"wrote {len(trajectory)} poses of session {session_id} to {os.path.abspath(path)}"
        self.get_logger().info(response.message)
        return response

    # ------------------------------------------------------------------ diagnostics (executor thread)
    def _publish_diagnostics(self) -> None:
        now = time.monotonic()
        with self._lock:
            c = self._c
            recent = [t for t in self._recv_times if now - t <= 5.0]
            lat = list(self._latencies)
            ovh = list(self._overheads)
            parts = [[v for v in col if v == v] for col in zip(*self._parts)] if self._parts else [[]] * 6
            snap = self._snapshot
            warnings = list(self._session_warnings)
            last_frame = self._last_frame_time
            by_kind = dict(c.rejected_by_kind)
            dropped_now, rejected_now = c.dropped_since_diag, c.rejected_since_diag
            c.dropped_since_diag = c.rejected_since_diag = 0
            counters = {k: getattr(c, k) for k in ("received", "processed", "dropped_queue", "rejected", "refused",
                                                   "errors", "sessions_started", "parameter_sessions", "resets")}
            last_reject, last_reject_t = c.last_reject_reason, c.last_reject_time
            last_error, last_error_t = c.last_error, c.last_error_time
            new_session_reason = c.last_new_session_reason
            expected = self._expected_wh
            last = dict(self._last_result_info)
        session = self._session
        info = session.info
        rate = (len(recent) - 1) / (recent[-1] - recent[0]) if len(recent) >= 2 and recent[-1] > recent[0] else 0.0
        hw = self.get_fully_qualified_name()

        def status(name, level, message, kv):
            return DiagnosticStatus(level=level, name=DIAG_PREFIX + name, message=message, hardware_id=hw,
                                    values=[KeyValue(key=k, value=str(v)) for k, v in kv])

        # input
        level, msg = DiagnosticStatus.OK, f"{rate:.1f} Hz"
        if last_frame is None:
            if now - self._t_start > 5.0:
                level, msg = DiagnosticStatus.WARN, f"no images received on {self._sub_topic}"
            else:
                msg = f"waiting for images on {self._sub_topic}"
        elif now - last_frame > 5.0:
            level, msg = DiagnosticStatus.WARN, f"no images for {now - last_frame:.0f} s on {self._sub_topic}"
        if rejected_now or now - last_reject_t < 5.0:
            level, msg = DiagnosticStatus.WARN, f"rejecting input: {last_reject}"
        kv_input = [("topic", self._sub_topic), ("transport", self._values["image_transport"]),
                    ("qos_reliability", self._values["qos_reliability"]), ("rate_hz", f"{rate:.2f}"),
                    ("frames_received", counters["received"]), ("frames_rejected", counters["rejected"])]
        kv_input += [(f"rejected_{k}", by_kind.get(k, 0))
                     for k in ("unsupported", "data_length", "zero_size", "resolution_changed")]
        kv_input += [("last_reject_reason", last_reject or "-"),
                     ("resolution", f"{expected[0]}x{expected[1]}" if expected else "-")]
        s_input = status("input", level, msg, kv_input)

        # inference
        med, p90 = (statistics.median(lat), _percentile(lat, 0.9)) if lat else (float("nan"), float("nan"))
        omed, op90 = (statistics.median(ovh), _percentile(ovh, 0.9)) if ovh else (float("nan"), float("nan"))
        level, msg = DiagnosticStatus.OK, (f"latency median {med:.1f} ms, p90 {p90:.1f} ms" if lat
                                           else "no frame processed yet")
        if session.buffered:
            msg += f"; {session.buffered}/{session.stream_cfg.scale_frames} scale frames buffered"
        if dropped_now:
            level, msg = DiagnosticStatus.WARN, f"falling behind the camera: {dropped_now} frames replaced in the queue"
        if now - last_error_t < 10.0:
            level, msg = DiagnosticStatus.ERROR, last_error
        s_inf = status("inference", level, msg, [
            ("latency_median_ms", f"{med:.2f}"), ("latency_p90_ms", f"{p90:.2f}"),
            ("node_overhead_median_ms", f"{omed:.2f}"), ("node_overhead_p90_ms", f"{op90:.2f}"),
            *[(f"{name}_median_ms", f"{statistics.median(col):.2f}" if col else "nan")
              for name, col in zip(("convert", "handoff", "preprocess", "publish", "session_bookkeeping",
                                    "in_node_minus_model"), parts)],
            ("fps_max", f"{1000.0 / med:.2f}" if lat and med > 0 else "-"),
            ("frames_processed", counters["processed"]), ("frames_dropped_queue", counters["dropped_queue"]),
            ("frames_refused", counters["refused"]), ("frames_buffered", session.buffered),
            ("errors", counters["errors"]), ("last_error", last_error or "-"),
            ("session_id", self._current_session_id()), ("sessions_started", counters["sessions_started"]),
            ("sessions_from_parameter_changes", counters["parameter_sessions"]), ("resets", counters["resets"]),
            ("last_new_session_reason", new_session_reason),
            ("last_frame_index", last.get("frame_index", "-")),
            ("keyframe_interval", session.stream_cfg.keyframe_interval),
        ])

        # kv cache
        cfg = session.stream_cfg
        level, msg = DiagnosticStatus.OK, (f"{snap.frames_stored} stored frames ({snap.scale_frames} scale, "
                                           f"{snap.window_frames} window, {snap.frames_evicted} evicted)")
        if warnings:
            level, msg = DiagnosticStatus.WARN, "; ".join(warnings)
        s_cache = status("kv cache", level, msg, [
            ("frames_stored", snap.frames_stored), ("scale_frames", snap.scale_frames),
            ("window_frames", snap.window_frames), ("frames_evicted", snap.frames_evicted),
            ("sliding_window", cfg.sliding_window), ("page_size", snap.page_size),
            ("patch_pages_total", snap.patch_pages_total), ("free_pages", snap.free_pages),
            ("special_pages", snap.special_pages), ("special_pages_capacity", snap.special_pages_capacity),
            ("special_tokens", snap.special_tokens), ("visible_keys", snap.visible_keys),
            ("camera_cache_frames", snap.camera_cache_frames),
            ("rope_frame_index", last.get("rope_frame_index", "-")), ("max_frame_num", cfg.max_frame_num),
            ("max_stored_frames", cfg.max_stored_frames), ("long_run_policy", cfg.long_run_policy),
            ("kv_mbytes", f"{snap.kv_bytes / 2**20:.1f}"),
            ("window_index", getattr(session, "window_index", 0)),
            ("window_switches", getattr(session, "window_switches", 0)),
        ])

        # backend
        level, msg = DiagnosticStatus.OK, f"{info.backend} {info.dtype} on {info.device}"
        if info.random_weights:
            level, msg = DiagnosticStatus.WARN, msg + "; RANDOM WEIGHTS: poses are not meaningful"
        s_backend = status("backend", level, msg, [
            ("backend", info.backend), ("backend_reason", info.backend_reason), ("dtype", info.dtype),
            ("device", info.device), ("model_preset", info.model_preset),
            ("checkpoint", self._active_runtime.checkpoint or "-"), ("random_weights", info.random_weights),
            ("depth_available", info.depth_available),
        ])

        array = DiagnosticArray()
        array.header.stamp = self.get_clock().now().to_msg()
        array.status = [s_input, s_inf, s_cache, s_backend]
        self._diag_pub.publish(array)


def main(args=None) -> int:
    """``lingbot_map_node``: run the node until SIGINT/SIGTERM (exit 0), or exit non-zero when it
    cannot start (2: invalid parameters, 1: anything else, e.g. an unreadable checkpoint)."""
    rclpy.init(args=args)
    try:
        node = LingBotMapNode()
    except (ValueError, rclpy.exceptions.ParameterException) as exc:
        print(f"[lingbot_map] cannot start: {exc}", flush=True)
        rclpy.try_shutdown()
        return 2
    except (KeyboardInterrupt, ExternalShutdownException):
        rclpy.try_shutdown()
        return 0
    except Exception as exc:  # noqa: BLE001 - say why in one line, then the traceback
        print(f"[lingbot_map] cannot start: {type(exc).__name__}: {exc}", flush=True)
        traceback.print_exc()
        rclpy.try_shutdown()
        return 1
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    try:
        executor.spin()
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        if node.context.ok():
            node.get_logger().info("shutting down: waiting for the inference thread")
        else:  # the context is gone (signal): rosout cannot take log messages any more
            print("[lingbot_map] shutting down: waiting for the inference thread", flush=True)
        node.shutdown()
        executor.shutdown(timeout_sec=1.0)
        node.destroy_node()
        rclpy.try_shutdown()
    print("[lingbot_map] stopped cleanly", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
