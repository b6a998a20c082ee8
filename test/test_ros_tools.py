"""The node started and driven with the real ROS 2 tools, from the pip environment, as a user does it.

Every command runs in bash after ``source .venv/bin/activate`` (nothing else of the test's
environment leaks in, see ``rostools.RosShell``) and is checked on what it prints:

* ``ros2 launch lingbot_map_ros lingbot_map.launch.py image_topic:=/cam/image params_file:=<yaml>``:
  the node appears in ``ros2 node list``, publishes poses and /tf for the frames a test node streams,
  and the CLI works against it: ``ros2 param describe/set/get``, ``ros2 topic echo --once``
  (``~/cache_stats``, ``/diagnostics``), ``ros2 service call ~/reset``, ``ros2 lifecycle
  get/set/nodes``, ``ros2 interface show``; SIGINT ends it cleanly (exit 0, "stopped cleanly").
* ``ros2 run lingbot_map_ros lingbot_map_node --ros-args ...``: the same node without launch, and
  with ``autostart:=false`` driven through its lifecycle by hand, a bad checkpoint included.
* ``use_sim_time:=true`` with a /clock publisher, and camera stamps that jump back in time.
* The live /diagnostics status names go through config/diagnostic_aggregator.yaml's analyzer
  (GenericAnalyzer's documented matching, ``diagnostic_analyzers.py``).

Test-only flags: ``--no-daemon --spin-time 2`` on the verbs that have them (no background daemon is
left behind; discovery gets 2 s instead of 0.5 s), and ``ros2 daemon stop`` at the end anyway.
Skipped, with the reason, only where the venv has no ros2 CLI / launch (the ros_cli wheels were not
installed by scripts/setup_env.sh).
"""
from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from rostools import CLI_FLAGS, REPO, VENV, FrameStreamer, RosShell, require_ros_tools, tiny_params, wait_until

require_ros_tools()
pytest.importorskip("rclpy")
pytest.importorskip("lingbot_map_ros.msg")
pytestmark = [pytest.mark.ros, pytest.mark.slow]  # starts nodes or tool processes

from diagnostic_analyzers import load_analyzers, route  # noqa: E402

NODE = "/lingbot_map"
LAUNCH_TOPIC = "/cam/image"
RUN_TOPIC = "/run/cam/image"
FLAGS = CLI_FLAGS  # test-only: see the module docstring
PROCESSED, DROPPED_RESET, DROPPED_INACTIVE = 0, 5, 6
DIAG_NAMES = {"lingbot_map: input", "lingbot_map: inference", "lingbot_map: kv cache", "lingbot_map: backend",
              "lingbot_map: tf", "lingbot_map: scale"}


def echo_once(shell: RosShell, topic: str, msg_type: str = "", timeout: float = 40) -> dict:
    """``ros2 topic echo --once TOPIC [TYPE]``, its YAML parsed (fails on no message or no YAML)."""
    res = shell.ros2(f"ros2 topic echo --once --no-daemon {topic} {msg_type}".strip(), timeout=timeout).ok()
    docs = [d for d in yaml.safe_load_all(res.output) if isinstance(d, dict)]
    assert docs, f"no message printed by `{res.command}`:\n{res.output[-3000:]}"
    return docs[0]


# ------------------------------------------------------------------------------------ ros2 launch


@pytest.fixture(scope="module")
def launched(tmp_path_factory, new_domain_id):
    """``ros2 launch`` of the installed launch file from an activated venv, with a user's params file."""
    tmp = tmp_path_factory.mktemp("ros2_launch")
    shell = RosShell(new_domain_id(), tmp)
    params = tiny_params(tmp / "my_params.yaml", world_frame="tools_world")
    t0 = time.monotonic()
    launch = shell.start(f"ros2 launch lingbot_map_ros lingbot_map.launch.py image_topic:={LAUNCH_TOPIC} "
                         f"params_file:={params}", "ros2_launch")
    streamer = None
    try:
        launch.wait_for(r"\[lingbot_map\]: ready: active", 150)
        startup = time.monotonic() - t0
        streamer = FrameStreamer(shell.domain_id, LAUNCH_TOPIC)
        assert streamer.listener.wait_connected(30), "the test node does not see the launched node"
        yield SimpleNamespace(shell=shell, launch=launch, streamer=streamer, params=params, startup=startup)
    finally:
        _stop_all(shell, launch, streamer)


def test_launch_show_args_lists_the_arguments(launched):
    out = launched.shell.run("ros2 launch lingbot_map_ros lingbot_map.launch.py --show-args", timeout=60).ok().output
    for arg in ("image_topic", "params_file", "namespace", "autostart", "diagnostics_aggregator", "log_level"):
        assert f"'{arg}':" in out, (arg, out)
    assert re.search(r"'diagnostics_aggregator':\n(.*\n)*?\s+\(default: 'false'\)", out), out


def test_launch_from_venv_finds_the_installed_package(launched):
    shell, launch = launched.shell, launched.launch
    prefix = shell.run("ros2 pkg prefix lingbot_map_ros", timeout=30).ok().output.strip()
    assert Path(prefix) == VENV, prefix
    # launch ran <venv>/lib/lingbot_map_ros/lingbot_map_node with the params file and the remap
    m = re.search(r"process started with pid \[(\d+)\]", launch.output())
    assert m, launch.output()[-3000:]
    cmdline = Path(f"/proc/{m.group(1)}/cmdline").read_bytes().decode().split("\0")
    assert cmdline[:2] == [str(VENV / "bin" / "python"), str(VENV / "lib" / "lingbot_map_ros" / "lingbot_map_node")] \
        or cmdline[1] == str(VENV / "lib" / "lingbot_map_ros" / "lingbot_map_node"), cmdline
    assert f"image:={LAUNCH_TOPIC}" in cmdline and str(launched.params) in cmdline, cmdline
    assert shell.wait_for_node(NODE), "ros2 node list never showed " + NODE


def test_launch_node_publishes_poses_and_tf(launched):
    s = launched.streamer
    s.streaming.set()
    try:
        assert s.wait_for(lambda rx: len(rx.poses) >= 4 and rx.tf, 90), \
            f"poses {len(s.rx.poses)}, tf {len(s.rx.tf)}; node output:\n{launched.launch.output()[-3000:]}"
    finally:
        s.streaming.clear()
    with s.listener.lock:
        poses = list(s.rx.poses.values())
        tfs = [t for m in s.rx.tf for t in m.transforms]
    assert {p.header.frame_id for p in poses} == {"tools_world"}  # from the user's params file
    assert {p.header.stamp.sec * 10**9 + p.header.stamp.nanosec for p in poses} <= set(s.sent)  # image stamps
    assert {(t.header.frame_id, t.child_frame_id) for t in tfs} == {("tools_world", "tools_test_cam")}


def test_param_describe_prints_range_and_description(launched):
    out = launched.shell.ros2(f"ros2 param describe {NODE} sliding_window diagnostics_period {FLAGS}",
                              timeout=30).ok().output
    window, period = out.split("Parameter name: diagnostics_period")
    assert "Parameter name: sliding_window" in window and "Type: integer" in window, out
    assert re.search(r"Description: .*stored frames", window), out
    assert "Min value: 1" in window and "Max value: 4096" in window, out
    assert "Type: double" in period and re.search(r"Description: .*diagnostics", period, re.I), out
    assert "Min value: 0.05" in period and "Max value: 60.0" in period, out


def test_param_set_valid_is_applied_invalid_prints_the_reason(launched):
    shell = launched.shell
    out = shell.ros2(f"ros2 param set {NODE} sliding_window 5 {FLAGS}", timeout=30).ok().output
    assert "Set parameter successful" in out, out
    assert "Integer value is: 5" in shell.ros2(f"ros2 param get {NODE} sliding_window {FLAGS}", timeout=30).output
    launched.launch.wait_for(r"parameters changed: sliding_window=5", 20)  # the node applied it (new session)
    # rejected by the node's validation: its reason is printed, the value stays
    out = shell.ros2(f"ros2 param set {NODE} long_run_policy forever {FLAGS}", timeout=30).output
    assert "Setting parameter failed" in out and "long_run_policy must be one of" in out, out
    assert "String value is: window" in shell.ros2(f"ros2 param get {NODE} long_run_policy {FLAGS}", timeout=30).output
    # rejected by the declared range
    out = shell.ros2(f"ros2 param set {NODE} sliding_window 5000 {FLAGS}", timeout=30).output
    assert "Setting parameter failed" in out and "out of range" in out and "4096" in out, out
    assert "Integer value is: 5" in shell.ros2(f"ros2 param get {NODE} sliding_window {FLAGS}", timeout=30).output


def test_topic_echo_once_cache_stats(launched):
    s = launched.streamer
    s.streaming.set()
    try:
        # with the type given, echo waits for a message instead of needing the topic discovered first
        msg = echo_once(launched.shell, f"{NODE}/cache_stats", "lingbot_map_ros/msg/CacheStats")
    finally:
        s.streaming.clear()
    assert msg["header"]["frame_id"] == "tools_world"
    assert msg["backend"] == "sdpa" and msg["dtype"] == "float32", msg
    assert msg["scale_frames"] == 2 and 0 <= msg["window_frames"] <= 5, msg  # sliding_window 5 (set above)
    assert msg["frames_received"] >= msg["frames_processed"] >= 1, msg


def test_topic_echo_once_diagnostics_and_the_aggregator_rules(launched):
    msg = echo_once(launched.shell, "/diagnostics", "diagnostic_msgs/msg/DiagnosticArray")
    statuses = {st["name"]: st for st in msg["status"]}
    assert DIAG_NAMES <= set(statuses), list(statuses)
    assert {st["hardware_id"] for st in statuses.values()} == {NODE}, "hardware_id: the node's full name"
    backend = {kv["key"]: kv["value"] for kv in statuses["lingbot_map: backend"]["values"]}
    assert backend["lifecycle_state"] == "active", backend
    # every live status is taken by exactly the shipped analyzer (none goes to 'Other'), shows under
    # its group without the node prefix, and every expected name is live
    _, analyzers = load_analyzers(REPO / "config" / "diagnostic_aggregator.yaml")
    with launched.streamer.listener.lock:
        live = {st.name for arr in launched.streamer.rx.diagnostics for st in arr.status}
    assert set(statuses) <= live
    for name in live:
        taken = route(analyzers, name)
        assert [a.key for a in taken] == ["lingbot_map"], (name, [a.key for a in taken])
        assert taken[0].output_name(name) == "/LingBot-Map/" + name.split(": ", 1)[1]
    expected = {n for a in analyzers for n in a.values("expected")}
    assert expected and expected <= live, expected - live


def test_service_call_reset(launched):
    out = launched.shell.run(f"ros2 service call {NODE}/reset std_srvs/srv/Trigger", timeout=40).ok().output
    assert re.search(r"std_srvs\.srv\.Trigger_Response\(success=True, message='[^']*new world frame", out), out
    launched.launch.wait_for(r"~/reset called", 20)


def test_lifecycle_get_set_deactivate_activate(launched):
    shell, s = launched.shell, launched.streamer
    assert wait_until(lambda: NODE in shell.run(f"ros2 lifecycle nodes {FLAGS}", timeout=30).ok().output.split(), 60)
    assert "active [3]" in shell.ros2(f"ros2 lifecycle get {NODE} {FLAGS}", timeout=30).ok().output
    out = shell.ros2(f"ros2 lifecycle set {NODE} deactivate {FLAGS}", timeout=30).ok().output
    assert "Transitioning successful" in out, out
    assert "inactive [2]" in shell.ros2(f"ros2 lifecycle get {NODE} {FLAGS}", timeout=30).ok().output
    # inactive: frames are received and counted, every one ends DROPPED_INACTIVE, no pose
    before = max(s.sent, default=0)
    s.streaming.set()
    try:
        assert s.wait_for(lambda rx: sum(1 for st in rx.status_log
                                         if st.status == DROPPED_INACTIVE) >= 3, 30), "no DROPPED_INACTIVE"
    finally:
        s.streaming.clear()
    with s.listener.lock:
        after_deactivate = [st for st in s.rx.status_log if st.header.stamp.sec * 10**9 + st.header.stamp.nanosec
                            > before]
    assert after_deactivate and {st.status for st in after_deactivate} == {DROPPED_INACTIVE}
    out = shell.ros2(f"ros2 lifecycle set {NODE} activate {FLAGS}", timeout=30).ok().output
    assert "Transitioning successful" in out, out
    resumed = max(s.sent)
    s.streaming.set()
    try:
        assert s.wait_for(lambda rx: any(t > resumed for t in rx.poses), 60), "no pose after activate"
    finally:
        s.streaming.clear()
    # that first pose after activate is the marker: ~/pose has one ordered writer, so a pose of a frame
    # received while inactive would have arrived before it
    assert [t for t in s.poses_after(before) if t <= resumed] == [], "poses published while inactive"


def test_interface_show_cache_stats(launched):
    out = launched.shell.run("ros2 interface show lingbot_map_ros/msg/CacheStats", timeout=30).ok().output
    fields = []
    for line in (REPO / "msg" / "CacheStats.msg").read_text().splitlines():
        code = line.split("#", 1)[0].strip()
        if code:
            fields.append(code.split()[:2])
    assert len(fields) > 20
    shown = {tuple(line.split("#", 1)[0].split()[:2]) for line in out.splitlines() if not line.startswith("\t")}
    missing = [f for f in fields if tuple(f) not in shown]
    assert not missing, f"fields of msg/CacheStats.msg not shown: {missing}\n{out[:2000]}"


def test_launch_sigint_stops_cleanly(launched):
    launched.streamer.streaming.clear()
    rc = launched.launch.interrupt(group=False)
    out = launched.launch.output()
    assert rc == 0, out[-3000:]
    assert "[lingbot_map] stopped cleanly" in out, out[-3000:]
    assert re.search(r"\[lingbot_map_node-1\]: process has finished cleanly", out), out[-3000:]
    print(f"ros2 launch: start to active {launched.startup:.1f} s")


# ------------------------------------------------------------------------------------ ros2 run


def _start_run(shell: RosShell, args: str, name: str):
    return shell.start(f"ros2 run lingbot_map_ros lingbot_map_node --ros-args {args}", name)



def _stream_until_poses(shell, run, count: int) -> "FrameStreamer":
    """Stream frames into the node started by ``run`` until ``count`` poses came back; the streamer
    (stopped, still connected) is returned for the caller's checks and cleanup."""
    streamer = FrameStreamer(shell.domain_id, RUN_TOPIC)
    assert streamer.listener.wait_connected(30)
    streamer.streaming.set()
    assert streamer.wait_for(lambda rx: len(rx.poses) >= count, 90), run.output()[-3000:]
    streamer.streaming.clear()
    return streamer


def _stop_all(shell: RosShell, proc, streamer) -> None:
    """End of a test: the streaming probe (if it was started), the node process (by its PID), the daemon."""
    if streamer is not None:
        streamer.close()
    proc.close()
    shell.stop_daemon()


def _interrupt_cleanly(run) -> None:
    """Ctrl-C as a terminal sends it (the whole foreground group): exit 0, "stopped cleanly"."""
    rc = run.interrupt(group=True)
    assert rc == 0, run.output()[-3000:]
    assert "[lingbot_map] stopped cleanly" in run.output()


def test_ros2_run_from_venv_publishes_and_stops_on_sigint(tmp_path, ros_domain_id):
    shell = RosShell(ros_domain_id, tmp_path)
    params = tiny_params(tmp_path / "run_params.yaml")
    run = _start_run(shell, f"--params-file {params} -r image:={RUN_TOPIC} -p world_frame:=run_world", "ros2_run")
    streamer = None
    try:
        run.wait_for(r"\[lingbot_map\]: ready: active", 150)
        assert shell.wait_for_node(NODE), run.output()[-3000:]
        streamer = _stream_until_poses(shell, run, 3)
        with streamer.listener.lock:
            assert {p.header.frame_id for p in streamer.rx.poses.values()} == {"run_world"}
        _interrupt_cleanly(run)
    finally:
        _stop_all(shell, run, streamer)


def test_ros2_run_autostart_false_lifecycle_by_hand_with_a_bad_checkpoint(tmp_path, ros_domain_id):
    """unconfigured at start; configure with an unloadable checkpoint fails with the reason and the
    node stays alive and unconfigured; fixed parameter -> configure, activate, poses; deactivate and
    cleanup free the model; SIGINT ends it cleanly."""
    shell = RosShell(ros_domain_id, tmp_path)
    params = tiny_params(tmp_path / "run_params.yaml")
    bad = tmp_path / "broken.pt"
    bad.write_bytes(b"this is not a torch checkpoint\n" * 64)
    run = _start_run(shell, f"--params-file {params} -r image:={RUN_TOPIC} -p autostart:=false "
                            f"-p checkpoint:={bad}", "ros2_run_manual")
    streamer = None

    def lifecycle(verb: str) -> str:
        return shell.ros2(f"ros2 lifecycle {verb} {FLAGS}", timeout=30).ok().output

    try:
        assert shell.wait_for_node(NODE, 90), run.output()[-3000:]
        assert "unconfigured [1]" in lifecycle(f"get {NODE}")
        assert "ready:" not in run.output()
        out = lifecycle(f"set {NODE} configure")
        assert "Transitioning failed" in out, out
        run.wait_for(r"configure failed: .*broken\.pt|configure failed: .*cannot build the model", 30)
        assert run.proc.poll() is None, "the node died on a bad checkpoint"
        assert "unconfigured [1]" in lifecycle(f"get {NODE}")
        diag = echo_once(shell, "/diagnostics", "diagnostic_msgs/msg/DiagnosticArray")
        backend = {kv["key"]: kv["value"] for st in diag["status"] if st["name"] == "lingbot_map: backend"
                   for kv in st["values"]}
        assert backend["lifecycle_state"] == "unconfigured" and backend["configure_error"] != "-", backend
        out = shell.ros2(f"ros2 param set {NODE} checkpoint '' {FLAGS}", timeout=30).output
        assert "Set parameter successful" in out, out
        assert "Transitioning successful" in lifecycle(f"set {NODE} configure")
        assert "Transitioning successful" in lifecycle(f"set {NODE} activate")  # poses below show it is active
        streamer = _stream_until_poses(shell, run, 2)
        assert "Transitioning successful" in lifecycle(f"set {NODE} deactivate")
        assert "Transitioning successful" in lifecycle(f"set {NODE} cleanup")
        assert "unconfigured [1]" in lifecycle(f"get {NODE}")
        run.wait_for(r"cleaned up", 20)
        _interrupt_cleanly(run)
    finally:
        _stop_all(shell, run, streamer)


def test_launch_autostart_false_waits_unconfigured(tmp_path, ros_domain_id):
    """The launch argument: the managed node stays unconfigured (no model) until told otherwise."""
    shell = RosShell(ros_domain_id, tmp_path)
    params = tiny_params(tmp_path / "params.yaml")
    launch = shell.start(f"ros2 launch lingbot_map_ros lingbot_map.launch.py autostart:=false params_file:={params}",
                         "ros2_launch_manual")
    try:
        assert shell.wait_for_node(NODE, 90), launch.output()[-3000:]
        assert "unconfigured [1]" in shell.ros2(f"ros2 lifecycle get {NODE} {FLAGS}", timeout=30).ok().output
        assert "configuring" not in launch.output() and "ready:" not in launch.output()
        rc = launch.interrupt(group=False)
        assert rc == 0 and "[lingbot_map] stopped cleanly" in launch.output(), launch.output()[-3000:]
    finally:
        launch.close()
        shell.stop_daemon()


# ------------------------------------------------------------------------------------ use_sim_time, time jumps

SIM_TOPIC = "/sim/cam/image"
SIM_START_S = 4242  # the simulator's clock: far from the wall clock (about 1.7e9 s)


class SimClock:
    """Publishes /clock (rosgraph_msgs/Clock) from SIM_START_S on, at 50 Hz, as a simulator does."""

    def __init__(self, node):
        from rosgraph_msgs.msg import Clock

        self._msg = Clock
        self._pub = node.create_publisher(Clock, "/clock", 10)
        self._t0 = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            sim = SIM_START_S + (time.monotonic() - self._t0)
            msg = self._msg()
            msg.clock.sec, msg.clock.nanosec = int(sim), int((sim % 1) * 1e9)
            self._pub.publish(msg)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)


def test_launch_use_sim_time_and_stamps_that_jump_back(tmp_path, ros_domain_id):
    """``use_sim_time:=true``: the node's clock follows /clock (its /diagnostics are stamped in sim
    time). Frames whose stamps go back (a bag played again, the simulation reset) start a new
    session each with the reason "time jumped back by X s", counted in /diagnostics, and every
    frame still ends with exactly one final status (a buffered scale frame ends DROPPED_RESET)."""
    import rclpy
    from rclpy.context import Context

    from lingbot_map_ros.tools.node_client import BUFFERED_STATUS, Listener, SyntheticCamera, image_message

    shell = RosShell(ros_domain_id, tmp_path)
    params = tiny_params(tmp_path / "sim_params.yaml", diagnostics_period=0.2)
    launch = shell.start(f"ros2 launch lingbot_map_ros lingbot_map.launch.py image_topic:={SIM_TOPIC} "
                         f"use_sim_time:=true params_file:={params}", "ros2_launch_sim")
    ctx = Context()
    rclpy.init(context=ctx, domain_id=ros_domain_id)
    listener = Listener(NODE, SIM_TOPIC, context=ctx, name="sim_time_probe")
    clock = SimClock(listener.node)
    try:
        launch.wait_for(r"\[lingbot_map\]: ready: active", 150)
        assert listener.wait_connected(30), launch.output()[-3000:]
        camera = SyntheticCamera(64, 48, seed=5)
        # seconds: a run, the bag again from an earlier stamp (its first frame is buffered as the
        # new session's first scale frame), the simulation reset once more, then on from there
        plan = [100.0, 100.1, 100.2, 100.3, 50.0, 20.0, 20.1, 20.2, 20.3]
        sent = []
        for i, t in enumerate(plan):
            stamp = int(round(t * 1e9))
            listener.pub.publish(image_message(camera.render(i), stamp, "sim_cam"))
            sent.append(stamp)
            assert listener.wait_for(lambda rx, s=stamp: s in rx.status, 60), launch.output()[-3000:]
        assert listener.wait_for(lambda rx: all(listener.final_status(s) is not None for s in sent), 60)

        def settled(rx) -> bool:
            for array in reversed(rx.diagnostics):
                for st in array.status:
                    if st.name == "lingbot_map: inference":
                        kv = {v.key: v.value for v in st.values}
                        return kv.get("frames_pending") == "0" and kv.get("frames_received") == str(len(plan))
            return False

        assert listener.wait_for(settled, 30), "diagnostics never counted every frame"
        with listener.lock:
            statuses = {s: [m.status for m in listener.rx.status[s]] for s in sent}
            sessions = {s: listener.final_status(s).session_id for s in sent}
            array = listener.rx.diagnostics[-1]
        inference = {v.key: v.value for st in array.status if st.name == "lingbot_map: inference" for v in st.values}
        for stamp, seq in statuses.items():  # at most one BUFFERED, then exactly one final status
            finals = [s for s in seq if s != BUFFERED_STATUS]
            assert len(finals) == 1 and seq[-1] == finals[0] and seq.count(BUFFERED_STATUS) <= 1, (stamp, seq)
        final = [statuses[s][-1] for s in sent]
        assert final == [PROCESSED] * 4 + [DROPPED_RESET] + [PROCESSED] * 4, final
        assert sessions[sent[0]] == sessions[sent[3]] < sessions[sent[5]] == sessions[sent[8]], sessions
        assert inference["time_jump_sessions"] == "2", inference
        assert inference["last_new_session_reason"] == "time jumped back by 30.000 s", inference
        launch.wait_for(r"new session \d+: time jumped back by 50\.300 s", 10)
        # the node's clock is the simulator's: /diagnostics stamped near SIM_START_S, not the wall clock
        assert SIM_START_S <= array.header.stamp.sec < SIM_START_S + 600, array.header.stamp
        rc = launch.interrupt(group=False)
        assert rc == 0 and "[lingbot_map] stopped cleanly" in launch.output(), launch.output()[-3000:]
    finally:
        clock.close()
        listener.close()
        rclpy.shutdown(context=ctx)
        launch.close()
        shell.stop_daemon()
