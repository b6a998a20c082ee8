"""Several cameras in one node (parameter ``cameras``; README "Several cameras").

One model, one page pool (``core.stream_group.StreamGroup``), one stream per camera. What each
camera has of its own (``CameraChannel``): its subscriptions (``<name>/image`` or
``<name>/image/compressed``, ``<name>/depth`` with ``scale_source: depth``), its frame ledger and
``~/<name>/frame_status``, its input size, its preprocessing thread, its latest-frame queue (a newer
frame replaces the waiting one, which ends DROPPED_QUEUE counted under the camera), its robot frames
and scale (``RobotFrames``: ``base_frame -> camera`` at each image stamp; depth, odometry and fixed
scales metric per stream), its time-jump detector, and ``~/<name>/pose``, ``~/<name>/cache_stats``,
``~/<name>/depth``.

One inference thread (``CameraGroupWorker``) runs the ticks: it takes the newest waiting frame of every
camera and runs them through ``StreamGroup.step`` as one batched step; a camera without a frame waits
for none. Each result is placed by its camera's ``RobotFrames`` (its own world), then by the rig
(``core.rig.Rig``: the one world, the one body pose, the hand-over); the driving camera's body pose
goes out through the node's ``ResultPublisher.publish_body`` (``~/pose``, ``~/odom``, ``~/path``,
``/tf``). Bad input, a fault or a non-finite output of one camera ends that camera's frames and
never touches another stream (the group's fault containment).
"""
from __future__ import annotations

import collections
import math
import statistics
import threading
import time
from typing import Any, Callable, Optional

from diagnostic_msgs.msg import DiagnosticStatus, KeyValue
from geometry_msgs.msg import PoseStamped
from rclpy.qos import QoSProfile, QoSReliabilityPolicy
from sensor_msgs.msg import Image

from lingbot_map_ros.msg import CacheStats, FrameStatus

from ..core.rig import Rig
from ..core.settings import camera_names, primary_camera
from .camera_worker import CameraGroupWorker
from .diagnostics import DIAG_PREFIX, RATE_WINDOW_S
from .frames import Frame, FrameLedger, LatestFrame
from .input_size import InputSize
from .intake import DepthPairing, ImageIntake
from .large_outputs import large_publisher
from .node_settings import OverriddenSettings, SettingsSource
from .node_state import NodeState
from .outbox import deferred, flush_sends, send_cost_median
from .robot_frames import RobotFrames
from .time_jump import TimeJumpDetector

REPLACED = "replaced by a newer frame of the same camera before inference"


class InitialSessionRefused(RuntimeError):
    """``initial_session`` could not be loaded (the reason): configure fails with it."""


class CameraChannel:
    """One camera: its input, its ledger, its queue, its frames in the robot, its outputs."""

    def __init__(self, node, settings: SettingsSource, name: str, tree, cond: threading.Condition, state: NodeState):
        from ..core.preprocess import FramePreprocessor

        self.name = name
        self._node = node
        self._settings = settings
        self.session_id = 0
        self.ledger = FrameLedger(node, session_id=lambda: self.session_id, topic=f"~/{name}/frame_status")
        self.input_size = InputSize(lambda: FramePreprocessor(fast_resize=bool(settings.current.fast_resize),
                                                              width=int(settings.current.image_width)))
        # its own world and scale; the rig publishes the body's /tf edge, never a camera's RobotFrames
        self.robot = RobotFrames(node, OverriddenSettings(settings, publish_tf=False), tree)
        self.depth = DepthPairing(node, settings, base=f"{name}/depth")
        self.depth.consumer = self.robot
        self.robot.depth = self.depth
        self.queue = LatestFrame(self.ledger, REPLACED, cond=cond)
        self.stage = None  # its PreprocessStage, while configured
        self.recon = None  # its ReconstructionPublisher (~/<name>/points, ...; the map is the node's), configured
        self.intake = ImageIntake(node, settings, self.ledger, self.input_size, sink=self._offer, state=state,
                                  depth=self.depth, base=f"{name}/image")
        reliable10 = QoSProfile(depth=10, reliability=QoSReliabilityPolicy.RELIABLE)
        # sent on the node's outbox thread (outbox.py), each frame's messages together and in order
        self.pose_pub = deferred(node, node.create_publisher(PoseStamped, f"~/{name}/pose", reliable10))
        self.stats_pub = deferred(node, node.create_publisher(CacheStats, f"~/{name}/cache_stats", reliable10))
        self.depth_pub = deferred(node, large_publisher(node, Image, f"~/{name}/depth", reliable10))  # large_outputs
        self.time_jump = TimeJumpDetector()
        self.non_finite_in_a_row = 0
        self.warned_no_frame_id = False
        # what this camera's frames cost the inference thread besides the model, per frame: (wall ms, the
        # thread's own CPU ms) of everything (the non-finite check, TF lookups, the scale, the rig, every
        # publish, points included), then of placing alone (TF lookups, the scale, the rig's anchoring and hand-over)
        self.costs: collections.deque = collections.deque(maxlen=200)

    def _offer(self, frame: Frame) -> None:
        stage = self.stage
        if stage is not None and stage.running:
            stage.offer(frame)
        else:
            self.ledger.finish(frame.header, FrameStatus.DROPPED_INACTIVE, "no preprocessing thread is running")

    def camera_frame(self, header) -> str:
        if header.frame_id:
            return header.frame_id
        if not self.warned_no_frame_id:
            self.warned_no_frame_id = True
            self._node.get_logger().warning(f"camera {self.name}: image header has no frame_id: its frames cannot "
                                            "be placed on the robot (base_frame -> camera)")
        return f"{self.name}_optical"


class CameraSystem:
    """The node's several-camera mode, from configure to cleanup (built only when ``cameras`` is set)."""

    def __init__(self, node, settings: SettingsSource, outputs, state: NodeState):
        self._node = node
        self._settings = settings
        self._outputs = outputs
        self.names = camera_names(settings.current.values())  # frozen at configure
        self.primary = primary_camera(settings.current.values())
        self.cond = threading.Condition()
        self.channels = {n: CameraChannel(node, settings, n, outputs.robot.tree, self.cond, state)
                         for n in self.names}
        self.worker: Optional[CameraGroupWorker] = None
        self._group = None  # until the worker exists (it owns the group from then on: a change rebuilds it)

    @property
    def group(self):
        worker = self.worker
        return worker.group if worker is not None else self._group

    def configure(self, runtime, stream, on_view: Callable[[Any], None], context_ok: Callable[[], bool],
                  parameters=None) -> None:
        """Build the model once and a stream per camera; raises with the reason when it cannot."""
        from ..core.model_host import ModelHost
        from ..core.stream_group import StreamGroup
        from .pipeline import PreprocessStage
        from .reconstruction import ReconstructionPublisher

        log = self._node.get_logger()
        host = ModelHost.load(runtime, log=log.info)
        group = self._group = StreamGroup(host, stream, self.names, log=log.info)
        values = self._settings.current
        rig = Rig(self.names, self.primary, float(values.camera_timeout),
                  unit_from_primary=str(values.scale_source) == "model",
                  min_travel=float(values.scale_min_travel))
        self.worker = CameraGroupWorker(self._node, group, self.channels, self._settings, self._outputs, rig,
                                        on_view=lambda: on_view(self.group.manager(self.primary)),
                                        context_ok=context_ok, requested=stream, parameters=parameters)
        self._group = None
        device = host.resolved.device
        if self._outputs.recon is None:  # the one map (~/map_points, ~/save_map) of every camera
            self._outputs.recon = ReconstructionPublisher(self._node, self._settings, device=device)
        for channel in self.channels.values():
            channel.stage = PreprocessStage(self._settings, channel.ledger, channel.input_size, sink=channel.queue.put,
                                            context_ok=context_ok)
            channel.recon = ReconstructionPublisher(self._node, self._settings, device=device,
                                                    prefix=f"~/{channel.name}/", map_into=self._outputs.recon)
            channel.input_size.renew()
        on_view(self.group.manager(self.primary))
        if values.initial_session:  # a bad one raises: configure fails with the reason
            import os

            path = os.path.abspath(os.path.expanduser(str(values.initial_session)))
            try:
                self.worker.load(self.prepare_load(path))
            except Exception as exc:  # noqa: BLE001 - not a session, other cameras, damaged, other settings
                raise InitialSessionRefused(f"initial_session: {exc}") from exc
        self.worker.start()
        for channel in self.channels.values():
            channel.intake.subscribe()

    @property
    def primary_manager(self):
        return self.group.manager(self.primary) if self.group is not None else None

    @property
    def topics(self) -> str:
        return ", ".join(c.intake.topic for c in self.channels.values())

    def activate(self) -> None:
        for channel in self.channels.values():
            channel.stage.start()

    def deactivate(self) -> None:
        for channel in self.channels.values():
            if channel.stage is not None and channel.stage.running:
                channel.stage.stop("the node was deactivated")
            frame = channel.queue.take()
            if frame is not None:
                channel.ledger.finish(frame.header, FrameStatus.DROPPED_INACTIVE, "the node was deactivated")

    def prepare_load(self, path: str):
        """``~/load_session``'s reading and checking (the services' thread): refused with the camera
        names when the session was saved with others."""
        from .camera_sessions import prepare
        from .parameters import staging_choice

        group = self.group
        if group is None:
            raise RuntimeError("the node is not configured")
        return prepare(path, self.names, {n: group.manager(n) for n in self.names},
                       staging_choice(self._settings.current))

    def submit(self, command: tuple, wait: float = 0.0) -> Optional[str]:
        worker = self.worker
        return worker.submit(command, wait) if worker is not None else None

    def shutdown(self, reason: str, timeout: float = 30.0) -> None:
        for channel in self.channels.values():
            stage, channel.stage = channel.stage, None
            if stage is not None and stage.running:
                stage.stop(reason, timeout)
        worker = self.worker
        if worker is not None:
            worker.stop(timeout)

    def teardown(self, why: str) -> None:
        self.shutdown(why)
        flush_sends(self._node)  # the last frames' outputs are sent before their publishers go
        for channel in self.channels.values():
            channel.intake.unsubscribe()
            recon, channel.recon = channel.recon, None
            if recon is not None:
                recon.destroy()
        worker, self.worker = self.worker, None
        if worker is not None:
            worker.close(why)
        self._group = None

    # ------------------------------------------------------------------ /diagnostics (executor thread)
    def statuses(self, hardware_id: str) -> list[DiagnosticStatus]:
        """One status per camera: its rate, latency, drops, state (tracking / stalled / driving) and scale."""
        now = time.monotonic()
        worker = self.worker
        if worker is not None:
            with worker.lock:
                reports = worker.rig.report(now)
                driver = worker.rig.driver
                last_handover = worker.rig.last_handover
        else:
            reports, driver, last_handover = {}, None, ""
        out = []
        for name, channel in self.channels.items():
            ledger = channel.ledger
            with ledger.lock:
                c = ledger.c
                recent = [t for t in ledger.recv_times if now - t <= RATE_WINDOW_S]
                latency = statistics.median(ledger.latencies) if ledger.latencies else math.nan
                received, processed, dropped = c.received, c.processed, c.dropped
                dropped_queue, rejected = c.dropped_queue, c.rejected
                costs = list(channel.costs)
            report = reports.get(name)
            state = report.state if report is not None else "unconfigured"
            level, message = DiagnosticStatus.OK, f"{state}"
            if state == "stalled":
                level = DiagnosticStatus.WARN
                # the hand-over happens at the next placed frame of a tracking camera: until then the
                # stalled camera is still the one whose last pose the body holds
                handing = ("the next frame of a tracking camera takes the body pose over" if driver in (None, name)
                           else f"{driver} drives the body pose")
                message = (f"{name} stalled: no processed frame for {report.age_s:.1f} s (camera_timeout "
                           f"{self._settings.current.camera_timeout} s); {handing}")
            elif state == "waiting":
                message = f"{name}: no frame yet on {channel.intake.topic}"
            elif state == "unit_estimating":
                message = f"{name}: taking the world's unit from the body's travel"
            scale = channel.robot.scale.status()
            values = [("topic", channel.intake.topic), ("state", state), ("driving", str(driver == name).lower()),
                      ("primary", str(name == self.primary).lower()),
                      ("rate_hz", f"{len(recent) / RATE_WINDOW_S:.2f}"), ("latency_ms", f"{latency:.1f}"),
                      ("frames_received", received), ("frames_processed", processed), ("frames_dropped", dropped),
                      ("frames_dropped_queue", dropped_queue), ("frames_rejected", rejected),
                      ("scale_source", scale.source), ("scale_state", scale.state),
                      ("unit_in_world", f"{report.unit:.6g}" if report is not None else "nan"),
                      ("place_publish_ms_median", f"{_median([c[0] for c in costs]):.3f}"),
                      ("place_publish_cpu_ms_median", f"{_median([c[1] for c in costs]):.3f}"),
                      ("place_ms_median", f"{_median([c[2] for c in costs]):.3f}"),
                      ("place_cpu_ms_median", f"{_median([c[3] for c in costs]):.3f}"),
                      # sending its frames' outputs (the body's too while it drives), on the outbox thread
                      ("sends_cpu_ms_median", f"{send_cost_median(self._node, name):.3f}"),
                      ("last_handover", last_handover)]
            out.append(DiagnosticStatus(level=level, name=f"{DIAG_PREFIX}camera {name}", message=message,
                                        hardware_id=hardware_id,
                                        values=[KeyValue(key=k, value=str(v)) for k, v in values]))
        return out


def _median(values: list) -> float:
    return statistics.median(values) if values else math.nan


__all__ = ["CameraChannel", "CameraGroupWorker", "CameraSystem", "InitialSessionRefused"]
