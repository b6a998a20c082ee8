"""``lingbot_map_demo`` (the README's main job) end to end, shortened: node + synthetic camera over
loopback, poses and diagnostics printed, eviction happens, exit code 0."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("rclpy")
pytest.importorskip("lingbot_map_ros.msg")
pytestmark = pytest.mark.ros


def test_demo_runs_and_exits_zero(tmp_path, ros_domain_id):
    tum = tmp_path / "demo.tum"
    cmd = [sys.executable, "-P", "-m", "lingbot_map_ros.tools.demo", "--frames", "12", "--scale-frames", "2",
           "--sliding-window", "3", "--width", "160", "--height", "120", "--camera-iterations", "1",
           "--quiet-node", "--tum", str(tum), "--domain-id", str(ros_domain_id), "--timeout", "240"]
    env = {k: v for k, v in os.environ.items() if k != "ROS_DOMAIN_ID"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "NOT MEANINGFUL" in out  # random weights are announced loudly
    assert sum(1 for line in out.splitlines() if line.startswith("[pose]")) == 12
    assert "[diagnostics]" in out and "lingbot_map: kv cache" in out
    assert "12 processed" in out and "eviction observed: yes" in out
    assert "node exited with code 0" in out
    lines = [line for line in tum.read_text().splitlines() if not line.startswith("#")]
    assert len(lines) == 12
