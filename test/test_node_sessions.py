"""Saved sessions on the node: ``~/save_session`` on a running node, ``initial_session`` in a freshly
launched one, ``~/load_session`` refusals, ``mapping:=false``.

The reference is the same node running on uninterrupted: after the save it keeps receiving frames;
a second node started from the saved session gets the same frames and must publish the same poses
(1e-6) with the numbering, ``~/path`` and ``~/save_trajectory`` continued.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy")
pytest.importorskip("lingbot_map_ros.msg")

from rclpy.context import Context  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from rclpy.parameter_client import AsyncParameterClient  # noqa: E402
from std_srvs.srv import Trigger  # noqa: E402

from lingbot_map_ros.core.trajectory import read_tum  # noqa: E402
from lingbot_map_ros.tools.node_client import Listener, NodeProcess, SyntheticCamera, image_message, stamp_ns  # noqa: E402

W, H = 64, 48
NS = "/lingbot_map"
TOPIC = "/test/camera/image"
WORLD = "session_world"
BASE_ARGS = ["-p", "model_preset:=tiny", "-p", "device:=cpu", "-p", "scale_frames:=2", "-p", "sliding_window:=3",
             "-p", "keyframe_interval:=2", "-p", "camera_iterations:=2", "-p", "qos_reliability:=reliable",
             "-p", "max_stored_frames:=8", "-p", "overlap_frames:=3", "-p", f"world_frame:={WORLD}",
             "-r", f"image:={TOPIC}"]
SAVED, AFTER = 10, 8  # frames before the save (a window switch and evictions happen), frames after it


class Camera:
    """The same synthetic frames and stamps for every node of the test."""

    def __init__(self):
        self.camera = SyntheticCamera(W, H, seed=4)

    @staticmethod
    def stamp(i: int) -> int:
        return 1_700_000_000 * 10**9 + 50_000_000 * (i + 1)

    def send(self, listener: Listener, node: NodeProcess, i: int) -> int:
        stamp = self.stamp(i)
        listener.pub.publish(image_message(self.camera.render(i), stamp, "session_cam"))
        ok = listener.wait_for(lambda rx: stamp in rx.status, 60)
        assert ok, f"no frame_status for {stamp}:\n{node.output()[-3000:]}"
        return stamp


def start(tmp: Path, domain: int, *args: str, name: str):
    env = dict(os.environ, ROS_DOMAIN_ID=str(domain))
    node = NodeProcess([*BASE_ARGS, *args], echo=False, env=env, log_path=str(tmp / f"{name}.log"))
    ctx = Context()
    rclpy.init(context=ctx, domain_id=domain)
    listener = Listener(NS, TOPIC, context=ctx, name=f"session_test_{name}")
    return node, listener, ctx


def stop(node: NodeProcess, listener: Listener, ctx) -> None:
    listener.close()
    rc = node.stop()
    rclpy.shutdown(context=ctx)
    assert rc == 0, f"node exit code {rc}:\n{node.output()[-3000:]}"


def poses_of(listener: Listener, stamps) -> np.ndarray:
    assert listener.wait_for(lambda rx: all(s in rx.poses and s in rx.stats for s in stamps), 30)
    rx = listener.rx
    return np.array([[rx.poses[s].pose.position.x, rx.poses[s].pose.position.y, rx.poses[s].pose.position.z,
                      rx.poses[s].pose.orientation.x, rx.poses[s].pose.orientation.y, rx.poses[s].pose.orientation.z,
                      rx.poses[s].pose.orientation.w] for s in stamps])


def set_params(listener: Listener, **values) -> None:
    client = AsyncParameterClient(listener.node, NS)
    assert client.wait_for_services(15)
    future = client.set_parameters([Parameter(k, value=v) for k, v in values.items()])
    t0 = time.monotonic()
    while not future.done() and time.monotonic() - t0 < 15.0:
        time.sleep(0.02)
    assert future.done() and all(r.successful for r in future.result().results), future.result()


@pytest.mark.slow
def test_a_saved_session_resumes_in_a_new_node_in_the_same_world(tmp_path, ros_domain_id):
    camera = Camera()
    session, bad = tmp_path / "session", tmp_path / "missing"
    # --- the uninterrupted node: SAVED frames, ~/save_session, AFTER more frames
    node, listener, ctx = start(tmp_path, ros_domain_id, "-p", f"session_path:={session}",
                                "-p", f"trajectory_path:={tmp_path / 'a.tum'}", name="a")
    try:
        assert node.wait_ready(120), node.why_not_ready()
        assert listener.wait_connected(30)
        first = [camera.send(listener, node, i) for i in range(SAVED)]
        poses_of(listener, first)
        resp = listener.call(Trigger, f"{NS}/save_session", Trigger.Request(), timeout=60)
        assert resp is not None and resp.success, resp
        assert str(session) in resp.message and f"{SAVED} frames" in resp.message and "MiB" in resp.message
        after = [camera.send(listener, node, SAVED + i) for i in range(AFTER)]
        expected = poses_of(listener, after)
        expected_index = [listener.rx.stats[s].frame_index for s in after]
        saved_session_id = listener.rx.stats[after[-1]].session_id
        # a refused load keeps the session: not a session -> the reason, and the next frame continues it
        set_params(listener, session_path=str(bad))
        resp = listener.call(Trigger, f"{NS}/load_session", Trigger.Request(), timeout=60)
        assert resp is not None and not resp.success and "no such folder" in resp.message, resp
        one_more = camera.send(listener, node, SAVED + AFTER)
        poses_of(listener, [one_more])
        assert listener.rx.stats[one_more].session_id == saved_session_id
        assert listener.rx.stats[one_more].frame_index == expected_index[-1] + 1
    finally:
        stop(node, listener, ctx)

    # --- a new node that starts from the saved session
    node, listener, ctx = start(tmp_path, ros_domain_id, "-p", f"initial_session:={session}",
                                "-p", f"trajectory_path:={tmp_path / 'b.tum'}", "-p", "session_staging:=host",
                                name="b")
    try:
        assert node.wait_ready(120), node.why_not_ready()
        assert listener.wait_connected(30)
        resumed = [camera.send(listener, node, SAVED + i) for i in range(AFTER)]
        got = poses_of(listener, resumed)
        np.testing.assert_allclose(got, expected, atol=1e-6, rtol=0)
        assert [listener.rx.stats[s].frame_index for s in resumed] == expected_index
        # ~/path and the trajectory continue: the saved poses first
        assert listener.wait_for(lambda rx: any(p.poses and stamp_ns(p.poses[-1].header.stamp) == resumed[-1]
                                                for p in rx.paths), 10)
        path = [p for p in listener.rx.paths if p.poses and stamp_ns(p.poses[-1].header.stamp) == resumed[-1]][-1]
        assert [stamp_ns(p.header.stamp) for p in path.poses][-(SAVED + AFTER):] == first + resumed
        resp = listener.call(Trigger, f"{NS}/save_trajectory", Trigger.Request())
        assert resp is not None and resp.success
        stamps, _, _ = read_tum(tmp_path / "b.tum")
        np.testing.assert_allclose(stamps, [s / 1e9 for s in first + resumed], atol=1e-6, rtol=0)
        # localization: mapping false stores nothing, every frame still gets a pose
        stored = listener.rx.stats[resumed[-1]].frames_stored
        set_params(listener, mapping=False)
        local = [camera.send(listener, node, 40 + i) for i in range(4)]
        poses_of(listener, local)
        assert all(listener.rx.stats[s].frames_stored == stored and not listener.rx.stats[s].is_keyframe
                   for s in local)
    finally:
        stop(node, listener, ctx)


@pytest.mark.slow
def test_a_bad_initial_session_fails_configure_and_the_node_stays_up(tmp_path, ros_domain_id):
    not_a_session = tmp_path / "empty"
    not_a_session.mkdir()
    node, listener, ctx = start(tmp_path, ros_domain_id, "-p", f"initial_session:={not_a_session}", name="c")
    try:
        assert not node.wait_ready(120)
        assert "initial_session" in node.why_not_ready() and "is not a session" in node.why_not_ready()
        assert node.proc.poll() is None  # alive, unconfigured: fix the parameter and configure again
        resp = listener.call(Trigger, f"{NS}/save_session", Trigger.Request())
        assert resp is not None and not resp.success and "unconfigured" in resp.message
    finally:
        stop(node, listener, ctx)
