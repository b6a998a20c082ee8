"""The node with compressed input, its default sensor-data (best-effort) QoS, depth output and SIGTERM;
and a start with invalid parameters (exits with the reason, no model is built)."""
from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

rclpy = pytest.importorskip("rclpy")
pytest.importorskip("lingbot_map_ros.msg")
pytest.importorskip("tf2_msgs.msg")
pytestmark = [pytest.mark.ros, pytest.mark.slow]  # starts nodes or tool processes

from rclpy.context import Context  # noqa: E402
from rclpy.qos import QoSReliabilityPolicy  # noqa: E402

from lingbot_map_ros.tools.node_client import (  # noqa: E402
    Listener,
    NodeProcess,
    SyntheticCamera,
    compressed_message,
    node_command,
    stamp_ns,
)

PROCESSED, BUFFERED = 0, 4
W, H = 64, 48
BASE = "/cam_b/image"
NS = "/lingbot_map"


@pytest.fixture(scope="module")
def env(tmp_path_factory, new_domain_id):
    tmp = tmp_path_factory.mktemp("node_b")
    domain = new_domain_id()
    node = NodeProcess(
        ["-p", "model_preset:=tiny", "-p", "device:=cpu", "-p", "scale_frames:=2", "-p", "sliding_window:=3",
         "-p", "camera_iterations:=1", "-p", "image_transport:=compressed", "-p", "publish_depth:=true",
         "-p", "camera_frame:=cam_b_optical", "-r", f"image:={BASE}"],  # remapping `image` moves image/compressed
        echo=False, env=dict(os.environ, ROS_DOMAIN_ID=str(domain)), log_path=str(tmp / "node.log"),
    )
    ctx = Context()
    rclpy.init(context=ctx, domain_id=domain)
    listener = Listener(NS, BASE, compressed=True, context=ctx, name="lingbot_test_client_b", depth=True)
    try:
        assert node.wait_ready(120), f"node did not start:\n{node.output()}"
        assert listener.wait_connected(30), "no connection to the node"
        yield {"node": node, "listener": listener}
    finally:
        listener.close()
        rc = node.stop(signal.SIGTERM)
        rclpy.shutdown(context=ctx)
        assert rc == 0, f"node exit code {rc} after SIGTERM:\n{node.output()[-3000:]}"
        assert "stopped cleanly" in node.output()


def test_compressed_input_with_default_best_effort_qos(env):
    lst = env["listener"]
    infos = lst.node.get_subscriptions_info_by_topic(BASE + "/compressed")
    assert len(infos) == 1 and infos[0].qos_profile.reliability == QoSReliabilityPolicy.BEST_EFFORT
    camera = SyntheticCamera(W, H, seed=5)
    stamps = []
    for i in range(4):
        stamp = 1_600_000_000 * 10**9 + i * 10**8
        msg = compressed_message(camera.render(i), stamp, "header_frame_is_overridden")
        for _attempt in range(3):  # best effort may lose a message: send it again, same stamp
            lst.pub.publish(msg)
            if lst.wait_for(lambda rx, s=stamp: s in rx.status, 20):
                break
        stamps.append(stamp)
    assert lst.wait_for(lambda rx: all(lst.final_status(s) is not None for s in stamps), 60)
    assert all(lst.final_status(s).status == PROCESSED for s in stamps)
    assert lst.wait_for(lambda rx: all(s in rx.odoms for s in stamps), 10)
    for s in stamps:
        assert lst.rx.odoms[s].child_frame_id == "cam_b_optical"  # camera_frame overrides the header
        assert stamp_ns(lst.rx.odoms[s].header.stamp) == s
    # ~/depth (publish_depth): 32FC1 at the model input size, stamped like the image
    assert lst.wait_for(lambda rx: len(rx.depth) >= len(stamps), 10)
    depth = lst.rx.depth[-1]
    assert depth.encoding == "32FC1" and (depth.height, depth.width) == (392, 518) and depth.step == 518 * 4
    assert stamp_ns(depth.header.stamp) == stamps[-1] and depth.header.frame_id == "cam_b_optical"


@pytest.mark.parametrize("bad", ["long_run_policy:=forever", "scale_frames:=0", "image_transport:=h264"])
def test_invalid_start_parameters_exit_with_reason(bad, ros_domain_id):
    t0 = time.monotonic()
    proc = subprocess.run([*node_command(), "--ros-args", "-p", bad],
                          env=dict(os.environ, ROS_DOMAIN_ID=str(ros_domain_id)),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    name = bad.split(":=")[0]
    assert name in out, out
    assert time.monotonic() - t0 < 30
