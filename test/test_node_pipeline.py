"""The preprocessing stage: frame n+1 is preprocessed while the model runs frame n.

In-process, with a preprocessor that blocks until the test lets it go:

* the stage holds one frame in preprocessing and one waiting; a newer frame replaces the waiting
  one, which ends DROPPED_QUEUE ("replaced by a newer frame before preprocessing");
* ``stop`` (deactivate, cleanup, shutdown) joins the thread after the frame in hand; that frame and
  the waiting one end DROPPED_INACTIVE; the stage starts again afterwards;
* a frame preprocessed for a session that was reset meanwhile is checked again by the inference
  thread: it becomes the new session's first frame, or is rejected when the new session already
  took another size; it never reaches a session at another size.

The real node (child process) with a model made slow on purpose (a wrapper sleeps in
``LingBotMap.forward``, the way a GPU step leaves the CPU idle):

* the node's own timeline in /diagnostics shows frame n+1's preprocessing inside frame n's push;
* a flood of frames with a reset, a parameter change, a frame of another size and a deactivate in
  the middle: every frame gets exactly one final status and the counters add up throughout.
"""
from __future__ import annotations

import math
import os
import re
import sys
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy")
pytest.importorskip("lingbot_map_ros.msg")
pytestmark = pytest.mark.ros

import torch  # noqa: E402
from builtin_interfaces.msg import Time as TimeMsg  # noqa: E402
from lifecycle_msgs.msg import Transition  # noqa: E402
from lifecycle_msgs.srv import ChangeState  # noqa: E402
from rclpy.context import Context  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from rclpy.parameter_client import AsyncParameterClient  # noqa: E402
from std_msgs.msg import Header  # noqa: E402
from std_srvs.srv import Trigger  # noqa: E402

from lingbot_map_ros.core.config import StreamConfig  # noqa: E402
from lingbot_map_ros.core.preprocess import FramePreprocessor  # noqa: E402
from lingbot_map_ros.core.results import CacheSnapshot  # noqa: E402
from lingbot_map_ros.core.session_manager import ManagerView, SessionStart  # noqa: E402
from lingbot_map_ros.core.settings import defaults  # noqa: E402
from lingbot_map_ros.msg import FrameStatus  # noqa: E402
from lingbot_map_ros.ros.commands import Reset  # noqa: E402
from lingbot_map_ros.ros.diagnostics import REJECT_KINDS  # noqa: E402
from lingbot_map_ros.ros.frames import Frame, FrameLedger, InputRejected  # noqa: E402
from lingbot_map_ros.ros.inference import InferenceWorker, SessionView  # noqa: E402
from lingbot_map_ros.ros.input_size import InputSize  # noqa: E402
from lingbot_map_ros.ros.node_settings import FixedSettings, NodeSettings  # noqa: E402
from lingbot_map_ros.ros.outputs import ResultPublisher  # noqa: E402
from lingbot_map_ros.ros.pipeline import PREPROCESSING_FAILED, PipelineTimeline, PreprocessStage  # noqa: E402
from lingbot_map_ros.tools.node_client import Listener, NodeProcess, SyntheticCamera, image_message  # noqa: E402

NO_REVERT = SimpleNamespace(revert_model_parameters=lambda runtime: None)  # no model parameters to revert here


def _settings(**changes) -> FixedSettings:
    """The settings table's defaults with ``changes``, as the node's parts read them."""
    return FixedSettings(NodeSettings.from_values(dict(defaults(), **changes)))

NS = "/lingbot_map"
TOPIC = "/pipeline/camera/image"


# ----------------------------------------------------------------------------------- in-process


class GatedPreprocessor(FramePreprocessor):
    """Blocks in ``__call__`` until ``gate`` is set; ``started`` tells the test a frame is inside."""

    def __init__(self, gate: threading.Event, started: threading.Event):
        super().__init__()
        self.gate, self.started = gate, started

    def __call__(self, rgb):
        self.started.set()
        assert self.gate.wait(10), "the test never opened the gate"
        return super().__call__(rgb)


@pytest.fixture
def rig(ros_domain_id):
    ctx = Context()
    rclpy.init(context=ctx, domain_id=ros_domain_id)
    node = rclpy.create_node("pipeline_unit_test", context=ctx)
    gate, started = threading.Event(), threading.Event()
    ledger = FrameLedger(node, session_id=lambda: 1)
    statuses: list[tuple[int, int, str]] = []  # (stamp sec, status, reason) as published
    publish = ledger.interim

    def record(header, status, reason):
        statuses.append((header.stamp.sec, status, reason))
        publish(header, status, reason)

    ledger.interim = record
    input_size = InputSize(lambda: GatedPreprocessor(gate, started))
    input_size.renew()
    sunk: list[Frame] = []
    stage = PreprocessStage(_settings(), ledger, input_size, sink=sunk.append, context_ok=ctx.ok)
    box = {"node": node, "ctx": ctx, "gate": gate, "started": started, "ledger": ledger, "statuses": statuses,
           "input_size": input_size, "sunk": sunk, "stage": stage}
    try:
        yield box
    finally:
        gate.set()
        if stage.running:
            stage.stop("test over")
        node.destroy_node()
        rclpy.shutdown(context=ctx)


def _frame(ledger: FrameLedger, sec: int, wh=(64, 48)) -> Frame:
    """A converted frame as the image callback hands it on (counted as received)."""
    ledger.received()
    header = Header(stamp=TimeMsg(sec=sec), frame_id="cam")
    return Frame(header=header, rgb=np.full((wh[1], wh[0], 3), sec % 255, np.uint8), wh=wh,
                 received=time.perf_counter(), convert_ms=0.0)


def _wait(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_stage_holds_one_frame_in_preprocessing_and_one_waiting(rig):
    stage, ledger, sunk = rig["stage"], rig["ledger"], rig["sunk"]
    stage.start()
    f1 = _frame(ledger, 1)
    stage.offer(f1)
    assert rig["started"].wait(5), "frame 1 never reached preprocessing"
    f2, f3 = _frame(ledger, 2), _frame(ledger, 3)
    stage.offer(f2)
    stage.offer(f3)  # replaces f2, which waited
    assert rig["statuses"] == [(2, FrameStatus.DROPPED_QUEUE, "replaced by a newer frame before preprocessing")]
    assert sunk == []  # frame 1 is still inside the preprocessor
    rig["gate"].set()
    assert _wait(lambda: len(sunk) == 2), sunk
    assert [f.header.stamp.sec for f in sunk] == [1, 3]
    for f in sunk:
        assert tuple(f.model_image.shape) == (3, 392, 518) and f.model_image.dtype == torch.float32
        assert f.rgb is None and f.pre_start < f.pre_end and f.preprocess_ms > 0
    c = ledger.c
    assert (c.received, c.processed, c.dropped, c.pending) == (3, 0, 1, 2)  # two frames handed on, pending


def _inside(thread: threading.Thread, function: str) -> bool:
    """Whether ``thread`` is running ``function`` now (somewhere in its stack)."""
    frame = sys._current_frames().get(thread.ident)
    while frame is not None:
        if frame.f_code.co_name == function:
            return True
        frame = frame.f_back
    return False


def test_stop_ends_the_frame_in_hand_and_the_waiting_one_then_restarts(rig):
    stage, ledger, sunk = rig["stage"], rig["ledger"], rig["sunk"]
    stage.start()
    stage.offer(_frame(ledger, 1))
    assert rig["started"].wait(5)
    stage.offer(_frame(ledger, 2))
    stopper = threading.Thread(target=stage.stop, args=("the node was deactivated",))
    stopper.start()
    # the marker: the stopping thread is inside Thread.join while the frame in hand is held at the gate
    # (a stop that does not wait for it never gets there: it ends, and the wait below says so)
    deadline = time.monotonic() + 10
    while stopper.is_alive() and not _inside(stopper, "join") and time.monotonic() < deadline:
        time.sleep(0.001)
    assert stopper.is_alive() and _inside(stopper, "join"), "stop must wait for the frame in preprocessing"
    rig["gate"].set()
    stopper.join(10)
    assert not stopper.is_alive() and not stage.running
    assert sunk == [], "a frame went on after stop"
    assert sorted(rig["statuses"]) == [(1, FrameStatus.DROPPED_INACTIVE, "the node was deactivated"),
                                       (2, FrameStatus.DROPPED_INACTIVE, "the node was deactivated")]
    assert ledger.c.pending == 0 and ledger.c.dropped_inactive == 2
    stage.start()  # activate again
    stage.offer(_frame(ledger, 3))
    assert _wait(lambda: len(sunk) == 1) and sunk[0].header.stamp.sec == 3


class FakeManager:
    """The session manager as the inference thread uses it; records what was pushed."""

    def __init__(self):
        self.session_id = 1
        self.pushed: list[tuple[int, tuple]] = []
        self.stream_cfg = StreamConfig(scale_frames=2)
        self.session = SimpleNamespace(buffered=0, mapping=True)  # what the worker reads of the session
        self.on_new_session = None
        self.last_start = None

    def push(self, tensor, stamp):
        self.pushed.append((stamp.header.stamp.sec, tuple(tensor.shape)))
        self.session.buffered = 1
        return []  # buffered for the scale frames: BUFFERED, no final status yet

    def reset(self, reason, cause):
        self.session_id += 1
        self.last_start = SessionStart(self.session_id, cause, reason)
        self.on_new_session(self.last_start)  # the real manager's one path: the listener hears of it
        return self.last_start

    def view(self):
        return ManagerView(session_id=self.session_id, stream_cfg=self.stream_cfg, snapshot=CacheSnapshot())


def test_frame_preprocessed_before_a_reset_is_checked_against_the_new_session(rig):
    node, ledger, input_size = rig["node"], rig["ledger"], rig["input_size"]
    rig["gate"].set()
    # the settings table's defaults (ResultPublisher reads the robot settings), with a short path
    settings = _settings(path_max_length=10, trajectory_max_length=10, max_non_finite_frames=3)
    manager = FakeManager()
    worker = InferenceWorker(node, manager, settings, ledger, input_size, ResultPublisher(node, settings, ledger),
                             SessionView(), PipelineTimeline(time.perf_counter()),
                             parameters=NO_REVERT, context_ok=rig["ctx"].ok)
    worker.started_session("configured", counter=None)
    worker.start()
    try:
        def preprocessed(sec: int, wh) -> Frame:
            frame = _frame(ledger, sec, wh)
            preproc = input_size.check(*wh)  # what the preprocessing stage does
            frame.pre_start = time.perf_counter()
            frame.model_image = preproc(frame.rgb)
            frame.pre_end = time.perf_counter()
            return frame

        stale = preprocessed(1, (64, 48))  # session 1 is 64x48
        assert worker.submit(Reset("test reset"), wait=10)  # session 2: no size yet
        input_size.check(80, 60)  # a frame of another size reached the callback first
        worker.offer(stale)
        assert _wait(lambda: any(s[0] == 1 for s in rig["statuses"]))
        [(_, status, reason)] = [s for s in rig["statuses"] if s[0] == 1]
        assert status == FrameStatus.REJECTED_INPUT and "resolution changed" in reason, reason
        assert manager.pushed == [] and input_size.input_wh == (80, 60)

        stale = preprocessed(2, (80, 60))  # session 2 is 80x60
        assert worker.submit(Reset("test reset"), wait=10)  # session 3: no size yet
        worker.offer(stale)  # the first frame of session 3: its size is adopted
        assert _wait(lambda: manager.pushed)
        assert manager.pushed == [(2, (3, 392, 518))] and input_size.input_wh == (80, 60)
        with pytest.raises(InputRejected, match="resolution changed"):
            input_size.check(64, 48)
        assert [s[1] for s in rig["statuses"] if s[0] == 2] == [FrameStatus.BUFFERED]
    finally:
        worker.stop()


class FailingPreprocessor(FramePreprocessor):
    """A preprocessor fault that is not the frame's fault (an allocation failing, a library bug)."""

    def __call__(self, rgb):
        raise RuntimeError("simulated allocation failure")


def test_a_preprocessing_fault_is_a_rejected_input_of_its_own_kind_not_a_failed_inference(rig):
    ledger = rig["ledger"]
    input_size = InputSize(FailingPreprocessor)
    input_size.renew()
    sunk: list[Frame] = []
    stage = PreprocessStage(_settings(), ledger, input_size, sink=sunk.append, context_ok=rig["ctx"].ok)
    stage.start()
    try:
        stage.offer(_frame(ledger, 7))
        assert _wait(lambda: rig["statuses"]), "the frame got no status"
    finally:
        stage.stop("test over")
    [(sec, status, reason)] = rig["statuses"]
    assert sec == 7 and status == FrameStatus.REJECTED_INPUT, (status, reason)
    assert reason == "preprocessing failed: RuntimeError: simulated allocation failure"
    assert sunk == [] and ledger.c.failed == 0 and ledger.c.rejected == 1 and ledger.c.pending == 0
    assert ledger.c.rejected_by_kind == {PREPROCESSING_FAILED: 1} and PREPROCESSING_FAILED in REJECT_KINDS
    assert ledger.c.errors == 1  # unexpected: logged as an error too (with its traceback)


class BufferingManager(FakeManager):
    """Keeps the frames it buffers (scale frames) and hands them back on a reset, as the real one does."""

    def __init__(self):
        super().__init__()
        self.waiting: list = []

    def push(self, tensor, stamp):
        self.pushed.append((stamp.header.stamp.sec, tuple(tensor.shape)))
        self.waiting.append(stamp)
        self.session.buffered = len(self.waiting)
        return []

    def reset(self, reason, cause):
        self.session_id += 1
        discarded, self.waiting = self.waiting, []
        self.session.buffered = 0
        self.last_start = SessionStart(self.session_id, cause, reason, tuple(discarded))
        self.on_new_session(self.last_start)
        return self.last_start


def test_stamps_that_jump_back_start_a_new_session_and_every_frame_ends_once(rig):
    node, ledger, input_size = rig["node"], rig["ledger"], rig["input_size"]
    rig["gate"].set()
    settings = _settings(path_max_length=10, trajectory_max_length=10, max_non_finite_frames=3)
    manager = BufferingManager()
    worker = InferenceWorker(node, manager, settings, ledger, input_size, ResultPublisher(node, settings, ledger),
                             SessionView(), PipelineTimeline(time.perf_counter()),
                             parameters=NO_REVERT, context_ok=rig["ctx"].ok)
    worker.started_session("configured", counter=None)
    worker.start()
    try:
        def push(sec: int) -> None:
            """One frame through the worker; returns once the worker has given it its status."""
            before = len(rig["statuses"])
            frame = _frame(ledger, sec)
            frame.model_image = input_size.check(*frame.wh)(frame.rgb)
            frame.pre_end = time.perf_counter()
            worker.offer(frame)
            assert _wait(lambda: any(s[0] == sec for s in rig["statuses"][before:])), f"frame {sec}: no status"

        for sec in (100, 101):  # session 1 buffers two frames
            push(sec)
        push(40)  # the bag played again: a new session; the two buffered frames are discarded
        assert manager.session_id == 2 and [p[0] for p in manager.pushed] == [100, 101, 40]
        assert ledger.c.time_jump_sessions == 1 and ledger.c.last_new_session_reason == "time jumped back by 61.000 s"
        push(35)  # and again, right after: compared with the new session's first frame
        assert manager.session_id == 3 and ledger.c.time_jump_sessions == 2
        assert ledger.c.last_new_session_reason == "time jumped back by 5.000 s"
        push(41)
        push(41)  # the same stamp again is no jump
        assert manager.session_id == 3 and ledger.c.time_jump_sessions == 2
        worker.submit(Reset("test reset"), wait=10)  # session 4: compared afresh, 30 < 41 is no jump
        push(30)
        assert manager.session_id == 4 and ledger.c.time_jump_sessions == 2 and ledger.c.resets == 1
    finally:
        worker.stop()
    by_frame: dict = {}
    for sec, status, reason in rig["statuses"]:
        by_frame.setdefault(sec, []).append((status, reason))
    discarded = "buffered for the scale frames, then discarded: time jumped back by 61.000 s"
    dropped = [(FrameStatus.BUFFERED, "buffered for the joint scale-frame call (1 of 2)"),
               (FrameStatus.DROPPED_RESET, discarded)]
    assert by_frame[100] == dropped
    assert [s for s, _ in by_frame[101]] == [FrameStatus.BUFFERED, FrameStatus.DROPPED_RESET]
    # the jump's frame is the first of the new session (buffered), discarded by the next jump
    assert by_frame[40] == [(FrameStatus.BUFFERED, "buffered for the joint scale-frame call (1 of 2)"),
                            (FrameStatus.DROPPED_RESET, "buffered for the scale frames, then discarded: time "
                                                        "jumped back by 5.000 s")]
    assert by_frame[35][0][0] == FrameStatus.BUFFERED and by_frame[35][1:] == [
        (FrameStatus.DROPPED_RESET, "buffered for the scale frames, then discarded: test reset")]
    assert [s for s, _ in by_frame[30]] == [FrameStatus.BUFFERED]
    for sec, seq in by_frame.items():  # never two final statuses, never anything after the final one
        if sec == 41:  # two frames with one stamp
            assert [s for s, _ in seq] == [FrameStatus.BUFFERED] * 2 + [FrameStatus.DROPPED_RESET] * 2, seq
            continue
        finals = [s for s, _ in seq if s != FrameStatus.BUFFERED]
        assert len(finals) <= 1 and (not finals or seq[-1][0] == finals[0]), (sec, seq)


# ----------------------------------------------------------------------------------- real node

SLOW_WRAPPER = '''\
import sys
import time
from lingbot_map_ros.core.model import lingbot_map as _m

_forward = _m.LingBotMap.forward


def _slow_forward(self, *args, **kwargs):
    time.sleep({delay})  # a model step that leaves the CPU idle, as a GPU step does
    return _forward(self, *args, **kwargs)


_m.LingBotMap.forward = _slow_forward
from lingbot_map_ros.ros.node import main
sys.exit(main())
'''


def _start_slow_node(tmp_path, domain: int, delay: float):
    wrapper = tmp_path / "slow_node.py"
    wrapper.write_text(SLOW_WRAPPER.format(delay=delay))
    args = ["-p", "model_preset:=tiny", "-p", "device:=cpu", "-p", "scale_frames:=2", "-p", "sliding_window:=3",
            "-p", "camera_iterations:=1", "-p", "qos_reliability:=reliable", "-p", "diagnostics_period:=0.2",
            "-r", f"image:={TOPIC}"]
    env = dict(os.environ, ROS_DOMAIN_ID=str(domain))
    node = NodeProcess(args, echo=False, env=env, log_path=str(tmp_path / "node.log"),
                       command=[sys.executable, str(wrapper)])
    ctx = Context()
    rclpy.init(context=ctx, domain_id=domain)
    listener = Listener(NS, TOPIC, context=ctx, name="pipeline_test_client")
    assert node.wait_ready(120), f"node did not start:\n{node.output()}"
    assert listener.wait_connected(30), "no connection to the node"
    return node, listener, ctx


def _stop(node, listener, ctx) -> None:
    listener.close()
    rc = node.stop()
    rclpy.shutdown(context=ctx)
    assert rc == 0 and "stopped cleanly" in node.output(), f"exit code {rc}:\n{node.output()[-3000:]}"


def _inference_diag(rx) -> dict:
    for array in reversed(rx.diagnostics):
        for s in array.status:
            if s.name == "lingbot_map: inference":
                return {kv.key: kv.value for kv in s.values}
    return {}


def _timeline(diag: dict) -> list[tuple[int, float, float, float, float]]:
    """(stamp ns, preprocess start, preprocess end, push start, push end) per frame, oldest first."""
    text = diag.get("frame_timeline_ms", "-")
    if text == "-":
        return []
    return [(int(s), float(a), float(b), float(c), float(d))
            for s, a, b, c, d in (item.split(":") for item in text.split())]


@pytest.mark.slow
def test_preprocessing_of_the_next_frame_overlaps_the_model_call(tmp_path, ros_domain_id):
    """Measured by the node's own timestamps, not by speed: while frame n is inside the (slowed)
    model call, frame n+1 is preprocessed. With preprocessing on the inference thread, frame n+1
    could only start after frame n's push returned, and this test fails."""
    node, listener, ctx = _start_slow_node(tmp_path, ros_domain_id, delay=0.4)
    try:
        camera = SyntheticCamera(320, 240, seed=2)
        stamps = []
        base = 1_900_000_000 * 10**9
        for i in range(10):
            stamps.append(base + i * 100_000_000)
            listener.pub.publish(image_message(camera.render(i), stamps[-1], "cam"))
            time.sleep(0.12)
        assert listener.wait_for(lambda rx: all(listener.final_status(s) is not None for s in stamps), 60), \
            node.output()[-3000:]
        processed = [s for s in stamps if listener.final_status(s).status == FrameStatus.PROCESSED]
        box = {}

        def timeline_covers_the_last_frame(rx):
            box["d"] = _inference_diag(rx)
            return processed[-1] in {t[0] for t in _timeline(box["d"])}

        assert listener.wait_for(timeline_covers_the_last_frame, 10), box.get("d")
        timeline = _timeline(box["d"])
        assert len(timeline) >= 3, timeline
        inside = [(a[0], b[0]) for a, b in zip(timeline, timeline[1:])
                  if a[3] <= b[1] <= b[2] <= a[4]]  # n+1's preprocessing within n's push
        assert inside, f"no frame was preprocessed while the previous one was in the model: {timeline}"
        for _, pre_start, pre_end, push_start, push_end in timeline:  # ms, rounded: equal can happen
            assert pre_start <= pre_end <= push_start <= push_end  # each frame: preprocess, then push
        assert int(box["d"]["preprocess_overlapped_frames"]) >= len(inside)
    finally:
        _stop(node, listener, ctx)


@pytest.mark.slow
def test_the_frames_outputs_are_sent_by_the_outbox_thread(tmp_path, ros_domain_id):
    """The node measures what sending each frame's outputs cost its outbox thread (ros/outbox.py): a finite
    median once frames were processed means they left through it, and none of the sends failed."""
    node, listener, ctx = _start_slow_node(tmp_path, ros_domain_id, delay=0.05)
    try:
        camera = SyntheticCamera(64, 48, seed=3)
        stamps = [2_100_000_000 * 10**9 + i * 100_000_000 for i in range(5)]
        for i, stamp in enumerate(stamps):
            listener.pub.publish(image_message(camera.render(i), stamp, "cam"))
            time.sleep(0.15)
        assert listener.wait_for(lambda rx: all(listener.final_status(s) is not None for s in stamps), 60), \
            node.output()[-3000:]
        assert any(listener.final_status(s).status == FrameStatus.PROCESSED for s in stamps)
        box = {}

        def sends_measured(rx):
            box["d"] = _inference_diag(rx)
            return math.isfinite(float(box["d"].get("sends_cpu_median_ms", "nan")))

        assert listener.wait_for(sends_measured, 10), box.get("d")
        assert float(box["d"]["sends_cpu_median_ms"]) > 0 and box["d"]["send_failures"] == "0", box["d"]
    finally:
        _stop(node, listener, ctx)


@pytest.mark.slow
def test_flood_with_reset_parameter_change_resize_and_deactivate_accounts_for_every_frame(tmp_path, ros_domain_id):
    node, listener, ctx = _start_slow_node(tmp_path, ros_domain_id, delay=0.05)
    rx = listener.rx
    try:
        camera = SyntheticCamera(64, 48, seed=4)
        sent: list[int] = []
        stamp = [2_000_000_000 * 10**9]

        def burst(n: int, wh=(64, 48), gap: float = 0.003):
            for i in range(n):
                stamp[0] += 10_000_000
                rgb = camera.render(len(sent)) if wh == (64, 48) else np.zeros((wh[1], wh[0], 3), np.uint8)
                listener.pub.publish(image_message(rgb, stamp[0], "cam"))
                sent.append(stamp[0])
                time.sleep(gap)

        change = listener.node.create_client(ChangeState, f"{NS}/change_state")
        assert change.wait_for_service(15.0)

        def transition(tid: int) -> None:
            future = change.call_async(ChangeState.Request(transition=Transition(id=tid)))
            end = time.monotonic() + 30
            while not future.done() and time.monotonic() < end:
                time.sleep(0.02)
            assert future.done() and future.result().success

        burst(3, gap=0.3)  # the session takes 64x48
        burst(20)
        burst(1, wh=(80, 60))  # another size in the middle of the session: rejected
        odd = sent[-1]
        burst(5)
        reset = listener.node.create_client(Trigger, f"{NS}/reset")
        assert reset.wait_for_service(10.0)
        reset.call_async(Trigger.Request())  # not awaited: lands between two frames of the flood
        burst(10)
        params = AsyncParameterClient(listener.node, NS)
        assert params.wait_for_services(15.0)
        params.set_parameters([Parameter("sliding_window", value=4)])  # a new session, not awaited
        burst(20)
        transition(Transition.TRANSITION_DEACTIVATE)  # while frames are in the pipeline
        inactive_from = len(sent)
        burst(5)
        transition(Transition.TRANSITION_ACTIVATE)
        burst(10)
        burst(2, gap=0.5)

        def settled(r):
            """The node holds no frame any more and every frame it received has its final status here."""
            d = _inference_diag(r)
            seen = [s for s in sent if s in r.status]
            return (bool(d) and int(d["frames_pending"]) == 0 and int(d["frames_received"]) == len(seen)
                    and all(listener.final_status(s) is not None for s in seen))

        assert listener.wait_for(settled, 60), f"{_inference_diag(rx)}\n{node.output()[-3000:]}"
        with listener.lock:
            seen = [s for s in sent if s in rx.status]
            finals = {s: listener.final_status(s) for s in seen}
        assert len(seen) >= len(sent) // 2, "DDS lost more frames than a reliable subscription should"
        for s in seen:  # exactly one final status each, nothing after it
            seq = [m.status for m in rx.status[s]]
            assert len([x for x in seq if x != FrameStatus.BUFFERED]) == 1 and seq[-1] != FrameStatus.BUFFERED, seq
        kinds = [finals[s].status for s in seen]
        assert finals[odd].status == FrameStatus.REJECTED_INPUT and "resolution changed" in finals[odd].reason
        queue_drops = [finals[s] for s in seen if finals[s].status == FrameStatus.DROPPED_QUEUE]
        assert queue_drops and all("replaced by a newer frame before" in f.reason for f in queue_drops)
        assert all(finals[s].status == FrameStatus.DROPPED_INACTIVE for s in sent[inactive_from:inactive_from + 5]
                   if s in finals)
        assert finals[sent[-1]].status == FrameStatus.PROCESSED and kinds.count(FrameStatus.PROCESSED) >= 5
        d = _inference_diag(rx)
        assert int(d["frames_processed"]) == kinds.count(FrameStatus.PROCESSED)
        assert int(d["frames_dropped_queue"]) == len(queue_drops)
        assert int(d["frames_dropped"]) == len(seen) - kinds.count(FrameStatus.PROCESSED)
        with listener.lock:
            for st in rx.stats.values():
                assert st.frames_received == st.frames_processed + st.frames_dropped + st.frames_pending, st
    finally:
        _stop(node, listener, ctx)


@pytest.mark.slow
@pytest.mark.parametrize("rate", [0, 30])
def test_node_overhead_reports_the_inference_thread_and_end_to_end(tmp_path, ros_domain_id, rate):
    """``tools/node_overhead`` against the real node: the end-to-end table, the inference thread's own
    time per frame from /diagnostics, and at a fixed rate what happened to the frames."""
    import subprocess

    cmd = [sys.executable, "-P", "-m", "lingbot_map_ros.tools.node_overhead", "--domain-id", str(ros_domain_id),
           "--frames", "12", "--width", "64", "--height", "48", "--rate", str(rate)]
    env = {k: v for k, v in os.environ.items() if k != "ROS_DOMAIN_ID"}
    env.update(ROS_LOG_DIR=str(tmp_path / "ros_log"))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "| message in -> pose out (end to end)" in out and "end to end minus session, median" in out
    assert "inference_thread_minus_model" in out and "inference thread per frame: model" in out, out
    assert bool(re.search(r"sent at 30 Hz: \d+ processed", out)) == (rate == 30), out


def test_a_status_after_the_context_is_gone_is_counted_not_raised(ros_domain_id):
    """A signal shuts the context down while the teardown still ends the waiting frames: the status
    cannot be published and that must not raise out of the teardown (exit code 1); it is counted.
    While the context is up, the same call publishes."""
    ctx = Context()
    rclpy.init(context=ctx, domain_id=ros_domain_id)
    node = rclpy.create_node("ledger_after_shutdown_test", context=ctx)
    ledger = FrameLedger(node, session_id=lambda: 1)
    header = Header(stamp=TimeMsg(sec=7), frame_id="cam")
    ledger.finish(header, FrameStatus.DROPPED_INACTIVE, "while up")
    rclpy.shutdown(context=ctx)
    ledger.finish(header, FrameStatus.DROPPED_INACTIVE, "after the signal")
    assert ledger.c.dropped_inactive == 2
    node.destroy_node()
