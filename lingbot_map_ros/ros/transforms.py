"""tf2 for the node, and the only module that touches it: the robot's transforms in, the node's out.

* In: a ``tf2_ros.Buffer`` fed by a ``TransformListener`` (``/tf`` and ``/tf_static``); ``lookup``
  asks it for a transform at an image stamp, waiting up to ``tf_timeout``, and says which link is
  missing when it does not come (``NoTransform``). A moving transform straight from the target (the
  robot's ``odom -> base_link``) is answered from the tree's copy of its samples (``tf_samples``), the
  way tf2 answers it, without tf2_py building a message per lookup.
* Out: a ``tf2_ros.TransformBroadcaster``'s /tf publisher (``send``; the message as bytes from a
  checked template, ``messages.tf_encoded``). The node's correction (its one edge) is kept and, with
  ``transform_publish_period`` > 0, re-sent by a timer stamped ``now + transform_tolerance``
  (AMCL and slam_toolbox do the same), so a tf2 consumer looking up "now" never has to extrapolate
  between frames; the value changes only when a frame is placed (``send``), ``forget`` drops it
  (a new session: its world is not the old one's), ``repeating`` pauses it (the node inactive).
* One edge, one publisher: an echo of the node's own edge is recognised by its stamp and value
  (each send is remembered for a while); a transform of that edge that is not one of them comes
  from another node (``foreign_edges``), which ``EdgePublishers`` then names.
* The one-parent rule: a TF tree is a tree, so before the node publishes ``parent -> child`` it asks
  whether ``child`` already has another parent (``parent_of``), e.g. a camera driver's
  ``camera_link -> camera_color_optical_frame``; then the node publishes nothing for it.

Why the listener leaves the node's own edges out of its Buffer: tf2 keeps one parent per frame and a
newer transform replaces the parent, so the node's own broadcasts, coming back over ``/tf``, would
overwrite the robot's parent in the node's own view, and the check could no longer see it. The
edges the node publishes are ``claim``ed first and never enter the Buffer; the node never needs to
look them up (they are its own estimate). Every other transform is recorded with its parent as it
arrives, which is what ``parent_of`` answers from.
"""
from __future__ import annotations

import collections
import threading
import time
from typing import Callable, Optional

import numpy as np
from builtin_interfaces.msg import Time as TimeMsg
from rclpy.duration import Duration
from rclpy.time import Time
from tf2_ros import Buffer, TransformBroadcaster, TransformException, TransformListener

from ..core.geometry import transform_matrix
from . import messages as rosmsg
from .outbox import deferred, send_built
from .tf_samples import EdgeSamples

AUTHORITY = "lingbot_map"
BUFFER_SECONDS = 10.0  # tf2's default cache: lookups at stamps up to this old succeed
SENDS_KEPT = 1024  # own sends remembered per edge to tell their echo from another publisher's transform
ECHO_ATOL = 1e-6  # an echo carries the sent values (float64 both ways); another node's differ or come at other stamps


class NoTransform(Exception):
    """``target <- source`` could not be looked up at the stamp (``link`` names it as TF does)."""

    def __init__(self, target: str, source: str, reason: str):
        self.link = f"{target} -> {source}"
        super().__init__(f"no transform {self.link}: {reason}")


class _Buffer(Buffer):
    """A Buffer whose ``clear`` (tf2_ros clears it on a jump back in time) runs through ``on_clear``, which
    empties the tree's copy of its samples in the same step."""

    def __init__(self, cache_time: Duration, on_clear: Callable[[Callable[[], None]], None]):
        super().__init__(cache_time=cache_time)
        self._on_clear = on_clear

    def clear(self) -> None:
        self._on_clear(super().clear)


class _TreeListener(TransformListener):
    """A TransformListener whose messages go through ``FrameTree.take`` (own edges left out, parents
    recorded) before they reach the Buffer."""

    def __init__(self, tree: "FrameTree", node):
        self._tree = tree
        super().__init__(tree.buffer, node)

    def callback(self, data) -> None:
        self._tree.take(data.transforms, static=False)

    def static_callback(self, data) -> None:
        self._tree.take(data.transforms, static=True)


class FrameTree:
    """The TF tree as the node sees it (Buffer, parents) and what the node adds to it.

    Thread use: the listener runs on the executor thread, ``lookup``/``send``/``parent_of`` on the
    inference thread (tf2's BufferCore has its own lock; the parent record has one here).
    ``node`` None: a recording's tree (``lingbot_map_offline --bag``): fed with the bag's transforms
    through ``take``, looked up without waiting, nothing published.
    """

    def __init__(self, node, buffer_seconds: float = BUFFER_SECONDS, repeat_period: float = 0.0,
                 tolerance: Callable[[], float] = lambda: 0.0):
        self._node = node
        self.buffer = _Buffer(Duration(seconds=buffer_seconds), self._cleared)
        self._buffer_seconds = buffer_seconds
        self._lock = threading.Lock()
        self._own: set[tuple[str, str]] = set()  # (parent, child) edges this node publishes
        self._parents: dict[str, tuple[str, float, bool]] = {}  # child -> (parent, last seen, static)
        # lookups whose whole chain is static (a camera mount): (target, source) -> (matrix, chain children);
        # dropped as soon as any transform for one of those children arrives
        self._static_lookups: dict[tuple[str, str], tuple[np.ndarray, frozenset]] = {}
        # the moving transforms the Buffer holds, per child (a child ever sent static: one that answers nothing)
        self._samples: dict[str, EdgeSamples] = {}
        self._cache_ns = Duration(seconds=buffer_seconds).nanoseconds
        # own sends per edge: stamp ns -> (translation, quaternion), the oldest forgotten first
        self._sent: dict[tuple[str, str], collections.OrderedDict] = {}
        self._foreign: dict[tuple[str, str], float] = {}  # own edge -> time.monotonic() another node's was seen
        self._latest: Optional[tuple[str, str, tuple]] = None  # the correction the timer re-sends (its values)
        self.repeating = False  # the node sets it while active
        self._tolerance = tolerance
        # node None: a recording's tree (lingbot_map_offline --bag), fed through ``take`` and never published
        self._listener = _TreeListener(self, node) if node is not None else None
        self._broadcaster = TransformBroadcaster(node) if node is not None else None
        # its /tf publisher, sending on the node's outbox thread (outbox.py)
        self._tf_pub = deferred(node, self._broadcaster.pub_tf) if node is not None else None
        self._clock = node.get_clock() if node is not None else None  # the node's clock (ROS time) for ``_ahead``
        self._repeat_timer = (node.create_timer(repeat_period, self._repeat)
                              if node is not None and repeat_period > 0 else None)

    # ------------------------------------------------------------------ in (executor thread)
    def take(self, transforms, static: bool) -> None:
        """The transforms of one /tf or /tf_static message: record parents, feed the Buffer."""
        now = time.monotonic()
        for t in transforms:
            parent, child = t.header.frame_id.lstrip("/"), t.child_frame_id.lstrip("/")
            with self._lock:  # the Buffer and the copy of its samples change together (``lookup`` reads both)
                if (parent, child) in self._own:
                    if not self._is_echo((parent, child), t):
                        self._foreign[(parent, child)] = now
                    continue
                self._parents[child] = (parent, now, static)
                if self._static_lookups:
                    self._static_lookups = {k: v for k, v in self._static_lookups.items() if child not in v[1]}
                try:
                    if static:
                        self.buffer.set_transform_static(t, AUTHORITY)
                    else:
                        self.buffer.set_transform(t, AUTHORITY)
                except TransformException as exc:  # a malformed transform (NaN, empty frame id): tf2 refuses it
                    refused = exc
                else:
                    refused = None
                self._copy(t, parent, child, static or refused is not None)
            if refused is not None and self._node is not None:
                self._node.get_logger().warning(f"TF transform {parent} -> {child} refused by tf2: {refused}",
                                                throttle_duration_sec=10.0)

    def _cleared(self, clear: Callable[[], None]) -> None:
        """The Buffer empties every cache it holds: the copies start empty with it (a copy that answers nothing
        stays so: a static cache is not emptied like a moving one)."""
        with self._lock:
            clear()
            self._samples = {child: edge if edge.lost else EdgeSamples(self._cache_ns)
                             for child, edge in self._samples.items()}

    def _copy(self, t, parent: str, child: str, unknown: bool) -> None:
        """The sample as the Buffer's moving cache of ``child`` holds it (called with the lock held). ``unknown``:
        a static transform (tf2 keeps it in another kind of cache) or one tf2 raised on: the copy of that child
        answers nothing from then on."""
        edge = self._samples.get(child)
        if edge is None:
            edge = self._samples[child] = EdgeSamples(self._cache_ns)
        if unknown:
            edge.lost = True
            return
        tr, q = t.transform.translation, t.transform.rotation
        edge.insert(t.header.stamp.sec * 10**9 + t.header.stamp.nanosec, parent, child,
                    (tr.x, tr.y, tr.z, q.x, q.y, q.z, q.w))

    def _is_echo(self, edge: tuple[str, str], t) -> bool:
        """Whether ``t`` is one of the node's own sends of ``edge`` (called with the lock held)."""
        sent = self._sent.get(edge)
        values = None if sent is None else sent.get(Time.from_msg(t.header.stamp).nanoseconds)
        if values is None:
            return False
        tr, q = t.transform.translation, t.transform.rotation
        got = (tr.x, tr.y, tr.z, q.x, q.y, q.z, q.w)
        return all(abs(a - b) <= ECHO_ATOL for a, b in zip(got, values))

    def foreign_edges(self, within: float) -> dict[tuple[str, str], float]:
        """The node's own edges that another publisher sent within the last ``within`` s: edge -> s ago."""
        now = time.monotonic()
        with self._lock:
            return {edge: now - seen for edge, seen in self._foreign.items() if now - seen <= within}

    def parent_of(self, child: str) -> Optional[str]:
        """The parent another node gives ``child`` in the TF tree (None: none). A moving parent not
        heard of for longer than the Buffer keeps transforms is gone."""
        with self._lock:
            entry = self._parents.get(child)
        if entry is None:
            return None
        parent, seen, static = entry
        if not static and time.monotonic() - seen > self._buffer_seconds:
            return None
        return parent

    def claim(self, parent: str, child: str) -> None:
        """``parent -> child`` is the node's own edge from now on: its echo stays out of the Buffer."""
        with self._lock:
            self._own.add((parent, child))

    # ------------------------------------------------------------------ lookups (inference thread)
    def lookup(self, target: str, source: str, stamp, timeout: float) -> np.ndarray:
        """``T_target_source`` [4, 4] at ``stamp`` (a ``builtin_interfaces/Time``), waiting up to
        ``timeout`` s for it; ``NoTransform`` naming the link when it does not come. A chain of static
        transforms only (a camera mount) is looked up once and reused until one of its links changes."""
        with self._lock:
            cached = self._static_lookups.get((target, source))
            # tf2's own answer from the copy of the samples: source's parent is target, target has none
            edge = self._samples.get(source) if cached is None and target not in self._parents else None
            values = edge.lookup(stamp.sec * 10**9 + stamp.nanosec, target) if edge is not None else None
        if cached is not None:
            return cached[0]
        if values is not None:
            return transform_matrix(values[:3], values[3:])
        try:
            try:  # one call into tf2 when the transform is there (the usual case); tf2 reads the stamp message
                t = self.buffer.lookup_transform_core(target, source, stamp)
            except TransformException:
                if self._node is None:
                    raise
                # not (yet) there: tf2_ros waits up to the timeout for it
                t = self.buffer.lookup_transform(target, source, Time.from_msg(stamp),
                                                 Duration(seconds=max(0.0, float(timeout))))
        except TransformException as exc:
            reason = " ".join(str(exc).split()) or type(exc).__name__
            raise NoTransform(target, source, f"{reason} (waited {timeout:g} s)") from None
        tr, q = t.transform.translation, t.transform.rotation
        matrix = transform_matrix((tr.x, tr.y, tr.z), (q.x, q.y, q.z, q.w))
        chain = self._static_chain(target, source)
        if chain is not None:
            matrix.setflags(write=False)  # shared by every later lookup of this pair
            with self._lock:
                self._static_lookups[(target, source)] = (matrix, chain)
        return matrix

    def _static_chain(self, target: str, source: str) -> Optional[frozenset]:
        """The child frames linking ``source`` up to ``target`` when every link is static, else None
        (down-and-up chains through a common ancestor are not cached: they are rare for a mount)."""
        with self._lock:
            children, frame = [], source
            while frame != target:
                entry = self._parents.get(frame)
                if entry is None or not entry[2] or len(children) > 64:
                    return None
                children.append(frame)
                frame = entry[0]
        return frozenset(children)

    # ------------------------------------------------------------------ out
    def send(self, parent: str, child: str, stamp, matrix: np.ndarray, repeat: bool = False) -> None:
        """A placed frame's edge at its image stamp. ``repeat`` (a correction: ``world -> odom`` or
        ``world -> base``, not a camera pose): kept for the timer, and with the timer on sent at once
        stamped ``now + transform_tolerance`` too (so the newest future-stamped sample carries it), in the
        same /tf message."""
        values = rosmsg.transform_values(matrix)  # once: the timer re-sends these numbers
        with self._lock:
            if repeat:
                self._latest = (parent, child, values)
        stamps = [stamp]
        if repeat and self._repeat_timer is not None and self.repeating:
            stamps.append(self._ahead())
        self._publish(parent, child, stamps, values)

    def forget(self) -> None:
        """A new session: the old correction places nothing in the new world; nothing is re-sent until
        the new session places a frame."""
        with self._lock:
            self._latest = None

    def _repeat(self) -> None:
        """The timer (executor thread): the latest correction again, stamped ``now + tolerance``."""
        with self._lock:
            latest = self._latest if self.repeating else None
        if latest is None:
            return
        self._publish(latest[0], latest[1], [self._ahead()], latest[2])

    def _ahead(self):
        """``now + transform_tolerance`` as a stamp: what a repeated correction carries."""
        # (now + Duration(seconds=tolerance)).to_msg() in integers, the clock read from its handle as Clock.now
        # reads it: no rclpy Time objects
        handle = self._clock.handle
        with handle:
            now = handle.get_now().nanoseconds
        ns = now + int(max(0.0, float(self._tolerance())) * 1e9)
        sec, nanosec = divmod(ns, 10**9)
        return TimeMsg(sec=sec, nanosec=nanosec)

    def _publish(self, parent: str, child: str, stamps: list, values: tuple) -> None:
        """``parent -> child`` with ``transform_values`` ``values`` at each of ``stamps``, in one /tf message
        (one send, through the broadcaster's own /tf publisher)."""
        with self._lock:  # remembered before it goes out: its echo may come back at once
            sent = self._sent.setdefault((parent, child), collections.OrderedDict())
            for s in stamps:
                sent[s.sec * 10**9 + s.nanosec] = values
            while len(sent) > SENDS_KEPT:
                sent.popitem(last=False)
        if self._tf_pub is not None:  # the broadcaster's publisher, given bytes from a checked template (messages.py)
            send_built(self._tf_pub, rosmsg.tf_encoded, values, stamps, parent, child)

    def destroy(self) -> None:
        if self._node is None:
            return
        if self._repeat_timer is not None:
            self._node.destroy_timer(self._repeat_timer)
        self._listener.unregister()
        self._node.destroy_publisher(self._broadcaster.pub_tf)


__all__ = ["FrameTree", "NoTransform"]
