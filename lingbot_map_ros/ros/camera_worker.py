"""The inference thread of the several-camera mode (``ros/cameras.py``): ticks and commands.

Each tick takes the newest waiting frame of every camera and runs them through ``StreamGroup.step`` as
one batched step, then places the results in the order of their frames' stamps: each by its camera's
``RobotFrames`` (its own world), then by the rig (``core.rig.Rig``: the one world, the one body pose,
the hand-over); the driving camera's body pose goes out through the node's
``ResultPublisher.publish_body``. Between ticks it runs the node's commands (``ros/commands.py``): a
reset of every stream, a saved session's capture and load, and a change of model or stream settings,
which rebuilds the group it owns when the streams' pool must be cut anew.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Optional

import numpy as np

from lingbot_map_ros.msg import FrameStatus

from ..core.geometry import body_twist
from ..core.rig import Rig, RigPlacement
from ..core.settings import RUNTIME_FIELDS, STREAM_FIELDS
from . import messages as rosmsg
from .commands import Command, CommandInbox, CommandResult, PendingCommand
from .frames import Frame, InputRejected, stamp_sec
from .node_settings import SettingsSource
from .outbox import send_built, sending_batch
from .robot_frames import Withheld
from .transforms import NoTransform

if TYPE_CHECKING:
    from .cameras import CameraChannel


class CameraGroupWorker:
    """The inference thread of several cameras: commands between ticks, one batched step per tick."""

    def __init__(self, node, group, channels: dict[str, CameraChannel], settings: SettingsSource, outputs, rig: Rig,
                 on_view: Callable[[], None], context_ok: Callable[[], bool], requested=None, parameters=None):
        self._node = node
        self._log = node.get_logger()
        self.group = group
        self._requested = requested if requested is not None else group.stream  # the stream settings asked for
        self._parameters = parameters  # ros/parameter_callbacks.ParameterHandler: reverts what cannot apply
        self.channels = channels
        self._settings = settings
        self._outputs = outputs
        self.rig = rig
        self._on_view = on_view
        self._context_ok = context_ok
        self.cond = next(iter(channels.values())).queue.cond
        self._commands = CommandInbox(self.cond)
        self._stop = False
        self._thread: Optional[threading.Thread] = None
        self._previous_body: Optional[tuple[float, np.ndarray]] = None
        self.world = 0  # the one world's number: ~/reset starts the next (the fused map starts empty)
        self.lock = threading.Lock()  # the rig's report (executor thread) against the ticks
        self._listen(group)

    # ------------------------------------------------------------------ thread
    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="lingbot_map_cameras", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        with self.cond:
            self._stop = True
            self.cond.notify_all()
        thread, self._thread = self._thread, None
        if thread is not None and thread.is_alive() and thread is not threading.current_thread():
            thread.join(timeout)

    def submit(self, command: Command, wait: float = 0.0) -> Optional[CommandResult]:
        """Queue ``command`` for the next gap between ticks; with ``wait`` > 0 wait that long for its result."""
        return self._commands.submit(command, wait)

    def _loop(self) -> None:
        while True:
            with self.cond:
                while (not self._stop and not self._commands.waiting
                       and not any(c.queue.waiting for c in self.channels.values())):
                    self.cond.wait(0.5)
                if self._stop:
                    return
                commands = self._commands.take()
            for command in commands:
                self._run_command(command)
            frames = {name: f for name, c in self.channels.items() if (f := c.queue.take()) is not None}
            if frames:
                try:
                    self._tick(frames)
                except Exception as exc:  # never let one tick kill the node; each frame still ends once
                    if not self._context_ok():
                        return
                    for name, frame in frames.items():
                        ledger = self.channels[name].ledger
                        ledger.record_error(f"camera {name}: inference failed: {type(exc).__name__}: {exc}", exc)
                        ledger.finish(frame.header, FrameStatus.FAILED_INFERENCE,
                                      f"inference error: {type(exc).__name__}: {exc}")

    # ------------------------------------------------------------------ one tick
    def _tick(self, frames: dict[str, Frame]) -> None:
        from ..core.session_events import InferenceFailed, SessionCause

        step: dict[str, tuple[Any, Frame]] = {}
        for name, frame in frames.items():
            channel = self.channels[name]
            frame.taken = time.perf_counter()
            frame.ready_wait_ms = (frame.taken - frame.pre_end) * 1e3
            manager = self.group.manager(name)
            jump = channel.time_jump.check(stamp_sec(frame.header.stamp), manager.session_id)
            if jump is not None:
                manager.reset(jump, SessionCause.TIME_JUMP)
            try:
                channel.input_size.check(*frame.wh)
            except InputRejected as exc:
                channel.ledger.reject(frame.header, exc.kind, str(exc))
                continue
            frame.push_start = time.perf_counter()
            manager.session.mapping = bool(self._settings.current.mapping)
            step[name] = (frame.model_image, frame)
        if not step:
            return
        outcomes = self.group.step(step)
        end = time.perf_counter()
        # Placed in the order the frames were taken (their stamps), not the cameras' order: the rig's
        # anchoring and hand-over then see the frames as a camera-by-camera feed of the same recording
        # would (lingbot_map_offline --base-frame places a recording in this order).
        order = {name: i for i, name in enumerate(self.channels)}
        def taken_at(n: str) -> tuple[int, int]:
            stamp = step[n][1].header.stamp
            return stamp.sec * 10**9 + stamp.nanosec, order[n]

        in_time = sorted(outcomes, key=taken_at)
        for name in in_time:
            outcome = outcomes[name]
            channel = self.channels[name]
            frame = step[name][1]
            frame.push_end = end
            if isinstance(outcome.error, InferenceFailed):
                reason = f"inference failed: {outcome.error}"
                channel.ledger.record_error(f"camera {name}: {reason}; a new session of this camera was started")
                channel.ledger.finish(frame.header, FrameStatus.FAILED_INFERENCE, reason)
                continue
            if outcome.error is not None:
                channel.ledger.finish(frame.header, FrameStatus.REFUSED_POLICY, str(outcome.error))
                continue
            if not outcome.results:
                manager = self.group.manager(name)
                channel.ledger.interim(frame.header, FrameStatus.BUFFERED,
                                       f"buffered for the joint scale-frame call ({manager.session.buffered} of "
                                       f"{manager.stream_cfg.scale_frames})")
            for result in outcome.results:  # each frame's outputs to the outbox thread as one piece
                with sending_batch(self._node, name):
                    self._publish(channel, result)
        self._on_view()

    def _publish(self, channel: CameraChannel, r) -> None:
        from ..core.session_events import SessionCause

        t0, c0 = time.perf_counter(), time.thread_time()  # the node's own cost of this frame from here on
        frame: Frame = r.stamp
        header = frame.header
        manager = self.group.manager(channel.name)
        bad = r.non_finite_fields()  # the guard of every output: part of publishing
        if bad:
            channel.non_finite_in_a_row += 1
            reason = f"non-finite model output ({', '.join(bad)}): nothing published"
            channel.ledger.note_non_finite(reason)
            limit = int(self._settings.current.max_non_finite_frames)
            if channel.non_finite_in_a_row >= limit:
                channel.non_finite_in_a_row = 0
                manager.reset(f"{limit} consecutive frames with non-finite output", SessionCause.NON_FINITE)
            # finished after the reset: a frame counted as done has its new session counted too
            channel.ledger.finish(header, FrameStatus.NON_FINITE_OUTPUT, reason)
            return
        channel.non_finite_in_a_row = 0
        t_place, c_place = time.perf_counter(), time.thread_time()
        session_id = manager.session_id
        channel.session_id = session_id
        camera_frame = channel.camera_frame(header)
        placed = channel.robot.place(r, header, camera_frame, session_id)
        if isinstance(placed, NoTransform):
            frame.model_image = None
            channel.ledger.finish(header, FrameStatus.NO_TRANSFORM, str(placed))
            return
        note = ""
        if isinstance(placed, Withheld):
            note = placed.reason
        else:
            with self.lock:  # camera_timeout and scale_min_travel apply from the next frame
                self.rig.timeout = float(self._settings.current.camera_timeout)
                self.rig.min_travel = float(self._settings.current.scale_min_travel)
                out = self.rig.place(channel.name, stamp_sec(header.stamp), placed.pose, placed.camera,
                                     time.monotonic(), placed.base_in_odom)
        place = ((time.perf_counter() - t_place) * 1e3, (time.thread_time() - c_place) * 1e3)
        if not isinstance(placed, Withheld):
            if isinstance(out, str):
                note = out
            else:
                self._publish_placed(channel, r, frame, out, placed)
        frame.model_image = None
        publish_ms = (time.perf_counter() - t0) * 1e3
        counts, overhead_ms = channel.ledger.processed(r, frame, session_id, publish_ms, note)
        send_built(channel.stats_pub, rosmsg.cache_stats_encoded, r, header.stamp, self._settings.current.world_frame,
                   session_id, counts, overhead_ms, manager.host.info)
        with channel.ledger.lock:
            channel.costs.append(((time.perf_counter() - t0) * 1e3, (time.thread_time() - c0) * 1e3, *place))

    def _publish_placed(self, channel: CameraChannel, r, frame: Frame, out: RigPlacement, placed) -> None:
        header = frame.header
        values = self._settings.current
        world = str(values.world_frame)
        send_built(channel.pose_pub, rosmsg.pose_encoded, out.camera, header.stamp, world)
        if out.handed_over:
            self._log.warning(f"hand-over: {out.handed_over}")
        if out.drives and out.published_body is not None:
            base, odom = str(values.base_frame), str(values.odom_frame)
            body = out.published_body
            tf = None
            if values.publish_tf:
                tf = self._outputs.robot.tf_edge(world, base, odom, channel.camera_frame(header), body,
                                                 placed.base_in_odom, out.correction)
            self._outputs.publish_body(body, header, base, self._twist(header, body), tf)
        depth = r.depth
        factor = float(placed.depth_factor) * out.unit  # metres when metric; the world's unit
        if depth is not None and factor != 1.0:
            depth = (depth * np.float32(factor)).astype(np.float32)
        if values.publish_depth and depth is not None:
            channel.depth_pub.publish(rosmsg.depth_image(depth, header.stamp, channel.camera_frame(header)))
        # its points in the one world; the map fuses every camera's (a frame without depth has none: the
        # reconstruction outputs publish nothing for it, and its copy of the result is not made)
        if channel.recon is not None and depth is not None:
            channel.recon.publish(dataclasses.replace(r, c2w=out.camera, depth=depth, session_id=self.world),
                                  frame.model_image, header, channel.camera_frame(header), world)

    def _twist(self, header, body: np.ndarray):
        t = stamp_sec(header.stamp)
        previous, self._previous_body = self._previous_body, (t, body)
        if previous is None or str(self._settings.current.scale_source) == "model":
            return None
        dt = t - previous[0]
        return body_twist(previous[1], body, dt) if 0.0 < dt <= 1.0 else None

    # ------------------------------------------------------------------ sessions and commands
    def _listen(self, group) -> None:
        for name, channel in self.channels.items():
            group.manager(name).on_new_session = self._session_listener(channel)

    def _session_listener(self, channel: CameraChannel):
        from .inference import SESSION_COUNTERS

        def started(start) -> None:
            channel.session_id = start.session_id
            channel.input_size.renew()
            channel.robot.begin_session()
            with self.lock:
                self.rig.begin_stream(channel.name)
            channel.ledger.note_new_session(start.reason, SESSION_COUNTERS[start.cause])
            # finished after the session is counted: a frame counted as done has its new session counted too
            for frame in start.discarded:
                channel.ledger.finish(frame.header, FrameStatus.DROPPED_RESET,
                                      f"buffered for the scale frames, then discarded: {start.reason}")
            self._log.info(f"camera {channel.name}: new session {start.session_id}: {start.reason}")
        return started

    def _run_command(self, pending: PendingCommand) -> None:
        """A command (``ros/commands.py``) between two ticks; its ``CommandResult`` goes back to the caller."""
        from ..core.session_events import SessionCause
        from .commands import ApplyParameters, LoadSession, Reset, SaveSession

        command = pending.command
        result = CommandResult(False, "not run")
        try:
            if isinstance(command, Reset):  # every stream, one new world
                for name in self.channels:
                    self.group.manager(name).reset(command.reason, SessionCause.RESET)
                self._new_world()
                self._on_view()
                result = CommandResult(True, f"every camera's stream restarted ({', '.join(self.channels)}): "
                                             "a new world frame")
            elif isinstance(command, SaveSession):
                result = CommandResult(True, "captured", capture=self.capture())
            elif isinstance(command, LoadSession):
                result = CommandResult(True, self.load(command.source))
            elif isinstance(command, ApplyParameters):
                result = self._apply_parameters(command.changed)
            else:
                result = CommandResult(False, f"{type(command).__name__} is not a command of the cameras mode")
        except Exception as exc:  # noqa: BLE001 - a command's failure is its answer
            self._log.error(f"{type(command).__name__} failed: {type(exc).__name__}: {exc}")
            result = CommandResult(False, str(exc))
        finally:
            pending.answer(result)

    def _apply_parameters(self, changed: tuple[str, ...]):
        """A change of model or stream settings (the settings table's ``applies``), for every camera at
        once: their streams share one model and one pool cut for one geometry. A new model, or a field
        that starts a new session (a window, the scale frames, the width, ...), rebuilds the group:
        every camera's stream restarts in one new world, as ``~/reset`` does. The rest applies to every
        stream from its next frame. What cannot apply (a model that does not build, a window that does
        not fit the budget for all cameras) changes nothing and the parameters go back to the values
        in use, as with one camera."""
        from ..core.memory_budget import MemoryBudget
        from ..core.session_manager import changed_fields, settings_problems
        from ..core.settings import applies_of_field
        from .commands import CommandResult

        runtime, requested = self._settings.current.configs()
        group = self.group
        host = group.host
        try:
            if runtime.device != host.settings.device:
                raise ValueError(f"device {host.settings.device} -> {runtime.device}: with several cameras the "
                                 "device changes at the next configure (cleanup, then configure)")
            if runtime == host.settings:
                fitted, warning = MemoryBudget().fit(host.cfg, host.resolved, requested,
                                                     lambda st: settings_problems(runtime, st), len(self.channels))
                session = [f for f in changed_fields(group.stream, fitted) if applies_of_field(f) == "session"]
                if not session:  # from the next frame, for every stream (the window and pool stay)
                    changes = [group.manager(name).apply(runtime, fitted) for name in self.channels]
                    group.stream = fitted
                    self._requested = requested
                    if warning:
                        self._log.warning(warning)
                    self._on_view()
                    return CommandResult(True, changes[0].change.value)
                self._rebuild(runtime, requested, f"parameters {session} changed")
                return CommandResult(True, "new session")
            model = list(changed_fields(host.settings, runtime))
            self._log.info(f"parameters {model} need a new model: building it")
            self._rebuild(runtime, requested, f"parameters {model} changed (new model)")
            return CommandResult(True, "new model")
        except Exception as exc:  # noqa: BLE001 - what cannot apply changes nothing
            self._log.error(f"parameters {list(changed)} not applied: {type(exc).__name__}: {exc}; reverted to the "
                            "values in use")
            if self._parameters is not None:
                in_use = {**{f: getattr(self.group.host.settings, f) for f in RUNTIME_FIELDS},
                          **{f: getattr(self._requested, f) for f in STREAM_FIELDS}}
                self._parameters.revert_parameters(in_use)
            return CommandResult(False, str(exc))

    def _rebuild(self, runtime, requested, why: str) -> None:
        """A new group of streams (over a new model when ``runtime`` differs), in one new world. The new
        model is built while the old one runs (a failure keeps it); the old streams' pages are freed
        before the new pool is cut; when the new group does not fit, the old settings are rebuilt."""
        import torch

        from ..core.model_host import ModelHost
        from ..core.stream_group import StreamGroup

        old = self.group
        host = old.host
        new_host = ModelHost.load(runtime, log=self._log.info) if runtime != host.settings else host
        last = {name: old.manager(name).session_id for name in self.channels}  # the rebuilt streams go on counting
        for name, channel in self.channels.items():  # frames buffered for the scale frames end here
            manager = old.manager(name)
            for stamp in manager.pending_stamps():
                channel.ledger.finish(stamp.header, FrameStatus.DROPPED_RESET,
                                      f"buffered for the scale frames, then discarded: {why}")
            manager.release()
        self.group = old = None
        if host.resolved.device.type == "cuda":
            torch.cuda.empty_cache()
        try:
            group = StreamGroup(new_host, requested, list(self.channels), log=self._log.info)
        except Exception:
            if new_host is not host:
                new_host.release()
            self.group = StreamGroup(host, self._requested, list(self.channels), log=self._log.info)
            self._restart_world(f"the previous settings restored after: {why}", last)
            raise
        if new_host is not host:
            host.release()
        self.group = group
        self._requested = requested
        self._restart_world(why, last)

    def _new_world(self) -> None:
        """The next world: the rig, the body's path and twist and the fused map start anew."""
        with self.lock:
            self.rig.reset()
        self._previous_body = None
        self.world += 1
        self._outputs.clear()
        if self._outputs.recon is not None:
            self._outputs.recon.reset()

    def _restart_world(self, why: str, last: dict[str, int]) -> None:
        """Every stream of ``self.group`` is new: one new world, and a new session per camera numbered
        after its last one (its listener does the camera's bookkeeping)."""
        from ..core.session_events import SessionCause

        self._listen(self.group)
        self._new_world()
        for name in self.channels:
            self.group.manager(name).start_after(last[name], why, SessionCause.PARAMETERS)
        self._on_view()

    def capture(self):
        """``~/save_session`` between two ticks: every stream's session (with its robot frames) and the rig."""
        from .camera_sessions import CamerasCapture
        from .parameters import staging_choice

        captures = {name: self.group.manager(name).capture(extra={"robot": channel.robot.session_state()},
                                                           on_device=staging_choice(self._settings.current))
                    for name, channel in self.channels.items()}
        with self.lock:
            rig = self.rig.state_dict()
        return CamerasCapture(captures, {"names": list(self.channels), "rig": rig, "world": self.world,
                                         "body": self._outputs.session_state()})

    def load(self, prepared) -> str:
        """``~/load_session`` / ``initial_session``: every stream continues its saved session, the rig its
        world, anchors, driver and offset; the body pose's path and trajectory continue."""
        for name, channel in self.channels.items():
            report = self.group.manager(name).commit_load(prepared.prepared[name])  # the listener ran
            channel.session_id = report.session_id
            if report.extra.get("robot"):
                channel.robot.restore_session(report.extra["robot"], report.session_id)
        state = prepared.state
        with self.lock:
            self.rig.load_state(state.get("rig", {}))
        self.world = int(state.get("world", 0))
        self._outputs.restore_session(state.get("body", {}), self.group.manager(self.rig.primary).session_id)
        self._on_view()
        message = f"loaded the session of cameras {list(self.channels)} from {prepared.path}"
        self._log.info(message)
        return message

    def close(self, why: str) -> None:
        """After ``stop``: waiting frames end DROPPED_INACTIVE, buffered ones DROPPED_RESET; the model goes."""
        for name, channel in self.channels.items():
            frame = channel.queue.take()
            if frame is not None:
                channel.ledger.finish(frame.header, FrameStatus.DROPPED_INACTIVE, why)
            manager = self.group.manager(name)
            for stamp in manager.pending_stamps():
                channel.ledger.finish(stamp.header, FrameStatus.DROPPED_RESET,
                                      "buffered for the scale frames when the model was freed")
            manager.release()
