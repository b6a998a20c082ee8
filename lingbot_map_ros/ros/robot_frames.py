"""Where a result goes in the robot's TF tree, and in which unit (REP 103 / REP 105).

``RobotFrames.place`` turns a finite ``FrameResult`` (the camera's pose in the model's world) into
what the node publishes for it, on the inference thread:

1. the scale: a depth-camera keyframe ratio (its depth image awaited up to ``tf_timeout``, like a
   transform) or an odometry step goes to the ``ScaleEstimator``;
   while it has no lock, the frame's pose outputs are withheld (nothing metric before the scale is
   known) and the frame ends PROCESSED with that note;
2. the transforms at the image stamp, through ``FrameTree.lookup`` (``tf_timeout``): ``base_frame ->
   camera`` with ``base_frame`` set, ``odom_frame -> base_frame`` with ``odom_frame``; a missing one
   ends the frame NO_TRANSFORM (the model has processed it: its cache stays whole);
3. the algebra (``core.geometry``, float64): the camera pose in metres (``MetricMap``); with
   ``base_frame`` the body pose ``T_cam T_base_cam^-1`` re-expressed in the session's first body pose
   (the world: x forward, z up on a level start); with ``odom_frame`` the correction
   ``T_world_odom = T_world_base T_odom_base^-1``;
4. the one edge the node adds to /tf: ``world -> odom_frame``, else ``world -> base_frame``, else
   ``world -> camera``; never ``odom -> base`` (the robot's odometry owns it), and nothing when the
   child already has another parent (ERROR in ``/diagnostics`` with the fix, once in the log).

The correction of step 4 is kept by the ``FrameTree`` and re-sent between frames
(``transform_publish_period``); a new session forgets it (``begin_session``). Another node sending
the same edge is an ERROR naming it (``EdgePublishers``).

Reporting: a missing link WARNs naming it (log once per outage, ``/diagnostics`` ``tf``), a jump of a
transform that should be constant (``base -> camera``) is counted and logged once, the scale's state
is the ``scale`` status. No per-frame log lines.
"""
from __future__ import annotations

import collections
import math
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Optional, Union

import numpy as np

from ..core.geometry import body_pose, body_twist, odom_correction, pose_difference, rigid_inverse
from ..core.scale import ScaleEstimator, ScaleStatus, depth_ratio, model_depth_grid
from .depth_io import RefusedDepth
from .node_settings import SettingsSource
from .transforms import FrameTree, NoTransform

EXTRINSIC_JUMP = (0.01, math.radians(1.0))  # m, rad: a base -> camera change beyond this is a TF jump
TWIST_MAX_DT = 1.0  # s: poses further apart give no twist (a gap is not a velocity)
RECENT_S = 5.0  # a missing link or a jump WARNs this long in /diagnostics
DEPTH_POLL_S = 0.005  # how often a keyframe waiting for its depth partner looks again


@dataclass(frozen=True)
class Placement:
    """What a frame publishes: every pose in ``world_frame``, in the world's unit (metres when metric)."""

    camera: np.ndarray  # [4, 4] T_world_cam (~/points, the map)
    pose: np.ndarray  # [4, 4] what ~/pose, ~/odom, ~/path carry: the body with base_frame, else the camera
    child: str  # ~/odom child_frame_id: base_frame, else the camera frame
    depth_factor: float  # published depth = model depth x this (metres when metric)
    twist: Optional[tuple[np.ndarray, np.ndarray]]  # body-frame (linear, angular) from the previous pose
    tf: Optional[tuple[str, str, np.ndarray]]  # (parent, child, T_parent_child) for /tf, None: nothing
    base_in_odom: Optional[np.ndarray] = None  # [4, 4] T_odom_base at the image stamp (with odom_frame)


@dataclass(frozen=True)
class Withheld:
    """The frame's pose outputs are held back (``reason``); the frame still ends PROCESSED."""

    reason: str


@dataclass(frozen=True)
class RobotReport:
    """``/diagnostics`` ``tf`` and ``scale``, read on the executor thread."""

    now: float
    world_frame: str
    base_frame: str
    odom_frame: str
    publish_tf: bool
    edge: str  # "world -> child" the node publishes on /tf ("" before the first frame / when off)
    conflicts: dict  # child -> (its other parent, the fix)
    no_transform: int  # frames that ended NO_TRANSFORM
    missing_link: str
    missing_reason: str
    missing_time: float  # time.monotonic() of the last NO_TRANSFORM (-inf: never)
    tf_jumps: int
    last_jump: str
    last_jump_time: float
    scale: ScaleStatus
    depth_counts: dict = field(default_factory=dict)  # DepthPairing's counters (scale_source depth)
    depth_problem: str = ""
    cost_ms: tuple = (math.nan, math.nan, math.nan)  # median, p90, max of place() + the depth scaling per frame
    cost_cpu_ms: tuple = (math.nan, math.nan, math.nan)  # the same in the inference thread's own CPU time
    other_publishers: dict = field(default_factory=dict)  # "world -> child" -> who else publishes it


class _Inverse:
    """``rigid_inverse`` of the last matrix asked for, kept while the same array object is asked for again:
    the session's world and a static mount's extrinsic (``FrameTree`` hands out one read-only array per
    cached lookup) change rarely, and their inverse would otherwise be computed again at every frame. The
    matrices given are never changed in place (each new value is a new array)."""

    def __init__(self) -> None:
        self._matrix: Optional[np.ndarray] = None
        self._inverse: Optional[np.ndarray] = None

    def of(self, matrix: np.ndarray) -> np.ndarray:
        if matrix is not self._matrix:
            self._inverse = rigid_inverse(np.asarray(matrix, np.float64).reshape(4, 4))
            self._matrix = matrix
        return self._inverse


class RobotFrames:
    """The frames and the scale of the current session, applied to each result (inference thread);
    ``report`` for the executor thread. ``depth`` is the ``DepthPairing`` (scale_source depth)."""

    def __init__(self, node, settings: SettingsSource, tree: FrameTree, depth=None, publishers=None):
        self._log = node.get_logger()
        self._publishers = publishers  # EdgePublishers: names another publisher of the node's edge
        self._logged_foreign: set[str] = set()
        self._settings = settings
        values = settings.current
        self.tree = tree
        self.depth = depth
        self.scale = ScaleEstimator(str(values.scale_source), float(values.scale_factor),
                                    int(values.scale_min_samples), float(values.scale_min_travel))
        self._lock = threading.Lock()  # the estimator and the report fields (inference <-> executor thread)
        self._session: Optional[int] = None
        self._window = 0
        self._first: Optional[tuple[np.ndarray, np.ndarray]] = None  # (camera pose, T_base_cam) of the session
        self._world: Optional[np.ndarray] = None  # T_model_world: the first body pose, metric (base_frame)
        self._previous: Optional[tuple[float, np.ndarray]] = None  # (stamp s, pose) for the twist
        self._extrinsic: Optional[np.ndarray] = None
        self._world_inverse = _Inverse()  # T_world_model, of _world
        self._extrinsic_inverse = _Inverse()  # T_cam_base, of the frame's T_base_cam
        self._edge = ""
        self._conflicts: dict[str, tuple[str, str]] = {}
        self._logged_conflicts: set[tuple[str, str]] = set()
        self._no_transform = 0
        self._missing = ("", "", -math.inf)
        self._link_down = False
        self._jumps = 0
        self._last_jump = ("", -math.inf)
        self._scale_logged: set[str] = set()
        self._estimating_logged = False
        self._costs: collections.deque = collections.deque(maxlen=200)  # (wall, CPU) ms per frame

    def record_cost(self, ms: float, cpu_ms: float) -> None:
        """What placing a frame cost the inference thread (lookups, scale, algebra, depth scaling):
        wall time, and the thread's own CPU time."""
        with self._lock:
            self._costs.append((ms, cpu_ms))

    @property
    def wants_depth(self) -> bool:
        return self.scale.wants_depth

    # ------------------------------------------------------------------ per frame
    def place(self, r, header, camera_frame: str, session_id: int) -> Union[Placement, Withheld, NoTransform]:
        """Steps 1-4 of the module docstring for the finite result ``r`` of the image with ``header``."""
        v = self._settings.current
        base, odom, world = str(v.base_frame), str(v.odom_frame), str(v.world_frame)
        with self._lock:
            if session_id != self._session:
                if self._session is not None:  # a session that started without begin_session
                    self._reset_session()
                self._session = session_id
            if r.window_index != self._window:
                self._window = r.window_index
                self.scale.start_window(r.c2w[:3, 3])
            self.scale.set_limits(int(v.scale_min_samples), float(v.scale_min_travel))
            if self.scale.wants_depth and r.is_keyframe:
                self._depth_sample(r, header)
        try:
            extrinsic, base_in_odom = self._lookups(header, camera_frame, base, odom, float(v.tf_timeout))
        except NoTransform as missing:
            self._note_missing(missing)
            return missing
        with self._lock:
            self._note_link_ok()
            if extrinsic is not None:
                self._check_jump(extrinsic)
                if self._first is None:
                    self._first = (np.asarray(r.c2w, np.float64), extrinsic)
            if self.scale.wants_travel:
                self.scale.add_positions(r.c2w[:3, 3], (base_in_odom @ extrinsic)[:3, 3], base_in_odom[:3, 3])
            self._log_scale_problems()
            metric = self.scale.map
            if metric is None:
                status = self.scale.status()
                return Withheld(f"scale estimating from {status.source} ({self._progress(status)}): nothing "
                                "metric is published until it locks")
            camera = metric.pose(r.c2w)
            pose, child = camera, camera_frame
            if base:
                if self._world is None:  # the session's first body pose, in the unit of the first lock
                    first_camera, first_extrinsic = self._first
                    self._world = body_pose(metric.pose(first_camera), first_extrinsic)
                camera = self._world_inverse.of(self._world) @ camera  # = relative_pose(self._world, camera)
                pose, child = camera @ self._extrinsic_inverse.of(extrinsic), base  # = body_pose(camera, extrinsic)
        tf = self._tf_edge(world, base, odom, camera_frame, pose, base_in_odom) if v.publish_tf else None
        return Placement(camera=camera, pose=pose, child=child, depth_factor=metric.factor,
                         twist=self._twist(header, pose), tf=tf, base_in_odom=base_in_odom)

    def _lookups(self, header, camera_frame: str, base: str, odom: str, timeout: float):
        """(T_base_cam or None, T_odom_base or None) at the image stamp; raises ``NoTransform``."""
        if not base:
            return None, None
        tree = self.tree
        extrinsic = np.eye(4) if camera_frame == base else tree.lookup(base, camera_frame, header.stamp, timeout)
        base_in_odom = tree.lookup(odom, base, header.stamp, timeout) if odom else None
        return extrinsic, base_in_odom

    def tf_edge(self, world: str, base: str, odom: str, camera_frame: str, pose: np.ndarray,
                base_in_odom: Optional[np.ndarray],
                correction: Optional[np.ndarray] = None) -> Optional[tuple[str, str, np.ndarray]]:
        """The /tf edge of the body pose ``pose`` (several cameras: the rig's body pose, placed here;
        ``correction``: its ``odom_correction`` when the rig has it already)."""
        return self._tf_edge(world, base, odom, camera_frame, pose, base_in_odom, correction)

    def _tf_edge(self, world: str, base: str, odom: str, camera_frame: str, pose: np.ndarray,
                 base_in_odom: Optional[np.ndarray],
                 correction: Optional[np.ndarray] = None) -> Optional[tuple[str, str, np.ndarray]]:
        """The node's one /tf edge for this frame, unless its child has another parent."""
        if base and odom:
            child = odom
            matrix = correction if correction is not None else odom_correction(pose, base_in_odom)
            fix = (f"another node already publishes {{parent}} -> {odom}: run one localizer (or set world_frame "
                   f"to that parent if it is the same map)")
        elif base:
            child, matrix = base, pose
            fix = (f"set odom_frame to {{parent}} (the node then publishes {world} -> {{parent}} and leaves "
                   f"{{parent}} -> {base} to the robot's odometry)")
        else:
            child, matrix = camera_frame, pose
            fix = (f"set base_frame (the robot body, e.g. base_link) so the node publishes {world} -> base_frame, "
                   f"and odom_frame (e.g. odom) when odometry publishes odom -> base_frame")
        parent = self.tree.parent_of(child)
        with self._lock:
            self._edge = f"{world} -> {child}"
            if parent is not None and parent != world:
                text = fix.format(parent=parent)
                self._conflicts[child] = (parent, text)
                if (child, parent) not in self._logged_conflicts:
                    self._logged_conflicts.add((child, parent))
                    self._log.error(f"{child} already has the parent {parent} in the TF tree: publishing nothing "
                                    f"for it on /tf (a frame has one parent). Fix: {text}")
                return None
            self._conflicts.pop(child, None)
        self.tree.claim(world, child)
        return world, child, matrix

    def _twist(self, header, pose: np.ndarray) -> Optional[tuple[np.ndarray, np.ndarray]]:
        """Velocity from the previous published pose, when both are metric and close in time."""
        t = header.stamp.sec + header.stamp.nanosec * 1e-9
        previous, self._previous = self._previous, (t, pose)
        if previous is None or self.scale.source == "model":  # model units per second is no velocity to fuse
            return None
        dt = t - previous[0]
        if not 0.0 < dt <= TWIST_MAX_DT:
            return None
        return body_twist(previous[1], pose, dt)

    # ------------------------------------------------------------------ scale samples
    def _depth_sample(self, r, header) -> None:
        grid = self._depth_partner(header, float(self._settings.current.tf_timeout))
        if grid is None:
            self.scale.miss("no depth partner: no depth image paired with this keyframe")
            return
        if isinstance(grid, RefusedDepth):
            self.scale.miss(f"depth image refused: {grid.reason}")
            return
        if r.depth is None:
            self.scale.miss("no model depth: the depth head did not run on this frame (depth_every)")
            return
        model = model_depth_grid(r.depth)
        if model.shape != grid.shape:
            self.scale.miss(f"grid mismatch: sensor grid {grid.shape} vs model grid {model.shape}")
            return
        self.scale.add_depth(depth_ratio(grid, model))

    def _depth_partner(self, header, timeout: float):
        """The keyframe's paired depth, waiting up to ``timeout`` (``tf_timeout``) for it as for a transform:
        a depth image sent with its colour frame may reach the node after the frame's result. A partner
        that came and was refused ends the wait at once (``RefusedDepth``)."""
        if self.depth is None:
            return None
        deadline = time.monotonic() + timeout
        while True:
            grid = self.depth.take(header)
            if grid is not None or time.monotonic() >= deadline:
                return grid
            self._lock.release()  # the executor thread reads the report meanwhile
            try:
                time.sleep(DEPTH_POLL_S)
            finally:
                self._lock.acquire()

    def _log_scale_problems(self) -> None:
        """Once per kind: samples left out (odometry jumps, bad depth), a round that does not lock."""
        for kind in self.scale.rejected:
            if kind not in self._scale_logged:
                self._scale_logged.add(kind)
                self._log.warning(f"scale: a sample was not used ({kind}); counted in /diagnostics 'scale', "
                                  "reported once")
        problem = self.scale.problem()
        if problem and not self._estimating_logged:
            self._estimating_logged = True
            self._log.warning(f"scale ({self.scale.source}) has not locked yet: {problem}; nothing metric is "
                              "published until it does (reported once per session)")

    @staticmethod
    def _progress(status: ScaleStatus) -> str:
        if status.source == "odometry":
            return f"{status.travel_m:.2f} of {status.needed_travel_m:.2f} m travelled"
        return f"{status.samples} keyframe ratios, {status.needed} must agree"

    # ------------------------------------------------------------------ events
    def begin_session(self) -> None:
        """A new session started (inference thread, before its first frame is pushed): a new world and
        a new model unit, so frames and scale start over now, not at its first result, so that the
        depth of its first frames is already wanted."""
        with self._lock:
            self._reset_session()
            self._session = None
        forget = getattr(self.tree, "forget", None)
        if forget is not None:
            forget()

    def session_state(self) -> dict:
        """What a saved session needs to continue in the same world: the window, the session's first
        camera pose and extrinsic, the world's body pose (base_frame) and the scale."""
        def matrix(m):
            return None if m is None else np.asarray(m, np.float64).tolist()

        with self._lock:
            first = None if self._first is None else [matrix(self._first[0]), matrix(self._first[1])]
            return {"window": self._window, "first": first, "world": matrix(self._world),
                    "scale": self.scale.state_dict()}

    def restore_session(self, state: dict, session_id: int) -> None:
        """Continue the saved world as session ``session_id`` (after ``begin_session``)."""
        with self._lock:
            self._session = session_id
            self._window = int(state.get("window", 0))
            first = state.get("first")
            self._first = None if first is None else (np.asarray(first[0], np.float64),
                                                      np.asarray(first[1], np.float64))
            world = state.get("world")
            self._world = None if world is None else np.asarray(world, np.float64)
            if state.get("scale"):
                self.scale.load_state(state["scale"])

    def _reset_session(self) -> None:
        self._window = 0
        self._first = self._world = self._previous = None
        self.scale.start_session()
        self._estimating_logged = False

    def _note_missing(self, missing: NoTransform) -> None:
        with self._lock:
            self._no_transform += 1
            self._missing = (missing.link, str(missing), time.monotonic())
            first = not self._link_down
            self._link_down = True
        if first:
            self._log.warning(f"{missing}; frames end NO_TRANSFORM (the model still processes them) until it "
                              "comes")

    def _note_link_ok(self) -> None:
        if self._link_down:
            self._link_down = False
            self._log.info(f"transform {self._missing[0]} is there again: frames are published")

    def _check_jump(self, extrinsic: np.ndarray) -> None:
        previous, self._extrinsic = self._extrinsic, extrinsic
        if previous is None or previous is extrinsic:  # the same (cached static) lookup: nothing moved
            return
        dist, angle = pose_difference(previous, extrinsic)
        if dist > EXTRINSIC_JUMP[0] or angle > EXTRINSIC_JUMP[1]:
            self._jumps += 1
            text = (f"{self._settings.current.base_frame} -> camera moved by {dist:.3f} m / "
                    f"{math.degrees(angle):.1f} deg between two frames (a TF jump): the new transform is used")
            self._last_jump = (text, time.monotonic())
            if self._jumps == 1:
                self._log.warning(text + " (reported once; counted in /diagnostics 'tf')")

    # ------------------------------------------------------------------ executor thread
    def _other_publishers(self) -> dict[str, str]:
        """The node's edges another node sent lately -> who (ERROR in /diagnostics, logged once each)."""
        if self._publishers is None:
            return {}
        found = {}
        for (parent, child) in self.tree.foreign_edges(RECENT_S):
            edge = f"{parent} -> {child}"
            found[edge] = self._publishers.names(edge, RECENT_S)
            if edge not in self._logged_foreign:
                self._logged_foreign.add(edge)
                self._log.error(f"another node publishes {edge} too ({found[edge]}): a transform must come from one "
                                "node; stop one of them, or give each its own frames")
        return found

    def report(self) -> RobotReport:
        v = self._settings.current
        depth_counts, depth_problem = self.depth.report() if self.depth is not None else ({}, "")
        other_publishers = self._other_publishers()
        with self._lock:
            cost, cost_cpu = (_summary([c[k] for c in self._costs]) for k in (0, 1))
            return RobotReport(
                now=time.monotonic(), world_frame=str(v.world_frame), base_frame=str(v.base_frame),
                odom_frame=str(v.odom_frame), publish_tf=bool(v.publish_tf), edge=self._edge,
                conflicts=dict(self._conflicts), no_transform=self._no_transform, missing_link=self._missing[0],
                missing_reason=self._missing[1], missing_time=self._missing[2], tf_jumps=self._jumps,
                last_jump=self._last_jump[0], last_jump_time=self._last_jump[1], scale=self.scale.status(),
                depth_counts=depth_counts, depth_problem=depth_problem, cost_ms=cost, cost_cpu_ms=cost_cpu,
                other_publishers=other_publishers,
            )


def _summary(values: list) -> tuple[float, float, float]:
    """(median, p90, max) of ``values``; nan when there are none."""
    if not values:
        return math.nan, math.nan, math.nan
    s = sorted(values)
    return statistics.median(s), s[min(len(s) - 1, int(0.9 * len(s)))], s[-1]


__all__ = ["Placement", "RobotFrames", "RobotReport", "Withheld"]
