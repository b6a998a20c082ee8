"""The node's large messages (depth images, point clouds, the path) go out through a DDS participant of their own.

Why: Fast DDS gives each participant one shared-memory segment for everything its writers send (512 kB by
default, and the default is what ``ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST`` always gets). A sample larger
than that (a 518 x 392 float depth image is 812 kB, a point cloud several MB) goes in fragments that cycle
through the whole segment, and the buffers of the participant's small samples that a reader has not taken
yet are reclaimed: those samples are lost and come only when the writer's next heartbeat (every 3 s) asks
what is missing. With a reader on the large topic, one sample in ten of the small ones comes seconds
late; from a second participant, none does. A nav2 stack reading the node's ``map -> odom`` while nvblox
reads ``~/depth`` would get its transform seconds late.

So every publisher of a large message is created on a second rclpy context (its own participant and
segment) through ``LargeOutputs``, in a node named ``<node>_large_outputs`` in the node's namespace. The
topic name is resolved by the node itself first, so its namespace and remaps apply as to any of its topics;
``ros2 topic info -v`` names that node as the publisher. Nothing on it is spun: publishing needs no executor.
"""
from __future__ import annotations

import threading
from typing import Optional

SUFFIX = "_large_outputs"


def participant_node(name: str, domain_id: int, **node_options):
    """``(node, context)``: an rclpy node in a context of its own, i.e. its own DDS participant and
    shared-memory segment, on ``domain_id``; no command line, no signal handlers (its owner shuts it down).
    For the node's large outputs, and for tools that play a robot's separate processes (camera drivers
    beside TF publishers)."""
    import rclpy
    from rclpy.context import Context
    from rclpy.signals import SignalHandlerOptions

    context = Context()
    rclpy.init(args=[], context=context, domain_id=domain_id, signal_handler_options=SignalHandlerOptions.NO)
    return rclpy.create_node(name, context=context, **node_options), context


def close_participant(node, context) -> None:
    """The node of ``participant_node`` destroyed, then its context shut down (either may be None: not made).
    In that order: a context shut down under a live node leaves the node's handles to a closed participant."""
    if node is not None:
        node.destroy_node()
    if context is not None:
        context.try_shutdown()


class LargeOutputs:
    """The node's second participant, made with its first large publisher and closed with the node."""

    def __init__(self, node):
        self._node = node
        self._lock = threading.Lock()
        self._context = None
        self._second = None  # the rclpy node of the second context

    @property
    def node_name(self) -> str:
        return self._node.get_name() + SUFFIX

    def _second_node(self):
        with self._lock:
            if self._second is None:
                # the node's remaps are applied by resolving names in the node; the node's shutdown closes it
                self._second, self._context = participant_node(
                    self.node_name, self._node.context.get_domain_id(), namespace=self._node.get_namespace(),
                    use_global_arguments=False, enable_rosout=False, start_parameter_services=False)
            return self._second

    def create_publisher(self, msg_type, topic: str, qos):
        """A publisher of ``topic`` (as the node would name it: ``~/depth``, ``depth``) on the second participant."""
        return self._second_node().create_publisher(msg_type, self._node.resolve_topic_name(topic), qos)

    def destroy_publisher(self, publisher) -> None:
        with self._lock:
            second = self._second
        if second is not None:
            second.destroy_publisher(publisher)

    def close(self) -> None:
        """Destroy the second node and shut its context down (idempotent)."""
        with self._lock:
            second, context, self._second, self._context = self._second, self._context, None, None
        close_participant(second, context)


def large_publisher(node, msg_type, topic: str, qos):
    """A large message's publisher: on the node's ``LargeOutputs`` when it has one, else on the node itself
    (a node of another kind, e.g. a test's stand-in)."""
    outputs: Optional[LargeOutputs] = getattr(node, "large_outputs", None)
    if outputs is None:
        return node.create_publisher(msg_type, topic, qos)
    return outputs.create_publisher(msg_type, topic, qos)


def destroy_large_publisher(node, publisher) -> None:
    outputs: Optional[LargeOutputs] = getattr(node, "large_outputs", None)
    if outputs is None:
        node.destroy_publisher(publisher)
    else:
        outputs.destroy_publisher(publisher)
