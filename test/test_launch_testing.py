"""Runs the launch_testing test ``launch_testing_lingbot_map.py`` with ``launch_test``, as ament does.

The launch test starts the installed launch file with a parameter file, a remap, a namespace and
``diagnostics_aggregator:=true``, streams frames, checks poses, /tf and /diagnostics and a clean
shutdown (see its docstring). It runs in a process of its own, from a shell with the venv activated,
with this test's ROS_DOMAIN_ID and temporary folders: launch_testing's pytest plugin stays off in the
main run (pytest.ini), so it neither imports every test module nor shares this process's rclpy.
"""
from __future__ import annotations

import re

import pytest
from rostools import REPO, RosShell, require_ros_tools

require_ros_tools()
pytest.importorskip("launch_testing")
pytestmark = [pytest.mark.ros, pytest.mark.slow]  # starts nodes or tool processes

LAUNCH_TEST = REPO / "test" / "launch_testing_lingbot_map.py"
ACTIVE = ("test_1_node_is_active_in_its_namespace", "test_2_frames_give_poses_tf_and_diagnostics",
          "test_3_diagnostics_aggregator_argument")
POST_SHUTDOWN = ("test_every_process_exited_0", "test_node_stopped_cleanly")


def _aggregator_installed(shell: RosShell) -> bool:
    return shell.run("ros2 pkg prefix diagnostic_aggregator", timeout=30).returncode == 0


def test_launch_testing_launch_file(tmp_path, ros_domain_id):
    shell = RosShell(ros_domain_id, tmp_path)
    try:
        res = shell.run(f"launch_test {LAUNCH_TEST}", timeout=300)
        out = res.output
        print(f"launch_test: {res.seconds:.1f} s")
        assert res.returncode == 0, out[-6000:]
        for name in ACTIVE + POST_SHUTDOWN:
            verdict = rf"^{name} \(.*\) \.\.\. (.*\n)*?.*(ok|skipped '.*')$"
            assert re.search(verdict, out, re.M), f"{name}:\n{out[-6000:]}"
        assert re.search(r"^Ran 3 tests in", out, re.M) and re.search(r"^Ran 2 tests in", out, re.M), out[-3000:]
        assert "FAILED" not in out, out[-6000:]
        if _aggregator_installed(shell):
            assert re.search(r"test_3_diagnostics_aggregator_argument \(.*\) \.\.\. ok", out), out[-6000:]
        else:  # the launch file's log line for diagnostics_aggregator:=true without the package
            assert "diagnostics_aggregator:=true, but diagnostic_aggregator is not installed" in out, out[-6000:]
        assert "[lingbot_map_node-1]: process has finished cleanly" in out, out[-6000:]
    finally:
        shell.stop_daemon()
