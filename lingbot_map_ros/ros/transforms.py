"""tf2 for the node, and the only module that touches it: the robot's transforms in, the node's out.

* In: a ``tf2_ros.Buffer`` fed by a ``TransformListener`` (``/tf`` and ``/tf_static``); ``lookup``
  asks it for a transform at an image stamp, waiting up to ``tf_timeout``, and says which link is
  missing when it does not come (``NoTransform``).
* Out: a ``tf2_ros.TransformBroadcaster`` (``send``).
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

import threading
import time
from typing import Optional

import numpy as np
from rclpy.duration import Duration
from rclpy.time import Time
from tf2_ros import Buffer, TransformBroadcaster, TransformException, TransformListener

from ..core.geometry import transform_matrix
from . import messages as rosmsg

AUTHORITY = "lingbot_map"
BUFFER_SECONDS = 10.0  # tf2's default cache: lookups at stamps up to this old succeed


class NoTransform(Exception):
    """``target <- source`` could not be looked up at the stamp (``link`` names it as TF does)."""

    def __init__(self, target: str, source: str, reason: str):
        self.link = f"{target} -> {source}"
        super().__init__(f"no transform {self.link}: {reason}")


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
    """

    def __init__(self, node, buffer_seconds: float = BUFFER_SECONDS):
        self._node = node
        self.buffer = Buffer(cache_time=Duration(seconds=buffer_seconds))
        self._buffer_seconds = buffer_seconds
        self._lock = threading.Lock()
        self._own: set[tuple[str, str]] = set()  # (parent, child) edges this node publishes
        self._parents: dict[str, tuple[str, float, bool]] = {}  # child -> (parent, last seen, static)
        # lookups whose whole chain is static (a camera mount): (target, source) -> (matrix, chain children);
        # dropped as soon as any transform for one of those children arrives
        self._static_lookups: dict[tuple[str, str], tuple[np.ndarray, frozenset]] = {}
        self._listener = _TreeListener(self, node)
        self._broadcaster = TransformBroadcaster(node)

    # ------------------------------------------------------------------ in (executor thread)
    def take(self, transforms, static: bool) -> None:
        """The transforms of one /tf or /tf_static message: record parents, feed the Buffer."""
        now = time.monotonic()
        for t in transforms:
            parent, child = t.header.frame_id.lstrip("/"), t.child_frame_id.lstrip("/")
            with self._lock:
                if (parent, child) in self._own:
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
                self._node.get_logger().warning(f"TF transform {parent} -> {child} refused by tf2: {exc}",
                                                throttle_duration_sec=10.0)

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
        if cached is not None:
            return cached[0]
        when = Time.from_msg(stamp)
        try:
            if self.buffer.can_transform_core(target, source, when)[0]:  # the usual case: no waiting machinery
                t = self.buffer.lookup_transform_core(target, source, when)
            else:  # not (yet) there: tf2_ros waits up to the timeout for it
                t = self.buffer.lookup_transform(target, source, when, Duration(seconds=max(0.0, float(timeout))))
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
    def send(self, parent: str, child: str, stamp, matrix: np.ndarray) -> None:
        self._broadcaster.sendTransform(rosmsg.transform_stamped(matrix, stamp, parent, child))

    def destroy(self) -> None:
        self._listener.unregister()
        self._node.destroy_publisher(self._broadcaster.pub_tf)


__all__ = ["FrameTree", "NoTransform"]
