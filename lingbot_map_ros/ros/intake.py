"""The image subscription: which topic, which QoS, what the middleware reports, and the image callback.

The callback runs on the executor thread and stays cheap: count the frame, convert the message to
RGB (every structural check lives in ``image_io``), ask the session's input size
(``InputSize.check``) and hand the frame on. Anything it cannot use ends here as REJECTED_INPUT, so a
bad frame never waits in a queue. Frames received while the node is not active end DROPPED_INACTIVE.
"""
from __future__ import annotations

import time
from typing import Callable, Mapping

import rclpy.qos
from rclpy.event_handler import SubscriptionEventCallbacks
from rclpy.qos import QoSDurabilityPolicy, QoSHistoryPolicy, QoSProfile, QoSReliabilityPolicy
from sensor_msgs.msg import CompressedImage, Image

from lingbot_map_ros.msg import FrameStatus

from .frames import Frame, FrameLedger, InputRejected
from .input_size import InputSize


class ImageIntake:
    """The node's image subscription and its callback.

    ``sink(frame)`` takes each accepted frame (the next stage's one-slot queue); ``is_active()`` and
    ``state_label()`` are the node's lifecycle state as the callback needs it.
    """

    def __init__(self, node, values: Mapping, ledger: FrameLedger, input_size: InputSize,
                 sink: Callable[[Frame], None], is_active: Callable[[], bool], state_label: Callable[[], str]):
        from .image_io import UnsupportedImage, message_to_rgb

        self._node = node
        self._values = values
        self._ledger = ledger
        self._input_size = input_size
        self._sink = sink
        self._is_active = is_active
        self._state_label = state_label
        self._message_to_rgb = message_to_rgb
        self._unsupported_image = UnsupportedImage
        self._sub = None
        self.topic = self.resolve_topic()

    @property
    def subscribed(self) -> bool:
        return self._sub is not None

    def resolve_topic(self) -> str:
        node = self._node
        if self._values["image_transport"] != "compressed":
            return node.resolve_topic_name("image")
        # image_transport convention: remapping 'image' also moves 'image/compressed', unless
        # 'image/compressed' is remapped itself.
        explicit = node.resolve_topic_name("image/compressed")
        if explicit != node.resolve_topic_name("image/compressed", only_expand=True):
            return explicit
        return node.resolve_topic_name("image") + "/compressed"

    def subscribe(self) -> None:
        """(Re-)create the subscription from the current parameters."""
        self.unsubscribe()
        if self._values["qos_reliability"] == "reliable":
            qos = QoSProfile(depth=5, reliability=QoSReliabilityPolicy.RELIABLE,
                             history=QoSHistoryPolicy.KEEP_LAST, durability=QoSDurabilityPolicy.VOLATILE)
        else:
            qos = rclpy.qos.qos_profile_sensor_data
        self.topic = self.resolve_topic()
        msg_type = CompressedImage if self._values["image_transport"] == "compressed" else Image
        # Losses before the node: what the middleware reports (message lost where the RMW supports it,
        # a publisher whose QoS cannot match ours, another message type on the topic).
        events = SubscriptionEventCallbacks(
            message_lost=self._on_messages_lost, incompatible_qos=self._on_incompatible_qos,
            incompatible_type=self._on_incompatible_type)
        self._sub = self._node.create_subscription(msg_type, self.topic, self.on_image, qos, event_callbacks=events)

    def unsubscribe(self) -> None:
        if self._sub is not None:
            self._node.destroy_subscription(self._sub)
            self._sub = None

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
        if not self._is_active():
            self._ledger.finish(msg.header, FrameStatus.DROPPED_INACTIVE, "dropped_inactive",
                                f"the node is {self._state_label()}: activate it to process frames")
            return
        try:
            rgb = self._convert(msg)
        except InputRejected as exc:
            self._ledger.reject(msg.header, exc.kind, str(exc))
            return
        self._sink(Frame(header=msg.header, rgb=rgb, wh=(int(rgb.shape[1]), int(rgb.shape[0])), received=t0,
                         convert_ms=(time.perf_counter() - t0) * 1e3))

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
