"""Two cameras on one node, over real ROS 2 on loopback (README "Several cameras").

The rig is emulated here: static ``base_link -> front_link -> front_optical`` and ``base_link ->
rear_link -> rear_optical`` (different mounts, the rear one turned around), a moving ``odom ->
base_link`` at every image stamp, and the images of each camera at their own rates (100 and 140 ms),
not synchronised; the rear camera starts 20 front frames later. A checker reads /tf through a ``tf2_ros.Buffer``.
The node runs as the real console script (tiny random weights, CPU fp32).

The reference of each camera is the core run here alone on that camera's frames (a lone
``SessionManager``: the batched step equals it, ``test_stream_group.py``), put in the robot by this
test's own float64 algebra: ``~/<name>/pose`` is that camera's estimate re-expressed in its first body
pose, times ONE rigid anchor per stream (1e-6). The front camera creates the world (its anchor is the
identity); the rear one is anchored at its first frame by the body pose the node held then
(correction x odometry, 1e-6). A flood of corrupt rear images ends each of them REJECTED_INPUT on the
rear camera and changes nothing in either camera's poses (both still equal their lone runs). Then the
front camera stops: after ``camera_timeout`` the rear camera drives ``~/pose`` with one constant
offset, the two cameras' disagreement at one instant, and /diagnostics names the stalled camera;
when the front camera returns it drives again. Both streams are saved in one session folder and a new
node resumes them: its poses continue each camera's lone run over every frame, with the same anchors
(1e-6).
"""
from __future__ import annotations

import math
import os
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
from rclpy.qos import QoSDurabilityPolicy, QoSProfile, QoSReliabilityPolicy  # noqa: E402
from rclpy.time import Time  # noqa: E402
from sensor_msgs.msg import PointCloud2  # noqa: E402
from std_srvs.srv import Trigger  # noqa: E402
from tf2_msgs.msg import TFMessage  # noqa: E402

from lingbot_map_ros.core.geometry import (  # noqa: E402
    R_OPTICAL_BODY,
    quaternion_to_matrix,
    quaternion_xyzw_from_matrix,
    se3,
    se3_inverse,
)
from lingbot_map_ros.tools.node_client import (  # noqa: E402
    Listener,
    NodeProcess,
    SyntheticCamera,
    image_message,
    stamp_ns,
)

PROCESSED, REJECTED_INPUT, BUFFERED = 0, 2, 4
W, H = 224, 168
NS = "/lingbot_map"
WORLD, BASE, ODOM = "map", "base_link", "odom"
TIMEOUT = 1.5  # long enough that a loaded CI host's slow ticks never stall a camera that sends
PARAMS = dict(model_preset="tiny", device="cpu", scale_frames=2, sliding_window=3, camera_iterations=2,
              image_width=W, qos_reliability="reliable", world_frame=WORLD, base_frame=BASE, odom_frame=ODOM,
              scale_source="fixed", diagnostics_period=0.2, transform_publish_period=0.0,
              cameras=["front", "rear"], camera_timeout=TIMEOUT, publish_points=True, publish_map=True,
              points_stride=8, map_period=0.2, map_voxel_size=0.05)


def _yaw(deg: float) -> np.ndarray:
    a = math.radians(deg)
    return np.array([[math.cos(a), -math.sin(a), 0], [math.sin(a), math.cos(a), 0], [0, 0, 1]])


MOUNTS = {  # base_link -> <name>_link, and <name>_link -> <name>_optical (REP 103)
    "front": (se3(_yaw(3.0), [0.25, 0.02, 0.40]), se3(R_OPTICAL_BODY.T, [0.0, 0.015, 0.0])),
    "rear": (se3(_yaw(178.0), [-0.30, -0.01, 0.35]), se3(R_OPTICAL_BODY.T, [0.0, -0.02, 0.0])),
}
EXTRINSIC = {n: link @ optical for n, (link, optical) in MOUNTS.items()}  # base_link -> optical


def matrix_of(t) -> np.ndarray:
    tr, q = t.transform.translation, t.transform.rotation
    return se3(quaternion_to_matrix([q.x, q.y, q.z, q.w]), [tr.x, tr.y, tr.z])


def pose_matrix(pose) -> np.ndarray:
    p, o = pose.position, pose.orientation
    return se3(quaternion_to_matrix([o.x, o.y, o.z, o.w]), [p.x, p.y, p.z])


def transform_msg(parent: str, child: str, m: np.ndarray, ns: int = 0) -> TransformStamped:
    t = TransformStamped()
    t.header.frame_id, t.child_frame_id = parent, child
    t.header.stamp.sec, t.header.stamp.nanosec = divmod(int(ns), 10**9)
    t.transform.translation.x, t.transform.translation.y, t.transform.translation.z = (float(v) for v in m[:3, 3])
    q = quaternion_xyzw_from_matrix(m[:3, :3])
    t.transform.rotation.x, t.transform.rotation.y, t.transform.rotation.z, t.transform.rotation.w = (
        float(v) for v in q)
    return t


def odom_at(ns: int) -> np.ndarray:
    s = (ns - STAMP0) * 1e-9
    return se3(_yaw(4.0 * s), [0.3 * s, 0.05 * s, 0.0])


STAMP0 = 1_700_000_000 * 10**9


class Rig:
    """The emulated robot, the checker's tf2 buffer and raw /tf, and one listener per camera + the body."""

    def __init__(self, domain: int):
        import threading

        self.ctx = Context()
        rclpy.init(context=self.ctx, domain_id=domain)
        self.node = rclpy.create_node("rig_emulator", context=self.ctx)
        self.static = tf2_ros.StaticTransformBroadcaster(self.node)
        self.moving = tf2_ros.TransformBroadcaster(self.node)
        self.buffer = tf2_ros.Buffer()
        self.tf_listener = tf2_ros.TransformListener(self.buffer, self.node)
        self.lock = threading.Lock()
        self.raw_tf: list = []
        self.node.create_subscription(TFMessage, "/tf", self._raw, QoSProfile(depth=500))
        self.clouds: dict[str, list] = {"front": [], "rear": [], "map": []}
        reliable = QoSProfile(depth=50, reliability=QoSReliabilityPolicy.RELIABLE)
        latched = QoSProfile(depth=1, reliability=QoSReliabilityPolicy.RELIABLE,
                             durability=QoSDurabilityPolicy.TRANSIENT_LOCAL)
        for key, topic, qos in (("front", f"{NS}/front/points", reliable), ("rear", f"{NS}/rear/points", reliable),
                                ("map", f"{NS}/map_points", latched)):
            self.node.create_subscription(PointCloud2, topic, lambda m, k=key: self._cloud(k, m), qos)
        self.executor = SingleThreadedExecutor(context=self.ctx)
        self.executor.add_node(self.node)
        self._thread = threading.Thread(target=self._spin, daemon=True)
        self._thread.start()
        self.cams = {n: Listener(f"{NS}/{n}", f"/{n}/image", context=self.ctx, name=f"client_{n}") for n in MOUNTS}
        self.body = Listener(NS, "/unused/image", context=self.ctx, name="client_body")
        self.render = {n: SyntheticCamera(W, H, seed=i + 3) for i, n in enumerate(MOUNTS)}
        self.sent: dict[str, list[int]] = {n: [] for n in MOUNTS}
        self.corrupt: dict[str, list[int]] = {n: [] for n in MOUNTS}

    def _spin(self) -> None:
        try:
            self.executor.spin()
        except Exception:  # context shut down
            pass

    def _cloud(self, key: str, msg) -> None:
        with self.lock:
            self.clouds[key].append(msg)

    def _raw(self, msg) -> None:
        with self.lock:
            for t in msg.transforms:
                self.raw_tf.append((t.header.frame_id, t.child_frame_id, stamp_ns(t.header.stamp), matrix_of(t)))

    def publish_static(self) -> None:
        self.static.sendTransform([transform_msg(BASE, f"{n}_link", link) for n, (link, _) in MOUNTS.items()]
                                  + [transform_msg(f"{n}_link", f"{n}_optical", o) for n, (_, o) in MOUNTS.items()])

    def send(self, events: list[tuple[str, int]], timeout: float = 60.0) -> None:
        """Publish the frames ``(camera, stamp)`` at once (odometry first), then wait for a status of each."""
        for _, ns in events:
            self.moving.sendTransform(transform_msg(ODOM, BASE, odom_at(ns), ns))
        for name, ns in events:
            self.cams[name].pub.publish(image_message(self.image(name, ns), ns, f"{name}_optical"))
            self.sent[name].append(ns)
        for name, ns in events:
            assert self.cams[name].wait_for(lambda rx: ns in rx.status, timeout), f"no status for {name} {ns}"

    def flood(self, name: str, stamps: list[int], timeout: float = 30.0) -> None:
        """Images whose data is cut short (the size says more): each must end REJECTED_INPUT on its camera."""
        for k in range(0, len(stamps), 3):  # bursts of 3: the subscription keeps the last 5 messages
            burst = stamps[k:k + 3]
            for ns in burst:
                msg = image_message(self.image(name, ns), ns, f"{name}_optical")
                msg.data = bytes(msg.data)[:1000]
                self.cams[name].pub.publish(msg)
            self.corrupt[name] += burst
            assert self.cams[name].wait_for(lambda rx: all(ns in rx.status for ns in burst), timeout), "flood unseen"

    def image(self, name: str, ns: int) -> np.ndarray:
        return self.render[name].render(int((ns - STAMP0) // 10_000_000) % 50)

    def close(self) -> None:
        for lst in (*self.cams.values(), self.body):
            lst.close()
        self.executor.shutdown(timeout_sec=2.0)
        self._thread.join(5)
        self.node.destroy_node()
        rclpy.shutdown(context=self.ctx)


def lone_camera_poses(name: str, stamps: list[int], rig: Rig) -> dict[int, np.ndarray]:
    """The core run alone on one camera's frames: stamp -> the camera's pose in its stream's world."""
    from lingbot_map_ros.core.preprocess import FramePreprocessor
    from lingbot_map_ros.core.session_manager import SessionManager
    from lingbot_map_ros.core.settings import configs_from_values, defaults

    values = defaults()
    values.update({k: v for k, v in PARAMS.items() if k in values})
    runtime, stream = configs_from_values(values)
    manager = SessionManager.open(runtime, stream, log=lambda m: None)
    pre = FramePreprocessor(width=W)
    out = {}
    for ns in stamps:
        for r in manager.push(pre(rig.image(name, ns)), ns):
            out[r.stamp] = np.asarray(r.c2w, np.float64)
    manager.release()
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory, new_domain_id):
    tmp = tmp_path_factory.mktemp("cameras")
    domain = new_domain_id()
    rig = Rig(domain)
    session = tmp / "session"

    def start(name: str, **extra) -> NodeProcess:
        params = tmp / f"{name}.yaml"
        params.write_text(yaml.safe_dump({"/**": {"ros__parameters": {**PARAMS, "session_path": str(session),
                                                                      **extra}}}))
        return NodeProcess(["--params-file", str(params)], echo=False,
                           env=dict(os.environ, ROS_DOMAIN_ID=str(domain)), log_path=str(tmp / f"{name}.log"))

    node = start("node")
    phases: dict[str, list] = {}
    diags_stalled: list = []
    try:
        assert node.wait_ready(120), f"node did not start: {node.why_not_ready()}\n{node.output()[-3000:]}"
        for lst in rig.cams.values():
            assert lst.wait_connected(30), "no connection to the node"
        deadline = time.monotonic() + 30
        while rig.body.node.count_publishers(f"{NS}/pose") == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        rig.publish_static()
        time.sleep(0.5)
        front = [STAMP0 + i * 100_000_000 for i in range(60)]
        rear = [STAMP0 + 2_037_000_000 + i * 140_000_000 for i in range(30)]
        # A: the front camera alone for 20 frames (it creates the world); the rear one starts later
        phases["A"] = [("front", s) for s in front[:20]]
        for e in phases["A"]:
            rig.send([e])
        # B: both, at their own rates; frames close in time are published together (one tick batches them)
        events = sorted([("front", s) for s in front[20:28]] + [("rear", s) for s in rear[:6]], key=lambda e: e[1])
        phases["B"] = events
        i = 0
        while i < len(events):
            pair = events[i:i + 2] if i + 1 < len(events) and events[i][0] != events[i + 1][0] else events[i:i + 1]
            rig.send(pair)
            i += len(pair)
            if i >= 6 and not rig.corrupt["rear"]:  # a flood of corrupt images on the rear camera, between its frames
                rig.flood("rear", [events[i - 1][1] + 1_000_000 * (k + 1) for k in range(12)])
        # C: the front camera stops; the rear one goes on in real time past camera_timeout
        phases["C"] = [("rear", s) for s in rear[6:14]]
        t_stop = time.monotonic()
        for e in phases["C"]:
            rig.send([e])
            time.sleep(TIMEOUT / 4)
            # the first /diagnostics after the rear camera took the body pose over (at its first frame placed
            # once the front one had stalled: a loaded host places it some time after it was sent)
            if (time.monotonic() - t_stop > TIMEOUT + 0.3 and not diags_stalled
                    and rig.body.wait_for(lambda rx, stamp=e[1]: stamp in rx.poses, 1.0)):
                after = time.time()
                assert rig.body.wait_for(lambda rx: any(
                    a.header.stamp.sec + a.header.stamp.nanosec * 1e-9 >= after for a in rx.diagnostics), 5)
                with rig.body.lock:
                    diags_stalled.extend(rig.body.rx.diagnostics[-1:])
        # D: the front camera returns
        phases["D"] = sorted([("front", s) for s in front[40:44]] + [("rear", s) for s in rear[14:16]],
                             key=lambda e: e[1])
        for e in phases["D"]:
            rig.send([e])
        for name, lst in rig.cams.items():
            assert lst.wait_for(lambda rx: all(lst.final_status(s) is not None for s in rig.sent[name]), 60)
        # E: save both streams, stop; a new node resumes the session and both streams go on in the same world
        saved = rig.body.call(Trigger, f"{NS}/save_session", Trigger.Request(), timeout=60)
        assert saved is not None and saved.success, saved
        rc = node.stop()
        assert rc == 0 and "stopped cleanly" in node.output(), f"exit {rc}:\n{node.output()[-3000:]}"
        node = start("resumed", initial_session=str(session))
        assert node.wait_ready(120), f"resumed node did not start: {node.why_not_ready()}\n{node.output()[-3000:]}"
        assert "loaded the session of cameras ['front', 'rear']" in node.output()
        for lst in rig.cams.values():
            assert lst.wait_connected(30), "no connection to the resumed node"
        phases["E"] = [("front", front[48]), ("rear", rear[18]), ("front", front[49]), ("rear", rear[19])]
        for e in phases["E"]:
            rig.send([e])
        for name, lst in rig.cams.items():
            assert lst.wait_for(lambda rx: all(lst.final_status(s) is not None for s in rig.sent[name]), 60)
        time.sleep(0.5)
        yield {"rig": rig, "phases": phases, "stalled_diag": diags_stalled, "node": node}
    finally:
        rig.close()
        rc = node.stop()
        assert rc == 0 and "stopped cleanly" in node.output(), f"exit {rc}:\n{node.output()[-3000:]}"


def _camera_poses(rig: Rig, name: str) -> dict[int, np.ndarray]:
    with rig.cams[name].lock:
        return {s: pose_matrix(p.pose) for s, p in rig.cams[name].rx.poses.items()}


def _body_poses(rig: Rig) -> dict[int, np.ndarray]:
    with rig.body.lock:
        return {s: pose_matrix(p.pose) for s, p in rig.body.rx.poses.items()}


def test_every_frame_of_every_camera_ends_once(run):
    rig = run["rig"]
    for name, lst in rig.cams.items():
        with lst.lock:
            for s in rig.sent[name]:
                finals = [m for m in lst.rx.status.get(s, []) if m.status != BUFFERED]
                assert len(finals) == 1, f"{name} {s}: {[m.status for m in finals]}"
                assert finals[0].status == PROCESSED, f"{name} {s}: {finals[0].reason}"
        for s in rig.corrupt[name]:  # the flood: each rejected once, on its own camera
            finals = [m for m in lst.rx.status.get(s, []) if m.status != BUFFERED]
            assert [m.status for m in finals] == [REJECTED_INPUT], f"{name} {s}: {[m.reason for m in finals]}"
    assert rig.corrupt["rear"] and not rig.corrupt["front"]
    with rig.cams["front"].lock:
        assert not set(rig.corrupt["rear"]) & set(rig.cams["front"].rx.status)
    with rig.body.lock:
        assert not rig.body.rx.status, "the single-camera ~/frame_status carries nothing with cameras"


def test_each_camera_pose_is_its_lone_run_with_one_anchor(run):
    """~/<name>/pose = A_name x (the lone run's camera pose in its first body pose), one A per stream; the
    front camera created the world (A = I) and the rear one was anchored at its first frame by the held
    body pose (the node's world -> odom correction then x odom -> base_link at that stamp)."""
    rig = run["rig"]
    anchors = {}
    for name in MOUNTS:
        lone = lone_camera_poses(name, rig.sent[name], rig)
        published = _camera_poses(rig, name)
        assert set(published) == set(rig.sent[name])
        first = min(lone)
        first_body = lone[first] @ se3_inverse(EXTRINSIC[name])
        in_own_world = {s: se3_inverse(first_body) @ c for s, c in lone.items()}  # the stream's own world
        anchor = published[first] @ se3_inverse(in_own_world[first])
        anchors[name] = anchor
        for s, c in in_own_world.items():
            np.testing.assert_allclose(published[s], anchor @ c, rtol=0, atol=1e-6)
    np.testing.assert_allclose(anchors["front"], np.eye(4), atol=1e-9)
    # the rear stream's first body pose is the held one: some correction the node sent times odometry there
    rear_first = min(rig.sent["rear"])
    with rig.lock:
        corrections = [m for parent, child, _, m in rig.raw_tf if (parent, child) == (WORLD, ODOM)]
    held = [c @ odom_at(rear_first) for c in corrections]
    errors = [np.abs(h - anchors["rear"]).max() for h in held]
    assert min(errors) < 1e-6, min(errors)


def test_one_body_pose_one_parent_and_the_hand_over(run):
    rig, phases = run["rig"], run["phases"]
    body = _body_poses(rig)
    front_poses, rear_poses = _camera_poses(rig, "front"), _camera_poses(rig, "rear")
    # /tf: the node sends world -> odom only; each frame has one parent
    with rig.lock:
        edges = {(p, c) for p, c, _, _ in rig.raw_tf}
    parents: dict[str, set] = {}
    for p, c in edges:
        parents.setdefault(c, set()).add(p)
    assert all(len(p) == 1 for p in parents.values()), parents
    assert (ODOM, BASE) in edges and (WORLD, ODOM) in edges
    assert not any(c == BASE and p != ODOM for p, c in edges), "the node never publishes a parent of base_link"
    # A and B: the front camera drives; world -> base through tf2 is its body pose at its stamps
    front_ab = [s for n, s in phases["A"] + phases["B"] if n == "front"]
    rear_b = [s for n, s in phases["B"] if n == "rear"]
    assert set(front_ab) <= set(body) and not set(rear_b) & set(body)
    for s in front_ab[-4:]:
        np.testing.assert_allclose(body[s], front_poses[s] @ se3_inverse(EXTRINSIC["front"]), atol=1e-6)
        looked = matrix_of(rig.buffer.lookup_transform(WORLD, BASE, Time(nanoseconds=s),
                                                        rclpy.duration.Duration(seconds=2.0)))
        np.testing.assert_allclose(looked, body[s], atol=1e-6)
    # C: the rear camera drives after camera_timeout, with one constant offset
    rear_c = [s for _, s in phases["C"]]
    driven = [s for s in rear_c if s in body]
    assert driven and driven[-1] == rear_c[-1], "the rear camera never took the body pose over"
    offsets = [body[s] @ se3_inverse(rear_poses[s] @ se3_inverse(EXTRINSIC["rear"])) for s in driven]
    for o in offsets[1:]:
        np.testing.assert_allclose(o, offsets[0], atol=1e-6)
    # the offset is the two cameras' disagreement at one instant: the rear camera's latest frame within
    # the front camera's frames, the front body interpolated there (so at that instant the carried pose
    # is the front camera's: no jump)
    front_body = {s: p @ se3_inverse(EXTRINSIC["front"]) for s, p in front_poses.items()}
    rear_body = {s: p @ se3_inverse(EXTRINSIC["rear"]) for s, p in rear_poses.items()}
    at = max(s for s in rear_b if s <= max(front_ab))
    np.testing.assert_allclose(offsets[0], interpolated(front_body, at) @ se3_inverse(rear_body[at]), atol=1e-6)
    # /diagnostics named the stalled camera
    assert run["stalled_diag"], "no /diagnostics while the front camera was stalled"
    statuses = {s.name: s for s in run["stalled_diag"][0].status}
    front_status = statuses["lingbot_map: camera front"]
    level = front_status.level if isinstance(front_status.level, int) else int.from_bytes(front_status.level, "little")
    assert level == 1 and "front stalled" in front_status.message and "rear drives" in front_status.message
    rear_values = {kv.key: kv.value for kv in statuses["lingbot_map: camera rear"].values}
    assert rear_values["state"] == "driving" and int(rear_values["frames_rejected"]) == len(rig.corrupt["rear"])
    costs = ("place_publish_ms_median", "place_publish_cpu_ms_median", "place_ms_median", "place_cpu_ms_median",
             "sends_cpu_ms_median")
    for key in costs:  # the node's own cost per frame of this camera
        assert math.isfinite(float(rear_values[key])), rear_values
    print("\nrear camera, node overhead per frame (median ms): " + ", ".join(f"{k} {rear_values[k]}" for k in costs))
    # D: the front camera drives again on its return, continuing with one offset of its own
    front_d = [s for n, s in phases["D"] if n == "front"]
    rear_after = [s for n, s in phases["D"] if n == "rear" and s > min(front_d)]
    assert rear_after and set(front_d) <= set(body) and not set(rear_after) & set(body)
    back = [body[s] @ se3_inverse(front_body[s]) for s in front_d]
    for o in back[1:]:
        np.testing.assert_allclose(o, back[0], atol=1e-6)
    # the hand-back's instant: the front camera's latest frame within the rear camera's frames
    at = max(s for s in front_body if s < min(front_d) and s >= min(rear_body))
    np.testing.assert_allclose(back[0], offsets[0] @ interpolated(rear_body, at) @ se3_inverse(front_body[at]),
                               atol=1e-6)


def interpolated(poses: dict[int, np.ndarray], t: int) -> np.ndarray:
    """The pose of ``poses`` at ``t``: translation linear, rotation by SciPy's Slerp (an independent
    reference for the rig's own interpolation)."""
    from scipy.spatial.transform import Rotation, Slerp

    stamps = sorted(poses)
    before = max(s for s in stamps if s <= t)
    after = min((s for s in stamps if s >= t), default=before)
    if after == before:
        return poses[before]
    a = (t - before) / (after - before)
    rot = Slerp([0.0, 1.0], Rotation.from_matrix([poses[before][:3, :3], poses[after][:3, :3]]))([a])
    return se3(rot.as_matrix()[0], (1 - a) * poses[before][:3, 3] + a * poses[after][:3, 3])


def _xyz(msg) -> np.ndarray:
    """[N, 3] of a PointCloud2 whose x, y, z are float32 fields (read by their offsets)."""
    offsets = {f.name: f.offset for f in msg.fields}
    raw = np.frombuffer(bytes(msg.data), np.uint8).reshape(-1, msg.point_step)
    return np.stack([raw[:, offsets[k]:offsets[k] + 4].copy().view(np.float32)[:, 0] for k in "xyz"], 1)


def test_each_camera_has_its_points_and_one_map_fuses_both(run):
    """~/<name>/points in the world from each camera; ~/map_points, one voxel map, holds both cameras'
    points (each within a voxel of a map point)."""
    rig = run["rig"]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with rig.lock:
            if rig.clouds["map"] and rig.clouds["front"] and rig.clouds["rear"]:
                break
        time.sleep(0.1)
    time.sleep(0.5)  # the map's next publication holds the last frames
    with rig.lock:
        clouds = {k: list(v) for k, v in rig.clouds.items()}
    assert clouds["front"] and clouds["rear"] and clouds["map"], {k: len(v) for k, v in clouds.items()}
    assert all(m.header.frame_id == WORLD for v in clouds.values() for m in v)
    fused = _xyz(clouds["map"][-1])
    voxel = PARAMS["map_voxel_size"]
    for name in ("front", "rear"):
        points = _xyz(clouds[name][-1])
        assert len(points) > 0
        d = np.sqrt(((points[:200, None, :] - fused[None, :, :]) ** 2).sum(-1)).min(axis=1)
        assert np.mean(d <= voxel * math.sqrt(3)) > 0.9, f"{name}: its points are not in the one map"
