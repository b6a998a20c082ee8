"""The real node (console script ``lingbot_map_node`` in a child process) against a separate test node
over real topics and services on loopback.

One node runs for the whole module (starting one costs a torch import and a model build); the tests
use it in file order: parameters, a stream, cache statistics and diagnostics, the TUM file, bad input,
parameter changes, reset. Small frames (64x48), the tiny preset, scale_frames 2, sliding_window 3,
keyframe_interval 2, reliable QoS so frames are counted exactly.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

rclpy = pytest.importorskip("rclpy")
pytest.importorskip("lingbot_map_ros.msg")
pytest.importorskip("tf2_msgs.msg")
pytestmark = pytest.mark.ros

from rclpy.context import Context  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from rclpy.parameter_client import AsyncParameterClient  # noqa: E402
from sensor_msgs.msg import Image  # noqa: E402
from std_srvs.srv import Trigger  # noqa: E402

from lingbot_map_ros.core.trajectory import read_tum  # noqa: E402
from lingbot_map_ros.ros.node import PARAMETER_NAMES  # noqa: E402
from lingbot_map_ros.tools.node_client import Listener, NodeProcess, SyntheticCamera, image_message, stamp_ns  # noqa: E402

PROCESSED, DROPPED_QUEUE, REJECTED_INPUT, REFUSED_POLICY, BUFFERED = 0, 1, 2, 3, 4
W, H = 64, 48
CAMERA_FRAME_ID = "test_cam_optical"
WORLD = "test_world"
NS = "/lingbot_map"
TOPIC = "/test/camera/image"


def wait_future(future, timeout: float = 15.0):
    deadline = time.monotonic() + timeout
    while not future.done():
        if time.monotonic() > deadline:
            raise TimeoutError("no answer")
        time.sleep(0.02)
    return future.result()


def diag_values(array, name: str) -> dict:
    for s in array.status:
        if s.name == "lingbot_map: " + name:
            return {"level": s.level, "message": s.message, **{kv.key: kv.value for kv in s.values}}
    return {}


class Driver:
    """Sends frames with unique stamps and waits for the node's verdict on each."""

    def __init__(self, listener: Listener, node: NodeProcess):
        self.listener, self.node = listener, node
        self.camera = SyntheticCamera(W, H, seed=3)
        self.next_stamp = 1_700_000_000 * 10**9
        self.index = 0

    def stamp(self) -> int:
        self.next_stamp += 50_000_000
        return self.next_stamp

    def send(self, msg=None, timeout: float = 60.0) -> int:
        """Publish ``msg`` (default: the next synthetic frame) and wait for its first FrameStatus."""
        stamp = self.stamp()
        if msg is None:
            msg = image_message(self.camera.render(self.index), stamp, CAMERA_FRAME_ID)
            self.index += 1
        msg.header.stamp.sec, msg.header.stamp.nanosec = divmod(stamp, 10**9)
        self.listener.pub.publish(msg)
        ok = self.listener.wait_for(lambda rx: stamp in rx.status, timeout)
        assert ok, f"no frame_status for stamp {stamp}; node output:\n{self.node.output()[-3000:]}"
        return stamp

    def final(self, stamp: int, timeout: float = 60.0):
        assert self.listener.wait_for(lambda rx: self.listener.final_status(stamp) is not None, timeout)
        with self.listener.lock:
            return self.listener.final_status(stamp)

    def latest_diag(self, after: float, timeout: float = 10.0):
        """The first /diagnostics message that arrives after ``after`` (perf_counter)."""
        box = {}

        def ready(rx):
            for arr in reversed(rx.diagnostics):
                t = arr.header.stamp.sec + arr.header.stamp.nanosec * 1e-9
                if t >= after:
                    box["a"] = arr
                    return True
            return False

        assert self.listener.wait_for(ready, timeout), "no /diagnostics"
        return box["a"]


@pytest.fixture(scope="module")
def env(tmp_path_factory, new_domain_id, package_dir):
    tmp = tmp_path_factory.mktemp("node")
    domain = new_domain_id()
    shipped = package_dir / "config" / "lingbot_map.yaml"
    # A second parameter file derived from the shipped one: what a user would write.
    doc = yaml.safe_load(shipped.read_text())
    params = doc["/**"]["ros__parameters"]
    params.update(world_frame=WORLD, path_max_length=5, trajectory_path=str(tmp / "traj.tum"), diagnostics_period=0.3)
    override = tmp / "override.yaml"
    override.write_text(yaml.safe_dump(doc))
    ros_env = dict(os.environ, ROS_DOMAIN_ID=str(domain))
    node = NodeProcess(
        ["--params-file", str(shipped), "--params-file", str(override),
         "-p", "model_preset:=tiny", "-p", "device:=cpu", "-p", "scale_frames:=2", "-p", "sliding_window:=3",
         "-p", "keyframe_interval:=2", "-p", "camera_iterations:=2", "-p", "qos_reliability:=reliable",
         "-r", f"image:={TOPIC}"],
        echo=False, env=ros_env, log_path=str(tmp / "node.log"),
    )
    ctx = Context()
    rclpy.init(context=ctx, domain_id=domain)
    listener = Listener(NS, TOPIC, context=ctx, name="lingbot_test_client")
    try:
        assert node.wait_ready(120), f"node did not start:\n{node.output()}"
        assert listener.wait_connected(30), "no connection to the node"
        yield {"node": node, "listener": listener, "driver": Driver(listener, node), "tmp": tmp, "ctx": ctx}
    finally:
        listener.close()
        rc = node.stop()  # SIGINT: clean shutdown
        rclpy.shutdown(context=ctx)
        assert rc == 0, f"node exit code {rc}:\n{node.output()[-3000:]}"
        assert "stopped cleanly" in node.output()


@pytest.mark.slow
def test_parameters_from_files_and_command_line(env):
    listener = env["listener"]
    client = AsyncParameterClient(listener.node, NS)
    assert client.wait_for_services(15)
    names = wait_future(client.list_parameters()).result.names
    assert set(PARAMETER_NAMES) <= set(names)
    shipped = yaml.safe_load((Path(__file__).parents[1] / "config" / "lingbot_map.yaml").read_text())
    assert set(shipped["/**"]["ros__parameters"]) <= set(names), "YAML holds a parameter the node does not declare"
    got = wait_future(client.get_parameters(["world_frame", "path_max_length", "scale_frames", "dtype",
                                             "trajectory_path"])).values
    assert got[0].string_value == WORLD  # from the second --params-file
    assert got[1].integer_value == 5
    assert got[2].integer_value == 2  # from -p
    assert got[3].string_value == "auto"  # from the shipped file
    assert got[4].string_value.endswith("traj.tum")
    descs = wait_future(client.describe_parameters(list(PARAMETER_NAMES))).descriptors
    for d in descs:
        assert d.description, f"{d.name} has no description"
    by_name = {d.name: d for d in descs}
    assert by_name["camera_iterations"].integer_range[0].from_value == 1
    assert by_name["camera_iterations"].integer_range[0].to_value == 4
    assert by_name["diagnostics_period"].floating_point_range
    assert by_name["allow_unsafe_checkpoint"].read_only


@pytest.mark.slow
def test_stream_poses_frames_tf_and_cache(env):
    d, rx = env["driver"], env["listener"].rx
    t_start = time.time()
    first = d.send()
    assert [s.status for s in rx.status[first]] == [BUFFERED]  # waiting for the second scale frame
    stamps = [first] + [d.send() for _ in range(9)]
    for s in stamps:
        assert d.final(s).status == PROCESSED
    lst = env["listener"]
    assert lst.wait_for(lambda r: all(s in r.poses and s in r.odoms and s in r.stats for s in stamps), 10)
    # poses: image stamps, configured frames (phase-1 frames with their own stamps)
    for s in stamps:
        pose, odom = rx.poses[s], rx.odoms[s]
        assert stamp_ns(pose.header.stamp) == s and pose.header.frame_id == WORLD
        assert odom.header.frame_id == WORLD and odom.child_frame_id == CAMERA_FRAME_ID
        q = pose.pose.orientation
        assert abs(q.x**2 + q.y**2 + q.z**2 + q.w**2 - 1) < 1e-6
        assert odom.pose.pose.position.x == pose.pose.position.x
    # path: bounded by path_max_length=5, newest last
    assert lst.wait_for(lambda r: any(stamp_ns(p.poses[-1].header.stamp) == stamps[-1] for p in r.paths if p.poses), 10)
    assert all(len(p.poses) <= 5 for p in rx.paths)
    last_path = [p for p in rx.paths if p.poses and stamp_ns(p.poses[-1].header.stamp) == stamps[-1]][0]
    assert [stamp_ns(p.header.stamp) for p in last_path.poses] == stamps[-5:]
    assert [p.pose for p in last_path.poses] == [rx.poses[s].pose for s in stamps[-5:]]  # the ~/pose values
    assert last_path.header.frame_id == WORLD
    # /tf: world -> camera frame of the image, at the image stamps
    assert lst.wait_for(lambda r: sum(len(m.transforms) for m in r.tf) >= len(stamps), 10)
    tfs = {stamp_ns(t.header.stamp): t for m in rx.tf for t in m.transforms}
    for s in stamps:
        t = tfs[s]
        assert t.header.frame_id == WORLD and t.child_frame_id == CAMERA_FRAME_ID
        assert t.transform.translation.z == rx.poses[s].pose.position.z
    # cache_stats: scale frames, keyframes every 2nd frame, stored/evicted/free pages that move
    stats = [rx.stats[s] for s in stamps]
    assert [st.frame_index for st in stats] == list(range(10))
    assert [st.is_scale_frame for st in stats] == [True, True] + [False] * 8
    assert [st.is_keyframe for st in stats] == [True, True] + [True, False] * 4
    assert [st.frames_stored for st in stats[2:]] == [3, 3, 4, 4, 5, 5, 6, 6]
    assert stats[-1].scale_frames == 2 and stats[-1].window_frames == 3 and stats[-1].frames_evicted == 1
    assert stats[4].frames_evicted == 0
    assert stats[-1].free_pages < stats[2].free_pages
    assert stats[-1].patch_pages_total == 2 + 3 + 16
    assert stats[-1].special_tokens == 6 * 6 and stats[-1].special_pages >= 1
    assert stats[-2].rope_frame_index == 5 and stats[-1].rope_frame_index == 6  # a non-keyframe uses f = F
    assert stats[-1].visible_keys > 0 and stats[-1].max_frame_num == 1024 and stats[-1].page_size == 28 * 37
    assert stats[-1].frames_received >= 10 and stats[-1].frames_processed >= 10
    assert stats[-1].latency_ms > 0 and stats[-1].node_overhead_ms > 0
    assert stats[-1].backend == "sdpa" and stats[-1].dtype == "float32" and stats[-1].camera_cache_frames > 0
    # /diagnostics: the four statuses, KV cache values that moved with the frames
    diag = d.latest_diag(after=time.time())
    names = {s.name for s in diag.status}
    assert {"lingbot_map: input", "lingbot_map: inference", "lingbot_map: kv cache", "lingbot_map: backend"} <= names
    cache = diag_values(diag, "kv cache")
    assert cache["frames_stored"] == "6" and cache["frames_evicted"] == "1" and cache["window_frames"] == "3"
    assert cache["free_pages"] == str(stats[-1].free_pages)
    earlier = [diag_values(a, "kv cache").get("frames_stored") for a in rx.diagnostics
               if a.header.stamp.sec + a.header.stamp.nanosec * 1e-9 >= t_start]
    assert len(set(earlier)) >= 2, f"kv cache diagnostics did not move: {earlier}"
    assert int(diag_values(diag, "input")["frames_received"]) >= 10
    assert int(diag_values(diag, "inference")["frames_processed"]) >= 10
    backend = diag_values(diag, "backend")
    assert backend["backend"] == "sdpa" and backend["random_weights"] == "True" and backend["level"] == b"\x01"
    env["stamps"] = stamps


@pytest.mark.slow
def test_save_trajectory_matches_published_poses(env):
    lst, rx = env["listener"], env["listener"].rx
    resp = lst.call(Trigger, f"{NS}/save_trajectory", Trigger.Request())
    assert resp is not None and resp.success, resp
    path = env["tmp"] / "traj.tum"
    stamps_sec, pos, quat = read_tum(path)
    sent = env["stamps"]
    assert len(stamps_sec) == len(sent)
    np.testing.assert_allclose(stamps_sec, [s / 1e9 for s in sent], atol=1e-6, rtol=0)
    for i, s in enumerate(sent):
        p, q = rx.poses[s].pose.position, rx.poses[s].pose.orientation
        np.testing.assert_allclose(pos[i], [p.x, p.y, p.z], atol=1e-9)
        qq = np.array([q.x, q.y, q.z, q.w])
        assert min(np.abs(quat[i] - qq).max(), np.abs(quat[i] + qq).max()) < 1e-9


def _bad_messages():
    ok = np.zeros((H, W, 3), np.uint8)
    unsupported = image_message(ok, 0, CAMERA_FRAME_ID)
    unsupported.encoding = "16UC1"
    short = image_message(ok, 0, CAMERA_FRAME_ID)
    short.data = bytes(W * 3 * H - 7)
    zero = Image(height=0, width=0, encoding="rgb8", step=0)
    zero.header.frame_id = CAMERA_FRAME_ID
    resized = image_message(np.zeros((H + 12, W + 16, 3), np.uint8), 0, CAMERA_FRAME_ID)
    return [("unsupported", unsupported, "encoding"), ("data_length", short, "data length"),
            ("zero_size", zero, "zero-sized"), ("resolution_changed", resized, "resolution changed")]


@pytest.mark.slow
def test_bad_input_rejected_logged_counted_and_node_keeps_going(env):
    d, lst = env["driver"], env["listener"]
    for kind, msg, text in _bad_messages():
        stamp = d.send(msg)
        status = d.final(stamp)
        assert status.status == REJECTED_INPUT and text in status.reason, (kind, status.reason)
        good = d.send()
        assert d.final(good).status == PROCESSED, f"good frame after {kind} not processed"
        deadline = time.monotonic() + 5
        while status.reason not in env["node"].output() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert status.reason in env["node"].output(), f"reason for {kind} not logged"
    assert lst.wait_for(lambda r: good in r.stats, 10)
    assert lst.rx.stats[good].frames_rejected == 4
    assert lst.rx.stats[good].frames_dropped >= 4
    diag = d.latest_diag(after=time.time())
    inp = diag_values(diag, "input")
    for kind, _, _ in _bad_messages():
        assert inp[f"rejected_{kind}"] == "1", (kind, inp)
    assert inp["frames_rejected"] == "4"


@pytest.mark.slow
def test_runtime_parameter_changes(env):
    d, lst, rx = env["driver"], env["listener"], env["listener"].rx
    client = AsyncParameterClient(lst.node, NS)
    assert client.wait_for_services(15)

    def set_(name, value):
        return wait_future(client.set_parameters([Parameter(name, value=value)])).results[0]

    before = rx.status_log[-1].session_id
    # rejected, each with its reason; nothing changes
    r = set_("long_run_policy", "forever")
    assert not r.successful and "long_run_policy must be one of" in r.reason
    r = set_("max_stored_frames", 5000)
    assert not r.successful and "must not exceed max_frame_num" in r.reason
    r = set_("camera_iterations", 9)
    assert not r.successful and r.reason
    r = set_("image_transport", "h264")
    assert not r.successful and "image_transport" in r.reason
    r = set_("allow_unsafe_checkpoint", True)
    assert not r.successful and "read-only" in r.reason
    r = set_("checkpoint", "/no/such/file.pt")
    assert not r.successful and "not a readable file" in r.reason
    assert wait_future(client.get_parameters(["sliding_window"])).values[0].integer_value == 3
    # valid session-level change: applied by starting a new session
    r = set_("sliding_window", 4)
    assert r.successful, r.reason
    d.send()  # the new session's two scale frames
    d.send()
    s3 = d.send()
    assert d.final(s3).status == PROCESSED
    assert lst.wait_for(lambda x: s3 in x.stats, 10)
    st = rx.stats[s3]
    assert st.session_id == before + 1 and st.frame_index == 2
    assert st.patch_pages_total == 2 + 4 + 16  # the new window size is in force
    diag = d.latest_diag(after=time.time())
    inf = diag_values(diag, "inference")
    assert inf["sessions_from_parameter_changes"] == "1" and "sliding_window" in inf["last_new_session_reason"]
    # keyframe_interval: from the next frame, same session
    r = set_("keyframe_interval", 1)
    assert r.successful
    more = [d.send() for _ in range(3)]
    assert lst.wait_for(lambda x: all(s in x.stats for s in more), 20)
    assert all(rx.stats[s].is_keyframe for s in more)
    assert {rx.stats[s].session_id for s in more} == {before + 1}
    # publishing parameters: from the next frame
    assert set_("world_frame", "other_world").successful
    s = d.send()
    assert d.final(s).status == PROCESSED and lst.wait_for(lambda x: s in x.poses, 10)
    assert rx.poses[s].header.frame_id == "other_world"
    assert set_("world_frame", WORLD).successful
    # fast_resize: from the next frame, same session, frames still processed
    assert set_("fast_resize", True).successful
    s = d.send()
    assert d.final(s).status == PROCESSED and lst.wait_for(lambda x: s in x.stats, 10)
    assert rx.stats[s].session_id == before + 1
    assert set_("fast_resize", False).successful
    assert "parameters changed" in env["node"].output()


@pytest.mark.slow
def test_reset_starts_new_world_frame(env):
    d, lst, rx = env["driver"], env["listener"], env["listener"].rx
    before = rx.status_log[-1].session_id
    resp = lst.call(Trigger, f"{NS}/reset", Trigger.Request())
    assert resp is not None and resp.success and "new world frame" in resp.message
    a = d.send()
    assert [s.status for s in rx.status[a]] == [BUFFERED]  # scale frames are collected anew
    b = d.send()
    assert d.final(b).status == PROCESSED
    assert lst.wait_for(lambda x: a in x.stats and b in x.stats, 10)
    assert rx.stats[a].session_id == before + 1 and rx.stats[a].frame_index == 0
    assert rx.stats[b].frames_stored == 2 and rx.stats[b].frames_evicted == 0
    assert lst.wait_for(lambda x: any(p.poses and stamp_ns(p.poses[-1].header.stamp) == b for p in x.paths), 10)
    path = [p for p in rx.paths if p.poses and stamp_ns(p.poses[-1].header.stamp) == b][-1]
    assert [stamp_ns(p.header.stamp) for p in path.poses] == [a, b]  # the path restarts with the session
    resp = lst.call(Trigger, f"{NS}/save_trajectory", Trigger.Request())
    stamps_sec, _, _ = read_tum(env["tmp"] / "traj.tum")
    assert len(stamps_sec) == 2


@pytest.mark.slow
def test_latest_frame_queue_drops_are_counted(env):
    """A burst faster than inference: newer frames replace queued ones; every frame is accounted for."""
    d, lst = env["driver"], env["listener"]
    burst = []
    for _ in range(4):  # fewer than the subscription depth (5): DDS itself loses nothing
        stamp = d.stamp()
        burst.append(stamp)
        lst.pub.publish(image_message(d.camera.render(d.index), stamp, CAMERA_FRAME_ID))
        d.index += 1
    finals = [d.final(s) for s in burst]
    kinds = [f.status for f in finals]
    assert set(kinds) <= {PROCESSED, DROPPED_QUEUE}
    assert kinds[-1] == PROCESSED  # the newest frame is never the one replaced
    assert DROPPED_QUEUE in kinds, kinds
    dropped = [f for f in finals if f.status == DROPPED_QUEUE]
    assert all("replaced by a newer frame" in f.reason for f in dropped)
    assert lst.wait_for(lambda x: burst[-1] in x.stats, 10)
    diag = d.latest_diag(after=time.time())
    assert int(diag_values(diag, "inference")["frames_dropped_queue"]) == len(dropped)


@pytest.mark.slow
def test_stop_policy_warns_then_refuses_and_policy_switch(env):
    """long_run_policy 'stop': WARN in /diagnostics before the limit, REFUSED_POLICY at it, ~/reset
    recovers; switching to 'window' is validated against overlap_frames, then applied."""
    d, lst, rx = env["driver"], env["listener"], env["listener"].rx
    client = AsyncParameterClient(lst.node, NS)
    assert client.wait_for_services(15)

    def set_(name, value):
        return wait_future(client.set_parameters([Parameter(name, value=value)])).results[0]

    assert set_("long_run_policy", "stop").successful
    assert set_("max_stored_frames", 4).successful  # scale 2 + two keyframes (keyframe_interval is 1 now)
    stamps = [d.send() for _ in range(4)]
    assert [d.final(s).status for s in stamps] == [PROCESSED] * 4
    diag = d.latest_diag(after=time.time())
    cache = diag_values(diag, "kv cache")
    assert cache["level"] == b"\x01" and "stored frames 4 of 4" in cache["message"], cache
    refused = d.send()
    status = d.final(refused)
    assert status.status == REFUSED_POLICY and "stop" in status.reason
    assert "frames are refused until reset" in diag_values(d.latest_diag(after=time.time()), "kv cache")["message"]
    assert lst.call(Trigger, f"{NS}/reset", Trigger.Request()).success
    d.send()  # the new session's first scale frame
    b = d.send()
    assert d.final(b).status == PROCESSED
    # 'window' needs overlap_frames (16) < max_stored_frames (4): rejected with that reason
    r = set_("long_run_policy", "window")
    assert not r.successful and "overlap_frames" in r.reason, r.reason
    assert set_("max_stored_frames", 320).successful
    assert set_("long_run_policy", "window").successful
    d.send()  # the new session's first scale frame
    e = d.send()
    assert d.final(e).status == PROCESSED
    assert lst.wait_for(lambda x: e in x.stats, 10)
    assert rx.stats[e].session_id > rx.stats[b].session_id and rx.stats[e].frames_stored == 2
    diag = d.latest_diag(after=time.time())
    assert diag_values(diag, "kv cache")["long_run_policy"] == "window"


# ----------------------------------------------------------------------------------- start-up errors


def test_declare_error_names_the_parameter_first():
    """rclpy's wording puts the name last ("Invalid parameter value (0) for parameter. Reason: ...:
    scale_frames"); the node's says which parameter, then what is wrong with the value."""
    from rclpy.exceptions import InvalidParameterTypeException, InvalidParameterValueException

    from lingbot_map_ros.ros.parameters import SPECS, declare_error

    rng = np.random.default_rng(7)
    for name in ("scale_frames", "sliding_window", "diagnostics_period", "points_min_confidence"):
        spec = SPECS[name]
        lo, hi = spec.range
        value = type(spec.default)(hi + rng.integers(1, 100))
        exc = InvalidParameterValueException(name, value, f"Parameter {name} out of range. Min: {lo}, Max: {hi}, "
                                             f"value: {value}")
        assert declare_error(spec, exc) == f"parameter {name}: {value} is out of range [{lo}, {hi}]"
    spec = SPECS["sliding_window"]
    wrong = InvalidParameterTypeException(Parameter("sliding_window", value="abc"), "INTEGER")
    text = declare_error(spec, wrong)
    assert text.startswith("parameter sliding_window: 'abc' is of type string, expected integer"), text
    other = InvalidParameterValueException("sliding_window", 3, "read-only")
    assert declare_error(spec, other) == "parameter sliding_window: invalid value 3: read-only"


@pytest.mark.slow
@pytest.mark.parametrize("arg, expected", [
    ("scale_frames:=0", "parameter scale_frames: 0 is out of range [1, 256]"),
    ("sliding_window:=wide", "parameter sliding_window: 'wide' is of type string, expected integer"),
])
def test_node_refuses_a_bad_parameter_at_start_in_one_line_naming_it(tmp_path, ros_domain_id, arg, expected):
    node = NodeProcess(["-p", arg], echo=False, env=dict(os.environ, ROS_DOMAIN_ID=str(ros_domain_id)),
                       log_path=str(tmp_path / "node.log"))
    try:
        assert node.proc.wait(60) == 2, node.output()
    finally:
        node.stop()
    lines = [line for line in node.output().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"[lingbot_map] cannot start: {expected}"), lines
