"""What the node knows about each received frame, and the one place where a frame's outcome is recorded.

Every received image is counted once when it arrives (``FrameLedger.received``) and ends exactly
once with a final ``~/frame_status``: ``FrameLedger.processed`` for a published pose,
``FrameLedger.finish`` (or its two front doors ``reject`` and ``dropped_from_queue``) for every other
outcome. The counters move and the status goes out here and nowhere else, under one lock, so
``frames_received == frames_processed + frames_dropped + frames_pending`` holds in every CacheStats
and /diagnostics message whichever thread ends a frame (executor, inference thread).

``LatestFrame`` is the one-slot hand-off between two threads where the newest frame wins; it ends
the frame it replaces itself, so no caller can forget to.
"""
from __future__ import annotations

import collections
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional

from builtin_interfaces.msg import Time as TimeMsg
from rclpy.impl.implementation_singleton import rclpy_implementation as _rclpy_impl
from rclpy.qos import QoSProfile
from std_msgs.msg import Header

from lingbot_map_ros.msg import FrameStatus

from . import messages as rosmsg
from .outbox import deferred, send_built

if TYPE_CHECKING:
    from ..core.results import FrameResult

RCLError = _rclpy_impl.RCLError

# The one table of final statuses other than PROCESSED and the counter each one moves (a field of
# ``Counters``, a ``frames_<name>`` key of /diagnostics); ``FrameLedger.finish`` reads it.
FINAL_STATUS_COUNTERS: dict[int, str] = {
    FrameStatus.DROPPED_QUEUE: "dropped_queue",
    FrameStatus.REJECTED_INPUT: "rejected",
    FrameStatus.REFUSED_POLICY: "refused",
    FrameStatus.FAILED_INFERENCE: "failed",
    FrameStatus.DROPPED_RESET: "dropped_reset",
    FrameStatus.DROPPED_INACTIVE: "dropped_inactive",
    FrameStatus.NON_FINITE_OUTPUT: "non_finite",
    FrameStatus.NO_TRANSFORM: "no_transform",
}
DROP_COUNTERS = tuple(FINAL_STATUS_COUNTERS.values())


class InputRejected(ValueError):
    """A message the node cannot use; ``kind`` names the counter it goes to."""

    def __init__(self, kind: str, reason: str):
        super().__init__(reason)
        self.kind = kind


def stamp_sec(stamp: TimeMsg) -> float:
    return stamp.sec + stamp.nanosec * 1e-9


@dataclass
class Frame:
    """A received, converted image on its way through the node; also the session's opaque stamp
    (``SessionManager.push(..., stamp=frame)`` hands it back with the frame's result).

    Times are ``time.perf_counter()`` values; the ``*_ms`` fields are the parts /diagnostics reports
    (``diagnostics.OVERHEAD_PARTS``)."""

    header: Header
    rgb: Any  # RGB uint8 [H0, W0, 3] (numpy); None once preprocessed
    wh: tuple[int, int]  # camera image size (W0, H0)
    received: float  # start of the image callback
    convert_ms: float
    handoff_ms: float = 0.0  # callback done -> preprocessing starts (queue wait + thread wake-up)
    preprocess_ms: float = 0.0
    ready_wait_ms: float = 0.0  # preprocessed -> the inference thread takes it (waits for the model)
    session_extra_ms: float = 0.0  # push() wall time beyond the model time (phase 2 only)
    pre_start: float = 0.0  # preprocessing began
    pre_end: float = 0.0  # preprocessing done
    taken: float = 0.0  # the inference thread took it
    push_start: float = 0.0  # SessionManager.push called
    push_end: float = 0.0  # SessionManager.push returned
    model_image: Optional[object] = None  # the preprocessed [3, H, W] tensor, until its result is published


@dataclass
class Counters:
    """The node's frame counters and last events (guarded by ``FrameLedger.lock``)."""

    received: int = 0
    processed: int = 0
    # final statuses other than PROCESSED (FINAL_STATUS_COUNTERS maps each status to its field)
    dropped_queue: int = 0
    rejected: int = 0
    refused: int = 0
    failed: int = 0
    dropped_reset: int = 0
    dropped_inactive: int = 0
    non_finite: int = 0
    no_transform: int = 0
    errors: int = 0  # errors of any kind (inference, commands), for diagnostics
    rejected_by_kind: collections.Counter = field(default_factory=collections.Counter)
    sessions_started: int = 0
    parameter_sessions: int = 0  # new sessions caused by parameter changes
    resets: int = 0
    non_finite_sessions: int = 0  # new sessions started because non-finite values kept coming
    failure_sessions: int = 0  # new sessions started because the model raised
    policy_sessions: int = 0  # new sessions the long-run policy asked for (reset policy, a window that cannot start)
    time_jump_sessions: int = 0  # new sessions started because the stamps went back in time
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


class FrameLedger:
    """Counts frames in, ends them with their final FrameStatus, and keeps the per-frame timings.

    ``session_id()`` is the current session's id (stamped on every FrameStatus). Thread-safe: the
    image callback, the inference thread and the transitions all end frames through here.
    """

    def __init__(self, node, session_id: Callable[[], int], topic: str = "~/frame_status"):
        self._log = node.get_logger()
        self._session_id = session_id
        self._status_pub = deferred(node, node.create_publisher(FrameStatus, topic, QoSProfile(depth=50)))
        self._context = node.context
        self.lock = threading.Lock()
        self.c = Counters()
        self.recv_times: collections.deque = collections.deque(maxlen=300)
        self.last_frame_time: Optional[float] = None
        self.latencies: collections.deque = collections.deque(maxlen=200)  # model ms per frame
        self.overheads: collections.deque = collections.deque(maxlen=200)  # convert + preprocess + publish ms
        # per-part node overhead (diagnostics.OVERHEAD_PARTS) per frame
        self.parts: collections.deque = collections.deque(maxlen=200)
        self.last_result_info: dict = {}
        self._reject_log_times: dict = {}
        self._reject_log_suppressed: collections.Counter = collections.Counter()

    # ------------------------------------------------------------------ arrival
    def received(self) -> None:
        now = time.monotonic()
        with self.lock:
            self.c.received += 1
            self.recv_times.append(now)
            self.last_frame_time = now

    # ------------------------------------------------------------------ final statuses
    def finish(self, header: Header, status: int, reason: str) -> None:
        """The one way a frame that produced no pose ends: the counter of ``status``
        (``FINAL_STATUS_COUNTERS``), then its final FrameStatus with ``reason``."""
        counter = FINAL_STATUS_COUNTERS[status]
        with self.lock:
            setattr(self.c, counter, getattr(self.c, counter) + 1)
        self.interim(header, status, reason)

    def dropped_from_queue(self, header: Header, reason: str) -> None:
        """A waiting frame replaced by a newer one (the camera is faster than the node)."""
        with self.lock:
            self.c.dropped_since_diag += 1
            self.c.last_drop_time = time.monotonic()
        self.finish(header, FrameStatus.DROPPED_QUEUE, reason)

    def reject(self, header: Header, kind: str, reason: str) -> None:
        """Bad input: REJECTED_INPUT, counted per kind, logged throttled per kind (a camera sending
        only bad frames must not flood the log)."""
        with self.lock:
            self.c.rejected_since_diag += 1
            self.c.rejected_by_kind[kind] += 1
            self.c.last_reject_reason = reason
            self.c.last_reject_time = time.monotonic()
        self.finish(header, FrameStatus.REJECTED_INPUT, reason)
        now = time.monotonic()
        with self.lock:
            due = now - self._reject_log_times.get(kind, -1e9) >= 2.0
            if due:
                extra = self._reject_log_suppressed.pop(kind, 0)
                self._reject_log_times[kind] = now
            else:
                self._reject_log_suppressed[kind] += 1
        if due:
            more = f" (+{extra} more like it not logged)" if extra else ""
            self._log.warning(f"rejected frame (stamp {stamp_sec(header.stamp):.3f}): {reason}{more}")

    def processed(self, r: FrameResult, frame: Frame, session_id: int,
                  publish_ms: float, note: str = "") -> tuple[rosmsg.FrameCounts, float]:
        """The frame's outputs are out: count it, record its timings, send PROCESSED (with ``note``
        as its reason when some outputs were withheld). Returns the counters as they stand now and
        the node overhead of the frame (both for its CacheStats)."""
        overhead_ms = frame.convert_ms + frame.preprocess_ms + publish_ms
        with self.lock:
            self.c.processed += 1
            self.latencies.append(float(r.latency_ms))
            self.overheads.append(overhead_ms)
            now = time.perf_counter()
            nan = float("nan")  # scale frames share one joint call: no per-frame model time
            # what the inference thread spends per frame besides the model: its throughput limit
            in_thread = (now - frame.taken) * 1e3 - float(r.latency_ms) if not r.is_scale_frame else nan
            # callback entry -> all outputs published, minus the model: the node's part of the latency
            in_node = (now - frame.received) * 1e3 - float(r.latency_ms) if not r.is_scale_frame else nan
            self.parts.append((frame.convert_ms, frame.handoff_ms, frame.preprocess_ms, frame.ready_wait_ms,
                               publish_ms, frame.session_extra_ms, in_thread, in_node))
            counts = self._counts()
            self.last_result_info = {"frame_index": int(r.frame_index), "rope_frame_index": int(r.rope_frame_index),
                                     "is_keyframe": bool(r.is_keyframe), "stamp": stamp_sec(frame.header.stamp)}
        # a note (a withheld pose's reason) changes from frame to frame: a message; else the bytes of one
        send_built(self._status_pub, rosmsg.processed_status if note else rosmsg.processed_status_encoded, r,
                   frame.header, session_id, *((note,) if note else ()))
        return counts, overhead_ms

    def interim(self, header: Header, status: int, reason: str) -> None:
        """Publish a status without counting: BUFFERED, or the second half of ``finish``.

        After a signal the context is gone while the teardown still ends the waiting frames: their
        statuses cannot be published any more (they are counted all the same), and that is no error."""
        try:
            self._status_pub.publish(rosmsg.frame_status(header, status, reason, self._session_id()))
        except RCLError:
            if self._context.ok():
                raise

    def _counts(self) -> rosmsg.FrameCounts:
        c = self.c
        dropped = c.dropped  # summed once (``pending`` would sum the drop counters again)
        return rosmsg.FrameCounts(c.received, c.processed, dropped, c.rejected, c.received - c.processed - dropped)

    # ------------------------------------------------------------------ events
    def record_error(self, text: str, exc: Optional[BaseException] = None, detail: str = "") -> None:
        with self.lock:
            self.c.errors += 1
            self.c.last_error = text
            self.c.last_error_time = time.monotonic()
        detail = detail or ("".join(traceback.format_exception(exc)) if exc is not None else "")
        self._log.error(text + ("\n" + detail if detail else ""), throttle_duration_sec=5.0)

    def note_non_finite(self, reason: str) -> None:
        with self.lock:
            self.c.last_non_finite = reason
            self.c.last_non_finite_time = time.monotonic()

    def note_new_session(self, reason: str, counter: Optional[str]) -> None:
        with self.lock:
            self.c.sessions_started += 1
            self.c.last_new_session_reason = reason
            if counter is not None:
                setattr(self.c, counter, getattr(self.c, counter) + 1)

    def note_qos_event(self, text: str, **counters: int) -> None:
        """A middleware event on the image subscription (lost messages, a QoS or type mismatch)."""
        with self.lock:
            for name, value in counters.items():
                setattr(self.c, name, int(value))
            self.c.last_qos_event = text
            self.c.last_qos_event_time = time.monotonic()


class LatestFrame:
    """One waiting frame between two threads: a newer frame replaces the waiting one, which ends
    DROPPED_QUEUE with ``replaced_reason``. ``cond`` may be shared with the consumer's other work
    (the inference thread waits for commands and frames on one condition)."""

    def __init__(self, ledger: FrameLedger, replaced_reason: str, cond: Optional[threading.Condition] = None):
        self.cond = cond if cond is not None else threading.Condition()
        self._ledger = ledger
        self._reason = replaced_reason
        self._frame: Optional[Frame] = None

    def put(self, frame: Frame) -> None:
        with self.cond:
            old, self._frame = self._frame, frame
            self.cond.notify_all()
        if old is not None:
            self._ledger.dropped_from_queue(old.header, self._reason)

    def take(self) -> Optional[Frame]:
        with self.cond:
            frame, self._frame = self._frame, None
            return frame

    @property
    def waiting(self) -> bool:
        return self._frame is not None
