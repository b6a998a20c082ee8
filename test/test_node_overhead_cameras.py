"""``node_overhead --cameras 2`` against the real node in the several-camera mode: both emulated cameras'
frames are all processed, and the node's own time per camera per frame (placing, placing + publishing;
wall and thread CPU) comes back from its /diagnostics as a row per measure with a number per camera."""
from __future__ import annotations

import math
import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("rclpy")
pytest.importorskip("lingbot_map_ros.msg")
pytestmark = [pytest.mark.ros, pytest.mark.slow]  # starts a node process

from lingbot_map_ros.tools.overhead_cameras import ROWS  # noqa: E402


def test_node_overhead_has_a_row_per_measure_and_a_column_per_camera(tmp_path, ros_domain_id):
    frames = 10
    cmd = [sys.executable, "-P", "-m", "lingbot_map_ros.tools.node_overhead", "--domain-id", str(ros_domain_id),
           "--cameras", "2", "--frames", str(frames), "--width", "64", "--height", "48"]
    env = {k: v for k, v in os.environ.items() if k != "ROS_DOMAIN_ID"}
    env.update(ROS_LOG_DIR=str(tmp_path / "ros_log"))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    for _, label in ROWS:
        row = next((line for line in out.splitlines() if line.startswith(f"| {label}")), None)
        assert row is not None, out
        values = [float(v) for v in row.split("|")[2:-1]]
        assert len(values) == 2 and all(math.isfinite(v) and v > 0 for v in values), row
    placing = [float(v) for v in next(line for line in out.splitlines() if "hand-over (wall)" in line).split("|")[2:-1]]
    publishing = [float(v) for v in next(line for line in out.splitlines()
                                         if "placing + publishing (wall)" in line).split("|")[2:-1]]
    assert all(p <= q for p, q in zip(placing, publishing)), out  # publishing includes the placing
    assert re.search(rf"cam0 {frames}, \d+ of them withheld .*cam1 {frames}, \d+ of them withheld", out), out
    # the steady state: the primary created the world and drives, no hand-over (every frame processed: above)
    assert "/tf): cam0 true, cam1 false; last hand-over: none" in out, out
    assert re.search(r"worst camera median [\d.]+ ms: (meets|MISSES) the <= 0.5 ms target", out), out
    host = re.search(r"this host: .* ([\d.]+) us right after another, ([\d.]+) us after a 20 ms pause", out)
    assert host is not None and 0 < float(host.group(1)) and 0 < float(host.group(2)), out
