"""The node's /diagnostics message, built from a snapshot of its numbers.

The node copies what it knows into a ``DiagnosticsSnapshot`` under its lock; ``diagnostic_array``
turns that into the statuses (input, inference, kv cache, backend, and on a robot tf and scale)
with their levels, messages and key/values. Keeping the judgement (what counts as a warning or an
error, and for how long) out of the node means the node's thread and lock handling and the
operator-facing wording can change independently.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Sequence

from builtin_interfaces.msg import Time as TimeMsg
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue

from ..core.config import StreamConfig
from ..core.results import CacheSnapshot
from .frames import DROP_COUNTERS  # the counters of frames that ended without a pose, one per final status

if TYPE_CHECKING:
    from ..core.memory_budget import MemoryReport
    from ..core.results import SessionInfo
    from .robot_frames import RobotReport

DIAG_PREFIX = "lingbot_map: "
RATE_WINDOW_S = 5.0  # input rate over the last seconds; also how long silence or a rejection warns
ERROR_HOLD_S = 10.0  # the inference status stays ERROR this long after an error
# The per-frame node timing parts, in the order the node records them.
# handoff: callback -> preprocessing thread; ready_wait: preprocessed -> the inference thread takes it;
# inference_thread_minus_model: what the inference thread spends per frame besides the model (its
# throughput limit); in_node_minus_model: callback entry -> all outputs published, minus the model.
OVERHEAD_PARTS = ("convert", "handoff", "preprocess", "ready_wait", "publish", "session_bookkeeping",
                  "inference_thread_minus_model", "in_node_minus_model")
REJECT_KINDS = ("unsupported", "data_length", "zero_size", "resolution_changed", "preprocessing_failed")
COUNTER_NAMES = ("received", "processed", *DROP_COUNTERS, "errors", "sessions_started", "parameter_sessions",
                 "resets", "non_finite_sessions", "failure_sessions", "policy_sessions", "time_jump_sessions",
                 "qos_messages_lost", "qos_incompatible")


@dataclass(frozen=True)
class DiagnosticsSnapshot:
    """Everything one /diagnostics message reports, copied from the node at one moment."""

    now: float  # time.monotonic() when the snapshot was taken
    started: float  # time.monotonic() when the node started
    hardware_id: str  # the node's fully qualified name
    topic: str  # the image topic subscribed to
    transport: str
    qos_reliability: str
    receive_times: Sequence[float]  # time.monotonic() of recent image callbacks, oldest first
    last_frame_time: Optional[float]  # None: no image received yet
    counters: dict[str, int]  # COUNTER_NAMES -> value
    rejected_by_kind: dict[str, int]
    dropped_since_last: int  # frames replaced in the queue since the previous message
    rejected_since_last: int
    last_reject_reason: str
    last_reject_time: float
    last_error: str
    last_error_time: float
    last_non_finite: str  # reason of the last frame with non-finite model output
    last_non_finite_time: float
    last_qos_event: str  # the middleware's last loss/incompatibility report on the image subscription
    last_qos_event_time: float
    new_session_reason: str
    expected_wh: Optional[tuple[int, int]]  # the session's image size; None before the first frame
    last_result: dict  # frame_index and rope_frame_index of the last published frame, when there was one
    latencies: Sequence[float]  # model time per frame, ms
    overheads: Sequence[float]  # node time per frame outside the model, ms
    parts: Sequence[tuple[float, ...]]  # per frame, OVERHEAD_PARTS in ms (nan: not measured)
    cache: CacheSnapshot
    cache_warnings: Sequence[str]
    session_id: int
    buffered: int  # scale frames waiting for the joint call
    pending: int  # received frames without a final status (received == processed + dropped + pending)
    dropped: int  # frames that ended without a pose (every drop counter)
    stream_cfg: StreamConfig
    window_index: int
    window_switches: int
    info: Optional[SessionInfo]  # None: no model loaded (unconfigured)
    checkpoint: str
    lifecycle_state: str = "active"  # unconfigured | inactive | active
    configure_error: str = ""  # why the last configure failed ("" when it did not)
    # last pushed frames: (stamp ns, preprocess start, preprocess end, push start, push end), ms
    timeline: Sequence[tuple] = ()
    overlapped: int = 0  # frames preprocessed while the previous frame was inside the model
    robot: Optional[RobotReport] = None  # the TF tree and the scale (None: no tf / scale statuses)
    memory: Optional[MemoryReport] = None  # predicted next to allocated (None: no model loaded)
    sends_cpu_ms: float = float("nan")  # the outbox thread's CPU to send one frame's outputs, median (ros/outbox.py)
    send_failures: int = 0  # sends the middleware refused while ROS was up


def _percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(math.ceil(q * len(s))) - 1))]


def _status(d: DiagnosticsSnapshot, name: str, level: bytes, message: str, kv: list[tuple[str, object]]
            ) -> DiagnosticStatus:
    return DiagnosticStatus(level=level, name=DIAG_PREFIX + name, message=message, hardware_id=d.hardware_id,
                            values=[KeyValue(key=k, value=str(v)) for k, v in kv])


def _input_status(d: DiagnosticsSnapshot) -> DiagnosticStatus:
    """Is the camera arriving, how fast, and is any of it unusable."""
    recent = [t for t in d.receive_times if d.now - t <= RATE_WINDOW_S]
    rate = (len(recent) - 1) / (recent[-1] - recent[0]) if len(recent) >= 2 and recent[-1] > recent[0] else 0.0
    level, msg = DiagnosticStatus.OK, f"{rate:.1f} Hz"
    if d.last_frame_time is None:
        if d.now - d.started > RATE_WINDOW_S:
            level, msg = DiagnosticStatus.WARN, f"no images received on {d.topic}"
        else:
            msg = f"waiting for images on {d.topic}"
    elif d.now - d.last_frame_time > RATE_WINDOW_S:
        level, msg = DiagnosticStatus.WARN, f"no images for {d.now - d.last_frame_time:.0f} s on {d.topic}"
    if d.rejected_since_last or d.now - d.last_reject_time < RATE_WINDOW_S:
        level, msg = DiagnosticStatus.WARN, f"rejecting input: {d.last_reject_reason}"
    if d.now - d.last_qos_event_time < RATE_WINDOW_S:
        level, msg = DiagnosticStatus.WARN, d.last_qos_event
    kv: list[tuple[str, object]] = [
        ("topic", d.topic), ("transport", d.transport), ("qos_reliability", d.qos_reliability),
        ("rate_hz", f"{rate:.2f}"), ("frames_received", d.counters["received"]),
        ("frames_rejected", d.counters["rejected"]),
        ("middleware_messages_lost", d.counters["qos_messages_lost"]),
        ("incompatible_qos_publishers", d.counters["qos_incompatible"]),
        ("last_middleware_event", d.last_qos_event or "-"),
    ]
    kv += [(f"rejected_{k}", d.rejected_by_kind.get(k, 0)) for k in REJECT_KINDS]
    kv += [("last_reject_reason", d.last_reject_reason or "-"),
           ("resolution", f"{d.expected_wh[0]}x{d.expected_wh[1]}" if d.expected_wh else "-")]
    return _status(d, "input", level, msg, kv)


def _inference_status(d: DiagnosticsSnapshot) -> DiagnosticStatus:
    """How long frames take, whether the node keeps up, and the session's history."""
    lat, ovh = d.latencies, d.overheads
    nan = float("nan")
    med, p90 = (statistics.median(lat), _percentile(lat, 0.9)) if lat else (nan, nan)
    omed, op90 = (statistics.median(ovh), _percentile(ovh, 0.9)) if ovh else (nan, nan)
    columns = [[v for v in col if v == v] for col in zip(*d.parts)] if d.parts else [[]] * len(OVERHEAD_PARTS)
    level, msg = DiagnosticStatus.OK, (f"latency median {med:.1f} ms, p90 {p90:.1f} ms" if lat
                                       else "no frame processed yet")
    if d.buffered:
        msg += f"; {d.buffered}/{d.stream_cfg.scale_frames} scale frames buffered"
    if d.dropped_since_last:
        level, msg = (DiagnosticStatus.WARN,
                      f"falling behind the camera: {d.dropped_since_last} frames replaced in the queue")
    if d.now - d.last_error_time < ERROR_HOLD_S:
        level, msg = DiagnosticStatus.ERROR, d.last_error
    if d.now - d.last_non_finite_time < ERROR_HOLD_S:
        level, msg = DiagnosticStatus.ERROR, d.last_non_finite
    c = d.counters
    return _status(d, "inference", level, msg, [
        ("latency_median_ms", f"{med:.2f}"), ("latency_p90_ms", f"{p90:.2f}"),
        ("node_overhead_median_ms", f"{omed:.2f}"), ("node_overhead_p90_ms", f"{op90:.2f}"),
        *[(f"{name}_median_ms", f"{statistics.median(col):.2f}" if col else "nan")
          for name, col in zip(OVERHEAD_PARTS, columns)],
        ("sends_cpu_median_ms", f"{d.sends_cpu_ms:.3f}"), ("send_failures", d.send_failures),
        ("fps_max", f"{1000.0 / med:.2f}" if lat and med > 0 else "-"),
        ("preprocess_overlapped_frames", d.overlapped),
        ("frame_timeline_ms", " ".join(f"{t[0]}:{t[1]:.2f}:{t[2]:.2f}:{t[3]:.2f}:{t[4]:.2f}" for t in d.timeline)
         or "-"),
        ("frames_received", c["received"]), ("frames_processed", c["processed"]),
        ("frames_dropped", d.dropped), ("frames_pending", d.pending),
        *[(f"frames_{name}", c[name]) for name in DROP_COUNTERS if name != "rejected"],
        ("frames_buffered", d.buffered), ("non_finite_sessions", c["non_finite_sessions"]),
        ("failure_sessions", c["failure_sessions"]), ("policy_sessions", c["policy_sessions"]),
        ("time_jump_sessions", c["time_jump_sessions"]),
        ("errors", c["errors"]), ("last_error", d.last_error or "-"),
        ("session_id", d.session_id), ("sessions_started", c["sessions_started"]),
        ("sessions_from_parameter_changes", c["parameter_sessions"]), ("resets", c["resets"]),
        ("last_new_session_reason", d.new_session_reason),
        ("last_frame_index", d.last_result.get("frame_index", "-")),
        ("keyframe_interval", d.stream_cfg.keyframe_interval),
    ])


def _cache_status(d: DiagnosticsSnapshot) -> DiagnosticStatus:
    """What the KV cache holds and how close it is to its limits."""
    snap, cfg = d.cache, d.stream_cfg
    level, msg = DiagnosticStatus.OK, (f"{snap.frames_stored} stored frames ({snap.scale_frames} scale, "
                                       f"{snap.window_frames} window, {snap.frames_evicted} evicted)")
    if d.cache_warnings:
        level, msg = DiagnosticStatus.WARN, "; ".join(d.cache_warnings)
    return _status(d, "kv cache", level, msg, [
        ("frames_stored", snap.frames_stored), ("scale_frames", snap.scale_frames),
        ("window_frames", snap.window_frames), ("frames_evicted", snap.frames_evicted),
        ("sliding_window", cfg.sliding_window), ("page_size", snap.page_size),
        ("patch_pages_total", snap.patch_pages_total), ("free_pages", snap.free_pages),
        ("special_pages", snap.special_pages), ("special_pages_capacity", snap.special_pages_capacity),
        ("special_tokens", snap.special_tokens), ("visible_keys", snap.visible_keys),
        ("camera_cache_frames", snap.camera_cache_frames),
        ("rope_frame_index", d.last_result.get("rope_frame_index", "-")), ("max_frame_num", cfg.max_frame_num),
        ("max_stored_frames", cfg.max_stored_frames), ("long_run_policy", cfg.long_run_policy),
        ("kv_mbytes", f"{snap.kv_bytes / 2**20:.1f}"),
        ("window_index", d.window_index), ("window_switches", d.window_switches), *_memory_values(d.memory),
    ])


def _memory_values(m: Optional[MemoryReport]) -> list[tuple[str, object]]:
    """The footprint's prediction next to what is allocated (docs/memory.md), GB."""
    if m is None:
        return []
    return [("memory_predicted_gb", f"{m.predicted / 1e9:.3f}"), ("memory_allocated_gb", f"{m.allocated / 1e9:.3f}"),
            ("memory_budget_gb", f"{m.budget / 1e9:.3f}" if m.budget else "none"),
            ("sliding_window_configured", m.configured_window),
            ("sliding_window_fitted", m.fitted_window if m.fitted_window is not None else "-")]


def _backend_status(d: DiagnosticsSnapshot) -> DiagnosticStatus:
    """Lifecycle state, which model, attention backend, dtype and device run, and whether the weights
    mean anything."""
    info = d.info
    state = [("lifecycle_state", d.lifecycle_state), ("configure_error", d.configure_error or "-")]
    if info is None:
        if d.configure_error:
            level, msg = DiagnosticStatus.ERROR, f"unconfigured: {d.configure_error}"
        else:
            level, msg = DiagnosticStatus.WARN, f"{d.lifecycle_state}: no model loaded (configure the node)"
        return _status(d, "backend", level, msg, [*state, ("checkpoint", d.checkpoint or "-")])
    level, msg = DiagnosticStatus.OK, f"{info.attention} {info.dtype} on {info.device}"
    if info.random_weights:
        level, msg = DiagnosticStatus.WARN, msg + "; RANDOM WEIGHTS: poses are not meaningful"
    if d.lifecycle_state != "active":
        level, msg = DiagnosticStatus.WARN, f"{d.lifecycle_state}: frames are not processed; " + msg
    return _status(d, "backend", level, msg, [
        *state, ("backend", info.backend), ("backend_reason", info.backend_reason),
        ("attention", info.attention), ("runtime_reasons", "; ".join(info.runtime_reasons) or "-"),
        ("dtype", info.dtype),
        ("device", info.device), ("model_preset", info.model_preset),
        ("checkpoint", d.checkpoint or "-"), ("random_weights", info.random_weights),
        ("depth_available", info.depth_available),
    ])


def _tf_status(d: DiagnosticsSnapshot, t: RobotReport) -> DiagnosticStatus:
    """The node in the robot's TF tree: which edge it publishes, a child with another parent (ERROR,
    with the fix), a transform that did not come (WARN naming the link), a transform that jumped."""
    if not t.publish_tf:
        level, msg = DiagnosticStatus.OK, "publish_tf is false: nothing published on /tf"
    else:
        level, msg = DiagnosticStatus.OK, (f"publishing {t.edge}" if t.edge else "no frame placed yet")
    if t.now - t.last_jump_time < RATE_WINDOW_S:
        level, msg = DiagnosticStatus.WARN, t.last_jump
    if t.now - t.missing_time < RATE_WINDOW_S:
        level, msg = DiagnosticStatus.WARN, (f"no transform {t.missing_link} at the image stamps: frames end "
                                             f"NO_TRANSFORM ({t.missing_reason})")
    if t.conflicts:
        level = DiagnosticStatus.ERROR
        msg = "; ".join(f"{child} already has the parent {parent}: nothing published for it on /tf. Fix: {fix}"
                        for child, (parent, fix) in sorted(t.conflicts.items()))
    if t.other_publishers:
        level = DiagnosticStatus.ERROR
        msg = "; ".join(f"another node publishes {edge} too: {who}. A transform must come from one node: stop "
                        "one of them, or give each its own frames" for edge, who in sorted(t.other_publishers.items())
                        ) + ("; " + msg if t.conflicts else "")
    return _status(d, "tf", level, msg, [
        ("world_frame", t.world_frame), ("base_frame", t.base_frame or "-"), ("odom_frame", t.odom_frame or "-"),
        ("published_edge", t.edge or "-"), ("publish_tf", t.publish_tf),
        ("parent_conflicts", "; ".join(f"{c} <- {p}" for c, (p, _) in sorted(t.conflicts.items())) or "-"),
        ("other_publishers", "; ".join(f"{e}: {w}" for e, w in sorted(t.other_publishers.items())) or "-"),
        ("frames_no_transform", t.no_transform), ("last_missing_link", t.missing_link or "-"),
        ("last_missing_reason", t.missing_reason or "-"), ("tf_jumps", t.tf_jumps),
        ("last_tf_jump", t.last_jump or "-"),
        # what placing a frame (lookups, scale, frame algebra, depth scaling) costs the inference thread
        ("tf_scale_median_ms", f"{t.cost_ms[0]:.3f}"), ("tf_scale_p90_ms", f"{t.cost_ms[1]:.3f}"),
        ("tf_scale_max_ms", f"{t.cost_ms[2]:.3f}"),
        ("tf_scale_cpu_median_ms", f"{t.cost_cpu_ms[0]:.3f}"), ("tf_scale_cpu_p90_ms", f"{t.cost_cpu_ms[1]:.3f}"),
        ("tf_scale_cpu_max_ms", f"{t.cost_cpu_ms[2]:.3f}"),
    ])


def _scale_status(d: DiagnosticsSnapshot, t: RobotReport) -> DiagnosticStatus:
    """The world's unit: model units (said, not metres), estimating (WARN: nothing metric published),
    locked (metres), re-estimating after a window switch (the locked scale still applies)."""
    from ..core.scale import ESTIMATING, MODEL_UNITS, RE_ESTIMATING

    s = t.scale
    spread = f"{100 * s.spread:.2f} %" if s.spread == s.spread else "-"
    if s.state == MODEL_UNITS:
        level, msg = DiagnosticStatus.OK, "model units (scale_source model): poses, depth and points are NOT metres"
    elif s.state == ESTIMATING:
        progress = (f"{s.travel_m:.2f} of {s.needed_travel_m:.2f} m travelled" if s.source == "odometry"
                    else f"{s.samples} keyframe ratios, {s.needed} must agree")
        level, msg = DiagnosticStatus.WARN, (f"estimating from {s.source} ({progress}): nothing metric is "
                                             "published until it locks" + (f"; {s.problem}" if s.problem else ""))
    else:
        level, msg = DiagnosticStatus.OK, f"locked: {s.value:.6g} m per model unit ({s.source}, spread {spread})"
        if s.state == RE_ESTIMATING:
            msg += "; re-estimating after a window switch" + (f" ({s.problem})" if s.problem else "")
    kv: list[tuple[str, object]] = [
        ("source", s.source), ("state", s.state), ("value", f"{s.value:.6g}" if s.value == s.value else "-"),
        ("spread", spread), ("samples", s.samples), ("samples_needed", s.needed),
        ("travel_m", f"{s.travel_m:.3f}"), ("travel_needed_m", f"{s.needed_travel_m:.3f}"),
        ("re_estimates_locked", s.relocks), ("metric", s.metric), ("problem", s.problem or "-"),
    ]
    kv += [(f"rejected_{k.replace(' ', '_')}", n) for k, n in sorted(s.rejected.items())]
    if s.source == "depth":
        kv += [(f"depth_{k}", n) for k, n in sorted(t.depth_counts.items())]
        kv.append(("depth_last_problem", t.depth_problem or "-"))
    return _status(d, "scale", level, msg, kv)


def diagnostic_array(d: DiagnosticsSnapshot, stamp: TimeMsg) -> DiagnosticArray:
    """The /diagnostics message for ``d``: input, inference, kv cache, backend, tf and scale, in that order."""
    array = DiagnosticArray()
    array.header.stamp = stamp
    array.status = [_input_status(d), _inference_status(d), _cache_status(d), _backend_status(d)]
    if d.robot is not None:
        array.status += [_tf_status(d, d.robot), _scale_status(d, d.robot)]
    return array
