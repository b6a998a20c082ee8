"""The real node with publish_depth/points/map on, seen from a second node.

``lingbot_map_node`` runs as a child process (tiny preset, CPU, 64x48 frames -> 518x392 model input);
a separate rclpy node subscribes to every reconstruction topic and checks types, frame ids, stamps,
sizes and finiteness, re-projects every point of ``~/points`` with the ``~/camera_info`` and
``~/pose`` of the same stamp onto ``~/depth``, calls ``~/save_map`` and ``~/reset``.
"""
from __future__ import annotations

import math
import os
import re
import threading
import time

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy")
pytest.importorskip("lingbot_map_ros.msg")
pytestmark = [pytest.mark.ros, pytest.mark.slow]  # starts nodes or tool processes

from diagnostic_msgs.msg import DiagnosticArray  # noqa: E402
from geometry_msgs.msg import PoseStamped  # noqa: E402
from map_files import read_ply  # noqa: E402
from rclpy.context import Context  # noqa: E402
from rclpy.executors import SingleThreadedExecutor  # noqa: E402
from rclpy.qos import QoSDurabilityPolicy, QoSProfile, QoSReliabilityPolicy  # noqa: E402
from sensor_msgs.msg import CameraInfo, Image, PointCloud2  # noqa: E402
from std_srvs.srv import Trigger  # noqa: E402

from lingbot_map_ros.msg import FrameStatus  # noqa: E402
from lingbot_map_ros.tools.node_client import NodeProcess, SyntheticCamera, image_message, stamp_ns  # noqa: E402

W, H = 64, 48
CAMERA = "recon_cam_optical"
WORLD = "recon_world"
NS = "/lingbot_map"
TOPIC = "/recon_test/image"
STRIDE = 8
MIN_CONF = 1.5
MAP_MAX = 3000
PROCESSED, BUFFERED = FrameStatus.PROCESSED, FrameStatus.BUFFERED
TOPICS = {"depth": Image, "depth_confidence": Image, "camera_info": CameraInfo, "points": PointCloud2,
          "map_points": PointCloud2, "pose": PoseStamped}


def cloud_fields(msg: PointCloud2) -> dict:
    """Every field of the cloud by its own offset (structured view of the bytes)."""
    names = [f.name for f in msg.fields]
    dt = np.dtype({"names": names, "formats": ["<f4"] * len(names), "offsets": [f.offset for f in msg.fields],
                   "itemsize": msg.point_step})
    rec = np.frombuffer(bytes(msg.data), dt, count=msg.width * msg.height)
    return {n: rec[n].astype(np.float64) for n in names}


class Collector:
    """The second node: everything it receives, keyed by topic, in arrival order."""

    def __init__(self, context):
        self.node = rclpy.create_node("recon_test_client", context=context)
        self.cv = threading.Condition()
        self.rx: dict = {k: [] for k in TOPICS}
        reliable = QoSProfile(depth=100, reliability=QoSReliabilityPolicy.RELIABLE)
        latched = QoSProfile(depth=1, reliability=QoSReliabilityPolicy.RELIABLE,
                             durability=QoSDurabilityPolicy.TRANSIENT_LOCAL)
        for name, typ in TOPICS.items():
            self.node.create_subscription(typ, f"{NS}/{name}", self._cb(name),
                                          latched if name == "map_points" else reliable)
        self.rx["frame_status"] = []
        self.node.create_subscription(FrameStatus, f"{NS}/frame_status", self._cb("frame_status"),
                                      QoSProfile(depth=100))
        # created last: our readers are announced in creation order on one reliable discovery stream, so once
        # the node's /diagnostics reach this one, the node has matched every reader above it too
        self.rx["diagnostics"] = []
        self.node.create_subscription(DiagnosticArray, "/diagnostics", self._cb("diagnostics"), reliable)
        self.pub = self.node.create_publisher(Image, TOPIC,
                                              QoSProfile(depth=10, reliability=QoSReliabilityPolicy.RELIABLE))
        self.executor = SingleThreadedExecutor(context=context)
        self.executor.add_node(self.node)
        self.thread = threading.Thread(target=self._spin, daemon=True)
        self.thread.start()

    def _spin(self):
        try:
            self.executor.spin()
        except Exception:  # context shut down
            pass

    def _cb(self, name):
        def cb(msg):
            with self.cv:
                self.rx[name].append(msg)
                self.cv.notify_all()
        return cb

    def wait(self, pred, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self.cv:
            while not pred(self.rx):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cv.wait(min(left, 0.2))
        return True

    def call(self, name: str, timeout: float = 30.0):
        client = self.node.create_client(Trigger, f"{NS}/{name}")
        assert client.wait_for_service(timeout_sec=timeout), f"no service {name}"
        future = client.call_async(Trigger.Request())
        deadline = time.monotonic() + timeout
        while not future.done():
            assert time.monotonic() < deadline, f"{name}: no answer"
            time.sleep(0.02)
        return future.result()

    def close(self):
        self.executor.shutdown(timeout_sec=1.0)
        self.node.destroy_node()


@pytest.fixture(scope="module")
def env(tmp_path_factory, new_domain_id):
    tmp = tmp_path_factory.mktemp("recon_node")
    domain = new_domain_id()
    map_path = tmp / "saved" / "map.ply"
    node = NodeProcess(
        ["-p", "model_preset:=tiny", "-p", "device:=cpu", "-p", "scale_frames:=2", "-p", "sliding_window:=3",
         "-p", "camera_iterations:=1", "-p", "qos_reliability:=reliable", "-p", f"world_frame:={WORLD}",
         "-p", "diagnostics_period:=0.2",
         "-p", f"camera_frame:={CAMERA}", "-p", "publish_depth:=true", "-p", "publish_points:=true",
         "-p", "publish_map:=true", "-p", f"points_stride:={STRIDE}", "-p", f"points_min_confidence:={MIN_CONF}",
         "-p", f"map_max_points:={MAP_MAX}", "-p", "map_period:=0.3", "-p", "map_voxel_size:=0.0001",
         "-p", f"map_path:={map_path}", "-r", f"image:={TOPIC}"],
        echo=False, env=dict(os.environ, ROS_DOMAIN_ID=str(domain)), log_path=str(tmp / "node.log"),
    )
    ctx = Context()
    rclpy.init(context=ctx, domain_id=domain)
    col = Collector(ctx)
    try:
        assert node.wait_ready(120), f"node did not start:\n{node.output()}"
        deadline = time.monotonic() + 30
        while col.pub.get_subscription_count() == 0 or col.node.count_publishers(f"{NS}/points") == 0:
            assert time.monotonic() < deadline, f"no connection:\n{node.output()[-2000:]}"
            time.sleep(0.05)
        # the node's side of discovery: its periodic /diagnostics reached our last reader
        assert col.wait(lambda rx: rx["diagnostics"], 30), f"the node never matched us:\n{node.output()[-2000:]}"
        yield {"node": node, "col": col, "map_path": map_path}
    finally:
        col.close()
        rc = node.stop()
        rclpy.shutdown(context=ctx)
        assert rc == 0, f"node exit code {rc}:\n{node.output()[-3000:]}"


def send_frames(env, count: int, first: int) -> list[int]:
    col, cam = env["col"], SyntheticCamera(W, H, seed=5)
    stamps = []
    for i in range(count):
        stamp = 1_700_000_000 * 10**9 + (first + i) * 100_000_000
        col.pub.publish(image_message(cam.render(first + i), stamp, "ignored_frame"))
        stamps.append(stamp)
        # one frame at a time: wait for its first status (BUFFERED while the scale frames fill up)
        assert col.wait(lambda rx: stamp in {stamp_ns(m.header.stamp) for m in rx["frame_status"]}, 120), \
            env["node"].output()[-3000:]
    assert col.wait(lambda rx: stamps[-1] in {stamp_ns(m.header.stamp) for m in rx["pose"]}, 60)
    with col.cv:
        final = {stamp_ns(m.header.stamp): m.status for m in col.rx["frame_status"] if m.status != BUFFERED}
    assert all(final.get(s) == PROCESSED for s in stamps), final
    return stamps


def by_stamp(msgs) -> dict:
    return {stamp_ns(m.header.stamp): m for m in msgs}


def test_topics_types_frames_stamps_sizes_and_reprojection(env):
    col = env["col"]
    stamps = send_frames(env, 5, first=0)
    need = ("depth", "depth_confidence", "camera_info", "points")
    assert col.wait(lambda rx: all(set(stamps) <= set(by_stamp(rx[k])) for k in need), 60), \
        {k: len(v) for k, v in col.rx.items()}
    types = dict(col.node.get_topic_names_and_types())
    for name, typ in TOPICS.items():
        assert types[f"{NS}/{name}"] == [f"{typ.__module__.split('.')[0]}/msg/{typ.__name__}"]

    with col.cv:
        rx = {k: by_stamp(v) for k, v in col.rx.items()}
    for s in stamps:
        topics = ("depth", "depth_confidence", "camera_info", "points", "pose")
        depth, conf, info, cloud, pose = (rx[k][s] for k in topics)
        # frames
        assert depth.header.frame_id == conf.header.frame_id == info.header.frame_id == CAMERA
        assert cloud.header.frame_id == pose.header.frame_id == WORLD
        # sizes: everything at the model input size (518 wide)
        assert (depth.width, depth.height) == (conf.width, conf.height) == (info.width, info.height)
        assert depth.width == 518 and depth.height % 14 == 0
        assert depth.encoding == conf.encoding == "32FC1" and cloud.height == 1
        assert cloud.point_step == 20 and cloud.row_step == 20 * cloud.width and cloud.is_dense
        assert 0 < cloud.width <= math.ceil(depth.width / STRIDE) * math.ceil(depth.height / STRIDE)
        d = np.frombuffer(bytes(depth.data), "<f4").reshape(depth.height, depth.width).astype(np.float64)
        c = np.frombuffer(bytes(conf.data), "<f4").reshape(conf.height, conf.width)
        assert np.all(np.isfinite(c)) and np.all(np.isfinite(info.k)) and np.all(np.isfinite(info.p))
        f = cloud_fields(cloud)
        assert all(np.all(np.isfinite(v)) for v in f.values())
        assert np.all(f["confidence"] >= MIN_CONF)
        # re-projection: pose of the same stamp (world <- camera), K of the same stamp
        q = np.array([pose.pose.orientation.x, pose.pose.orientation.y, pose.pose.orientation.z,
                      pose.pose.orientation.w])
        x, y, z, w = q / np.linalg.norm(q)
        rot = np.array([[1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
                        [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
                        [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)]])
        t = np.array([pose.pose.position.x, pose.pose.position.y, pose.pose.position.z])
        k = np.array(info.k).reshape(3, 3)
        pts = np.stack([f["x"], f["y"], f["z"]], 1)
        cam = (pts - t) @ rot  # R^T (p - t)
        assert np.all(cam[:, 2] > 0)
        u = np.rint(k[0, 0] * cam[:, 0] / cam[:, 2] + k[0, 2]).astype(int)
        v = np.rint(k[1, 1] * cam[:, 1] / cam[:, 2] + k[1, 2]).astype(int)
        assert np.all((u >= 0) & (u < depth.width) & (v >= 0) & (v < depth.height))
        assert np.all(u % STRIDE == 0) and np.all(v % STRIDE == 0)
        z_ref = d[v, u]
        assert np.max(np.abs(cam[:, 2] - z_ref) / z_ref) <= 1e-4
        assert np.all(c[v, u] >= MIN_CONF)


def test_map_points_bounded_finite_and_saved(env):
    col = env["col"]
    assert col.wait(lambda rx: any(m.width > 0 for m in rx["map_points"]), 30)
    with col.cv:
        latest = col.rx["map_points"][-1]
    assert latest.header.frame_id == WORLD and 0 < latest.width <= MAP_MAX
    assert latest.point_step == 20 and latest.row_step == 20 * latest.width and latest.is_dense
    f = cloud_fields(latest)
    assert all(np.all(np.isfinite(v)) for v in f.values())
    res = col.call("save_map")
    assert res.success, res.message
    _, vert = read_ply(env["map_path"])
    assert 0 < len(vert) <= MAP_MAX
    assert all(np.all(np.isfinite(vert[n])) for n in ("x", "y", "z", "confidence"))
    # more frames than the map holds: it stays at MAP_MAX voxels (tiny voxels: every point is new)
    send_frames(env, 4, first=10)
    assert col.wait(lambda rx: rx["map_points"][-1].width == MAP_MAX, 30), [m.width for m in col.rx["map_points"]]


def test_reset_empties_the_map(env):
    col = env["col"]
    with col.cv:
        before = len(col.rx["map_points"])
    assert col.call("reset").success
    assert col.wait(lambda rx: any(m.width == 0 for m in rx["map_points"][before:]), 30), \
        [m.width for m in col.rx["map_points"][before:]]


def _set_parameter(col, name: str, value) -> None:
    from rclpy.parameter import Parameter
    from rclpy.parameter_client import AsyncParameterClient

    client = AsyncParameterClient(col.node, NS)
    assert client.wait_for_services(timeout_sec=30), "no parameter services"
    future = client.set_parameters([Parameter(name, value=value)])
    deadline = time.monotonic() + 30
    while not future.done():
        assert time.monotonic() < deadline, f"set {name}: no answer"
        time.sleep(0.02)
    assert all(r.successful for r in future.result().results), future.result()


def test_save_map_says_why_an_empty_map_is_not_written(env):
    """With publish_map off the map is not built: ~/save_map used to answer success with 0 points and
    overwrite the last good file with an empty one. It fails with the reason and keeps the file; a
    map kept from before is written, with a note that it is not being updated."""
    col, path = env["col"], env["map_path"]
    assert path.is_file()
    saved = path.read_bytes()
    _set_parameter(col, "publish_map", False)
    try:
        assert col.call("reset").success  # a new session: the map is emptied
        res = col.call("save_map")
        assert not res.success, res.message
        assert res.message.startswith(f"nothing written to {path}: the map is empty because it is built only "
                                      "while publish_map is true, and it is false"), res.message
        assert path.read_bytes() == saved
        _set_parameter(col, "publish_map", True)
        res = col.call("save_map")  # on, but nothing merged into the new session's map yet
        assert not res.success and "no frame of this session has been merged" in res.message, res.message
        send_frames(env, 3, first=20)
        assert col.wait(lambda rx: rx["map_points"][-1].width > 0, 30)
        _set_parameter(col, "publish_map", False)
        res = col.call("save_map")
        assert res.success and re.fullmatch(rf"wrote \d+ map points to {re.escape(str(path))} \(publish_map is "
                                            r"false: the map is not being updated\)", res.message), res.message
        assert read_ply(path)[1].shape[0] > 0
    finally:
        _set_parameter(col, "publish_map", True)


def test_depth_every_set_at_runtime_thins_the_depth_outputs_only(env):
    """``ros2 param set ... depth_every 3``: from the next frame, two of any six consecutive frames
    carry ~/depth, ~/camera_info and ~/points, three frames apart; every frame still gets its pose and
    ends PROCESSED. Back at 1, every frame has depth again."""
    col = env["col"]
    send_frames(env, 2, first=30)  # the session is in phase 2 even when this test runs alone (the env's
    # scale_frames is 2, and scale frames carry depth whatever depth_every says)
    _set_parameter(col, "depth_every", 3)
    try:
        thinned = send_frames(env, 6, first=40)  # every frame: PROCESSED and a pose
    finally:
        _set_parameter(col, "depth_every", 1)
    # back at 1: these two carry every output, and they are the markers: each topic has one ordered
    # writer, so once their outputs are here every output of the six frames before them is too
    markers = send_frames(env, 2, first=50)
    kinds = ("depth", "camera_info", "points")
    assert col.wait(lambda rx: all(set(markers) <= set(by_stamp(rx[k])) for k in kinds), 30)
    with col.cv:
        got = {k: set(by_stamp(col.rx[k])) & set(thinned) for k in kinds}
    with_depth = [i for i, s in enumerate(thinned) if s in got["depth"]]
    assert len(with_depth) == 2 and with_depth[1] - with_depth[0] == 3, with_depth
    assert got["camera_info"] == got["points"] == got["depth"]
