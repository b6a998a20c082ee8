"""The localizer's pieces without a running node (fast): the re-sent correction and the one-publisher
check of ``transforms.FrameTree``, the ``~/odom`` covariance parameters, the depth pairing's reason
for an unpaired depth image, and ``lingbot_map_node --help``.
"""
from __future__ import annotations

import subprocess

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy")
pytest.importorskip("tf2_ros")
from rclpy.context import Context  # noqa: E402
from rclpy.serialization import deserialize_message  # noqa: E402
from rclpy.time import Time  # noqa: E402
from sensor_msgs.msg import Image  # noqa: E402
from std_msgs.msg import Header  # noqa: E402
from tf2_msgs.msg import TFMessage  # noqa: E402

from lingbot_map_ros.core.geometry import se3  # noqa: E402
from lingbot_map_ros.core.settings import covariance_matrix, defaults, validate_values  # noqa: E402
from lingbot_map_ros.ros import messages as rosmsg  # noqa: E402
from lingbot_map_ros.ros.intake import DepthPairing  # noqa: E402
from lingbot_map_ros.ros.node_settings import FixedSettings, NodeSettings  # noqa: E402
from lingbot_map_ros.ros.transforms import FrameTree  # noqa: E402
from lingbot_map_ros.tools.node_client import node_command  # noqa: E402


@pytest.fixture
def ros_node(ros_domain_id):
    ctx = Context()
    rclpy.init(context=ctx, domain_id=ros_domain_id)
    node = rclpy.create_node("localizer_unit", context=ctx)
    try:
        yield node
    finally:
        node.destroy_node()
        rclpy.shutdown(context=ctx)


def _capture(tree: FrameTree, messages: list | None = None) -> list:
    """The transforms that would go out on /tf, in order; ``messages`` gets each /tf message's count."""
    sent: list = []

    def publish(message) -> None:  # what the broadcaster's /tf publisher is given: bytes, read back as a subscriber
        if isinstance(message, bytes):
            message = deserialize_message(message, TFMessage)
        if messages is not None:
            messages.append(len(message.transforms))
        sent.extend(message.transforms)

    tree._broadcaster.pub_tf.publish = publish
    return sent


def _ns(stamp) -> int:
    return Time.from_msg(stamp).nanoseconds


def test_the_correction_is_re_sent_stamped_ahead_and_forgotten_with_the_session(ros_node):
    tree = FrameTree(ros_node, repeat_period=0.05, tolerance=lambda: 0.5)
    messages: list = []
    sent = _capture(tree, messages)
    correction = se3(np.eye(3), [1.0, 2.0, 0.5])
    tree._repeat()
    assert sent == []  # nothing placed yet: nothing to re-send
    tree.repeating = True
    image_stamp = Time(nanoseconds=1_000_000_000).to_msg()
    tree.send("map", "odom", image_stamp, correction, repeat=True)
    # at the image stamp, then at once stamped now + tolerance, in one /tf message
    assert len(sent) == 2 and _ns(sent[0].header.stamp) == 1_000_000_000 and messages == [2]
    assert _ns(sent[1].header.stamp) > ros_node.get_clock().now().nanoseconds  # ahead by the tolerance
    assert sent[1].transform == sent[0].transform and sent[1].child_frame_id == "odom"
    before = ros_node.get_clock().now().nanoseconds
    tree._repeat()
    after = ros_node.get_clock().now().nanoseconds
    stamp = _ns(sent[-1].header.stamp)
    assert before + 0.5e9 <= stamp <= after + 0.5e9
    assert (sent[-1].header.frame_id, sent[-1].child_frame_id) == ("map", "odom")
    assert sent[-1].transform.translation.y == 2.0  # the same correction, unchanged between frames
    tree.repeating = False  # the node inactive: nothing
    tree._repeat()
    assert len(sent) == 3
    tree.repeating = True
    tree.send("lingbot_world", "camera", image_stamp, correction)  # a camera pose: not re-sent
    tree._repeat()
    assert sent[-1].child_frame_id == "odom" and len(sent) == 5
    tree.forget()  # a new session
    tree._repeat()
    assert len(sent) == 5


def test_another_publisher_of_the_own_edge_is_told_from_the_echo(ros_node):
    tree = FrameTree(ros_node, repeat_period=0.05, tolerance=lambda: 0.5)
    sent = _capture(tree)
    tree.claim("map", "odom")
    tree.repeating = True
    stamp = Time(nanoseconds=2_000_000_000).to_msg()
    tree.send("map", "odom", stamp, se3(np.eye(3), [1.0, 0.0, 0.0]), repeat=True)
    tree.take(sent, static=False)  # our own sends coming back over /tf
    assert tree.foreign_edges(5.0) == {}
    same_stamp_other_value = rosmsg.transform_stamped(se3(np.eye(3), [-0.4, 0.0, 0.0]), stamp, "map", "odom")
    tree.take([same_stamp_other_value], static=False)
    assert set(tree.foreign_edges(5.0)) == {("map", "odom")}
    other = FrameTree(ros_node)
    other.take([rosmsg.transform_stamped(np.eye(4), Time(nanoseconds=3).to_msg(), "map", "odom")], static=False)
    assert other.foreign_edges(5.0) == {}  # not its edge: a parent, not a second publisher


def test_covariance_parameters():
    assert covariance_matrix([-1.0] * 6) == [-1.0] + [0.0] * 35  # the default: unknown
    m = np.asarray(covariance_matrix([1, 2, 3, 4, 5, 6]), np.float64).reshape(6, 6)
    np.testing.assert_array_equal(m, np.diag([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]))
    ok = dict(defaults(), pose_covariance_diagonal=[0.1] * 6)
    assert not validate_values(ok, resolve=False)
    for bad, text in (([0.1] * 5, "needs 6 values"), ([0.1, -1, 0.1, 0.1, 0.1, 0.1], "all six >= 0"),
                      ([float("nan")] * 6, "finite")):
        problems = validate_values(dict(defaults(), twist_covariance_diagonal=bad), resolve=False)
        assert any(p.startswith("twist_covariance_diagonal") and text in p for p in problems), problems


def _header(ns: int) -> Header:
    h = Header(frame_id="cam")
    h.stamp.sec, h.stamp.nanosec = divmod(ns, 10**9)
    return h


def _depth(ns: int) -> Image:
    return Image(header=_header(ns), height=4, width=4, encoding="16UC1", step=8, data=bytes(32))


@pytest.mark.parametrize("cause", ["lost", "offset"])
def test_an_unpaired_depth_image_names_its_cause(ros_node, cause):
    values = dict(defaults(), depth_sync_slop=0.02)
    pairing = DepthPairing(ros_node, FixedSettings(NodeSettings.from_values(values)))  # no consumer: no decoding
    pairing.subscribe(10)
    texts: dict = {}
    record = pairing._bad
    pairing._bad = lambda kind, text, n=1: (texts.__setitem__(kind, text), record(kind, text, n))
    period = 100_000_000  # 10 Hz colour and depth
    for i in range(8):
        t = 10**9 + i * period
        colour_lost = cause == "lost" and i == 3
        depth_t = t + (40_000_000 if cause == "offset" and i == 3 else 0)  # 40 ms late: beyond the slop
        pairing._sub.signalMessage(_depth(depth_t))
        if not colour_lost:
            pairing.colour(_header(t), (4, 4))
    counts, _ = pairing.report()
    problem = texts.get("unpaired_depth", "")
    assert counts["unpaired_depth"] == 1, (counts, texts)
    if cause == "lost":
        assert "never reached the node (lost messages" in problem and "differ by more" not in problem, problem
    else:
        assert "differ by more than depth_sync_slop" in problem and "lost messages" not in problem, problem
    pairing.unsubscribe()


def test_node_help_prints_and_starts_nothing():
    res = subprocess.run(node_command() + ["--help"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("usage: lingbot_map_node") and "transform_publish_period (0.05)" in res.stdout
    for marker in ("configuring: building the model", "ready: active", "stopped cleanly"):  # no node ran
        assert marker not in res.stdout + res.stderr, marker


def test_every_robot_setting_of_the_readme_is_reachable_from_the_launch_file():
    """What the README sets on a robot (``-p name:=`` of ``ros2 run``, ``name:=`` of ``ros2 launch``) is a
    launch argument that sets the parameter, typed as the node declares it."""
    import re
    from pathlib import Path

    from test_launch import PARAMS, _context

    from lingbot_map_ros.core.settings import SETTINGS_BY_NAME

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    mod, context = _context(params_file=str(PARAMS))
    declared = {a.name for a in mod.generate_launch_description().entities if hasattr(a, "default_value")}
    set_by_run = set(re.findall(r"-p (\w+):=", readme))
    launches = [line for line in readme.splitlines() if line.startswith("ros2 launch lingbot_map_ros")]
    set_by_launch = {name for line in launches for name in re.findall(r" (\w+):=", line)}
    assert set_by_run and len(launches) >= 3
    assert set_by_launch <= declared, set_by_launch - declared
    wanted = (set_by_run | set_by_launch) & set(SETTINGS_BY_NAME)
    assert {"qos_reliability", "initial_session", "mapping", "base_frame"} <= wanted
    # autostart has an argument of its own; trajectory_path is set in "The node by hand", not on a robot
    assert wanted - {"autostart", "trajectory_path"} <= set(mod.PARAMETER_ARGUMENTS), \
        wanted - set(mod.PARAMETER_ARGUMENTS)
    examples = {"str": "x", "bool": "false", "float": "0.25", "int": "392"}
    arguments = {n: examples[k.__name__] for n, k in mod.PARAMETER_ARGUMENTS.items()}
    mod, context = _context(params_file=str(PARAMS), **arguments)
    overrides = mod.node_settings(context)[0][1]
    for name in mod.PARAMETER_ARGUMENTS:
        assert type(overrides[name]) is type(SETTINGS_BY_NAME[name].default), name  # what declare_parameter takes


def test_a_ros1_robot_bag_replays_as_jazzy_messages(tmp_path):
    """A ROS 1 recording's /tf (tf2_msgs/TFMessage with Header.seq) and depth come out as Jazzy CDR that
    rclpy reads back field for field, in stamp order, transforms before the image at one stamp."""
    pytest.importorskip("rosbags")
    from rclpy.serialization import deserialize_message
    from rosbags.rosbag1 import Writer
    from rosbags.typesys import Stores, get_types_from_msg, get_typestore
    from tf2_msgs.msg import TFMessage

    from lingbot_map_ros.tools.bag_io import image_fields, iter_robot_messages, message_cdr

    store = get_typestore(Stores.ROS1_NOETIC)
    store.register(get_types_from_msg("geometry_msgs/TransformStamped[] transforms", "tf2_msgs/msg/TFMessage"))
    t = store.types
    bag = tmp_path / "robot.bag"
    with Writer(bag) as writer:
        tf_conn = writer.add_connection("/tf", "tf2_msgs/msg/TFMessage", typestore=store)
        img_conn = writer.add_connection("/depth", "sensor_msgs/msg/Image", typestore=store)
        for i in range(3):
            stamp = t["builtin_interfaces/msg/Time"](sec=100 + i, nanosec=5)
            header = t["std_msgs/msg/Header"](seq=i, stamp=stamp, frame_id="odom")
            tf = t["tf2_msgs/msg/TFMessage"](transforms=[t["geometry_msgs/msg/TransformStamped"](
                header=header, child_frame_id="base_link", transform=t["geometry_msgs/msg/Transform"](
                    translation=t["geometry_msgs/msg/Vector3"](x=float(i), y=2.0, z=3.0),
                    rotation=t["geometry_msgs/msg/Quaternion"](x=0.0, y=0.0, z=0.0, w=1.0)))])
            depth = t["sensor_msgs/msg/Image"](header=t["std_msgs/msg/Header"](seq=i, stamp=stamp, frame_id="cam"),
                                               **image_fields(np.full((2, 3), i, np.float32), "32FC1"))
            time_ns = (100 + i) * 10**9 + 5
            writer.write(img_conn, time_ns, store.serialize_ros1(depth, "sensor_msgs/msg/Image"))  # image first
            writer.write(tf_conn, time_ns + 1, store.serialize_ros1(tf, "tf2_msgs/msg/TFMessage"))
    out = list(iter_robot_messages(bag, {"/tf": "tf", "/depth": "depth"}))
    assert [k for k, *_ in out] == ["tf", "depth"] * 3  # the transforms first at each stamp
    for i, (kind, _, msgtype, msg, raw, stamp) in enumerate(out[::2]):
        assert raw is None and stamp == (100 + i) * 10**9 + 5
        tf = deserialize_message(message_cdr(msg, msgtype, raw), TFMessage)
        [transform] = tf.transforms
        assert (transform.header.frame_id, transform.child_frame_id) == ("odom", "base_link")
        assert transform.transform.translation.x == float(i) and transform.header.stamp.nanosec == 5
    _, _, msgtype, msg, raw, _ = out[1]
    depth = deserialize_message(message_cdr(msg, msgtype, raw), Image)
    assert depth.encoding == "32FC1" and np.frombuffer(bytes(depth.data), np.float32).tolist() == [0.0] * 6
