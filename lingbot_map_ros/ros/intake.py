"""Where frames enter: the image subscription (topic, QoS, middleware events, the image callback) and,
for a depth-camera scale, the depth subscription paired with the colour frames by stamp.

The callback runs on the executor thread and stays cheap: count the frame, convert the message to
RGB (every structural check lives in ``image_io``), ask the session's input size
(``InputSize.check``) and hand the frame on. Anything it cannot use ends here as REJECTED_INPUT, so a
bad frame never waits in a queue. Frames received while the node is not active end DROPPED_INACTIVE.

Depth (``DepthPairing``): colour frames never wait for their depth partner. The callback hands each
accepted frame's stamp to a ``message_filters.ApproximateTimeSynchronizer`` that pairs it with the
depth topic within ``depth_sync_slop``; a pair's depth is read under the model's depth grid and kept
by colour stamp until the frame's result asks for it (``take``). A partner that could not be read is
kept as a ``RefusedDepth``, so the keyframe's wait ends at once; one that has not arrived yet (a
large message the middleware repairs after a lost fragment comes late) is awaited up to
``tf_timeout`` by ``robot_frames``.
"""
from __future__ import annotations

import collections
import threading
import time
from typing import Callable, Optional, Protocol

import rclpy.qos
from rclpy.event_handler import SubscriptionEventCallbacks
from rclpy.qos import QoSDurabilityPolicy, QoSHistoryPolicy, QoSProfile, QoSReliabilityPolicy
from sensor_msgs.msg import CompressedImage, Image

from lingbot_map_ros.msg import FrameStatus

from ..core.config import planned_height
from .frames import Frame, FrameLedger, InputRejected, stamp_sec
from .input_size import InputSize
from .node_settings import SettingsSource
from .node_state import NodeState

DEPTH_QUEUE = 10  # messages per topic the synchronizer holds while it looks for a partner
DEPTH_KEPT = 64  # paired depth grids kept for the results to come (each ~50 kB)


def _stamp_ns(header) -> int:
    return int(header.stamp.sec) * 10**9 + int(header.stamp.nanosec)


def transport_topic(node, base: str, transport: str) -> str:
    """The topic of ``base`` (``image`` or ``depth``) for ``transport``. The image_transport convention:
    remapping ``base`` also moves ``base/compressed``, unless ``base/compressed`` is remapped itself."""
    if transport != "compressed":
        return node.resolve_topic_name(base)
    explicit = node.resolve_topic_name(base + "/compressed")
    if explicit != node.resolve_topic_name(base + "/compressed", only_expand=True):
        return explicit
    return node.resolve_topic_name(base) + "/compressed"


class DepthConsumer(Protocol):
    """Who reads the paired depth (``robot_frames.RobotFrames``): whether a scale round is open."""

    @property
    def wants_depth(self) -> bool: ...


class _ColourStamp:
    """What the synchronizer gets of a colour frame: its header (all it reads) and its image size,
    not the image (the synchronizer's queue would otherwise hold DEPTH_QUEUE camera images)."""

    __slots__ = ("header", "wh")

    def __init__(self, header, wh: tuple[int, int]):
        self.header, self.wh = header, wh


class DepthPairing:
    """The depth topic (``depth``, or ``depth/compressed`` with ``image_transport: compressed``),
    paired with the colour frames by header stamp; the node's depth scale reads it.

    ``consumer`` (set by whoever pairs this with a ``RobotFrames``) says whether a scale round is
    open (``wants_depth``): only then is a pair's depth decoded. Bad input
    is counted per kind and logged once (``counts``, ``/diagnostics``), never per frame: depth of
    another encoding, size or aspect ratio, depth without a colour partner, colour without depth.
    """

    def __init__(self, node, settings: SettingsSource, base: str = "depth"):
        from .depth_io import GridCache

        self._node = node
        self._base = base  # the topic before remapping: depth, or <camera>/depth
        self._settings = settings
        self.consumer: Optional[DepthConsumer] = None
        self._grid = GridCache(width=self._model_width, max_height=self._model_max_height)
        self._lock = threading.Lock()
        self._sub = None
        self._sync = None
        self._colour_in = None
        self.topic = ""
        self._kept: collections.OrderedDict = collections.OrderedDict()  # colour stamp ns -> grid [h', w']
        self._waiting_depth: collections.OrderedDict = collections.OrderedDict()  # depth stamps not paired yet
        self._waiting_colour: collections.OrderedDict = collections.OrderedDict()
        self._colour_seen: collections.deque = collections.deque(maxlen=4 * DEPTH_KEPT)  # received colour stamps
        self.counts: collections.Counter = collections.Counter()  # received, paired, and the bad kinds
        self.last_problem = ""
        self._logged: set[str] = set()

    @property
    def subscribed(self) -> bool:
        return self._sub is not None

    def _model_width(self) -> int:
        return self._settings.current.image_width

    def _model_max_height(self) -> int:
        settings = self._settings.current
        return planned_height(settings.image_width, settings.camera_aspect)

    def _wanted(self) -> bool:
        consumer = self.consumer
        return consumer is not None and consumer.wants_depth

    def resolve_topic(self) -> str:
        return transport_topic(self._node, self._base, self._settings.current.image_transport)

    def subscribe(self, qos) -> None:
        """(Re-)create the depth subscription and the synchronizer (same QoS as the colour topic)."""
        import message_filters

        self.unsubscribe()
        settings = self._settings.current
        self.topic = self.resolve_topic()
        compressed = settings.image_transport == "compressed"
        self._sub = message_filters.Subscriber(self._node, CompressedImage if compressed else Image, self.topic,
                                               qos_profile=qos)
        self._sub.registerCallback(self._on_depth)  # first: it sees every depth message before the pairing
        self._colour_in = message_filters.SimpleFilter()
        self._sync = message_filters.ApproximateTimeSynchronizer(
            [self._colour_in, self._sub], DEPTH_QUEUE, settings.depth_sync_slop)
        self._sync.registerCallback(self._on_pair)

    def unsubscribe(self) -> None:
        if self._sub is not None:
            self._node.destroy_subscription(self._sub.sub)
            self._sub = self._sync = self._colour_in = None

    # ------------------------------------------------------------------ executor thread
    def colour(self, header, wh: tuple[int, int]) -> None:
        """An accepted colour frame (from the image callback): offer its stamp for pairing."""
        colour_in = self._colour_in
        if colour_in is None:
            return
        with self._lock:
            self._remember(self._waiting_colour, _stamp_ns(header))
            self._colour_seen.append(_stamp_ns(header))
        colour_in.signalMessage(_ColourStamp(header, wh))  # may pair at once (depth came first)

    def _on_depth(self, msg) -> None:
        with self._lock:
            self.counts["received"] += 1
            self._remember(self._waiting_depth, _stamp_ns(msg.header))

    def _remember(self, waiting: collections.OrderedDict, ns: int) -> None:
        waiting[ns] = True
        while len(waiting) > DEPTH_KEPT:
            waiting.popitem(last=False)

    def _on_pair(self, colour: _ColourStamp, depth) -> None:
        c_ns, d_ns = _stamp_ns(colour.header), _stamp_ns(depth.header)
        slop = self._settings.current.depth_sync_slop
        slop_ns = int(slop * 1e9)
        with self._lock:
            self.counts["paired"] += 1
            self._waiting_colour.pop(c_ns, None)
            self._waiting_depth.pop(d_ns, None)
            # both streams arrive in stamp order: what is older than this pair by more than the slop
            # will never find a partner now
            lost_depth = self._expire(self._waiting_depth, c_ns - slop_ns)
            lost_colour = self._expire(self._waiting_colour, d_ns - slop_ns)
            offset = [ns for ns in lost_depth if self._colour_near(ns)]
        if lost_depth:
            n_lost = len(lost_depth) - len(offset)
            if offset:
                cause = (f"{len(offset)} had a colour frame near their stamp but beyond the slop: the stamps of "
                         f"{self.topic} and the colour topic differ by more than depth_sync_slop")
            else:
                cause = ""
            if n_lost:
                cause += ("; " if cause else "") + (
                    f"{n_lost} had no colour frame at their time: the colour image never reached the node (lost "
                    "messages: the middleware dropped it, e.g. best_effort on a loaded host; 'input' in "
                    "/diagnostics counts them; qos_reliability reliable keeps them)")
            self._bad("unpaired_depth", f"{len(lost_depth)} depth image(s) without a colour partner within "
                                        f"depth_sync_slop {slop} s: {cause}",
                      len(lost_depth))
        if lost_colour:
            lost_colour = len(lost_colour)
            self._bad("colour_without_depth", f"{lost_colour} colour frame(s) without a depth partner on "
                                              f"{self.topic} within depth_sync_slop", lost_colour)
        if not self._wanted():
            return
        from .depth_io import BadDepth, RefusedDepth, compressed_depth_grid, image_depth_grid

        try:
            if isinstance(depth, CompressedImage):
                kept = compressed_depth_grid(depth, colour.wh, self._grid)
            else:
                kept = image_depth_grid(depth, colour.wh, self._grid)
        except BadDepth as exc:
            self._bad(f"bad_{exc.kind}", f"depth image at {stamp_sec(depth.header.stamp):.3f} not used: {exc}")
            kept = RefusedDepth(str(exc))
        with self._lock:
            self._kept[c_ns] = kept
            while len(self._kept) > DEPTH_KEPT:
                self._kept.popitem(last=False)

    @staticmethod
    def _expire(waiting: collections.OrderedDict, before_ns: int) -> list[int]:
        old = [ns for ns in waiting if ns < before_ns]
        for ns in old:
            del waiting[ns]
        return old

    def _colour_near(self, depth_ns: int) -> bool:
        """Whether a received colour frame lies closer to ``depth_ns`` than half the colour period: then
        the pair failed on the stamps, not on a lost colour image (called with the lock held)."""
        seen = sorted(self._colour_seen)
        if len(seen) < 2:
            return bool(seen)
        gaps = sorted(b - a for a, b in zip(seen, seen[1:]) if b > a)
        half_period = gaps[len(gaps) // 2] / 2 if gaps else 0
        return min(abs(ns - depth_ns) for ns in seen) < half_period

    def _bad(self, kind: str, text: str, n: int = 1) -> None:
        """Counted every time, logged once per kind: a steady fault must not flood the log."""
        with self._lock:
            self.counts[kind] += n
            self.last_problem = text
            first = kind not in self._logged
            self._logged.add(kind)
        if first:
            self._node.get_logger().warning(text + " (reported once; counted in /diagnostics 'scale')")

    # ------------------------------------------------------------------ inference thread
    def take(self, header) -> Optional[object]:
        """The sensor depth (metres, under the model grid) paired with the colour frame ``header``,
        once: a grid, a ``RefusedDepth`` (the partner came and was refused), or None (none yet)."""
        with self._lock:
            return self._kept.pop(_stamp_ns(header), None)

    def report(self) -> tuple[dict, str]:
        with self._lock:
            return dict(self.counts), self.last_problem


class ImageIntake:
    """The node's image subscription and its callback.

    ``sink(frame)`` takes each accepted frame (the next stage's one-slot queue); ``state`` is the
    node's lifecycle state (frames are let in only while active).
    """

    def __init__(self, node, settings: SettingsSource, ledger: FrameLedger, input_size: InputSize,
                 sink: Callable[[Frame], None], state: NodeState, depth: Optional[DepthPairing] = None,
                 base: str = "image"):
        from .image_io import UnsupportedImage, message_to_rgb

        self._node = node
        self._base = base  # the topic before remapping: image, or <camera>/image
        self._settings = settings
        self._ledger = ledger
        self._input_size = input_size
        self._sink = sink
        self._state = state
        self._message_to_rgb = message_to_rgb
        self._unsupported_image = UnsupportedImage
        self._sub = None
        self.depth = depth  # the depth topic's pairing, subscribed with the images for scale_source depth
        self.topic = self.resolve_topic()

    @property
    def subscribed(self) -> bool:
        return self._sub is not None

    def resolve_topic(self) -> str:
        return transport_topic(self._node, self._base, self._settings.current.image_transport)

    def resubscribe(self) -> None:
        """``image_transport`` or ``qos_reliability`` changed: a subscription is re-created at once;
        without one (not configured) only the topic is resolved again for the next ``subscribe``."""
        if self.subscribed:
            self.subscribe()
            self._node.get_logger().info(f"image subscription re-created on {self.topic}")
        else:
            self.topic = self.resolve_topic()

    def subscribe(self) -> None:
        """(Re-)create the subscription from the current parameters."""
        self.unsubscribe()
        settings = self._settings.current
        if settings.qos_reliability == "reliable":
            qos = QoSProfile(depth=5, reliability=QoSReliabilityPolicy.RELIABLE,
                             history=QoSHistoryPolicy.KEEP_LAST, durability=QoSDurabilityPolicy.VOLATILE)
        else:
            qos = rclpy.qos.qos_profile_sensor_data
        self.topic = self.resolve_topic()
        msg_type = CompressedImage if settings.image_transport == "compressed" else Image
        # Losses before the node: what the middleware reports (message lost where the RMW supports it,
        # a publisher whose QoS cannot match ours, another message type on the topic).
        events = SubscriptionEventCallbacks(
            message_lost=self._on_messages_lost, incompatible_qos=self._on_incompatible_qos,
            incompatible_type=self._on_incompatible_type)
        self._sub = self._node.create_subscription(msg_type, self.topic, self.on_image, qos, event_callbacks=events)
        if self.depth is not None and settings.scale_source == "depth":
            self.depth.subscribe(qos)

    def unsubscribe(self) -> None:
        if self._sub is not None:
            self._node.destroy_subscription(self._sub)
            self._sub = None
        if self.depth is not None:
            self.depth.unsubscribe()

    # ------------------------------------------------------------------ middleware events
    def _on_messages_lost(self, info) -> None:
        self._ledger.note_qos_event(f"{info.total_count_change} image(s) lost by the middleware before the node",
                                    qos_messages_lost=info.total_count)

    def _on_incompatible_qos(self, info) -> None:
        text = (f"a publisher on {self.topic} offers an incompatible QoS (policy id {info.last_policy_kind}); "
                "set qos_reliability to match it")
        self._ledger.note_qos_event(text, qos_incompatible=info.total_count)
        self._node.get_logger().warning(text, throttle_duration_sec=10.0)

    def _on_incompatible_type(self, info) -> None:
        text = f"a publisher on {self.topic} sends another message type"
        self._ledger.note_qos_event(text)
        self._node.get_logger().warning(text, throttle_duration_sec=10.0)

    # ------------------------------------------------------------------ the callback
    def on_image(self, msg) -> None:
        t0 = time.perf_counter()
        self._ledger.received()
        state = self._state
        if not state.active:
            self._ledger.finish(msg.header, FrameStatus.DROPPED_INACTIVE,
                                f"the node is {state.label}: activate it to process frames")
            return
        try:
            rgb = self._convert(msg)
        except InputRejected as exc:
            self._ledger.reject(msg.header, exc.kind, str(exc))
            return
        wh = (int(rgb.shape[1]), int(rgb.shape[0]))
        if self.depth is not None:
            self.depth.colour(msg.header, wh)
        self._sink(Frame(header=msg.header, rgb=rgb, wh=wh, received=t0, convert_ms=(time.perf_counter() - t0) * 1e3))

    def _convert(self, msg):
        """The message as RGB uint8 [H0, W0, 3] of the session's size, or ``InputRejected``."""
        try:
            rgb = self._message_to_rgb(msg)  # every structural check of the message lives there
        except self._unsupported_image as exc:
            raise InputRejected(exc.kind, str(exc)) from exc
        except (ValueError, TypeError) as exc:  # a decoder that fails in its own words
            raise InputRejected("unsupported", f"cannot convert: {exc}") from exc
        # checked here, before any queue: a frame of the wrong size never waits for the model
        self._input_size.check(int(rgb.shape[1]), int(rgb.shape[0]))
        return rgb
