"""The ROS 2 managed (lifecycle) node: camera topic in, camera pose + KV-cache diagnostics out.

This module is the lifecycle shell: it declares the parameters, wires the pieces together and
starts, stops and frees them on each transition. Each piece has one job and a module of its own:

* ``intake``: the image subscription and its callback (conversion, checks, the hand-off);
* ``pipeline``: the preprocessing thread (frame n+1 is preprocessed while the model runs frame n);
* ``input_size``: the session's input size (its ``FramePreprocessor`` owns the size check);
* ``inference``: the inference thread, the only user of the session manager (frames, commands,
  new sessions, failures);
* ``outputs``: what a processed frame publishes, the path and the trajectory;
* ``robot_frames`` and ``transforms``: where a result goes in the robot's TF tree (tf2) and in which
  unit (the metric scale); ``intake.DepthPairing``: the depth camera paired with the colour frames;
* ``frames``: the frame counters and the one place a frame gets its final FrameStatus;
* ``parameter_callbacks`` and ``services``: ``ros2 param set``, ``~/reset``, ``~/save_trajectory``;
* ``diagnostics`` (what /diagnostics says), ``messages`` (how results look as ROS messages),
  ``parameters`` (the settings table as ROS parameters), ``reconstruction`` (points and map);
* ``node_settings``: the settings as one frozen, typed object; ``LiveSettings`` owns the current one
  (the parameter callbacks swap it whole, every part reads a snapshot);
* ``node_state``: what the parts ask of the node (its lifecycle state, what configure built, the
  commands for the inference thread, the diagnostics timer).

Lifecycle (managed node, REP 2002-style states)
-----------------------------------------------
* unconfigured: parameters only; no model. ``configure`` validates them, builds the model and
  allocates the caches; a failure (e.g. a bad checkpoint) fails the transition with its reason and
  the node stays unconfigured, alive.
* inactive: model loaded, image subscription up; received frames are counted and get the final
  status DROPPED_INACTIVE.
* active: frames are processed and poses published.
* ``cleanup`` frees the model (and GPU memory); ``shutdown`` from any state. Parameter
  ``autostart`` (default true) configures and activates at start.

Threads
-------
* the executor thread runs the image callback (conversion + validation, cheap), services, the
  diagnostics timer, parameter callbacks and the transitions;
* the preprocessing thread (while active) takes the newest converted frame and turns it into the
  model's input tensor;
* the inference thread (configure to cleanup) takes the newest preprocessed frame, pushes it into
  the session and publishes the results; between frames it applies session commands.
Each hand-off holds one waiting frame; a newer frame replaces it (the replaced one ends
DROPPED_QUEUE), so the node never falls behind the camera.
"""
from __future__ import annotations

import os
import sys
import time
from typing import Optional

import rclpy
import rclpy.exceptions
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
from rclpy.impl.implementation_singleton import rclpy_implementation as _rclpy_impl
from rclpy.lifecycle import LifecycleNode, LifecycleState, TransitionCallbackReturn
from rclpy.qos import QoSProfile, QoSReliabilityPolicy

from lingbot_map_ros.msg import FrameStatus

from .diagnostics import COUNTER_NAMES, DIAG_PREFIX, DiagnosticsSnapshot, diagnostic_array
from .frames import Frame, FrameLedger, InputRejected
from .input_size import InputSize
from .intake import DepthPairing, ImageIntake
from .large_outputs import LargeOutputs
from .node_settings import LiveSettings, NodeSettings
from .node_state import ConfiguredParts, NodeState, RestartableTimer
from .outbox import Outbox
from .outputs import FALLBACK_CAMERA_FRAME, PATH_EVERY_FRAME, PATH_MIN_PERIOD, ResultPublisher
from .parameter_callbacks import ParameterHandler
from .parameters import (
    PARAMETER_NAMES,
    PARAMETERS,
    ParamSpec,
    configs_from_values,
    declare,
    declare_error,
    validate_values,
)
from .services import NodeServices
from .stop_signals import StopSignals

RCLError = _rclpy_impl.RCLError

# The parameter table, the diagnostics prefix and the output constants live in their own modules;
# they stay importable from here, where the tests import them from.
__all__ = [
    "DIAG_PREFIX", "FALLBACK_CAMERA_FRAME", "NODE_NAME", "PARAMETERS", "PARAMETER_NAMES", "PATH_EVERY_FRAME",
    "PATH_MIN_PERIOD", "InputRejected", "LingBotMapNode", "ParamSpec", "configs_from_values", "main",
    "validate_values",
]

NODE_NAME = "lingbot_map"


class LingBotMapNode(LifecycleNode):
    """LingBot-Map streaming reconstruction on one camera topic, as a managed node (README: "The node")."""

    def __init__(self, node_name: str = NODE_NAME, **kwargs):
        super().__init__(node_name, **kwargs)
        for spec in PARAMETERS:
            try:
                declare(self, spec)
            except rclpy.exceptions.ParameterException as exc:  # a refused value from the command line or file
                raise ValueError(declare_error(spec, exc)) from None
        values = {p.name: self.get_parameter(p.name).value for p in PARAMETERS}
        problems = validate_values(values)
        if problems:
            raise ValueError("invalid parameters: " + "; ".join(problems))
        # the one owner of the current settings; the parameter callbacks swap them (ParameterHandler)
        self._settings = LiveSettings(NodeSettings.from_values(values))

        # Late imports: torch-heavy modules load after parameters are known to be valid.
        from ..core.session_manager import SessionManager
        from .inference import SessionView
        from .pipeline import PipelineTimeline

        self._session_manager_cls = SessionManager
        self._state = NodeState()
        self._parts = ConfiguredParts(self._settings)  # filled in configure, emptied in cleanup
        self._configure_error = ""
        self._t_start = time.monotonic()

        # every output's sends, off the inference thread (outbox.py); made before the publishers that use it
        self.outbox = Outbox(context_ok=self.context.ok, log_error=self.get_logger().error)
        self._ledger = FrameLedger(self, session_id=self._parts.session_id)
        self._input_size = InputSize(self._new_preprocessor)
        self._session_view = SessionView()
        self._timeline = PipelineTimeline(origin=time.perf_counter())
        # The robot's frames and scale: the depth topic's pairing (scale_source depth) feeds the scale
        # that ResultPublisher's RobotFrames applies; tf2's listener runs from here on, in every state.
        self._depth = DepthPairing(self, self._settings)
        # depth images, point clouds and the path leave through a participant of their own (large_outputs.py)
        self.large_outputs = LargeOutputs(self)
        self._outputs = ResultPublisher(self, self._settings, self._ledger, depth=self._depth)
        self._depth.consumer = self._outputs.robot
        self._intake = ImageIntake(self, self._settings, self._ledger, self._input_size, sink=self._offer,
                                   state=self._state, depth=self._depth)
        # Plain publishers: /diagnostics must report every state; frames are gated by the state.
        self._diag_pub = self.create_publisher(DiagnosticArray, "/diagnostics",
                                               QoSProfile(depth=10, reliability=QoSReliabilityPolicy.RELIABLE))
        self._diag_timer = RestartableTimer(self, self._settings.current.diagnostics_period, self._publish_diagnostics)
        self._params = ParameterHandler(self, self._settings, self._session_view, self._intake, self._diag_timer,
                                        self._parts)
        self._node_services = NodeServices(self, self._settings, self._state, self._parts, self._outputs)
        self.add_on_set_parameters_callback(self._params.on_set)
        self.add_post_set_parameters_callback(self._params.on_set_post)

    @property
    def settings(self) -> LiveSettings:
        """The node's current settings (read ``settings.current``); only its parameters change them."""
        return self._settings

    @property
    def autostart(self) -> bool:
        return self._settings.current.autostart

    # ------------------------------------------------------------------ lifecycle transitions
    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Validate the parameters, build the model and its caches, start the inference thread."""
        from .inference import InferenceWorker
        from .pipeline import PreprocessStage
        from .reconstruction import ReconstructionPublisher

        settings = self._settings.current
        problems = validate_values(settings.values())
        if problems:
            return self._configure_failed("invalid parameters: " + "; ".join(problems))
        runtime, stream = settings.configs()
        if settings.cameras:
            return self._configure_cameras(runtime, stream)
        self.get_logger().info(
            f"configuring: building the model (preset {runtime.resolved_preset()}, device {runtime.device}, "
            f"dtype {runtime.dtype}, backend {runtime.attention_backend}); stream {stream}"
        )
        try:
            manager = self._session_manager_cls.open(runtime, stream, log=self.get_logger().info,
                                                warn=self.get_logger().warning)
        except Exception as exc:  # noqa: BLE001 - any failure of the model build fails the transition
            return self._configure_failed(*build_failure(exc))
        parts = self._parts
        parts.manager = manager
        self._configure_error = ""
        if self._outputs.recon is None:
            self._outputs.recon = ReconstructionPublisher(self, self._settings, device=parts.device)
        parts.worker = InferenceWorker(self, manager, self._settings, self._ledger, self._input_size, self._outputs,
                                       self._session_view, self._timeline, parameters=self._params,
                                       context_ok=self.context.ok)
        parts.stage = PreprocessStage(self._settings, self._ledger, self._input_size, sink=parts.worker.offer,
                                      context_ok=self.context.ok)
        parts.worker.started_session("configured", counter=None)
        if settings.initial_session:  # a bad session fails the transition: the node stays unconfigured
            try:
                parts.worker.load_session(os.path.abspath(os.path.expanduser(settings.initial_session)))
            except Exception as exc:  # noqa: BLE001 - not a session, damaged, other settings, unreadable
                self._teardown()
                return self._configure_failed(f"initial_session: {exc}")
        parts.worker.start()
        self._intake.subscribe()
        info = manager.host.info
        if info.random_weights:
            self.get_logger().warning(
                "NO CHECKPOINT: random weights (preset %s) - poses are NOT meaningful" % info.model_preset
            )
        settings = self._settings.current
        self.get_logger().info(
            f"configured: attention {info.attention} ({info.backend_reason}), dtype {info.dtype}, "
            f"device {info.device}; "
            f"subscribed to {self._intake.topic} ({settings.image_transport}, {settings.qos_reliability})"
        )
        self._state.enter("inactive")
        return TransitionCallbackReturn.SUCCESS

    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        if self._parts.cameras is not None:
            self._parts.cameras.activate()
        else:
            self._parts.stage.start()  # before frames are let in
        self._outputs.robot.tree.repeating = True  # the world -> odom correction is re-sent while active
        self._state.enter("active")
        self.get_logger().info(f"ready: active, {self._intake.topic} -> {self.resolve_topic_name('~/pose')}")
        return super().on_activate(state)

    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Stop taking frames (each one still gets a final status); the model stays loaded.

        The preprocessing thread is joined first, so nothing reaches the inference thread's queue
        after it was emptied here; the frame inside the model finishes."""
        self._state.enter("inactive")
        self._outputs.robot.tree.repeating = False
        parts = self._parts
        if parts.stage is not None:
            parts.stage.stop("the node was deactivated")
        if parts.cameras is not None:
            parts.cameras.deactivate()
        frame = parts.worker.queue.frames.take() if parts.worker is not None else None
        if frame is not None:
            self._ledger.finish(frame.header, FrameStatus.DROPPED_INACTIVE, "the node was deactivated")
        self.get_logger().info("inactive: frames are counted and dropped until activated again")
        return super().on_deactivate(state)

    def on_cleanup(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._teardown()
        self.get_logger().info("cleaned up: model and caches freed")
        return TransitionCallbackReturn.SUCCESS

    def on_shutdown(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._teardown()
        return TransitionCallbackReturn.SUCCESS

    def on_error(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._teardown()
        return TransitionCallbackReturn.SUCCESS  # back to unconfigured

    def _configure_cameras(self, runtime, stream) -> TransitionCallbackReturn:
        """``cameras`` set: one model, one stream per camera (ros/cameras.py)."""
        from .cameras import CameraSystem, InitialSessionRefused

        parts = self._parts
        if parts.cameras is None or parts.cameras.names != list(self._settings.current.cameras):
            parts.cameras = CameraSystem(self, self._settings, self._outputs, self._state)
        cameras = parts.cameras
        try:
            cameras.configure(runtime, stream, on_view=self._session_view.update, context_ok=self.context.ok,
                              parameters=self._params)
        except InitialSessionRefused as exc:
            cameras.teardown("configure failed")
            return self._configure_failed(str(exc))
        except Exception as exc:  # noqa: BLE001 - any failure of the model build fails the transition
            cameras.teardown("configure failed")
            return self._configure_failed(*build_failure(exc))
        parts.follow_cameras()
        self._configure_error = ""
        self._state.enter("inactive")
        self.get_logger().info(f"configured: cameras {cameras.names} (primary {cameras.primary}) on "
                               f"{cameras.topics}")
        return TransitionCallbackReturn.SUCCESS

    def _configure_failed(self, reason: str, exc: Optional[BaseException] = None) -> TransitionCallbackReturn:
        self._configure_error = reason
        self._ledger.record_error(f"configure failed: {reason}; the node stays unconfigured (fix the parameters, "
                                  f"then `ros2 lifecycle set {self.get_fully_qualified_name()} configure`)", exc)
        return TransitionCallbackReturn.FAILURE

    def _teardown(self) -> None:
        """Stop both threads (the frame in the model finishes), drop the subscription and the model."""
        if self._state.active:
            self._state.enter("inactive")  # no frame is let in any more
        self._outputs.robot.tree.repeating = False
        parts = self._parts
        worker = parts.worker
        self.shutdown(reason="the node was cleaned up")
        self._intake.unsubscribe()
        if parts.cameras is not None:
            parts.cameras.teardown("the node was cleaned up")
        if worker is not None:
            worker.close("the node was cleaned up")
        parts.manager = None
        self.outbox.flush()  # the threads' last frames are sent before their publishers go
        recon, self._outputs.recon = self._outputs.recon, None
        if recon is not None:
            recon.destroy()
        self._state.enter("unconfigured")

    def destroy_node(self) -> None:
        """The outbox's waiting sends, the node, then its second participant (``large_outputs``)."""
        self.outbox.close()
        super().destroy_node()
        self.large_outputs.close()

    def shutdown(self, timeout: float = 30.0, reason: str = "the node was shut down") -> None:
        """Stop and join the preprocessing thread, then the inference thread; each finishes the frame
        in hand. The preprocessing thread's frames end DROPPED_INACTIVE with ``reason`` while ROS is
        still up (after a signal it is not: nothing can be published); ``_teardown`` then ends the
        inference thread's waiting frame."""
        parts = self._parts
        stage, parts.stage = parts.stage, None
        if stage is not None and stage.running:
            stage.stop(reason, timeout)
        worker, parts.worker = parts.worker, None
        if worker is not None:
            worker.stop(timeout)
        if parts.cameras is not None:
            parts.cameras.shutdown(reason, timeout)

    # ------------------------------------------------------------------ wiring
    def _new_preprocessor(self):
        """A new session's ``FramePreprocessor`` (``InputSize``), from the current settings."""
        from ..core.config import planned_height
        from ..core.preprocess import FramePreprocessor

        settings = self._settings.current
        return FramePreprocessor(fast_resize=settings.fast_resize, width=settings.image_width,
                                 max_height=planned_height(settings.image_width, settings.camera_aspect))

    def _offer(self, frame: Frame) -> None:
        """The image callback's hand-off: into the preprocessing thread's one-slot queue."""
        stage = self._parts.stage
        if stage is not None and stage.running:
            stage.offer(frame)
        else:  # cannot happen while active (activate starts the stage first); never lose a frame
            self._ledger.finish(frame.header, FrameStatus.DROPPED_INACTIVE, "no preprocessing thread is running")

    # ------------------------------------------------------------------ diagnostics (executor thread)
    def _publish_diagnostics(self) -> None:
        settings = self._settings.current
        _, stream = settings.configs()
        view = self._session_view.read()  # the inference thread's latest snapshot of the session
        configured = view.info is not None
        timeline, overlapped = self._timeline.read()
        robot = self._outputs.robot.report()
        ledger = self._ledger
        with ledger.lock:
            c = ledger.c
            snapshot = DiagnosticsSnapshot(
                now=time.monotonic(), started=self._t_start, hardware_id=self.get_fully_qualified_name(),
                topic=self._intake.topic, transport=settings.image_transport,
                qos_reliability=settings.qos_reliability, receive_times=list(ledger.recv_times),
                last_frame_time=ledger.last_frame_time, counters={k: getattr(c, k) for k in COUNTER_NAMES},
                rejected_by_kind=dict(c.rejected_by_kind), dropped_since_last=c.dropped_since_diag,
                rejected_since_last=c.rejected_since_diag, last_reject_reason=c.last_reject_reason,
                last_reject_time=c.last_reject_time, last_error=c.last_error, last_error_time=c.last_error_time,
                last_non_finite=c.last_non_finite, last_non_finite_time=c.last_non_finite_time,
                last_qos_event=c.last_qos_event, last_qos_event_time=c.last_qos_event_time,
                new_session_reason=c.last_new_session_reason, expected_wh=self._input_size.input_wh,
                last_result=dict(ledger.last_result_info), latencies=list(ledger.latencies),
                overheads=list(ledger.overheads), parts=list(ledger.parts), cache=view.snapshot,
                cache_warnings=list(view.warnings), session_id=view.session_id, buffered=view.buffered,
                pending=c.pending, dropped=c.dropped,
                stream_cfg=view.stream_cfg if configured else stream,
                window_index=view.window_index, window_switches=view.window_switches, info=view.info,
                checkpoint=view.runtime.checkpoint if configured else settings.checkpoint,
                lifecycle_state=self._state.label, configure_error=self._configure_error,
                timeline=timeline, overlapped=overlapped, robot=robot, memory=view.memory,
                sends_cpu_ms=self.outbox.cost_median(""), send_failures=self.outbox.failed,
            )
            c.dropped_since_diag = c.rejected_since_diag = 0
        array = diagnostic_array(snapshot, self.get_clock().now().to_msg())
        if self._parts.cameras is not None:
            array.status.extend(self._parts.cameras.statuses(self.get_fully_qualified_name()))
        self._diag_pub.publish(array)


def build_failure(exc: BaseException) -> tuple[str, Optional[BaseException]]:
    """The configure failure's one-line reason, and the exception whose traceback goes to the log.

    A refused checkpoint (``CheckpointError``: not a checkpoint, wrong keys, unsafe pickle) is the
    user's input, fully explained by its message: no traceback (forty lines of loader frames would
    bury it). So is a geometry that does not fit the memory budget (``MemoryBudgetExceeded``, with its
    numbers). Anything else is unexpected and keeps its type and traceback."""
    from ..core.memory_budget import MemoryBudgetExceeded
    from ..core.model.checkpoint import CheckpointError

    if isinstance(exc, MemoryBudgetExceeded):
        return f"does not fit the memory budget: {exc}", None
    if isinstance(exc, CheckpointError):
        return f"cannot build the model: {exc}", None
    return f"cannot build the model: {type(exc).__name__}: {exc}", exc


def make_executor(context=None) -> SingleThreadedExecutor:
    """The node's executor: one thread for every callback. The session services' seconds of disk run
    on threads of their own that the services' coroutines await (ros/services.py), so frames keep
    coming meanwhile."""
    return SingleThreadedExecutor(context=context)


def main(args=None) -> int:
    """``lingbot_map_node``: run the managed node until SIGINT/SIGTERM (exit 0); exit 2 when its
    parameters are invalid; ``--help`` prints the usage and the parameters and exits 0 (no node).
    With ``autostart`` (default) it configures and activates itself; a failed configure (e.g. an
    unreadable checkpoint) is logged with its reason and leaves the node
    unconfigured, alive, so the parameters can be fixed and `ros2 lifecycle set ... configure` run.
    The first SIGINT/SIGTERM stops it; later ones are reported and ignored (``StopSignals``)."""
    from ..tools.cli import asks_for_help, node_help

    if asks_for_help(sys.argv[1:] if args is None else args):  # help only: no ROS, no node
        print(node_help(), end="", flush=True)
        return 0
    signals = StopSignals().install()  # before rclpy.init: rclpy's handler chains to it
    rclpy.init(args=args)
    try:
        node = LingBotMapNode()
    except (ValueError, rclpy.exceptions.ParameterException) as exc:
        print(f"[lingbot_map] cannot start: {exc}", flush=True)
        rclpy.try_shutdown()
        return 2
    except (KeyboardInterrupt, ExternalShutdownException):
        rclpy.try_shutdown()
        return 0
    executor = make_executor()
    executor.add_node(node)
    try:
        if node.autostart:
            if node.trigger_configure() == TransitionCallbackReturn.SUCCESS:
                node.trigger_activate()
            else:
                print(f"[lingbot_map] configure failed: {node._configure_error}", flush=True)
        signals.spinning()
        executor.spin()
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    except RCLError:
        # rclpy's spin checks the context, then builds a wait set: a SIGTERM between the two (its
        # handler shuts the context down) surfaces as this error instead of ExternalShutdownException.
        # That is the same clean stop; any other RCLError, with the context still valid, is not.
        if node.context.ok():
            raise
    finally:
        if node.context.ok():
            node.get_logger().info("shutting down: waiting for the preprocessing and inference threads")
        else:  # the context is gone (signal): rosout cannot take log messages any more
            print("[lingbot_map] shutting down: waiting for the preprocessing and inference threads", flush=True)
        node.shutdown()
        executor.shutdown(timeout_sec=1.0)
        node.destroy_node()
        rclpy.try_shutdown()
    print("[lingbot_map] stopped cleanly", flush=True)
    signals.stopped()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
