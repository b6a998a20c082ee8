"""The node on an emulated robot, over real ROS 2 on loopback: its TF tree (REP 105) through tf2, and a
metric world from a depth camera or odometry.

The robot is emulated in this process with tf2_ros broadcasters: a static ``base_link -> camera_link
-> camera_color_optical_frame`` (REP 103 optical rotation) and a moving ``odom -> base_link`` at each
image stamp. A second node checks through its own ``tf2_ros.Buffer``. The node runs as the real
console script in a child process (tiny random weights, CPU fp32: deterministic, so a second run of
the same frames sees the same model output).

* default parameters with a camera frame that already has a parent: one parent stays, ERROR gives the fix;
* ``base_frame``: ``world -> base_link`` composed with the robot's static transform is the node's camera
  estimate (1e-6); the first body pose is the identity; a missing ``base_link -> camera`` gives
  NO_TRANSFORM and a WARN naming the link, and the node recovers when it appears;
* ``odom_frame``: ``map -> odom`` then ``odom -> base_link`` is the body estimate at every stamp (1e-6);
  nothing from the node is published as ``odom -> base_link``; a vanishing odometry gives NO_TRANSFORM;
* depth scale k = 2.5 as 16UC1 mm and 32FC1 m with holes and 1 % noise: locked within 1 % of k, the
  published translations and depth are the locked scale times the model's (1e-4); bad depth input is
  counted and reported once;
* odometry scale: an odom path k times the model's gives k within 2 %.
"""
from __future__ import annotations

import math
import os
import threading
import time

import numpy as np
import pytest
import yaml

rclpy = pytest.importorskip("rclpy")
pytest.importorskip("lingbot_map_ros.msg")
tf2_ros = pytest.importorskip("tf2_ros")
pytestmark = pytest.mark.ros

from geometry_msgs.msg import TransformStamped  # noqa: E402
from rclpy.context import Context  # noqa: E402
from rclpy.executors import SingleThreadedExecutor  # noqa: E402
from rclpy.qos import QoSProfile, QoSReliabilityPolicy  # noqa: E402
from rclpy.time import Time  # noqa: E402
from sensor_msgs.msg import Image  # noqa: E402
from std_srvs.srv import Trigger  # noqa: E402
from tf2_msgs.msg import TFMessage  # noqa: E402

from lingbot_map_ros.core.geometry import (  # noqa: E402
    R_OPTICAL_BODY,
    decode_pose_encoding,
    quaternion_to_matrix,
    quaternion_xyzw_from_matrix,
    se3,
    se3_inverse,
)
from lingbot_map_ros.ros.large_outputs import close_participant, participant_node  # noqa: E402
from lingbot_map_ros.tools.node_client import (  # noqa: E402
    Listener,
    NodeProcess,
    SyntheticCamera,
    image_message,
    stamp_ns,
    wait_matched,
)

PROCESSED, BUFFERED, NO_TRANSFORM = 0, 4, 9
W, H = 518, 392  # colour = model input size: the depth test's sensor pixels are the model's pixels
MODEL_HW = (392, 518)
NS = "/lingbot_map"
TOPIC, DEPTH_TOPIC = "/robot/camera/color/image_raw", "/robot/camera/aligned_depth_to_color/image_raw"
WORLD, BASE, LINK, OPTICAL, ODOM = "map", "base_link", "camera_link", "camera_color_optical_frame", "odom"
K = 2.5
FRAMES = 10


def _pitch(deg: float) -> np.ndarray:
    a = math.radians(deg)
    return np.array([[math.cos(a), 0, math.sin(a)], [0, 1, 0], [-math.sin(a), 0, math.cos(a)]])


T_BASE_LINK = se3(_pitch(10.0), [0.20, 0.01, 0.45])  # camera mount: 20 cm ahead, 45 cm up, pitched 10 deg down
T_LINK_OPTICAL = se3(R_OPTICAL_BODY.T, [0.0, 0.015, 0.0])  # REP 103: z forward, x right, y down
X_BASE_CAM = T_BASE_LINK @ T_LINK_OPTICAL  # base_link -> camera_color_optical_frame


def matrix_of(t) -> np.ndarray:
    tr, q = t.transform.translation, t.transform.rotation
    return se3(quaternion_to_matrix([q.x, q.y, q.z, q.w]), [tr.x, tr.y, tr.z])


def transform_msg(parent: str, child: str, m: np.ndarray, stamp_ns_: int = 0) -> TransformStamped:
    t = TransformStamped()
    t.header.frame_id, t.child_frame_id = parent, child
    t.header.stamp.sec, t.header.stamp.nanosec = divmod(int(stamp_ns_), 10**9)
    t.transform.translation.x, t.transform.translation.y, t.transform.translation.z = (float(v) for v in m[:3, 3])
    q = quaternion_xyzw_from_matrix(m[:3, :3])
    t.transform.rotation.x, t.transform.rotation.y, t.transform.rotation.z, t.transform.rotation.w = (float(v)
                                                                                                      for v in q)
    return t


def pose_matrix(pose) -> np.ndarray:
    p, o = pose.position, pose.orientation
    return se3(quaternion_to_matrix([o.x, o.y, o.z, o.w]), [p.x, p.y, p.z])


def diag(array, name: str) -> dict:
    for s in array.status:
        if s.name == "lingbot_map: " + name:
            level = s.level if isinstance(s.level, int) else int.from_bytes(s.level, "little")
            return {"level": level, "message": s.message, **{kv.key: kv.value for kv in s.values}}
    return {}


class Robot:
    """The emulated robot on the test's domain, in three rclpy contexts (DDS participants): the robot's TF
    (static + moving), the TF checker and the node's ``Listener`` in one; the colour images in another; the
    depth images in a third. From one participant, images over 512 kB delay that participant's other
    messages by up to the middleware's heartbeat, 3 s (``lingbot_map_ros/ros/large_outputs.py``): what is
    tested here is the node, not that (``tf_timeout`` covers it on a robot whose driver sends both)."""

    def __init__(self, domain: int):
        self.ctx = Context()
        rclpy.init(context=self.ctx, domain_id=domain)
        self.node = rclpy.create_node("robot_emulator", context=self.ctx)
        self.static = tf2_ros.StaticTransformBroadcaster(self.node)
        self.moving = tf2_ros.TransformBroadcaster(self.node)
        reliable = QoSProfile(depth=10, reliability=QoSReliabilityPolicy.RELIABLE)
        self.camera_node, self.camera_ctx = participant_node("camera_driver", domain)
        self.depth_node, self.depth_ctx = participant_node("depth_driver", domain)
        self.depth_pub = self.depth_node.create_publisher(Image, DEPTH_TOPIC, reliable)
        self.colour_pub = self.camera_node.create_publisher(Image, TOPIC, reliable)
        self.checker = rclpy.create_node("tf_checker", context=self.ctx)
        self.buffer = tf2_ros.Buffer()
        self.tf_listener = tf2_ros.TransformListener(self.buffer, self.checker)
        self.lock = threading.Lock()
        self.raw_tf: list = []  # (parent, child, stamp ns, matrix) of every /tf transform seen
        self.checker.create_subscription(TFMessage, "/tf", self._raw, QoSProfile(depth=200))
        self.sent_odom: dict[int, np.ndarray] = {}
        self.executor = SingleThreadedExecutor(context=self.ctx)
        self.executor.add_node(self.node)
        self.executor.add_node(self.checker)
        self._thread = threading.Thread(target=self._spin, daemon=True)
        self._thread.start()
        self.listener = Listener(NS, TOPIC, context=self.ctx, name="robot_test_client", depth=True)
        self.camera = SyntheticCamera(W, H, seed=7)
        self.stamp0 = 1_700_000_000 * 10**9

    def _spin(self) -> None:
        try:
            self.executor.spin()
        except Exception:  # context shut down
            pass

    def _raw(self, msg) -> None:
        with self.lock:
            for t in msg.transforms:
                self.raw_tf.append((t.header.frame_id, t.child_frame_id, stamp_ns(t.header.stamp), matrix_of(t)))

    def publish_static(self) -> None:
        self.static.sendTransform([transform_msg(BASE, LINK, T_BASE_LINK),
                                   transform_msg(LINK, OPTICAL, T_LINK_OPTICAL)])

    def publish_odom(self, stamp: int, base_in_odom: np.ndarray) -> None:
        self.sent_odom[stamp] = base_in_odom
        self.moving.sendTransform(transform_msg(ODOM, BASE, base_in_odom, stamp))

    def connect(self, timeout: float = 30.0) -> bool:
        """The node is connected to the client (``Listener``) and subscribes to the camera's colour images."""
        return self.listener.wait_connected(timeout) and wait_matched([self.colour_pub], timeout)

    def connect_depth(self, timeout: float = 30.0) -> bool:
        """The node's depth subscription (made only with ``scale_source:=depth``) met the depth camera's
        participant: a depth image sent before is lost, and its keyframe gives no ratio."""
        return wait_matched([self.depth_pub], timeout)

    def stamp(self, i: int) -> int:
        return self.stamp0 + (i + 1) * 50_000_000

    def send(self, i: int, stamp: int, timeout: float = 60.0) -> None:
        """Colour frame ``i`` with ``stamp``; waits for its first FrameStatus."""
        self.colour_pub.publish(image_message(self.camera.render(i % 30), stamp, OPTICAL))
        ok = self.listener.wait_for(lambda rx: stamp in rx.status, timeout)
        assert ok, f"no frame_status for frame {i}"

    def finals(self, stamps: list[int], timeout: float = 60.0) -> dict:
        lst = self.listener
        assert lst.wait_for(lambda rx: all(lst.final_status(s) is not None for s in stamps), timeout), "no final"
        with lst.lock:
            return {s: lst.final_status(s) for s in stamps}

    def latest_diag(self, after: float, timeout: float = 10.0):
        box = {}

        def ready(rx):
            for arr in reversed(rx.diagnostics):
                if arr.header.stamp.sec + arr.header.stamp.nanosec * 1e-9 >= after:
                    box["a"] = arr
                    return True
            return False

        assert self.listener.wait_for(ready, timeout), "no /diagnostics"
        return box["a"]

    def lookup(self, target: str, source: str, stamp: int) -> np.ndarray:
        t = self.buffer.lookup_transform(target, source, Time(nanoseconds=stamp),
                                         rclpy.duration.Duration(seconds=2.0))
        return matrix_of(t)

    def close(self) -> None:
        self.listener.close()
        self.executor.shutdown(timeout_sec=2.0)
        self._thread.join(5)
        self.node.destroy_node()
        self.checker.destroy_node()
        rclpy.shutdown(context=self.ctx)
        close_participant(self.camera_node, self.camera_ctx)
        close_participant(self.depth_node, self.depth_ctx)


def start_node(tmp, domain: int, name: str, extra_args: tuple = (), **params) -> NodeProcess:
    base = dict(model_preset="tiny", device="cpu", scale_frames=2, sliding_window=3, camera_iterations=2,
                qos_reliability="reliable", world_frame=WORLD, diagnostics_period=0.3,
                transform_publish_period=0.0)  # /tf carries the placed frames only (test_nav2.py: the re-sends)
    base.update(params)
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"/**": {"ros__parameters": base}}))
    node = NodeProcess(["--params-file", str(path), "-r", f"image:={TOPIC}", "-r", f"depth:={DEPTH_TOPIC}",
                        *extra_args],
                       echo=False, env=dict(os.environ, ROS_DOMAIN_ID=str(domain)), log_path=str(tmp / f"{name}.log"))
    assert node.wait_ready(120), f"node did not start: {node.why_not_ready()}\n{node.output()[-3000:]}"
    return node


def stop_node(node: NodeProcess) -> None:
    rc = node.stop()
    assert rc == 0 and "stopped cleanly" in node.output(), f"exit {rc}:\n{node.output()[-3000:]}"


@pytest.fixture
def rig(tmp_path, ros_domain_id):
    robot = Robot(ros_domain_id)
    holder: dict = {}

    def launch(name: str, **params) -> NodeProcess:
        holder["node"] = start_node(tmp_path, ros_domain_id, name, **params)
        assert robot.connect(30), "no connection to the node"
        return holder["node"]

    try:
        yield robot, launch
    finally:
        node = holder.get("node")
        robot.close()
        if node is not None:
            stop_node(node)


def camera_estimates(finals: dict) -> dict:
    """stamp -> the node's camera estimate in the model's world, decoded here from the raw pose_enc."""
    return {s: decode_pose_encoding(np.asarray(f.pose_enc, np.float64), MODEL_HW)[0]
            for s, f in finals.items() if f.status == PROCESSED}


# --------------------------------------------------------------------------------------- reference run
@pytest.fixture(scope="module")
def reference(tmp_path_factory, new_domain_id):
    """Default parameters (camera pose, model units, ~/depth on) on a robot whose optical frame already
    has a parent: the model's poses and depth for the scale tests, and the one-parent checks."""
    tmp = tmp_path_factory.mktemp("robot_reference")
    domain = new_domain_id()
    robot = Robot(domain)
    node = None
    try:
        robot.publish_static()
        node = start_node(tmp, domain, "reference", publish_depth=True)
        assert robot.connect(30)
        stamps = [robot.stamp(i) for i in range(FRAMES)]
        for i, s in enumerate(stamps):
            robot.publish_odom(s, se3(np.eye(3), [0.05 * i, 0, 0]))
            robot.send(i, s)
        finals = robot.finals(stamps)
        lst = robot.listener
        assert lst.wait_for(lambda rx: len(rx.depth) >= FRAMES and all(s in rx.poses for s in stamps), 20)
        diag_array = robot.latest_diag(time.time() + 0.1)
        with lst.lock:
            poses = {s: pose_matrix(lst.rx.poses[s].pose) for s in stamps}
            depth = {stamp_ns(m.header.stamp): np.frombuffer(bytes(m.data), np.float32).reshape(m.height, m.width)
                     for m in lst.rx.depth}
        with robot.lock:
            raw_tf = list(robot.raw_tf)
        yield {"stamps": stamps, "finals": finals, "poses": poses, "depth": depth, "diag": diag_array,
               "raw_tf": raw_tf, "frames_yaml": yaml.safe_load(robot.buffer.all_frames_as_yaml()),
               "camera": camera_estimates(finals), "output": node.output()}
    finally:
        robot.close()
        if node is not None:
            stop_node(node)


def test_default_parameters_keep_the_cameras_one_parent(reference):
    assert all(f.status == PROCESSED for f in reference["finals"].values())
    assert set(reference["poses"]) == set(reference["stamps"])  # ~/pose still goes out
    # nobody published a second parent of the optical frame: it has the camera driver's, on /tf_static
    assert not [t for t in reference["raw_tf"] if t[1] == OPTICAL], "a second parent for the optical frame"
    assert reference["frames_yaml"][OPTICAL]["parent"] == LINK
    tf = diag(reference["diag"], "tf")
    assert tf["level"] == 2, tf
    assert f"{OPTICAL} already has the parent {LINK}" in tf["message"] and "set base_frame" in tf["message"]
    assert tf["parent_conflicts"] == f"{OPTICAL} <- {LINK}"
    errors = [line for line in reference["output"].splitlines() if "already has the parent" in line]
    assert len(errors) == 1, errors  # logged once, not per frame
    scale = diag(reference["diag"], "scale")
    assert scale["state"] == "model units" and scale["level"] == 0 and "NOT metres" in scale["message"]


def test_base_frame_composes_with_the_robot_and_a_missing_link_recovers(rig):
    robot, launch = rig
    node = launch("base", base_frame=BASE)
    stamps = [robot.stamp(i) for i in range(FRAMES)]
    missing = 4  # the static transforms come only after frame 3: frames 0..3 cannot be placed
    t_missing = time.time()
    for i, s in enumerate(stamps):
        if i == missing:
            robot.publish_static()
            time.sleep(0.3)
        robot.send(i, s)
    finals = robot.finals(stamps)
    statuses = [finals[s].status for s in stamps]
    assert statuses == [NO_TRANSFORM] * missing + [PROCESSED] * (FRAMES - missing), statuses
    assert f"{BASE} -> {OPTICAL}" in finals[stamps[0]].reason
    link_warned = robot.listener.wait_for(lambda rx: any(
        diag(a, "tf").get("level") == 1 and f"no transform {BASE} -> {OPTICAL}" in diag(a, "tf")["message"]
        for a in rx.diagnostics if a.header.stamp.sec >= int(t_missing)), 10)
    assert link_warned, "no WARN naming the missing link in /diagnostics"
    warns = [line for line in node.output().splitlines() if f"no transform {BASE} -> {OPTICAL}" in line]
    assert len(warns) == 1, warns  # one WARN per outage
    assert "is there again" in node.output()

    lst = robot.listener
    placed = stamps[missing:]
    assert lst.wait_for(lambda rx: all(s in rx.poses for s in placed), 20)
    assert not [s for s in stamps[:missing] if s in lst.rx.poses], "a NO_TRANSFORM frame was published"
    with lst.lock:
        body = {s: pose_matrix(lst.rx.poses[s].pose) for s in placed}
        odom_children = {lst.rx.odoms[s].child_frame_id for s in placed}
    assert odom_children == {BASE}
    np.testing.assert_allclose(body[placed[0]], np.eye(4), atol=1e-9)  # the world is the first body pose
    camera = camera_estimates(finals)
    x = robot.lookup(BASE, OPTICAL, placed[0])  # the robot's transform, through the checker's Buffer
    np.testing.assert_allclose(x, X_BASE_CAM, atol=1e-9)
    first = camera[placed[0]]
    for s in placed:
        world_base = robot.lookup(WORLD, BASE, s)
        expected = x @ se3_inverse(first) @ camera[s]  # the camera estimate in the world of the first body pose
        np.testing.assert_allclose(world_base @ x, expected, atol=1e-6)
        np.testing.assert_allclose(world_base, body[s], atol=1e-9)
    with robot.lock:
        edges = {(t[0], t[1]) for t in robot.raw_tf}
    assert edges == {(WORLD, BASE)}
    assert lst.wait_for(lambda rx: diag(rx.diagnostics[-1], "tf").get("level") == 0, 10), "tf never back to OK"


def test_odom_frame_publishes_map_to_odom_and_never_odom_to_base(rig):
    robot, launch = rig
    robot.publish_static()
    launch("odom", base_frame=BASE, odom_frame=ODOM)
    rng = np.random.default_rng(3)
    stamps = [robot.stamp(i) for i in range(FRAMES)]
    vanish = (6, 7)  # odometry silent for these frames: they cannot be placed
    for i, s in enumerate(stamps):
        if i not in vanish:
            q = rng.normal(size=4)
            robot.publish_odom(s, se3(quaternion_to_matrix(q / np.linalg.norm(q)), rng.normal(size=3)))
            time.sleep(0.05)
        robot.send(i, s)
    finals = robot.finals(stamps)
    statuses = [finals[s].status for s in stamps]
    assert statuses == [NO_TRANSFORM if i in vanish else PROCESSED for i in range(FRAMES)], statuses
    assert f"{ODOM} -> {BASE}" in finals[stamps[vanish[0]]].reason
    placed = [s for i, s in enumerate(stamps) if i not in vanish]
    lst = robot.listener
    assert lst.wait_for(lambda rx: all(s in rx.poses for s in placed), 20)
    with lst.lock:
        body = {s: pose_matrix(lst.rx.poses[s].pose) for s in placed}
    camera = camera_estimates(finals)
    first = camera[placed[0]]
    for s in placed:
        expected_body = X_BASE_CAM @ se3_inverse(first) @ camera[s] @ se3_inverse(X_BASE_CAM)
        chained = robot.lookup(WORLD, ODOM, s) @ robot.lookup(ODOM, BASE, s)
        np.testing.assert_allclose(chained, expected_body, atol=1e-6)
        np.testing.assert_allclose(chained, body[s], atol=1e-9)
    np.testing.assert_allclose(body[placed[0]], np.eye(4), atol=1e-9)
    with robot.lock:
        raw = list(robot.raw_tf)
    to_base = [t for t in raw if t[1] == BASE]
    # every odom -> base_link on /tf is one the robot sent, once: none from the node
    assert len(to_base) == len(robot.sent_odom) and {t[0] for t in to_base} == {ODOM}
    for _, _, stamp, m in to_base:
        np.testing.assert_allclose(m, robot.sent_odom[stamp], atol=1e-12)
    assert {(t[0], t[1]) for t in raw} == {(ODOM, BASE), (WORLD, ODOM)}
    assert {t[2] for t in raw if t[1] == ODOM} == set(placed)


def depth_message(depth_m: np.ndarray, stamp: int, encoding: str, rng: np.random.Generator) -> Image:
    """k x the model's depth with 1 % noise and holes, as a depth camera would send it."""
    noisy = depth_m * (1.0 + 0.01 * rng.standard_normal(depth_m.shape))
    holes = rng.random(depth_m.shape) < 0.15
    if encoding == "16UC1":
        values = np.round(noisy * 1000.0).astype(np.uint16)
        values[holes] = 0
    else:
        values = noisy.astype(np.float32)
        values[holes] = np.nan
        values[rng.random(depth_m.shape) < 0.05] = 0.0
    msg = Image(height=int(values.shape[0]), width=int(values.shape[1]), encoding=encoding, is_bigendian=0,
                step=int(values.shape[1] * values.itemsize), data=values.tobytes())
    msg.header.stamp.sec, msg.header.stamp.nanosec = divmod(int(stamp), 10**9)
    msg.header.frame_id = OPTICAL
    return msg


def test_depth_scale_16uc1_and_32fc1(rig, reference):
    robot, launch = rig
    # tf_timeout bounds the wait of a keyframe for its depth image too. A large depth image can reach the node
    # seconds late on a loaded host (a reliable writer resends a lost fragment after its next heartbeat); a
    # ratio that misses the wait is late (counted, the lock a frame later), not wrong. What is tested is the
    # lock after five agreeing ratios and the refusal of bad depth images, not the middleware's repair time;
    # a refused depth image ends its keyframe's wait at once, so the bad frames cost nothing here.
    node = launch("depth", scale_source="depth", publish_depth=True, tf_timeout=5.0)
    assert robot.connect_depth(), "the node has no depth subscription"
    rng = np.random.default_rng(17)
    ref_stamps = reference["stamps"]
    lst = robot.listener
    base = 0
    for session, encoding in enumerate(("16UC1", "32FC1")):
        if session:
            assert lst.call(Trigger, f"{NS}/reset", Trigger.Request(), 30).success
            base = FRAMES + 5
            # bad input first, before the scale can lock: another encoding, another aspect ratio, and a
            # depth image whose stamp no colour frame has (each counted, logged once)
            bad = depth_message(K * reference["depth"][ref_stamps[0]], robot.stamp(base), "16UC1", rng)
            bad.encoding = "8UC1"
            robot.depth_pub.publish(bad)
            robot.send(0, robot.stamp(base))
            wrong = depth_message(K * reference["depth"][ref_stamps[1]][:300], robot.stamp(base + 1), encoding, rng)
            robot.depth_pub.publish(wrong)
            robot.send(1, robot.stamp(base + 1))
            robot.depth_pub.publish(depth_message(np.ones((H, W)), robot.stamp(base + 1) + 25_000_000, encoding, rng))
            assert lst.call(Trigger, f"{NS}/reset", Trigger.Request(), 30).success  # the same frames, from the start
            base += 2
        stamps = [robot.stamp(base + i) for i in range(FRAMES)]
        for i, s in enumerate(stamps):
            robot.depth_pub.publish(depth_message(K * reference["depth"][ref_stamps[i]], s, encoding, rng))
            robot.send(i, s)
        finals = robot.finals(stamps)
        assert all(finals[s].status == PROCESSED for s in stamps)
        published = [i for i, s in enumerate(stamps) if not finals[s].reason]
        withheld = [i for i, s in enumerate(stamps) if finals[s].reason]
        # nothing metric until the 5th keyframe ratio agrees: frames 0-3 at least. The colour frame never
        # waits for its depth, so on a loaded machine a depth image that arrives after its frame's result
        # gives no ratio and the lock comes a frame later; it is always a prefix of the frames.
        reasons = [finals[s].reason for s in stamps]
        assert withheld == list(range(len(withheld))) and 4 <= len(withheld) <= 6, reasons  # at most 2 late
        assert all("scale estimating from depth" in reasons[i] and "5 must agree" in reasons[i] for i in withheld), \
            reasons
        assert lst.wait_for(lambda rx: all(stamps[i] in rx.poses for i in published), 20)
        assert not [i for i in withheld if stamps[i] in lst.rx.poses], "a pose was published before the lock"
        scale = diag(robot.latest_diag(time.time() + 0.1), "scale")
        assert scale["state"] == "locked" and scale["level"] == 0, scale
        value = float(scale["value"])
        assert abs(value - K) / K < 0.01, (encoding, value)
        with lst.lock:
            depth_msgs = {stamp_ns(m.header.stamp): m for m in lst.rx.depth}
            poses = {s: pose_matrix(lst.rx.poses[s].pose) for s in stamps if s in lst.rx.poses}
        for i in published:
            ref_pose = reference["poses"][ref_stamps[i]]
            got = poses[stamps[i]]
            np.testing.assert_allclose(got[:3, :3], ref_pose[:3, :3], atol=1e-6)
            t_ref = value * ref_pose[:3, 3]
            assert np.linalg.norm(got[:3, 3] - t_ref) <= 1e-4 * np.linalg.norm(t_ref), (encoding, i)
            m = depth_msgs[stamps[i]]
            d = np.frombuffer(bytes(m.data), np.float32).reshape(m.height, m.width)
            np.testing.assert_allclose(d, value * reference["depth"][ref_stamps[i]], rtol=1e-4)
    scale = diag(robot.latest_diag(time.time() + 0.1), "scale")
    assert int(scale["depth_bad_encoding"]) == 1 and int(scale["depth_bad_size"]) == 1, scale
    assert int(scale["depth_unpaired_depth"]) >= 1, scale
    out = node.output()
    for text in ("depth encoding '8UC1' is not supported", "another aspect ratio", "without a colour partner"):
        assert sum(text in line for line in out.splitlines()) == 1, text


def test_odometry_scale(rig, reference):
    robot, launch = rig
    robot.publish_static()
    launch("odometry", base_frame=BASE, odom_frame=ODOM, scale_source="odometry", scale_min_travel=0.2)
    ref = reference["camera"]
    ref_stamps = reference["stamps"]
    stamps = [robot.stamp(i) for i in range(FRAMES)]
    x_inv = se3_inverse(X_BASE_CAM)
    for i, s in enumerate(stamps):
        c = ref[ref_stamps[i]].copy()
        c[:3, 3] *= K  # the camera in odom: K times the model's path
        robot.publish_odom(s, c @ x_inv)
        time.sleep(0.05)
        robot.send(i, s)
    finals = robot.finals(stamps)
    assert all(f.status == PROCESSED for f in finals.values()), [(f.status, f.reason) for f in finals.values()]
    scale = diag(robot.latest_diag(time.time() + 0.1), "scale")
    assert scale["state"] == "locked", scale
    assert abs(float(scale["value"]) - K) / K < 0.02, scale
    published = [s for s in stamps if not finals[s].reason]
    assert published, [finals[s].reason for s in stamps]
    lst = robot.listener
    assert lst.wait_for(lambda rx: all(s in rx.poses for s in published), 20)
    value = float(scale["value"])
    camera = camera_estimates(finals)
    first = camera[stamps[0]].copy()
    first[:3, 3] *= value
    for s in published:
        c = camera[s].copy()
        c[:3, 3] *= value  # metric camera estimate
        expected_body = X_BASE_CAM @ se3_inverse(first) @ c @ x_inv
        chained = robot.lookup(WORLD, ODOM, s) @ robot.lookup(ODOM, BASE, s)
        np.testing.assert_allclose(chained, expected_body, atol=1e-6)
    with lst.lock:
        twists = [lst.rx.odoms[s].twist.twist for s in published[1:]]
    assert twists and all(math.isfinite(t.linear.x) for t in twists)
