"""The robot install path: the repository in a colcon workspace, built and launched from there.

What a user does (README, "Installing on a robot"), against the pip environment instead of
/opt/ros (no system ROS here; AMENT_PREFIX_PATH / CMAKE_PREFIX_PATH = the venv, set by activating it):

    source .venv/bin/activate
    mkdir -p ws/src && <clone> ws/src/lingbot_map_ros        # here: a copy of the tracked files
    cd ws && colcon build
    source install/setup.bash
    ros2 launch lingbot_map_ros lingbot_map.launch.py image_topic:=/cam/image params_file:=...

Checks that the package is found in ws/install (``ros2 pkg prefix``), that launch ran the
workspace's executable with the venv's Python, that the node imported its code from ws/install
(the byte-code it compiled lands there) and not from the source tree, and that it publishes poses
and stops cleanly. Test-only colcon flags: ``--event-handlers console_direct-`` (quiet) and
``--log-base`` in the test's folder.
"""
from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from rostools import REPO, VENV, FrameStreamer, RosShell, copy_tracked_tree, python_of, require_ros_tools, tiny_params

require_ros_tools()
pytest.importorskip("rclpy")
pytestmark = [pytest.mark.ros, pytest.mark.slow]

BUILD_TIMEOUT = 600  # 2 cores shared: the message generation and its C code dominate (~1-2 min)
TOPIC = "/ws/cam/image"


def test_colcon_workspace_build_and_launch(tmp_path, ros_domain_id):
    if not (VENV / "bin" / "colcon").is_file():
        pytest.skip("colcon is not installed in the venv (scripts/setup_env.sh installs it)")
    ws = tmp_path / "ws"
    src = ws / "src" / "lingbot_map_ros"
    copied = copy_tracked_tree(REPO, src)
    assert copied > 20 and (src / "package.xml").is_file() and not (src / ".venv").exists()
    shell = RosShell(ros_domain_id, tmp_path)
    t0 = time.monotonic()
    build = shell.run(f"colcon --log-base {tmp_path / 'colcon_log'} build --event-handlers console_direct-",
                      timeout=BUILD_TIMEOUT, cwd=ws)
    build_s = time.monotonic() - t0
    assert build.returncode == 0, build.output[-6000:]
    assert re.search(r"Summary: 1 package finished", build.output), build.output[-3000:]

    install = ws / "install" / "lingbot_map_ros"
    exe = install / "lib" / "lingbot_map_ros" / "lingbot_map_node"
    assert exe.is_file() and re.fullmatch(re.escape(str(VENV / "bin" / "python")) + r"3?(\.\d+)?", python_of(exe)), \
        python_of(exe)  # the venv's interpreter, found by CMake through the activated venv
    site = next(install.glob("lib/python3*/site-packages/lingbot_map_ros"))
    assert (site / "msg" / "_cache_stats.py").is_file(), "generated messages missing from the install"
    node_py = site / "ros" / "node.py"
    assert node_py.is_file() and not node_py.is_symlink(), "the sources are installed (copied) into ws/install"
    assert (install / "share" / "lingbot_map_ros" / "config" / "diagnostic_aggregator.yaml").is_file()
    pyc_dir = node_py.parent / "__pycache__"
    assert not pyc_dir.exists() or not list(pyc_dir.glob("node.*.pyc"))

    # the user's shell: the venv activated, then the workspace sourced
    shell.sources.append(ws / "install" / "setup.bash")
    shell.extra_env["PYTHONDONTWRITEBYTECODE"] = ""  # let the node leave its byte-code where it imported from
    prefix = shell.run("ros2 pkg prefix lingbot_map_ros", timeout=30).ok().output.strip()
    assert Path(prefix) == install, prefix
    params = tiny_params(tmp_path / "ws_params.yaml", world_frame="ws_world")
    t1 = time.monotonic()
    launch = shell.start(f"ros2 launch lingbot_map_ros lingbot_map.launch.py image_topic:={TOPIC} "
                         f"params_file:={params}", "ws_launch", cwd=ws)
    streamer = None
    try:
        launch.wait_for(r"\[lingbot_map\]: ready: active", 150)
        pid = re.search(r"process started with pid \[(\d+)\]", launch.output()).group(1)
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        assert str(exe) in cmdline[:2], cmdline
        environ = Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0")
        env = dict(kv.split("=", 1) for kv in environ if "=" in kv)
        assert env["PYTHONPATH"].split(":")[0].startswith(str(install)), env.get("PYTHONPATH")
        compiled = list(pyc_dir.glob("node.*.pyc"))
        assert compiled, f"the node did not import {node_py} (no byte-code beside it)"
        streamer = FrameStreamer(shell.domain_id, TOPIC)
        assert streamer.listener.wait_connected(30)
        streamer.streaming.set()
        assert streamer.wait_for(lambda rx: len(rx.poses) >= 3, 90), launch.output()[-3000:]
        streamer.streaming.clear()
        with streamer.listener.lock:
            assert {p.header.frame_id for p in streamer.rx.poses.values()} == {"ws_world"}
        rc = launch.interrupt(group=False)
        assert rc == 0, launch.output()[-3000:]
        assert "[lingbot_map] stopped cleanly" in launch.output(), launch.output()[-3000:]
    finally:
        if streamer is not None:
            streamer.close()
        launch.close()
        shell.stop_daemon()
    print(f"colcon build {build_s:.0f} s; launch to clean stop {time.monotonic() - t1:.0f} s")
