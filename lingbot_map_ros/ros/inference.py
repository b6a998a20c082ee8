"""The inference thread: the only user of the session manager.

It waits on one condition for two kinds of work: session commands (``~/reset``, parameter changes)
and the newest preprocessed frame (from ``pipeline.PreprocessStage``). Commands run first, between
two frames, so a session change never races a frame inside the model. Per frame it checks the
frame's size against the current session once more (a new session may have started while the frame
was preprocessed), pushes it into the session and hands every result to ``ResultPublisher``; every
way a frame can fail (refused by the policy, the model raising, non-finite output) is decided here
and recorded through the ledger. Every new session, whoever started it (``~/reset``, a parameter
change, the long-run policy, a model fault, non-finite outputs), reaches ``on_session_start`` through
the manager's listener, with everything that goes with it: buffered frames end DROPPED_RESET, a fresh
input size, an empty path, trajectory and map, the counter of its cause.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Protocol

from lingbot_map_ros.msg import FrameStatus

from ..core.session_errors import SessionError
from ..core.session_manager import Change, InferenceFailed, ManagerView, SessionCause, SessionStart
from ..core.session_store import PreparedSession, SessionCapture
from .commands import (
    ApplyParameters,
    Command,
    CommandInbox,
    CommandResult,
    LoadSession,
    PendingCommand,
    Reset,
    SaveSession,
)
from .frames import Frame, FrameLedger, InputRejected, LatestFrame, stamp_sec
from .input_size import InputSize
from .node_settings import SettingsSource
from .outputs import ResultPublisher
from .parameters import staging_choice
from .pipeline import PipelineTimeline
from .time_jump import TIME_JUMP_COUNTER, TimeJumpDetector

REPLACED_BEFORE_INFERENCE = "replaced by a newer frame before inference"
# The counter of each cause of a new session (``FrameLedger`` counts them; /diagnostics shows them).
SESSION_COUNTERS: dict[SessionCause, Optional[str]] = {
    SessionCause.STARTED: None,
    SessionCause.RESET: "resets",
    SessionCause.PARAMETERS: "parameter_sessions",
    SessionCause.POLICY: "policy_sessions",
    SessionCause.FAILURE: "failure_sessions",
    SessionCause.NON_FINITE: "non_finite_sessions",
    SessionCause.TIME_JUMP: TIME_JUMP_COUNTER,
    SessionCause.LOADED: None,  # ~/load_session, initial_session: the log and last_new_session_reason say so
}


@dataclass
class SessionView:
    """The one read-only view of the session for the executor thread (diagnostics, parameter checks):
    the manager's latest ``ManagerView``, refreshed by the inference thread after every change."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    latest: ManagerView = field(default_factory=ManagerView)

    def update(self, manager) -> None:
        view = manager.view()
        with self.lock:
            self.latest = view

    def clear(self) -> None:
        with self.lock:
            self.latest = ManagerView()

    def read(self) -> ManagerView:
        with self.lock:
            return self.latest


class WorkQueue:
    """Commands and the newest frame for the inference thread, on one condition."""

    def __init__(self, ledger: FrameLedger):
        self._cond = threading.Condition()
        self.frames = LatestFrame(ledger, REPLACED_BEFORE_INFERENCE, cond=self._cond)
        self.commands = CommandInbox(self._cond)
        self._stop = False

    def submit(self, command: Command, wait: float = 0.0) -> Optional[CommandResult]:
        """Queue ``command``; with ``wait`` > 0 wait that long for its result (None: not yet)."""
        return self.commands.submit(command, wait)

    def next(self) -> Optional[tuple[list[PendingCommand], Optional[Frame]]]:
        """Block until there is work: (commands, None) or ([], frame); None once stopped."""
        with self._cond:
            while not self._stop and not self.frames.waiting and not self.commands.waiting:
                self._cond.wait(0.5)
            if self._stop:
                return None
            commands = self.commands.take()
            return (commands, None) if commands else ([], self.frames.take())

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()


class ModelParameters(Protocol):
    """Who puts the model parameters back when a new model could not be built
    (``parameter_callbacks.ParameterHandler``)."""

    def revert_model_parameters(self, runtime: Any) -> None: ...


class InferenceWorker:
    """The inference thread over one ``SessionManager`` (from configure to cleanup).

    ``parameters`` reverts the model parameters when a new model could not be built; ``context_ok()``
    says whether ROS is still up (a frame failing during shutdown is not an error).
    """

    def __init__(self, node, manager, settings: SettingsSource, ledger: FrameLedger, input_size: InputSize,
                 outputs: ResultPublisher, session_view: SessionView, timeline: PipelineTimeline,
                 parameters: ModelParameters, context_ok: Callable[[], bool]):
        self._log = node.get_logger()
        self.manager = manager
        manager.on_new_session = self.on_session_start
        self._settings = settings
        self._ledger = ledger
        self._input_size = input_size
        self._outputs = outputs
        self._view = session_view
        self._timeline = timeline
        self._parameters = parameters
        self._context_ok = context_ok
        self.queue = WorkQueue(ledger)
        self._consecutive_non_finite = 0
        self._time_jump = TimeJumpDetector()
        self._thread: Optional[threading.Thread] = None

    # ------------------------------------------------------------------ thread
    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="lingbot_map_inference", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the thread; the frame in progress finishes first."""
        self.queue.stop()
        thread, self._thread = self._thread, None
        if thread is not None and thread.is_alive() and thread is not threading.current_thread():
            thread.join(timeout)

    def offer(self, frame: Frame) -> None:
        self.queue.frames.put(frame)

    def submit(self, command: Command, wait: float = 0.0) -> Optional[CommandResult]:
        return self.queue.submit(command, wait)

    def _loop(self) -> None:
        while True:
            work = self.queue.next()
            if work is None:
                return
            commands, frame = work
            for command in commands:
                self._run_command(command)
            if frame is not None:
                try:
                    self._process(frame)
                except Exception as exc:  # never let one frame kill the node
                    if not self._context_ok():
                        return  # shutting down: publishers are gone
                    self._ledger.record_error(f"inference failed: {type(exc).__name__}: {exc}", exc)
                    self._ledger.finish(frame.header, FrameStatus.FAILED_INFERENCE,
                                        f"inference error: {type(exc).__name__}: {exc}")

    # ------------------------------------------------------------------ one frame
    def _process(self, frame: Frame) -> None:
        manager = self.manager
        frame.taken = time.perf_counter()
        frame.ready_wait_ms = (frame.taken - frame.pre_end) * 1e3
        jump = self._time_jump.check(stamp_sec(frame.header.stamp), manager.session_id)
        if jump is not None:  # a bag replayed again, a sim clock reset: a new session, as tf2 listeners do
            manager.reset(jump, SessionCause.TIME_JUMP)
        try:  # preprocessed for the session current then; the session may be a new one by now
            self._input_size.check(*frame.wh)
        except InputRejected as exc:
            self._ledger.reject(frame.header, exc.kind, str(exc))
            return
        frame.push_start = time.perf_counter()
        manager.session.mapping = self._settings.current.mapping  # false: localize against the map, store nothing
        before = manager.last_start
        try:
            results, failure = manager.push(frame.model_image, stamp=frame), None
        except (SessionError, InferenceFailed) as exc:
            results, failure = [], exc
        frame.push_end = time.perf_counter()
        if failure is None and manager.last_start is not before:
            # The long-run policy started a session with this frame as its first: its size is the
            # new session's size (the listener renewed the input size before the frame went in).
            self._input_size.check(*frame.wh)
        self._timeline.record(frame)
        if isinstance(failure, InferenceFailed):  # the manager started a new session (on_session_start)
            reason = f"inference failed: {failure}"
            self._ledger.record_error(reason + "; a new session was started", detail=failure.detail)
            self._ledger.finish(frame.header, FrameStatus.FAILED_INFERENCE, reason)
            return
        if failure is not None:  # a SessionError (SessionStopped included): the policy refuses it
            self._log.warning(f"frame refused by the session: {failure}", throttle_duration_sec=5.0)
            self._ledger.finish(frame.header, FrameStatus.REFUSED_POLICY, str(failure))
            self._view.update(manager)
            return
        if len(results) == 1:
            frame.session_extra_ms = max(0.0, (frame.push_end - frame.push_start) * 1e3 - float(results[0].latency_ms))
        self._view.update(manager)  # before publishing: diagnostics never lag the topics
        if not results:
            self._ledger.interim(
                frame.header, FrameStatus.BUFFERED,
                f"buffered for the joint scale-frame call ({manager.session.buffered} of "
                f"{manager.stream_cfg.scale_frames})",
            )
        for result in results:
            self._publish(result)

    def _publish(self, r) -> None:
        bad = r.non_finite_fields()
        if bad:
            self._on_non_finite(r.stamp, bad)
            return
        self._consecutive_non_finite = 0
        self._outputs.publish(r, self.manager)

    def _on_non_finite(self, frame: Frame, bad: list[str]) -> None:
        """Publish nothing of the frame; after ``max_non_finite_frames`` in a row, a new session
        (non-finite values in the KV cache would poison every later frame)."""
        self._consecutive_non_finite += 1
        reason = f"non-finite model output ({', '.join(bad)}): nothing published"
        self._ledger.note_non_finite(reason)
        self._log.error(f"frame {stamp_sec(frame.header.stamp):.3f}: {reason}", throttle_duration_sec=5.0)
        limit = self._settings.current.max_non_finite_frames
        if self._consecutive_non_finite >= limit:
            self._consecutive_non_finite = 0
            self.manager.reset(f"{limit} consecutive frames with non-finite output", SessionCause.NON_FINITE)
        # finished last: once /diagnostics counts the frame as done, the new session it caused is
        # counted too (a reader that waits for every frame sees the counters settled)
        self._ledger.finish(frame.header, FrameStatus.NON_FINITE_OUTPUT, reason)

    # ------------------------------------------------------------------ commands
    def _run_command(self, pending: PendingCommand) -> None:
        command = pending.command
        result = CommandResult(False, "not run")
        try:
            if isinstance(command, Reset):
                self.manager.reset(command.reason, SessionCause.RESET)
                result = CommandResult(True, f"session {self.manager.session_id} started (new world frame)")
            elif isinstance(command, ApplyParameters):
                result = self._apply_parameters(list(command.changed))
            elif isinstance(command, SaveSession):
                result = CommandResult(True, "session copied", capture=self.capture_session())
            elif isinstance(command, LoadSession):
                result = CommandResult(True, self.load_session(command.source))
            else:
                raise TypeError(f"not a command: {command!r}")
        except Exception as exc:
            name = type(command).__name__
            self._ledger.record_error(f"{name} failed: {type(exc).__name__}: {exc}", exc)
            result = CommandResult(False, str(exc))
        finally:
            pending.answer(result)

    def _apply_parameters(self, changed: list[str]) -> CommandResult:
        """Hand the new settings to the session manager; it decides what they need."""
        manager = self.manager
        runtime, stream = self._settings.current.configs()
        if runtime != manager.host.settings:
            self._log.info(f"parameters {changed} need a new model: building it")
        try:
            result = manager.apply(runtime, stream)
        except Exception as exc:  # noqa: BLE001 - a failed model build keeps the previous model
            self._ledger.record_error(f"could not build the model for {changed}: {exc}; keeping the previous one "
                                      "and reverting the parameters to the values it runs with", exc)
            self._parameters.revert_model_parameters(manager.host.settings)
            return CommandResult(False, str(exc))
        if result.change is Change.NEXT_FRAME:
            self._view.update(manager)
        return CommandResult(True, result.change.value)  # a new session or model reached on_session_start already

    # ------------------------------------------------------------------ saved sessions
    def capture_session(self) -> SessionCapture:
        """``~/save_session``, the part between two frames (this thread): the map and the node's world
        copied (in device memory where it has room, else to the host). The service writes the copy
        to disk while the frames go on."""
        return self.manager.capture(extra=self._outputs.session_state(),
                                    on_device=staging_choice(self._settings.current))

    def load_session(self, source: str | PreparedSession) -> str:
        """``~/load_session`` (a ``PreparedSession``: its commit) / ``initial_session`` (a path: read
        and commit here): replace the session (refused: the current one is kept, ``SessionFileError``
        with the reason); poses, ``~/path`` and the trajectory continue."""
        manager = self.manager
        # on_session_start has run by the time either returns: outputs cleared, counters noted
        if isinstance(source, str):
            report = manager.load(source, on_device=staging_choice(self._settings.current))
        else:
            report = manager.commit_load(source)
        path = report.path
        self._outputs.restore_session(report.extra, report.session_id)
        self._view.update(self.manager)
        saved_world, world = report.extra.get("world_frame"), self._settings.current.world_frame
        if saved_world and saved_world != world:
            self._log.warning(f"session {path} was saved with world_frame {saved_world!r}, publishing in {world!r}")
        self._log.info(report.message())
        return report.message()

    # ------------------------------------------------------------------ sessions
    def on_session_start(self, start: SessionStart) -> None:
        """The manager started a session (its listener): everything that follows a new world frame, then
        the frames it discarded end DROPPED_RESET (after the session is counted: a /diagnostics reader that
        sees every frame finished sees the session's counter too)."""
        self.started_session(start.reason, SESSION_COUNTERS[start.cause])
        for frame in start.discarded:
            self._ledger.finish(frame.header, FrameStatus.DROPPED_RESET,
                                f"buffered for the scale frames, then discarded: {start.reason}")

    def started_session(self, reason: str, counter: Optional[str]) -> None:
        """Everything that follows a new session: a fresh input size, empty path, trajectory and map,
        the counters, the diagnostics view. Also called once at configure (before the thread starts)."""
        self._input_size.renew()
        self._outputs.clear()
        self._ledger.note_new_session(reason, counter)
        recon = self._outputs.recon
        if recon is not None:
            recon.reset()  # a new world frame: the map starts empty
        self._view.update(self.manager)
        self._log.info(f"new session {self.manager.session_id}: {reason}")

    # ------------------------------------------------------------------ teardown
    def close(self, why: str) -> None:
        """After ``stop``: the waiting frame ends DROPPED_INACTIVE, frames buffered in the session
        DROPPED_RESET, and the model is freed."""
        frame = self.queue.frames.take()
        if frame is not None:
            self._ledger.finish(frame.header, FrameStatus.DROPPED_INACTIVE, why)
        for stamp in self.manager.pending_stamps():
            self._ledger.finish(stamp.header, FrameStatus.DROPPED_RESET,
                                "buffered for the scale frames when the model was freed")
        self.manager.release()
        self._view.clear()
