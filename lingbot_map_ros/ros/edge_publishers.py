"""Who else publishes the node's own /tf edge, by name.

tf2 keeps no publisher per transform here (rclpy's TransformListener files every transform under one
authority, and a /tf message carries no sender), so ``transforms.FrameTree`` can tell that another
node sends the node's edge (a transform that is not its own echo) but not which node. The name comes
from two places:

* another lingbot_map node says which edge it publishes in its ``/diagnostics`` ``tf`` status
  (``published_edge``, ``hardware_id`` = its fully qualified name): that node is named exactly;
* any other publisher (AMCL, slam_toolbox) is one of the ROS graph's ``/tf`` publishers other than
  this node: they are listed as candidates.
"""
from __future__ import annotations

import threading
import time

from diagnostic_msgs.msg import DiagnosticArray
from rclpy.qos import QoSProfile, QoSReliabilityPolicy

TF_STATUS = "lingbot_map: tf"  # diagnostics.DIAG_PREFIX + "tf", written out: diagnostics imports this side
CLAIM_KEY = "published_edge"


class EdgePublishers:
    """The edges other lingbot_map nodes say they publish, and the names for an edge of this node."""

    def __init__(self, node):
        self._node = node
        self._lock = threading.Lock()
        self._claims: dict[str, tuple[str, float]] = {}  # hardware_id -> (edge, time.monotonic() seen)
        self._sub = node.create_subscription(DiagnosticArray, "/diagnostics", self._take,
                                             QoSProfile(depth=50, reliability=QoSReliabilityPolicy.RELIABLE))

    def _own_name(self) -> str:
        return self._node.get_fully_qualified_name()

    def _take(self, msg: DiagnosticArray) -> None:
        own = self._own_name()
        now = time.monotonic()
        for status in msg.status:
            if status.name != TF_STATUS or status.hardware_id == own:
                continue
            edge = next((kv.value for kv in status.values if kv.key == CLAIM_KEY), "")
            with self._lock:
                self._claims[status.hardware_id] = (edge, now)

    def names(self, edge: str, within: float) -> str:
        """Who else publishes ``edge`` ("map -> odom"): the lingbot_map nodes that said so within
        ``within`` s, else the other /tf publishers of the graph as candidates."""
        now = time.monotonic()
        with self._lock:
            claimants = sorted(h for h, (e, seen) in self._claims.items() if e == edge and now - seen <= within)
        if claimants:
            return ", ".join(claimants)
        own = self._own_name()
        others = sorted({_join(i.node_namespace, i.node_name) for i in self._node.get_publishers_info_by_topic("/tf")}
                        - {own})
        return ("one of the other /tf publishers: " + ", ".join(others)) if others else "a node no longer in the graph"

    def destroy(self) -> None:
        self._node.destroy_subscription(self._sub)


def _join(namespace: str, name: str) -> str:
    return (namespace.rstrip("/") + "/" + name) if namespace else "/" + name


__all__ = ["EdgePublishers"]
