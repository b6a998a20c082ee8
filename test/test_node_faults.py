"""Faults injected into the real node (child process, real topics): nothing non-finite is published,
every received frame ends with exactly one final status, the counters add up, the node survives.

* a checkpoint with NaN in the camera head: every pose is NaN -> NON_FINITE_OUTPUT, nothing on
  ~/pose, ~/odom, ~/path, /tf; a new session after ``max_non_finite_frames`` in a row; ERROR in
  /diagnostics;
* a model that raises on chosen calls (a wrapper script patches ``LingBotMap.forward`` before the
  node starts): FAILED_INFERENCE for that frame, DROPPED_RESET for the frames buffered with it, a
  new session, and the node processes the next frames;
* ``~/reset`` and a session-parameter change while a scale frame is buffered: DROPPED_RESET;
* deactivate/activate: frames received while inactive end DROPPED_INACTIVE.
Always: ``frames_received == frames_processed + frames_dropped + frames_pending`` in every
CacheStats, and pending 0 once the stream is settled.
"""
from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path

import pytest

rclpy = pytest.importorskip("rclpy")

pytest.importorskip("lingbot_map_ros.msg")
pytest.importorskip("tf2_msgs.msg")
pytestmark = [pytest.mark.ros, pytest.mark.slow]  # starts nodes or tool processes

import torch  # noqa: E402
from lifecycle_msgs.msg import Transition  # noqa: E402
from lifecycle_msgs.srv import ChangeState  # noqa: E402
from rclpy.context import Context  # noqa: E402
from rclpy.parameter import Parameter, parameter_value_to_python  # noqa: E402
from rclpy.parameter_client import AsyncParameterClient  # noqa: E402
from std_srvs.srv import Trigger  # noqa: E402

from lingbot_map_ros.msg import FrameStatus  # noqa: E402
from lingbot_map_ros.tools.node_client import Listener, NodeProcess, SyntheticCamera, image_message, node_command  # noqa: E402

W, H = 64, 48
NS = "/lingbot_map"
TOPIC = "/fault/camera/image"
BASE_ARGS = ["-p", "model_preset:=tiny", "-p", "device:=cpu", "-p", "scale_frames:=2", "-p", "sliding_window:=3",
             "-p", "camera_iterations:=1", "-p", "qos_reliability:=reliable", "-p", "diagnostics_period:=0.2",
             "-r", f"image:={TOPIC}"]


class Stream:
    """Sends frames one by one with unique stamps and reads the node's verdicts."""

    def __init__(self, listener: Listener, node: NodeProcess):
        self.listener, self.node = listener, node
        self.camera = SyntheticCamera(W, H, seed=5)
        self.stamp = 1_800_000_000 * 10**9
        self.sent: list[int] = []

    def send(self) -> int:
        self.stamp += 40_000_000
        stamp = self.stamp
        msg = image_message(self.camera.render(len(self.sent)), stamp, "fault_cam")
        self.listener.pub.publish(msg)
        self.sent.append(stamp)
        ok = self.listener.wait_for(lambda rx: stamp in rx.status, 60)
        assert ok, f"no frame_status for {stamp}:\n{self.node.output()[-3000:]}"
        return stamp

    def statuses(self, stamp: int) -> list[int]:
        with self.listener.lock:
            return [s.status for s in self.listener.rx.status.get(stamp, [])]

    def wait_final(self, stamps, timeout: float = 60.0) -> None:
        ok = self.listener.wait_for(lambda rx: all(self.listener.final_status(s) is not None for s in stamps), timeout)
        assert ok, f"not every frame got a final status:\n{self.node.output()[-3000:]}"

    def assert_one_final_status_each(self) -> None:
        """Each sent frame: at most one BUFFERED, then exactly one final status, nothing after it."""
        for stamp in self.sent:
            seq = self.statuses(stamp)
            finals = [s for s in seq if s != FrameStatus.BUFFERED]
            assert len(finals) == 1, f"{stamp}: statuses {seq}"
            assert seq[-1] == finals[0] and seq.count(FrameStatus.BUFFERED) <= 1, f"{stamp}: {seq}"


def _diag(rx, name: str) -> dict:
    for array in reversed(rx.diagnostics):
        for s in array.status:
            if s.name == "lingbot_map: " + name:
                return {"level": s.level, "message": s.message, **{kv.key: kv.value for kv in s.values}}
    return {}


def _counters_add_up(rx) -> None:
    for stats in rx.stats.values():
        assert stats.frames_received == stats.frames_processed + stats.frames_dropped + stats.frames_pending, stats


def _settled_diag(listener: Listener, received: int, timeout: float = 10.0) -> dict:
    """The inference status of a /diagnostics message that has counted all ``received`` frames."""
    box = {}

    def ready(rx):
        d = _diag(rx, "inference")
        if d and int(d["frames_received"]) == received and int(d["frames_pending"]) == 0:
            box["d"] = d
            return True
        return False

    assert listener.wait_for(ready, timeout), f"diagnostics never settled: {_diag(listener.rx, 'inference')}"
    return box["d"]


def _start(tmp: Path, domain: int, extra_args: list[str], command=None):
    env = dict(os.environ, ROS_DOMAIN_ID=str(domain))
    node = NodeProcess([*BASE_ARGS, *extra_args], echo=False, env=env, log_path=str(tmp / "node.log"), command=command)
    ctx = Context()
    rclpy.init(context=ctx, domain_id=domain)
    listener = Listener(NS, TOPIC, context=ctx, name="fault_test_client")
    assert node.wait_ready(120), f"node did not start:\n{node.output()}"
    assert listener.wait_connected(30), "no connection to the node"
    return node, listener, ctx


def _stop(node: NodeProcess, listener: Listener, ctx, sig: int = 2) -> None:
    """Stop the node with ``sig`` (SIGINT; 15: SIGTERM): it must exit 0 and say it stopped cleanly."""
    listener.close()
    rc = node.stop(sig=sig)
    rclpy.shutdown(context=ctx)
    assert rc == 0, f"node exit code {rc}:\n{node.output()[-3000:]}"
    assert "stopped cleanly" in node.output()


def _nan_checkpoint(path: Path, model) -> None:
    sd = dict(model.state_dict())  # a copy of the mapping: the shared model keeps its weights
    poisoned = [k for k in sd if k.startswith("camera_head.") and sd[k].is_floating_point()]
    assert poisoned
    for k in poisoned[:1]:
        sd[k] = torch.full_like(sd[k], float("nan"))
    torch.save({"model": sd}, path)


def test_nan_checkpoint_publishes_nothing_and_restarts_sessions(tmp_path, ros_domain_id, tiny_model):
    ckpt = tmp_path / "nan_tiny.pt"
    _nan_checkpoint(ckpt, tiny_model(1)[1])
    node, listener, ctx = _start(tmp_path, ros_domain_id,
                                 ["-p", f"checkpoint:={ckpt}", "-p", "max_non_finite_frames:=2"])
    try:
        s = Stream(listener, node)
        stamps = [s.send() for _ in range(6)]
        s.wait_final(stamps)
        rx = listener.rx
        assert [listener.final_status(t).status for t in stamps] == [FrameStatus.NON_FINITE_OUTPUT] * 6
        assert all("non-finite" in listener.final_status(t).reason for t in stamps)
        # scale 2, limit 2: every joint call gives two bad frames in a row -> a new session each time
        assert [s.statuses(t).count(FrameStatus.BUFFERED) for t in stamps] == [1, 0, 1, 0, 1, 0]
        # the marker: no valid frame can follow (every output is NaN), so the node's own count is it: a
        # /diagnostics message that has counted all six frames as finished was read after the last
        # frame's outputs and status went out, and comes later than any of them (the node's timer)
        d = _settled_diag(listener, received=6)
        with listener.lock:
            assert not rx.poses and not rx.odoms and not rx.tf, "a non-finite frame was published"
            assert all(not p.poses for p in rx.paths)
        assert int(d["frames_non_finite"]) == 6 and int(d["frames_processed"]) == 0
        assert int(d["non_finite_sessions"]) == 3
        assert d["level"] == b"\x02" and "non-finite" in d["message"], d  # ERROR while such frames occur
        s.assert_one_final_status_each()
    finally:
        _stop(node, listener, ctx)


FAULT_WRAPPER = '''\
import sys
from lingbot_map_ros.core.model import lingbot_map as _m

_FAIL_ON = {fail_on!r}
_calls = [0]
_forward = _m.LingBotMap.forward


def _faulty_forward(self, *args, **kwargs):
    _calls[0] += 1
    if _calls[0] in _FAIL_ON:
        raise RuntimeError(f"injected fault on model call {{_calls[0]}}")
    return _forward(self, *args, **kwargs)


_m.LingBotMap.forward = _faulty_forward
from lingbot_map_ros.ros.node import main
sys.exit(main())
'''


def test_model_exception_fails_one_frame_and_the_node_carries_on(tmp_path, ros_domain_id):
    wrapper = tmp_path / "faulty_node.py"
    wrapper.write_text(FAULT_WRAPPER.format(fail_on={3, 4}))
    command = [sys.executable, str(wrapper)]
    assert os.path.isfile(node_command()[0]) or node_command()[0] == sys.executable
    node, listener, ctx = _start(tmp_path, ros_domain_id, [], command=command)
    try:
        s = Stream(listener, node)
        stamps = [s.send() for _ in range(8)]
        s.wait_final(stamps)
        final = [listener.final_status(t).status for t in stamps]
        P, F, R = FrameStatus.PROCESSED, FrameStatus.FAILED_INFERENCE, FrameStatus.DROPPED_RESET
        # call 1: frames 1+2 (scale), call 2: frame 3, call 3 (frame 4) raises -> new session;
        # frame 5 buffered, call 4 (frames 5+6) raises -> 6 failed, 5 dropped; call 5: frames 7+8
        assert final == [P, P, P, F, R, F, P, P], final
        assert "injected fault on model call 3" in listener.final_status(stamps[3]).reason
        # a frame's ~/cache_stats goes out just after its PROCESSED status: wait for it, not race it
        listener.wait_for(lambda rx: all(stamps[i] in rx.stats for i in (0, 1, 2, 6, 7)), 10)
        with listener.lock:
            poses = set(listener.rx.poses)
            sessions = {t: listener.rx.stats[t].session_id for t in listener.rx.stats}
        assert poses == {stamps[i] for i in (0, 1, 2, 6, 7)}
        assert sessions[stamps[7]] == sessions[stamps[2]] + 2
        d = _settled_diag(listener, received=8)
        assert int(d["frames_failed"]) == 2 and int(d["frames_dropped_reset"]) == 1
        assert int(d["failure_sessions"]) == 2 and int(d["frames_processed"]) == 5
        _counters_add_up(listener.rx)
        s.assert_one_final_status_each()
    finally:
        _stop(node, listener, ctx)


WINDOW_OOM_WRAPPER = '''\
import sys
import torch
from lingbot_map_ros.core import stream as _s

_begin_window = _s.StreamingSession.begin_window
_run_model = _s.StreamingSession._run_model
_armed = [False]


def _begin_window_then_arm(self):
    _begin_window(self)
    _armed[0] = True  # the window switch's first model call (the re-fed scale frames) runs out of memory


def _run_model_oom(self, images, *args, **kwargs):
    if _armed[0]:
        _armed[0] = False
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected during the window switch)")
    return _run_model(self, images, *args, **kwargs)


_s.StreamingSession.begin_window = _begin_window_then_arm
_s.StreamingSession._run_model = _run_model_oom
from lingbot_map_ros.ros.node import main
sys.exit(main())
'''


def test_out_of_memory_during_a_window_switch_takes_the_failure_path(tmp_path, ros_domain_id):
    """Regression: a fault in the window switch was filed as REFUSED_POLICY (no error record, no failure
    count) and its new session reached neither the counters nor the input size. Now: the failure path,
    and the new session takes a frame of another size as its first."""
    wrapper = tmp_path / "window_oom_node.py"
    wrapper.write_text(WINDOW_OOM_WRAPPER)
    window = ["-p", "long_run_policy:=window", "-p", "max_stored_frames:=6", "-p", "overlap_frames:=3"]
    node, listener, ctx = _start(tmp_path, ros_domain_id, window, command=[sys.executable, str(wrapper)])
    try:
        s = Stream(listener, node)
        stamps = [s.send() for _ in range(7)]
        s.wait_final(stamps)
        final = [listener.final_status(t).status for t in stamps]
        P, F = FrameStatus.PROCESSED, FrameStatus.FAILED_INFERENCE
        # frames 1+2 scale, 3..6 keyframes: 6 stored; frame 7 hits the limit, the switch runs out of memory
        assert final == [P] * 6 + [F], final
        assert "OutOfMemoryError" in listener.final_status(stamps[6]).reason
        # the new session takes frames of another size: the input size was renewed with it
        s.camera = SyntheticCamera(W + 16, H + 12, seed=6)
        other = [s.send() for _ in range(2)]
        s.wait_final(other)
        assert [listener.final_status(t).status for t in other] == [P, P]
        d = _settled_diag(listener, received=9)
        assert int(d["failure_sessions"]) == 1 and int(d["frames_failed"]) == 1, d
        assert int(d["frames_refused"]) == 0 and int(d["sessions_started"]) == 2, d  # configured, failure
        assert "OutOfMemoryError" in d["last_error"] and "inference failed" in d["last_new_session_reason"], d
        _counters_add_up(listener.rx)
        s.assert_one_final_status_each()
    finally:
        _stop(node, listener, ctx)


def test_a_policy_session_is_counted_and_keeps_the_input_size(tmp_path, ros_domain_id):
    """Regression: sessions the long-run policy started were invisible to the node. The reset policy's
    session is counted, named in /diagnostics, and its first frame (the one at the limit) fixes its
    input size: a frame of another size is rejected as a resolution change, not refused by the session."""
    reset = ["-p", "long_run_policy:=reset", "-p", "max_stored_frames:=6"]
    node, listener, ctx = _start(tmp_path, ros_domain_id, reset)
    try:
        s = Stream(listener, node)
        stamps = [s.send() for _ in range(8)]
        s.wait_final(stamps)
        assert [listener.final_status(t).status for t in stamps] == [FrameStatus.PROCESSED] * 8
        s.camera = SyntheticCamera(W + 16, H + 12, seed=6)
        other = s.send()
        d = _settled_diag(listener, received=9)
        assert int(d["policy_sessions"]) == 1 and int(d["sessions_started"]) == 2, d
        assert "stored-frame limit 6 reached" in d["last_new_session_reason"], d
        assert listener.final_status(other).status == FrameStatus.REJECTED_INPUT
        assert "resolution changed" in listener.final_status(other).reason
        with listener.lock:
            sessions = [listener.rx.stats[t].session_id for t in stamps if t in listener.rx.stats]
        assert sessions[-1] == sessions[0] + 1
        s.assert_one_final_status_each()
    finally:
        _stop(node, listener, ctx)


def test_reset_parameter_change_and_deactivate_account_for_every_frame(tmp_path, ros_domain_id):
    node, listener, ctx = _start(tmp_path, ros_domain_id, [])
    try:
        s = Stream(listener, node)
        a = s.send()
        assert s.statuses(a) == [FrameStatus.BUFFERED]
        resp = listener.call(Trigger, f"{NS}/reset", Trigger.Request())
        assert resp is not None and resp.success
        s.wait_final([a])
        assert listener.final_status(a).status == FrameStatus.DROPPED_RESET
        assert "~/reset" in listener.final_status(a).reason

        b = s.send()
        assert s.statuses(b) == [FrameStatus.BUFFERED]
        client = AsyncParameterClient(listener.node, NS)
        assert client.wait_for_services(15.0)
        future = client.set_parameters([Parameter("sliding_window", value=4)])
        deadline = time.monotonic() + 15
        while not future.done() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert future.done() and all(r.successful for r in future.result().results)
        s.wait_final([b])
        assert listener.final_status(b).status == FrameStatus.DROPPED_RESET
        assert "sliding_window" in listener.final_status(b).reason

        c, d = s.send(), s.send()
        s.wait_final([c, d])
        assert [listener.final_status(t).status for t in (c, d)] == [FrameStatus.PROCESSED] * 2

        change = listener.node.create_client(ChangeState, f"{NS}/change_state")
        assert change.wait_for_service(15.0)

        def transition(tid: int) -> bool:
            future = change.call_async(ChangeState.Request(transition=Transition(id=tid)))
            end = time.monotonic() + 30
            while not future.done() and time.monotonic() < end:
                time.sleep(0.02)
            return future.done() and future.result().success

        assert transition(Transition.TRANSITION_DEACTIVATE)
        e = s.send()
        s.wait_final([e])
        assert listener.final_status(e).status == FrameStatus.DROPPED_INACTIVE
        assert transition(Transition.TRANSITION_ACTIVATE)
        f = s.send()
        s.wait_final([f])
        assert listener.final_status(f).status == FrameStatus.PROCESSED

        diag = _settled_diag(listener, received=len(s.sent))
        assert int(diag["frames_dropped_reset"]) == 2 and int(diag["frames_dropped_inactive"]) == 1
        assert int(diag["frames_processed"]) == 3
        assert int(diag["frames_dropped"]) == 3 and int(diag["frames_pending"]) == 0
        _counters_add_up(listener.rx)
        s.assert_one_final_status_each()
        assert not any(math.isnan(v) for t in listener.rx.poses.values()
                       for v in (t.pose.position.x, t.pose.position.y, t.pose.position.z))

        # A camera driver publishing best effort to a node that asks for reliable: the middleware
        # cannot match them; the node reports it instead of waiting silently.
        from rclpy.qos import QoSProfile, QoSReliabilityPolicy
        from sensor_msgs.msg import Image

        listener.node.create_publisher(Image, TOPIC, QoSProfile(depth=1, reliability=QoSReliabilityPolicy.BEST_EFFORT))
        assert listener.wait_for(lambda rx: int(_diag(rx, "input").get("incompatible_qos_publishers", 0)) >= 1, 20)
        diag = _diag(listener.rx, "input")
        assert diag["level"] == b"\x01" and "incompatible QoS" in diag["message"], diag
    finally:
        _stop(node, listener, ctx)


def _set(listener: Listener, **values):
    """``ros2 param set`` through the node's parameter service: [(successful, reason)] per value."""
    client = AsyncParameterClient(listener.node, NS)
    assert client.wait_for_services(15.0)
    future = client.set_parameters([Parameter(k, value=v) for k, v in values.items()])
    deadline = time.monotonic() + 60
    while not future.done() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert future.done(), "no answer from set_parameters"
    return [(r.successful, r.reason) for r in future.result().results]


def _get(listener: Listener, name: str):
    """``ros2 param get``: the node's current value of ``name``."""
    client = AsyncParameterClient(listener.node, NS)
    assert client.wait_for_services(15.0)
    future = client.get_parameters([name])
    deadline = time.monotonic() + 15
    while not future.done() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert future.done(), "no answer from get_parameters"
    return parameter_value_to_python(future.result().values[0])


class _Exploit:
    """Unpickling this runs code: a checkpoint nobody should load by default."""

    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_model_changes_are_checked_before_they_are_accepted(tmp_path, ros_domain_id, tiny_model):
    """A checkpoint of the other preset, a truncated file and a code-running pickle are refused by
    ``ros2 param set`` itself, with the reason; the value stays what the model uses."""
    _, model = tiny_model(2)
    good = tmp_path / "tiny.pt"
    torch.save({"model": model.state_dict()}, good)
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 3])
    unsafe = tmp_path / "unsafe.pt"
    torch.save({"model": model.state_dict(), "payload": _Exploit()}, unsafe)
    node, listener, ctx = _start(tmp_path, ros_domain_id, ["-p", f"checkpoint:={good}"])
    try:
        [(ok, reason)] = _set(listener, model_preset="full")
        assert not ok and "does not match the model" in reason and "full" in reason, reason
        for bad in (truncated, unsafe):
            [(ok, reason)] = _set(listener, checkpoint=str(bad))
            assert not ok and str(bad) in reason, reason
        assert _get(listener, "checkpoint") == str(good) and _get(listener, "model_preset") == "tiny"
        s = Stream(listener, node)
        stamps = [s.send() for _ in range(3)]
        s.wait_final(stamps)
        assert [listener.final_status(t).status for t in stamps] == [FrameStatus.PROCESSED] * 3
        assert "new model" not in node.output()
    finally:
        _stop(node, listener, ctx)


BUILD_FAULT_WRAPPER = '''\
import sys
from lingbot_map_ros.core.model_host import ModelHost

_calls = [0]
_load = ModelHost.load.__func__


def _failing_load(cls, *args, **kwargs):
    _calls[0] += 1
    print(f"[wrapper] model build {{_calls[0]}}", flush=True)
    if _calls[0] == 2:
        raise RuntimeError("injected failure while building the model")
    return _load(cls, *args, **kwargs)


ModelHost.load = classmethod(_failing_load)
from lingbot_map_ros.ros.node import main
sys.exit(main())
'''


def test_failed_model_build_reverts_the_parameter_and_is_not_retried(tmp_path, ros_domain_id):
    wrapper = tmp_path / "failing_build_node.py"
    wrapper.write_text(BUILD_FAULT_WRAPPER.format())
    node, listener, ctx = _start(tmp_path, ros_domain_id, ["-p", "seed:=0"], command=[sys.executable, str(wrapper)])
    try:
        [(ok, _)] = _set(listener, seed=7)  # passes every check; the build itself fails
        assert ok
        assert listener.wait_for(lambda rx: "injected failure" in _diag(rx, "inference").get("message", ""), 30), \
            node.output()[-3000:]
        assert _diag(listener.rx, "inference")["level"] == b"\x02"
        deadline = time.monotonic() + 15
        while _get(listener, "seed") != 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _get(listener, "seed") == 0, "the parameter still shows a value the model does not use"
        [(ok, _)] = _set(listener, keyframe_interval=2)  # unrelated: must not retry the build
        assert ok
        s = Stream(listener, node)
        stamps = [s.send() for _ in range(3)]
        s.wait_final(stamps)
        assert [listener.final_status(t).status for t in stamps] == [FrameStatus.PROCESSED] * 3
        builds = [line for line in node.output().splitlines() if line.startswith("[wrapper] model build")]
        assert builds == ["[wrapper] model build 1", "[wrapper] model build 2"], builds
    finally:
        _stop(node, listener, ctx)


def _run_wrapped_node(tmp: Path, domain: int, source: str, frames: int, sig: int) -> NodeProcess:
    """Run the node through the wrapper script ``source`` (it patches ``lingbot_map_ros.ros.node``,
    then calls ``main``), process ``frames`` frames, stop it with ``sig`` (``_stop``'s checks)."""
    wrapper = tmp / "wrapped_node.py"
    wrapper.write_text(source)
    node, listener, ctx = _start(tmp, domain, [], command=[sys.executable, str(wrapper)])
    try:
        s = Stream(listener, node)
        s.wait_final([s.send() for _ in range(frames)])
    finally:
        _stop(node, listener, ctx, sig=sig)
    return node


RACE_WRAPPER = r'''
import sys

from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
from rclpy.impl.implementation_singleton import rclpy_implementation

import lingbot_map_ros.ros.node as node_module


class RacingExecutor(SingleThreadedExecutor):
    """rclpy's spin() checks the context, then builds a wait set; a SIGTERM between the two raises
    RCLError from the wait set. This executor spins for real and ends the way that race does."""

    def spin(self):
        try:
            while self._context.ok():
                self.spin_once(timeout_sec=0.05)
        except ExternalShutdownException:  # the SIGTERM landed inside the wait: the usual way
            pass
        raise rclpy_implementation.RCLError("failed to initialize wait set: the given context is not valid")


node_module.make_executor = lambda context=None: RacingExecutor(context=context)
sys.exit(node_module.main())
'''


def test_sigterm_racing_the_executor_wait_set_ends_cleanly(tmp_path, ros_domain_id):
    """The SIGTERM that lands between rclpy's context check and its wait set (seen once in CI as
    exit 1 with an RCLError traceback) is the same clean stop as any other SIGTERM."""
    _run_wrapped_node(tmp_path, ros_domain_id, RACE_WRAPPER, frames=3, sig=15)


SECOND_SIGNAL_WRAPPER = r'''
import os
import sys
import time

import lingbot_map_ros.ros.node as node_module

SECOND, MOMENT = {second}, "{moment}"


def signal_again() -> None:
    """Ctrl-C pressed twice, or ros2 launch's SIGTERM after its SIGINT. os.kill runs the Python-level
    handler before it returns, so the signal is handled right here."""
    os.kill(os.getpid(), SECOND)
    time.sleep(0.2)
    print(f"[wrapper] went on after the second signal ({{MOMENT}})", flush=True)


if MOMENT == "teardown":  # while the threads are being joined
    original_shutdown = node_module.LingBotMapNode.shutdown

    def shutdown_with_a_second_signal(self, *args, **kwargs):
        signal_again()
        return original_shutdown(self, *args, **kwargs)

    node_module.LingBotMapNode.shutdown = shutdown_with_a_second_signal
rc = node_module.main()
if MOMENT == "exit":  # after "stopped cleanly": the interpreter's own exit is left
    signal_again()
sys.exit(rc)
'''


@pytest.mark.parametrize("second", [2, 15], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("moment", ["teardown", "exit"])
def test_a_second_stop_signal_changes_nothing(tmp_path, ros_domain_id, moment, second):
    """SIGINT, then a second SIGINT or SIGTERM while the node tears down or after it said it stopped:
    exit 0, "stopped cleanly", the second signal reported (CI saw ros2 launch report the node as died
    when a KeyboardInterrupt landed in the teardown)."""
    node = _run_wrapped_node(tmp_path, ros_domain_id, SECOND_SIGNAL_WRAPPER.format(second=second, moment=moment),
                             frames=2, sig=2)
    assert f"[wrapper] went on after the second signal ({moment})" in node.output(), node.output()[-3000:]
    if moment == "teardown":
        assert "again: already stopping" in node.output(), node.output()[-3000:]


@pytest.mark.parametrize("moment", ["phase1", "model_change", "save"])
def test_sigterm_at_awkward_moments_ends_cleanly(tmp_path, ros_domain_id, moment):
    """SIGTERM while a scale frame is buffered, while a new model is being built, or while
    ~/save_trajectory writes: exit 0, "stopped cleanly", and the trajectory file (written to a temp
    file and renamed) is either absent or complete."""
    from lingbot_map_ros.core.trajectory import read_tum

    traj = tmp_path / "traj.tum"
    node, listener, ctx = _start(tmp_path, ros_domain_id, ["-p", f"trajectory_path:={traj}"])
    try:
        s = Stream(listener, node)
        if moment == "phase1":
            a = s.send()
            assert s.statuses(a) == [FrameStatus.BUFFERED]
        else:
            stamps = [s.send() for _ in range(4)]
            s.wait_final(stamps)
            if moment == "model_change":
                client = AsyncParameterClient(listener.node, NS)
                assert client.wait_for_services(15.0)
                client.set_parameters([Parameter("seed", value=11)])  # not awaited: SIGTERM during the build
                time.sleep(0.05)
            else:
                client = listener.node.create_client(Trigger, f"{NS}/save_trajectory")
                assert client.wait_for_service(15.0)
                client.call_async(Trigger.Request())  # not awaited: SIGTERM while it writes
                time.sleep(0.01)
    finally:
        _stop(node, listener, ctx, sig=15)
    assert not list(tmp_path.glob("traj.tum.tmp*")), "a temporary trajectory file was left behind"
    if traj.exists():
        stamps_sec, _, _ = read_tum(traj)
        assert len(stamps_sec) == 4, "a half-written trajectory file"
