"""The ROS 2 managed (lifecycle) node: camera topic in, camera pose + KV-cache diagnostics out.

The node is thin. It converts messages (``image_io``), preprocesses them (``core.preprocess``),
hands the tensor to the core's ``SessionManager`` on its own inference thread and publishes what
comes back. It owns the ROS side only: parameters, lifecycle, QoS, the latest-frame queue,
publishers, services and the diagnostics timer. What the parameters are (``core.settings``), what a
change needs (``core.session_manager``), how results look as ROS messages (``messages``) and what
/diagnostics says (``diagnostics``) live in modules of their own.

Lifecycle (managed node, REP 2002-style states)
-----------------------------------------------
* unconfigured: parameters only; no model. ``configure`` validates them, builds the model and
  allocates the caches; a failure (e.g. a bad checkpoint) fails the transition with its reason and
  the node stays unconfigured, alive.
* inactive: model loaded, image subscription up; received frames are counted and get the final
  status DROPPED_INACTIVE.
* active: frames are processed and poses published.
* ``cleanup`` frees the model (and GPU memory); ``shutdown`` from any state. Parameter
  ``autostart`` (default true) configures and activates at start.

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
import os
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import rclpy
import rclpy.exceptions
import rclpy.parameter
import rclpy.qos
from rclpy.lifecycle import LifecycleNode, LifecycleState, TransitionCallbackReturn
from builtin_interfaces.msg import Time as TimeMsg
from diagnostic_msgs.msg import DiagnosticArray
from geometry_msgs.msg import PoseStamped
from lingbot_map_ros.msg import CacheStats, FrameStatus
from nav_msgs.msg import Odometry, Path
from rcl_interfaces.msg import SetParametersResult
from rclpy.event_handler import SubscriptionEventCallbacks
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
from rclpy.qos import QoSDurabilityPolicy, QoSHistoryPolicy, QoSProfile, QoSReliabilityPolicy
from sensor_msgs.msg import CompressedImage, Image
from std_msgs.msg import Header
from std_srvs.srv import Trigger
from tf2_msgs.msg import TFMessage

from ..core.geometry import write_tum
from ..core.results import CacheSnapshot, FrameResult
from ..core.settings import DEPTH_OUTPUTS
from . import messages as rosmsg
from .diagnostics import COUNTER_NAMES, DIAG_PREFIX, DROP_COUNTERS, DiagnosticsSnapshot, diagnostic_array
from .parameters import (PARAMETER_NAMES, PARAMETERS, RUNTIME_FIELDS, SPECS, ParamSpec, configs_from_values, descriptor,
                         validate_values)

# The parameter table and the diagnostics prefix live in their own modules; they stay importable
# from here, where the tests import them from.
__all__ = [
    "DIAG_PREFIX", "FALLBACK_CAMERA_FRAME", "NODE_NAME", "PARAMETERS", "PARAMETER_NAMES", "PATH_EVERY_FRAME",
    "PATH_MIN_PERIOD", "InputRejected", "LingBotMapNode", "ParamSpec", "configs_from_values", "main",
    "validate_values",
]

NODE_NAME = "lingbot_map"
FALLBACK_CAMERA_FRAME = "lingbot_camera"
PATH_EVERY_FRAME = 1000  # ~/path is sent with every pose while it holds at most this many poses,
PATH_MIN_PERIOD = 0.5  # then at most every this many seconds

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
    model_image: Optional[object] = None  # the preprocessed [3, H, W] tensor, until its result is published


@dataclass
class _Counters:
    received: int = 0
    processed: int = 0
    # final statuses other than PROCESSED (diagnostics.DROP_COUNTERS names them)
    dropped_queue: int = 0
    rejected: int = 0
    refused: int = 0
    failed: int = 0
    dropped_reset: int = 0
    dropped_inactive: int = 0
    non_finite: int = 0
    errors: int = 0  # errors of any kind (inference, commands), for diagnostics
    rejected_by_kind: dict = field(default_factory=lambda: collections.Counter())
    sessions_started: int = 0
    parameter_sessions: int = 0  # new sessions caused by parameter changes
    resets: int = 0
    non_finite_sessions: int = 0  # new sessions started because non-finite values kept coming
    failure_sessions: int = 0  # new sessions started because the model raised
    qos_messages_lost: int = 0  # reported by the middleware (message_lost event)
    qos_incompatible: int = 0  # publishers whose QoS cannot match the subscription
    last_qos_event: str = ""
    last_qos_event_time: float = -1e9
    last_reject_reason: str = ""
    last_reject_time: float = -1e9
    last_drop_time: float = -1e9
    last_error: str = ""
    last_error_time: float = -1e9
    last_non_finite: str = ""
    last_non_finite_time: float = -1e9
    last_new_session_reason: str = "node started"
    dropped_since_diag: int = 0
    rejected_since_diag: int = 0

    @property
    def dropped(self) -> int:
        return sum(getattr(self, name) for name in DROP_COUNTERS)

    @property
    def pending(self) -> int:
        """Received frames without a final status yet (queued, buffered, in the model)."""
        return self.received - self.processed - self.dropped


def _stamp_sec(stamp: TimeMsg) -> float:
    return stamp.sec + stamp.nanosec * 1e-9


# --------------------------------------------------------------------------------------- the node


class LingBotMapNode(LifecycleNode):
    """LingBot-Map streaming reconstruction on one camera topic, as a managed node (README: "The node")."""

    def __init__(self, node_name: str = NODE_NAME, **kwargs):
        super().__init__(node_name, **kwargs)
        for spec in PARAMETERS:
            self.declare_parameter(spec.name, spec.default, descriptor(spec))
        self._values = {p.name: self.get_parameter(p.name).value for p in PARAMETERS}
        problems = validate_values(self._values)
        if problems:
            raise ValueError("invalid parameters: " + "; ".join(problems))

        # Late imports: torch-heavy modules load after parameters are known to be valid.
        from ..core import stream as streammod
        from ..core.preprocess import FramePreprocessor, ResolutionChanged
        from ..core.session_manager import Change, InferenceFailed, SessionManager
        from .image_io import UnsupportedImage, message_to_rgb

        self._session_manager_cls = SessionManager
        self._change = Change
        self._inference_failed = InferenceFailed
        self._message_to_rgb = message_to_rgb
        self._unsupported_image = UnsupportedImage
        self._make_preprocessor = FramePreprocessor
        self._resolution_changed = ResolutionChanged
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
        self._reject_log_times: dict = {}
        self._reject_log_suppressed: collections.Counter = collections.Counter()
        self._warned_no_frame_id = False
        self._t_start = time.monotonic()
        self._last_frame_time: Optional[float] = None
        self._consecutive_non_finite = 0

        # Set in configure, cleared in cleanup; read by the executor thread under the lock.
        self._manager = None
        self._worker: Optional[threading.Thread] = None
        self._active = False
        self._state_label = "unconfigured"
        self._configure_error = ""
        self._preproc = None
        self._published_session: Optional[int] = None
        self._snapshot = None
        self._session_warnings: list[str] = []
        self._last_result_info: dict = {}
        self._recon = None  # ReconstructionPublisher (issue 9), from configure to cleanup

        # Publishers (plain ones: /diagnostics must report every state; frames are gated by _active)
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

        self._sub = None
        self._sub_topic = self._image_topic()
        self._diag_timer = self.create_timer(float(self._values["diagnostics_period"]), self._publish_diagnostics)
        self.add_on_set_parameters_callback(self._on_set_parameters)
        self.add_post_set_parameters_callback(self._on_parameters_set)

    @property
    def autostart(self) -> bool:
        return bool(self._values["autostart"])

    # ------------------------------------------------------------------ lifecycle transitions
    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Validate the parameters, build the model and its caches, start the inference thread."""
        problems = validate_values(self._values)
        if problems:
            return self._configure_failed("invalid parameters: " + "; ".join(problems))
        runtime, stream = configs_from_values(self._values)
        self.get_logger().info(
            f"configuring: building the model (preset {runtime.resolved_preset()}, device {runtime.device}, "
            f"dtype {runtime.dtype}, backend {runtime.attention_backend}); stream {stream}"
        )
        try:
            manager = self._session_manager_cls(runtime, stream, log=self._session_log)
        except Exception as exc:  # noqa: BLE001 - any failure of the model build fails the transition
            return self._configure_failed(f"cannot build the model: {type(exc).__name__}: {exc}", exc)
        with self._lock:
            self._manager = manager
            self._configure_error = ""
            self._snapshot = manager.snapshot()
            self._session_warnings = manager.warnings()
        self._preproc = self._make_preprocessor(fast_resize=bool(self._values["fast_resize"]))
        if self._recon is None:
            from .reconstruction import ReconstructionPublisher

            self._recon = ReconstructionPublisher(
                self, lambda: self._values,
                device=lambda: self._manager.session.device if self._manager is not None else None)
        self._after_new_session("configured", counter=None)
        self._stop = False
        self._worker = threading.Thread(target=self._worker_loop, name="lingbot_map_inference", daemon=True)
        self._worker.start()
        self._create_subscription()
        info = manager.info
        if info.random_weights:
            self.get_logger().warning(
                "NO CHECKPOINT: random weights (preset %s) - poses are NOT meaningful" % info.model_preset
            )
        self.get_logger().info(
            f"configured: backend {info.backend} ({info.backend_reason}), dtype {info.dtype}, device {info.device}; "
            f"subscribed to {self._sub_topic} ({self._values['image_transport']}, {self._values['qos_reliability']})"
        )
        self._state_label = "inactive"
        return TransitionCallbackReturn.SUCCESS

    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._active = True
        self._state_label = "active"
        self.get_logger().info(f"ready: active, {self._sub_topic} -> {self.resolve_topic_name('~/pose')}")
        return super().on_activate(state)

    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Stop taking frames (each one still gets a final status); the model stays loaded."""
        self._active = False
        self._state_label = "inactive"
        with self._cond:
            frame, self._pending = self._pending, None
        if frame is not None:
            self._finish(frame.header, FrameStatus.DROPPED_INACTIVE, "dropped_inactive", "the node was deactivated")
        self.get_logger().info("inactive: frames are counted and dropped until activated again")
        return super().on_deactivate(state)

    def on_cleanup(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._teardown()
        self.get_logger().info("cleaned up: model and caches freed")
        return TransitionCallbackReturn.SUCCESS

    def on_shutdown(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._teardown()
        return TransitionCallbackReturn.SUCCESS

    def on_error(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._teardown()
        return TransitionCallbackReturn.SUCCESS  # back to unconfigured

    def _configure_failed(self, reason: str, exc: Optional[BaseException] = None) -> TransitionCallbackReturn:
        with self._lock:
            self._configure_error = reason
        self._record_error(f"configure failed: {reason}; the node stays unconfigured (fix the parameters, then "
                           f"`ros2 lifecycle set {self.get_fully_qualified_name()} configure`)", exc)
        return TransitionCallbackReturn.FAILURE

    def _teardown(self) -> None:
        """Stop the inference thread (the frame in progress finishes), drop the subscription and model."""
        self._active = False
        self.shutdown()
        if self._sub is not None:
            self.destroy_subscription(self._sub)
            self._sub = None
        with self._cond:
            frame, self._pending = self._pending, None
        if frame is not None:
            self._finish(frame.header, FrameStatus.DROPPED_INACTIVE, "dropped_inactive", "the node was cleaned up")
        with self._lock:
            manager, self._manager = self._manager, None
        if manager is not None:
            for stamp in manager.session.pending_stamps():
                self._finish(stamp.header, FrameStatus.DROPPED_RESET, "dropped_reset",
                             "buffered for the scale frames when the model was freed")
            manager.release()
        recon, self._recon = self._recon, None
        if recon is not None:
            recon.destroy()
        self._state_label = "unconfigured"

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop the inference thread (finishes the frame in progress) and wait for it."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        worker, self._worker = self._worker, None
        if worker is not None and worker.is_alive() and worker is not threading.current_thread():
            worker.join(timeout)

    def _session_log(self, text: str) -> None:
        self.get_logger().info(text)

    # ------------------------------------------------------------------ subscription
    def _image_topic(self) -> str:
        if self._values["image_transport"] != "compressed":
            return self.resolve_topic_name("image")
        # image_transport convention: remapping 'image' also moves 'image/compressed', unless
        # 'image/compressed' is remapped itself.
        explicit = self.resolve_topic_name("image/compressed")
        if explicit != self.resolve_topic_name("image/compressed", only_expand=True):
            return explicit
        return self.resolve_topic_name("image") + "/compressed"

    def _create_subscription(self) -> None:
        if self._sub is not None:
            self.destroy_subscription(self._sub)
            self._sub = None
        if self._values["qos_reliability"] == "reliable":
            qos = QoSProfile(depth=5, reliability=QoSReliabilityPolicy.RELIABLE,
                             history=QoSHistoryPolicy.KEEP_LAST, durability=QoSDurabilityPolicy.VOLATILE)
        else:
            qos = rclpy.qos.qos_profile_sensor_data
        self._sub_topic = self._image_topic()
        msg_type = CompressedImage if self._values["image_transport"] == "compressed" else Image
        # Losses before the node: what the middleware reports (message lost where the RMW supports it,
        # a publisher whose QoS cannot match ours, another message type on the topic).
        events = SubscriptionEventCallbacks(
            message_lost=self._on_messages_lost, incompatible_qos=self._on_incompatible_qos,
            incompatible_type=self._on_incompatible_type)
        self._sub = self.create_subscription(msg_type, self._sub_topic, self._on_image, qos, event_callbacks=events)

    def _on_messages_lost(self, info) -> None:
        with self._lock:
            self._c.qos_messages_lost = int(info.total_count)
            self._c.last_qos_event = f"{info.total_count_change} image(s) lost by the middleware before the node"
            self._c.last_qos_event_time = time.monotonic()

    def _on_incompatible_qos(self, info) -> None:
        with self._lock:
            self._c.qos_incompatible = int(info.total_count)
            self._c.last_qos_event = (f"a publisher on {self._sub_topic} offers an incompatible QoS (policy id "
                                      f"{info.last_policy_kind}); set qos_reliability to match it")
            self._c.last_qos_event_time = time.monotonic()
        self.get_logger().warning(self._c.last_qos_event, throttle_duration_sec=10.0)

    def _on_incompatible_type(self, info) -> None:
        with self._lock:
            self._c.last_qos_event = f"a publisher on {self._sub_topic} sends another message type"
            self._c.last_qos_event_time = time.monotonic()
        self.get_logger().warning(self._c.last_qos_event, throttle_duration_sec=10.0)

    def _on_image(self, msg) -> None:
        t0 = time.perf_counter()
        now = time.monotonic()
        with self._lock:
            self._c.received += 1
            self._recv_times.append(now)
            self._last_frame_time = now
        if not self._active:
            self._finish(msg.header, FrameStatus.DROPPED_INACTIVE, "dropped_inactive",
                         f"the node is {self._state_label}: activate it to process frames")
            return
        try:
            try:
                rgb = self._message_to_rgb(msg)  # every structural check of the message lives there
            except self._unsupported_image as exc:
                raise InputRejected(exc.kind, str(exc)) from exc
            except (ValueError, TypeError) as exc:  # a decoder that fails in its own words
                raise InputRejected("unsupported", f"cannot convert: {exc}") from exc
            try:  # the preprocessor owns the session's input size: checked here, before the queue
                self._preproc.fix_size(int(rgb.shape[1]), int(rgb.shape[0]))
            except self._resolution_changed as exc:
                raise InputRejected("resolution_changed", f"resolution changed mid-session: {exc}; call "
                                    "~/reset to start a session at the new size") from exc
            except ValueError as exc:
                raise InputRejected("unsupported", f"cannot preprocess this size: {exc}") from exc
        except InputRejected as exc:
            self._reject(msg.header, exc.kind, str(exc))
            return
        frame = _Frame(header=msg.header, rgb=rgb, received=t0, convert_ms=(time.perf_counter() - t0) * 1e3)
        with self._cond:
            old, self._pending = self._pending, frame
            self._cond.notify()
        if old is not None:
            with self._lock:
                self._c.dropped_since_diag += 1
                self._c.last_drop_time = time.monotonic()
            self._finish(old.header, FrameStatus.DROPPED_QUEUE, "dropped_queue",
                         "replaced by a newer frame before inference")

    def _reject(self, header: Header, kind: str, reason: str) -> None:
        with self._lock:
            self._c.rejected_since_diag += 1
            self._c.rejected_by_kind[kind] += 1
            self._c.last_reject_reason = reason
            self._c.last_reject_time = time.monotonic()
        self._finish(header, FrameStatus.REJECTED_INPUT, "rejected", reason)
        # Throttled per kind: a camera sending only bad frames must not flood the log.
        now = time.monotonic()
        if now - self._reject_log_times.get(kind, -1e9) >= 2.0:
            extra = self._reject_log_suppressed.pop(kind, 0)
            self._reject_log_times[kind] = now
            more = f" (+{extra} more like it not logged)" if extra else ""
            self.get_logger().warning(f"rejected frame (stamp {_stamp_sec(header.stamp):.3f}): {reason}{more}")
        else:
            self._reject_log_suppressed[kind] += 1

    def _finish(self, header: Header, status: int, counter: str, reason: str) -> None:
        """The one way a frame that produced no pose ends: its counter, then its final FrameStatus."""
        with self._lock:
            setattr(self._c, counter, getattr(self._c, counter) + 1)
        self._publish_status(header, status, reason)

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
                    self._finish(frame.header, FrameStatus.FAILED_INFERENCE, "failed",
                                 f"inference error: {type(exc).__name__}: {exc}")

    def _record_error(self, text: str, exc: Optional[BaseException] = None, detail: str = "") -> None:
        with self._lock:
            self._c.errors += 1
            self._c.last_error = text
            self._c.last_error_time = time.monotonic()
        detail = detail or ("".join(traceback.format_exception(exc)) if exc is not None else "")
        self.get_logger().error(text + ("\n" + detail if detail else ""), throttle_duration_sec=5.0)

    def _process(self, frame: _Frame) -> None:
        manager = self._manager
        t0 = time.perf_counter()
        frame.handoff_ms = (t0 - frame.received) * 1e3 - frame.convert_ms
        fast = bool(self._values["fast_resize"])
        self._preproc.fast_resize = fast  # the resize method applies from the next frame
        try:
            tensor = self._preproc(frame.rgb)
        except self._resolution_changed as exc:
            self._reject(frame.header, "resolution_changed", str(exc))
            return
        except ValueError as exc:
            self._reject(frame.header, "unsupported", f"preprocessing failed: {exc}")
            return
        frame.preprocess_ms = (time.perf_counter() - t0) * 1e3
        frame.model_image = tensor  # colours of ~/points and the map
        t_push = time.perf_counter()
        try:
            results = manager.push(tensor, stamp=frame)
        except self._streammod.SessionError as exc:  # SessionStopped included: the policy refuses it
            self.get_logger().warning(f"frame refused by the session: {exc}", throttle_duration_sec=5.0)
            self._finish(frame.header, FrameStatus.REFUSED_POLICY, "refused", str(exc))
            self._refresh_session_state()
            return
        except self._inference_failed as exc:  # the manager already started a new session
            reason = f"inference failed: {exc}"
            self._record_error(reason + "; a new session was started", detail=exc.detail)
            self._finish(frame.header, FrameStatus.FAILED_INFERENCE, "failed", reason)
            self._drop_discarded(exc.discarded, reason)
            self._after_new_session(reason, "failure_sessions")
            return
        if len(results) == 1:
            frame.session_extra_ms = max(0.0, (time.perf_counter() - t_push) * 1e3 - float(results[0].latency_ms))
        self._refresh_session_state()  # before publishing: diagnostics never lag the topics
        if not results:
            self._publish_status(
                frame.header, FrameStatus.BUFFERED,
                f"buffered for the joint scale-frame call ({manager.buffered} of {manager.stream_cfg.scale_frames})",
            )
        for result in results:
            self._publish_result(result, manager)

    def _refresh_session_state(self) -> None:
        manager = self._manager
        warnings, snapshot = manager.warnings(), manager.snapshot()
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

    def _publish_result(self, r: FrameResult, manager) -> None:
        t0 = time.perf_counter()
        frame: _Frame = r.stamp
        header = frame.header
        bad = r.non_finite_fields()
        if bad:
            self._on_non_finite(frame, r, bad, manager)
            return
        self._consecutive_non_finite = 0
        note = (r.frame_extra or {}).get("window_switch")
        if note:
            self.get_logger().info(f"long-run window {r.window_index}: {note}")
        values = self._values
        session_id = manager.session_id
        if session_id != self._published_session:
            with self._lock:
                self._path.clear()
                self._trajectory.clear()
            self._published_session = session_id
        world = values["world_frame"]
        child = self._camera_frame(header)
        c2w = np.asarray(r.c2w, dtype=np.float64)

        pose = rosmsg.pose_stamped(c2w, header.stamp, world)
        self._pose_pub.publish(pose)
        self._odom_pub.publish(rosmsg.odometry(pose, child))

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
            self._path_pub.publish(rosmsg.path_message(pose.header, path_poses))

        if values["publish_tf"]:
            self._tf_pub.publish(rosmsg.tf_message(pose, child))

        if values["publish_depth"] and r.depth is not None:
            self._depth_pub.publish(rosmsg.depth_image(r.depth, header.stamp, child))
        recon = self._recon
        if recon is not None:  # depth confidence, camera info, points, map (after the pose)
            recon.publish(r, frame.model_image, header, child, world)
        frame.model_image = None

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
            counts = self._frame_counts()
            self._last_result_info = {"frame_index": int(r.frame_index), "rope_frame_index": int(r.rope_frame_index),
                                      "is_keyframe": bool(r.is_keyframe), "stamp": _stamp_sec(header.stamp)}
        self._status_pub.publish(rosmsg.processed_status(r, header, session_id))
        self._stats_pub.publish(rosmsg.cache_stats(r, header.stamp, world, session_id, counts, overhead_ms,
                                                   manager.info))

    def _frame_counts(self) -> rosmsg.FrameCounts:
        """The counters as CacheStats reports them; call with the lock held."""
        c = self._c
        return rosmsg.FrameCounts(c.received, c.processed, c.dropped, c.rejected, c.pending)

    def _on_non_finite(self, frame: _Frame, r: FrameResult, bad: list[str], manager) -> None:
        """Publish nothing of the frame; after ``max_non_finite_frames`` in a row, a new session
        (non-finite values in the KV cache would poison every later frame)."""
        self._consecutive_non_finite += 1
        reason = f"non-finite model output ({', '.join(bad)}): nothing published"
        with self._lock:
            self._c.last_non_finite = reason
            self._c.last_non_finite_time = time.monotonic()
        self.get_logger().error(f"frame {_stamp_sec(frame.header.stamp):.3f}: {reason}", throttle_duration_sec=5.0)
        self._finish(frame.header, FrameStatus.NON_FINITE_OUTPUT, "non_finite", reason)
        limit = int(self._values["max_non_finite_frames"])
        if self._consecutive_non_finite >= limit:
            self._consecutive_non_finite = 0
            self._new_session(f"{limit} consecutive frames with non-finite output", counter="non_finite_sessions")

    def _publish_status(self, header: Header, status: int, reason: str) -> None:
        self._status_pub.publish(rosmsg.frame_status(header, status, reason, self._current_session_id()))

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
                self._new_session(arg, counter="resets")
                box["result"] = f"session {self._current_session_id()} started (new world frame)"
            elif kind == "apply":
                box["result"] = self._apply_parameters(arg)
        except Exception as exc:
            self._record_error(f"{kind} failed: {type(exc).__name__}: {exc}", exc)
            box["result"] = f"error: {exc}"
        finally:
            done.set()

    def _current_session_id(self) -> int:
        manager = self._manager
        return manager.session_id if manager is not None else 0

    def _new_session(self, reason: str, counter: str) -> None:
        """A new session (new world frame) on the same model: ~/reset, or non-finite recovery."""
        self._drop_discarded(self._manager.reset(), reason)
        self._after_new_session(reason, counter)

    def _drop_discarded(self, stamps: list, reason: str) -> None:
        for frame in stamps:
            self._finish(frame.header, FrameStatus.DROPPED_RESET, "dropped_reset",
                         f"buffered for the scale frames, then discarded: {reason}")

    def _after_new_session(self, reason: str, counter: Optional[str]) -> None:
        self._preproc = self._make_preprocessor(fast_resize=bool(self._values["fast_resize"]))
        with self._lock:
            self._path.clear()
            self._trajectory.clear()
            self._c.sessions_started += 1
            self._c.last_new_session_reason = reason
            if counter is not None:
                setattr(self._c, counter, getattr(self._c, counter) + 1)
        if self._recon is not None:
            self._recon.reset()  # a new world frame: the map starts empty
        self._refresh_session_state()
        self.get_logger().info(f"new session {self._current_session_id()}: {reason}")

    def _apply_parameters(self, changed: list[str]) -> str:
        """Hand the new settings to the session manager; it decides what they need."""
        manager = self._manager
        if manager is None:
            return "stored: applies at configure"
        runtime, stream = configs_from_values(self._values)
        if runtime != manager.runtime:
            self.get_logger().info(f"parameters {changed} need a new model: building it")
        try:
            result = manager.apply(runtime, stream)
        except Exception as exc:  # noqa: BLE001 - a failed model build keeps the previous model
            self._record_error(f"could not build the model for {changed}: {exc}; keeping the previous one and "
                               "reverting the parameters to the values it runs with", exc)
            self._revert_model_parameters(manager.runtime)
            return f"error: {exc}"
        Change = self._change
        if result.change in (Change.NEW_MODEL, Change.NEW_SESSION):
            reason = f"parameters {list(result.fields)} changed" + (
                " (new model)" if result.change is Change.NEW_MODEL else "")
            self._drop_discarded(result.discarded, reason)
            self._after_new_session(reason, "parameter_sessions")
        return result.change.value

    def _revert_model_parameters(self, runtime) -> None:
        """Put the model parameters back to the values the running model was built from, so that
        ``ros2 param get`` never shows a value the model does not use and no later change retries
        the failed build."""
        active = {name: getattr(runtime, name) for name in RUNTIME_FIELDS}
        stale = {k: v for k, v in active.items() if self._values.get(k) != v}
        if not stale:
            return
        self._values.update(stale)  # first: the post-set callback then sees nothing to apply
        self.set_parameters([rclpy.parameter.Parameter(k, value=v) for k, v in stale.items()])
        self.get_logger().warning("reverted " + ", ".join(f"{k}={v!r}" for k, v in stale.items()))

    # ------------------------------------------------------------------ parameters (executor thread)
    def _on_set_parameters(self, params) -> SetParametersResult:
        values = dict(self._values)
        for p in params:
            if p.name not in SPECS:
                continue
            spec = SPECS[p.name]
            if spec.read_only:
                return SetParametersResult(successful=False, reason=f"{p.name} is read-only")
            values[p.name] = p.value
        problems = validate_values(values)
        if problems:
            return SetParametersResult(successful=False, reason="; ".join(problems))
        runtime = configs_from_values(values)[0]
        manager = self._manager
        if manager is not None and runtime != manager.runtime and runtime != configs_from_values(self._values)[0]:
            # A new model: check the file, its keys and shapes, the device and its memory now, so
            # that "Set parameter successful" means the model will be built.
            from ..core.session_manager import model_change_problems

            problems = model_change_problems(runtime)
            if problems:
                return SetParametersResult(successful=False, reason="; ".join(problems))
        return SetParametersResult(successful=True)

    def _on_parameters_set(self, params) -> None:
        changed = [p.name for p in params if p.name in SPECS and self._values.get(p.name) != p.value]
        if not changed:
            return
        for p in params:
            if p.name in SPECS:
                self._values[p.name] = p.value
        self.get_logger().info("parameters changed: " + ", ".join(f"{n}={self._values[n]!r}" for n in changed))
        applies = {SPECS[n].applies for n in changed}
        if "subscription" in applies:
            if self._sub is not None:
                self._create_subscription()
                self.get_logger().info(f"image subscription re-created on {self._sub_topic}")
            else:
                self._sub_topic = self._image_topic()
        if "timer" in applies:
            self.destroy_timer(self._diag_timer)
            self._diag_timer = self.create_timer(float(self._values["diagnostics_period"]), self._publish_diagnostics)
        if self._manager is not None and (applies & {"model", "session"} or {
                "keyframe_interval", *DEPTH_OUTPUTS} & set(changed)):
            self._submit(("apply", changed))

    # ------------------------------------------------------------------ services
    def _on_reset(self, request, response):
        if self._manager is None:
            response.success = False
            response.message = f"the node is {self._state_label}: configure it first"
            return response
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
            tmp = f"{path}.tmp{os.getpid()}"
            write_tum(tmp, np.array([s for s, _ in trajectory], np.float64),
                      np.array([m for _, m in trajectory], np.float64).reshape(-1, 4, 4))
            os.replace(tmp, path)  # atomic: a crash never leaves half a file at `path`
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
        _, stream = configs_from_values(self._values)
        with self._lock:
            manager = self._manager
            c = self._c
            snapshot = DiagnosticsSnapshot(
                now=time.monotonic(), started=self._t_start, hardware_id=self.get_fully_qualified_name(),
                topic=self._sub_topic, transport=self._values["image_transport"],
                qos_reliability=self._values["qos_reliability"], receive_times=list(self._recv_times),
                last_frame_time=self._last_frame_time, counters={k: getattr(c, k) for k in COUNTER_NAMES},
                rejected_by_kind=dict(c.rejected_by_kind), dropped_since_last=c.dropped_since_diag,
                rejected_since_last=c.rejected_since_diag, last_reject_reason=c.last_reject_reason,
                last_reject_time=c.last_reject_time, last_error=c.last_error, last_error_time=c.last_error_time,
                last_non_finite=c.last_non_finite, last_non_finite_time=c.last_non_finite_time,
                last_qos_event=c.last_qos_event, last_qos_event_time=c.last_qos_event_time,
                new_session_reason=c.last_new_session_reason, expected_wh=self._preproc.input_wh if self._preproc is not None else None,
                last_result=dict(self._last_result_info), latencies=list(self._latencies),
                overheads=list(self._overheads), parts=list(self._parts), cache=self._snapshot or CacheSnapshot(),
                cache_warnings=list(self._session_warnings), session_id=self._current_session_id(),
                buffered=manager.buffered if manager is not None else 0,
                pending=c.pending, dropped=c.dropped,
                stream_cfg=manager.stream_cfg if manager is not None else stream,
                window_index=manager.session.window_index if manager is not None else 0,
                window_switches=manager.session.window_switches if manager is not None else 0,
                info=manager.info if manager is not None else None,
                checkpoint=manager.runtime.checkpoint if manager is not None else self._values["checkpoint"],
                lifecycle_state=self._state_label, configure_error=self._configure_error,
            )
            c.dropped_since_diag = c.rejected_since_diag = 0
        self._diag_pub.publish(diagnostic_array(snapshot, self.get_clock().now().to_msg()))


def main(args=None) -> int:
    """``lingbot_map_node``: run the managed node until SIGINT/SIGTERM (exit 0); exit 2 when its
    parameters are invalid. With ``autostart`` (default) it configures and activates itself; a
    failed configure (e.g. an unreadable checkpoint) is logged with its reason and leaves the node
    unconfigured, alive, so the parameters can be fixed and `ros2 lifecycle set ... configure` run."""
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
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    try:
        if node.autostart:
            if node.trigger_configure() == TransitionCallbackReturn.SUCCESS:
                node.trigger_activate()
            else:
                print(f"[lingbot_map] configure failed: {node._configure_error}", flush=True)
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
