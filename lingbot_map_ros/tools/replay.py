"""``lingbot_map_replay``: publish a recording's camera images (rosbag2 folder or ROS 1 .bag) to the node.

``ros2 bag play`` is not available from the PyPI wheels (no rosbag2_py), and it cannot pace a
recording by the consumer: this tool reads the bag with ``rosbags`` (rosbag2 mcap or sqlite3, or a
ROS 1 ``.bag``) and publishes the recorded CDR bytes unchanged (ROS 1 messages are rebuilt as ROS 2
ones, field by field), either

* ``--rate R`` (R > 0): at R times the recorded rate (receive times of the bag), like ``ros2 bag
  play``; a node slower than the camera then drops frames, as it would live; or
* ``--rate 0``: as fast as the node keeps up: the next image goes out only when the node has
  accounted for the previous one on ``<node>/frame_status`` (processed, buffered, dropped or
  rejected - the node publishes one status per received frame), so nothing is dropped and a
  trajectory gets one pose per recorded frame.

A robot's recording (``--depth-topic``, and the bag's ``/tf`` + ``/tf_static``, published unless
``--no-tf``) goes out in header-stamp order with each message's own stamps: at one stamp the
transforms and the depth image before the colour image, so the node (``base_frame``, ``odom_frame``,
``scale_source: depth``) has what a frame needs when it arrives, as on the robot. Publishing them first
is not enough for the first frame: a subscriber that has not matched our publisher yet (discovery is not
symmetric, and slow on a loaded host) takes a message only when the middleware resends it, seconds
later; the frame would end NO_TRANSFORM and the session's world start at a later frame than the
recording's. So the first image goes out only once every reliable subscriber has acknowledged what went
before it (``--ack-timeout`` at most, then it goes anyway, said once): from then on both sides are
matched. Acknowledgements come with the middleware's heartbeat (about 3 s with Fast DDS), so later
frames do not wait for them. ``/tf_static`` is published latched (transient local), the others as
recorded; only the colour images are paced.

Before anything is published the bag, the topic and its first image are checked (a depth topic or
an unsupported encoding is refused in one line, exit 2). Ctrl-C stops the replay and prints what was
sent and acknowledged (exit 130). Discovery is kept on loopback
(``ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST``) unless the caller set a range explicitly. Exit code 0
when every frame went out (and, with ``--rate 0``, was accounted for).
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from typing import Optional

from .cli import INTERRUPTED_EXIT, OneLineParser, fail

DEFAULT_NODE = "lingbot_map"


PROG = "lingbot_map_replay"


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog=PROG, description=__doc__)
    p.add_argument("bag", help="rosbag2 folder (mcap or sqlite3) or ROS 1 .bag file")
    p.add_argument("--topic", default="", help="image topic in the bag (default: the only image topic)")
    p.add_argument("--topic-out", default="", help="topic to publish on (default: the bag's topic)")
    p.add_argument("--depth-topic", default="", help="also publish this depth topic of the bag (Image 16UC1/32FC1 "
                   "or compressedDepth), on its own name (remap the node's 'depth' to it)")
    p.add_argument("--tf", action=argparse.BooleanOptionalAction, default=True,
                   help="also publish the bag's /tf and /tf_static (default: when the bag has them)")
    p.add_argument("--rate", type=float, default=1.0,
                   help="1.0 = recorded rate, 2.0 = twice as fast, 0 = as fast as the node acknowledges")
    p.add_argument("--qos", default="reliable", choices=["reliable", "best_effort"],
                   help="publisher reliability (match the node's qos_reliability)")
    p.add_argument("--node", default=DEFAULT_NODE,
                   help="the LingBot-Map node's fully qualified name; its ~/frame_status paces --rate 0")
    p.add_argument("--status-topic", default="", help="FrameStatus topic (default: /<node>/frame_status)")
    p.add_argument("--wait-subscriber", type=float, default=10.0,
                   help="seconds to wait for a subscriber on the output topic before the first frame")
    p.add_argument("--ack-timeout", type=float, default=30.0,
                   help="--rate 0: seconds to wait for one frame's status before going on without it")
    p.add_argument("--max-missing", type=int, default=3,
                   help="--rate 0: give up after this many consecutive unacknowledged frames (node gone)")
    p.add_argument("--drain", type=float, default=1.0,
                   help="--rate > 0: at most this many seconds to keep collecting statuses after the last "
                        "frame (it ends as soon as every frame sent has its final one)")
    p.add_argument("--max-frames", type=int, default=0, help="stop after this many frames (0 = all)")
    p.add_argument("--quiet", action="store_true", help="print nothing but errors (no progress bar)")
    return p


def _status_topic(args: argparse.Namespace) -> str:
    if args.status_topic:
        return args.status_topic
    node = args.node if args.node.startswith("/") else "/" + args.node
    return node.rstrip("/") + "/frame_status"


class _Replayer:
    """Publisher of raw image bytes plus a FrameStatus listener.

    Each image topic (colour, depth) goes out from a participant of its own, as from a robot's camera
    drivers, and /tf, /tf_static and the status listener from the node ``lingbot_map_replay``: from one
    participant, images over Fast DDS's 512 kB shared-memory segment would delay the transforms by up to
    the writer's heartbeat, 3 s (``ros/large_outputs.py``)."""

    def __init__(self, rclpy, topic: str, msgtype: str, qos_name: str, status_topic: str, say,
                 others: Optional[dict[str, str]] = None) -> None:
        from rclpy.qos import QoSDurabilityPolicy, QoSProfile, QoSReliabilityPolicy, qos_profile_sensor_data
        from sensor_msgs.msg import CompressedImage, Image
        from tf2_msgs.msg import TFMessage

        from lingbot_map_ros.msg import FrameStatus

        self.rclpy = rclpy
        self.say = say
        self.node = rclpy.create_node("lingbot_map_replay")
        self._image_nodes: list = []  # (node, context) per image topic
        msg_cls = CompressedImage if msgtype.endswith("CompressedImage") else Image
        qos = (
            QoSProfile(depth=10, reliability=QoSReliabilityPolicy.RELIABLE)
            if qos_name == "reliable"
            else qos_profile_sensor_data
        )
        self.pub = self._image_node().create_publisher(msg_cls, topic, qos)
        # the robot's other topics (topic -> msgtype): depth like the image, /tf as tf2 does, /tf_static latched
        self.others = {}
        self.senders = {}  # topic -> the node (participant) whose publisher sends it
        for other, other_type in (others or {}).items():
            if other == "/tf_static":
                cls, other_qos = TFMessage, QoSProfile(depth=100, reliability=QoSReliabilityPolicy.RELIABLE,
                                                       durability=QoSDurabilityPolicy.TRANSIENT_LOCAL)
            elif other == "/tf":
                cls, other_qos = TFMessage, QoSProfile(depth=100, reliability=QoSReliabilityPolicy.RELIABLE)
            else:
                cls, other_qos = (CompressedImage if other_type.endswith("CompressedImage") else Image), qos
            node = self.node if cls is TFMessage else self._image_node()
            self.others[other] = node.create_publisher(cls, other, other_qos)
            self.senders[other] = node
        self.status_topic = status_topic
        self.acked: dict[tuple[int, int], int] = {}  # stamp -> last status code
        self.sent_keys: set[tuple[int, int]] = set()  # the stamps of the frames sent
        self.status_counts: dict[int, int] = {}
        self.node.create_subscription(FrameStatus, status_topic, self._on_status, QoSProfile(depth=100))
        self._buffered = int(FrameStatus.BUFFERED)  # the one status that is not a frame's last

    def _image_node(self):
        """A node in a participant of its own, on this process's domain, for one image topic."""
        from lingbot_map_ros.ros.large_outputs import participant_node

        node, context = participant_node(f"lingbot_map_replay_images_{len(self._image_nodes)}",
                                         self.node.context.get_domain_id())
        self._image_nodes.append((node, context))
        return node

    def _on_status(self, msg) -> None:
        key = (int(msg.header.stamp.sec), int(msg.header.stamp.nanosec))
        self.acked[key] = int(msg.status)
        self.status_counts[int(msg.status)] = self.status_counts.get(int(msg.status), 0) + 1

    def all_final(self) -> bool:
        """Whether every frame sent has had its final status (buffered frames have one more to come)."""
        return all(self.acked.get(key, self._buffered) != self._buffered for key in self.sent_keys)

    def spin_for(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while True:
            left = end - time.monotonic()
            if left <= 0:
                return
            self.rclpy.spin_once(self.node, timeout_sec=min(left, 0.05))

    def wait_until(self, predicate, timeout: float) -> bool:
        end = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() >= end:
                return False
            self.rclpy.spin_once(self.node, timeout_sec=0.02)
        return True

    def wait_delivered(self, topics, timeout: float) -> list[str]:
        """Wait until every matched reliable subscriber has acknowledged what went out on ``topics``
        (other than the image); returns those still unacknowledged after ``timeout`` s."""
        from rclpy.duration import Duration

        end = time.monotonic() + timeout
        return [t for t in topics
                if not self.others[t].wait_for_all_acked(Duration(seconds=max(0.0, end - time.monotonic())))]

    def summary(self) -> str:
        from .node_client import status_summary

        return status_summary(self.status_counts) or "no status seen"

    def close(self) -> None:
        from lingbot_map_ros.ros.large_outputs import close_participant

        self.node.destroy_node()
        for node, context in self._image_nodes:
            close_participant(node, context)


def replay(args: argparse.Namespace) -> int:
    from .bag_io import BagError, check_first_image, iter_bag_messages, stamp_seconds

    say = (lambda m: None) if args.quiet else (lambda m: print(f"[{PROG}] {m}", flush=True))
    for name in ("rate", "wait_subscriber", "ack_timeout", "drain"):
        if getattr(args, name) < 0:
            return fail(PROG, f"--{name.replace('_', '-')} must be >= 0 (got {getattr(args, name):g})")
    if args.max_missing < 1 or args.max_frames < 0:
        return fail(PROG, "--max-missing must be >= 1 and --max-frames >= 0")
    try:
        topic_in, msgtype, count = check_first_image(args.bag, args.topic)  # before any DDS set-up
        robot = robot_topics(args, topic_in)
    except (BagError, OSError) as exc:
        return fail(PROG, str(exc))
    topic_out = args.topic_out or topic_in

    os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")  # before rclpy reads it
    import rclpy
    import rclpy.signals
    from rclpy.executors import ExternalShutdownException
    from rosbags.typesys import Stores, get_typestore

    store = get_typestore(Stores.ROS2_JAZZY)
    # Our own Ctrl-C: a KeyboardInterrupt wherever we wait, so the summary is printed (rclpy's handler
    # would only shut the context down and leave the loop to fail on the next call).
    rclpy.init(signal_handler_options=rclpy.signals.SignalHandlerOptions.NO)
    rep: Optional[_Replayer] = None
    progress = {"sent": 0, "missing": 0}
    try:
        rep = _Replayer(rclpy, topic_out, msgtype, args.qos, _status_topic(args), say,
                        others={t: m for t, (kind, m) in robot.items() if kind != "image"})
        if args.wait_subscriber > 0 and not rep.wait_until(lambda: rep.pub.get_subscription_count() > 0,
                                                           args.wait_subscriber):
            if args.rate == 0:  # nobody would ever acknowledge: fail now, not after a timeout per frame
                return fail(PROG, f"no subscriber on {topic_out} after {args.wait_subscriber:g} s (is the node "
                            "running on this ROS_DOMAIN_ID? check --topic-out and the node's image remapping)", 1)
            say(f"no subscriber on {topic_out} after {args.wait_subscriber:g} s; publishing anyway")
        # the statuses the summary counts (and --rate 0 paces by) are lost until our listener met the node's
        # publisher: a loaded machine's discovery can take longer than the first frames
        if not rep.wait_until(lambda: rep.node.count_publishers(rep.status_topic) > 0,
                              max(args.wait_subscriber, 1.0)):
            if args.rate == 0:
                return fail(
                    PROG, f"--rate 0 needs the node's {rep.status_topic}; nobody publishes it (check --node)", 1
                )
            say(f"nobody publishes {rep.status_topic} (check --node); the summary will have no statuses")
        # what is sent before the node's subscription matched is lost (the first frame's transforms and depth):
        # wait for the node's own subscriptions (others, a TF monitor say, may listen on /tf already)
        volatile = [t for t in rep.others if t != "/tf_static"]
        if volatile and not rep.wait_until(lambda: not _unmatched(rep, volatile, args.node),
                                           max(args.wait_subscriber, 1.0)):
            say(f"{args.node} has no subscription on {', '.join(_unmatched(rep, volatile, args.node))} yet; "
                "publishing anyway")
        if not rep.others:  # a robot's replay proves it instead: its first frame waits for acknowledgements
            rep.spin_for(0.5)  # let the node's side of discovery match our publisher too
        say(f"{args.bag}: {topic_in} ({msgtype}) -> {topic_out}"
            + "".join(f", {t}" for t in robot if t != topic_in) + ", "
            + ("paced by " + rep.status_topic if args.rate == 0 else f"rate x{args.rate:g}"))
        total = min(count, args.max_frames) if args.max_frames and count else (args.max_frames or count or None)
        messages = (robot_messages(args.bag, robot, store) if len(robot) > 1
                    else (("image", topic_in, m, raw, t) for m, raw, t in iter_bag_messages(args.bag, topic_in)))
        sent, missing = _publish_all(rep, messages, store, stamp_seconds, args, say, total, progress)
        if args.rate > 0:
            rep.wait_until(rep.all_final, args.drain)
        say(f"published {sent} frames; node statuses: {rep.summary()}")
        if missing:
            return fail(PROG, f"{missing} frames were not acknowledged within {args.ack_timeout:g} s", 1)
        return 0
    except (KeyboardInterrupt, ExternalShutdownException):  # Ctrl-C / SIGTERM
        print(f"[{PROG}] interrupted: published {progress['sent']} frames; node statuses: "
              f"{rep.summary() if rep else 'none'}", file=sys.stderr, flush=True)
        return INTERRUPTED_EXIT
    finally:
        if rep is not None:
            rep.close()
        rclpy.try_shutdown()


def _publish_all(rep: _Replayer, messages, store, stamp_seconds, args, say, total: Optional[int] = None,
                 progress: Optional[dict] = None) -> tuple[int, int]:
    """Publish every message (paced by rate or by acknowledgements); returns (sent, unacknowledged).

    ``progress`` is updated as frames go out, so an interrupted replay can say how far it got.
    """
    from .progress import Progress

    progress = progress if progress is not None else {}
    bar = Progress(total, PROG, enabled=False if args.quiet else None)
    try:
        return _publish_loop(rep, messages, store, stamp_seconds, args, say, bar, progress)
    finally:
        bar.close()


def _publish_loop(rep: _Replayer, messages, store, stamp_seconds, args, say, bar, progress: dict) -> tuple[int, int]:
    sent = missing = consecutive = 0
    undelivered: set[str] = set()  # the robot's topics published before the first image
    t0_bag: Optional[int] = None
    t0_wall = 0.0
    for kind, topic, msgtype, raw, t_ns in messages:
        if args.max_frames and sent >= args.max_frames:
            break
        if kind != "image":  # the robot's transforms and depth: as they come, not paced
            rep.others[topic].publish(raw)
            if sent == 0:
                undelivered.add(topic)
            continue
        header = store.deserialize_cdr(raw, msgtype).header
        key = (int(header.stamp.sec), int(header.stamp.nanosec))
        late = rep.wait_delivered(sorted(undelivered), args.ack_timeout) if sent == 0 and undelivered else []
        if late:
            bar.write(f"[{PROG}] {', '.join(late)} not acknowledged by every subscriber within {args.ack_timeout:g} s "
                      f"before the first frame (stamp {stamp_seconds(header):.9f}); publishing it anyway")
        if args.rate > 0:
            if t0_bag is None:  # the recorded rate from the first image on
                t0_bag, t0_wall = t_ns, time.monotonic()
            due = t0_wall + (t_ns - t0_bag) * 1e-9 / args.rate
            rep.spin_for(max(0.0, due - time.monotonic()))
        rep.acked.pop(key, None)  # a repeated stamp must be acknowledged afresh
        rep.pub.publish(raw)
        rep.sent_keys.add(key)
        sent += 1
        progress["sent"] = sent
        if args.rate == 0:
            if rep.wait_until(lambda: key in rep.acked, args.ack_timeout):
                consecutive = 0
            else:
                missing += 1
                consecutive += 1
                bar.write(f"[{PROG}] frame {sent - 1} (stamp {stamp_seconds(header):.9f}) not acknowledged; going on")
                if consecutive >= args.max_missing:
                    bar.write(f"[{PROG}] {consecutive} frames in a row not acknowledged: is the node still running? "
                              "giving up")
                    break
        else:
            rep.rclpy.spin_once(rep.node, timeout_sec=0.0)  # take statuses as they come
        bar.update(1, extra=rep.summary())
    return sent, missing


def _unmatched(rep: _Replayer, topics: list[str], node: str) -> list[str]:
    """The topics whose publisher has not yet met ``node``'s (a fully qualified name) subscription.

    Asked of the participant that sends the topic (a depth image's is not the replay node's): another
    participant may have discovered the node's subscription while this one has not, and what it sends
    before then is lost (the first frame's depth: one keyframe ratio short, the scale locks a frame late)."""
    name = node if node.startswith("/") else "/" + node

    def met(topic: str) -> bool:
        seen = {(i.node_namespace.rstrip("/") + "/" + i.node_name)
                for i in rep.senders[topic].get_subscriptions_info_by_topic(topic)}
        return name in seen and rep.others[topic].get_subscription_count() > 0

    return [t for t in topics if not met(t)]


def robot_topics(args: argparse.Namespace, image_topic: str) -> dict[str, tuple[str, str]]:
    """topic -> (kind, msgtype) of what is replayed: the image, ``--depth-topic``, the bag's TF (``--tf``)."""
    from .bag_io import TF_TYPE, pick_depth_topic, tf_topics

    topics = {image_topic: ("image", "")}
    if args.depth_topic:
        topics[args.depth_topic] = ("depth", pick_depth_topic(args.bag, args.depth_topic)[1])
    if args.tf:
        for topic in tf_topics(args.bag):
            topics[topic] = ("tf_static" if topic == "/tf_static" else "tf", TF_TYPE)
    return topics


def robot_messages(bag: str, robot: dict[str, tuple[str, str]], store):
    """``(kind, topic, msgtype, Jazzy CDR bytes, stamp ns)`` of a robot's recording, in stamp order."""
    from .bag_io import TF_TYPE, iter_robot_messages, message_cdr

    for kind, topic, msgtype, msg, raw, stamp in iter_robot_messages(bag, {t: k for t, (k, _) in robot.items()}):
        out_type = TF_TYPE if kind.startswith("tf") else msgtype
        yield kind, topic, out_type, message_cdr(msg, msgtype, raw, store), max(stamp, 0)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    return replay(args)


def _sigterm_as_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
