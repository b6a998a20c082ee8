"""The ROS side of the tools: ROS 1 recordings replayed into the real node, the demo's plot, and the
demo's failure path (the node's own reason at once, a non-zero exit, no C++ abort).

The node is the installed console script in a child process on loopback DDS, as in test_replay.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest

pytest.importorskip("rclpy")
pytest.importorskip("lingbot_map_ros.msg")
pytestmark = [pytest.mark.ros, pytest.mark.slow]  # starts nodes or tool processes

from replay_node import NodeProcess, RosClient, frames, node_params, replay, ros_env, stamps  # noqa: E402

from lingbot_map_ros.core.trajectory import read_tum  # noqa: E402
from lingbot_map_ros.tools.bag_io import write_image_bag  # noqa: E402


@pytest.mark.parametrize("transport", ["raw", "compressed"])
def test_ros1_bags_replay_through_the_node(tmp_path, ros_domain_id, transport):
    """A ROS 1 .bag (raw bgr8 / JPEG and PNG CompressedImage) replays into the node with
    every frame accounted for, and the node's trajectory carries the recorded stamps."""
    env = ros_env(tmp_path, ros_domain_id)
    if transport == "raw":
        bags = [(write_image_bag(tmp_path / "raw.bag", frames(8, 1), stamps(8, 500.0), storage="ros1",
                                 encoding="bgr8", topic="/usb_cam/image_raw"), stamps(8, 500.0))]
    else:
        bags = [(write_image_bag(tmp_path / f"{codec}.bag", frames(8, i), stamps(8, 600.0 + 100 * i), storage="ros1",
                                 compressed=codec, topic="/usb_cam/image_raw/compressed"), stamps(8, 600.0 + 100 * i))
                for i, codec in enumerate(("jpeg", "png"))]
    params = node_params(tmp_path, image_transport=transport)
    node = NodeProcess(env, tmp_path / "node.log", params, {"image": "/cam/image_raw"})
    client = None
    try:
        node.wait_ready()
        client = RosClient(ros_domain_id)
        out_topic = "/cam/image_raw" + ("/compressed" if transport == "compressed" else "")
        for bag, st in bags:
            out = replay(env, bag, "--topic-out", out_topic)
            assert out.returncode == 0, f"{bag.name}: {out.stdout}\n{out.stderr}\n{node.log()}"
            assert "published 8 frames" in out.stdout and "8 processed" in out.stdout, out.stdout
            assert client.trigger("/lingbot_map/save_trajectory").success
            tum_stamps, pos, _ = read_tum(tmp_path / "traj.tum")
            np.testing.assert_allclose(tum_stamps, st, atol=1e-6)
            assert np.isfinite(pos).all()
            assert client.trigger("/lingbot_map/reset").success
    finally:
        if client is not None:
            client.close()
        node.stop()
    assert node.proc.returncode == 0, node.log()


def _demo(tmp_path, domain: int, *extra: str, timeout: float = 300) -> tuple[subprocess.CompletedProcess, float]:
    cmd = [sys.executable, "-P", "-m", "lingbot_map_ros.tools.demo", "--domain-id", str(domain), *extra]
    env = {k: v for k, v in os.environ.items() if k != "ROS_DOMAIN_ID"}
    env.update(OMP_NUM_THREADS="1", ROS_LOG_DIR=str(tmp_path / "ros_log"))
    start = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    return proc, time.monotonic() - start


def test_demo_failure_prints_the_nodes_reason_at_once(tmp_path, ros_domain_id):
    """A checkpoint that exists but is not one: the node's configure fails (the managed node stays
    alive); the demo must quote the reason, stop the node, exit 1, not abort and not wait 30 s."""
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"this is not a checkpoint" * 8)
    # the node's log is echoed: it must hold the one-line reason, and no traceback of the loader
    proc, seconds = _demo(tmp_path, ros_domain_id, "--checkpoint", str(bad), "--frames", "4")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out  # not 134 (abort), not 0
    failed = [line for line in out.splitlines() if line.startswith("[demo] FAILED")]
    assert len(failed) == 1 and "configure failed" in failed[0] and "bad.pt" in failed[0], out
    assert "is not a PyTorch or safetensors checkpoint: a text file" in failed[0], failed[0]
    assert "loopback" not in failed[0] and "Traceback" not in out and "KeyError" not in out, out
    node_lines = [line for line in out.splitlines() if line.startswith("[node] ")]
    assert len(node_lines) <= 6, node_lines  # configuring, the error, its echo: no 40-line traceback
    assert seconds < 60, seconds  # it stopped at the node's line, not after a 30 s + 30 s wait
    assert "node exited with code" in out


FAKE_NODE_THAT_EXITS = """
import sys, time
print("[lingbot_map] cannot start: invalid parameters: device 'cuda' requested but CUDA is not available", flush=True)
time.sleep(1.5)  # the interpreter's way out (rclpy shutdown, atexit handlers) takes a moment
sys.exit(2)
"""


def test_a_node_that_says_it_exits_is_not_signalled(tmp_path):
    """The node prints "cannot start:" and exits 2 by itself; stopping it must not send SIGINT into
    its way out (that made the exit code 2 once, -2 or an atexit KeyboardInterrupt traceback another
    time). A fake node that takes 1.5 s to exit makes the race certain without the fix."""
    from lingbot_map_ros.tools.node_client import NodeProcess as Node

    for _ in range(2):
        node = Node([], echo=False, command=[sys.executable, "-c", FAKE_NODE_THAT_EXITS])
        assert not node.wait_ready(30) and node.exits_by_itself, node.output()
        assert node.stop() == 2, node.output()
        assert "Traceback" not in node.output() and "KeyboardInterrupt" not in node.output()


def test_demo_on_a_device_that_is_not_there_exits_the_same_way_every_time(tmp_path, ros_domain_id):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: --device cuda is valid here")
    codes = set()
    for _ in range(2):
        proc, _ = _demo(tmp_path, ros_domain_id, "--device", "cuda", "--frames", "2")
        out = proc.stdout + proc.stderr
        assert "Traceback" not in out and "KeyboardInterrupt" not in out, out
        failed = [line for line in out.splitlines() if line.startswith("[demo] FAILED")]
        assert len(failed) == 1 and "CUDA is not available" in failed[0], out
        codes.add((proc.returncode, [line for line in out.splitlines() if "node exited with code" in line][0]))
    assert codes == {(1, "[demo] node exited with code 2")}, codes


def test_demo_writes_its_plot(tmp_path, ros_domain_id):
    plot = tmp_path / "demo.png"
    proc, _ = _demo(tmp_path, ros_domain_id, "--frames", "8", "--scale-frames", "2", "--sliding-window", "3",
                    "--width", "160", "--height", "120", "--camera-iterations", "1", "--quiet-node",
                    "--plot", str(plot), "--timeout", "240")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "[demo] figure (8 frames)" in out
    assert plot.is_file() and plot.stat().st_size > 10_000 and plot.read_bytes()[:4] == b"\x89PNG"
