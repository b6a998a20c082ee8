"""One world and one body pose from several camera streams (README "Several cameras").

Each camera is a stream of its own: its own session, its own world (the body pose at that stream's
first frame) and, with ``scale_source: model``, its own unit. The rig puts them together without
ever letting one stream see another's frames; only poses cross, as rigid transforms:

* **Anchoring.** A stream's body poses ``B_s(t)`` (its world, through ``base_frame -> camera`` from
  tf2) become world poses ``A_s S_s(B_s(t))``. The first stream anchored creates the world
  (``A = I``: the world is its first body pose). A stream anchored later - a late start, or a new
  session of its own (reset, time jump, fault) - is anchored at its first frame by the body pose
  the node holds at that stamp: ``A_s = H(t1) S_s(B_s(t1))^-1``.
* **Unit.** ``S_s`` scales translations by ``unit_s``. With ``scale_source: model`` every stream has
  the model's own unit, a different one per session; the stream that creates the world sets it, a
  stream anchored later takes it from the ratio of the held body's travel to its own over the same
  stamps, once the held body has travelled ``min_travel`` (until then its outputs are withheld).
  With a metric source each stream is metric on its own and ``unit_s`` is 1.
* **The held pose** ``H(t)``: with odometry, the published correction times ``odom -> base`` at ``t``
  (``held_correction``); without, the published body pose nearest to ``t``.
* **Driving.** One stream drives the published body pose: the primary while it tracks. A stream
  that has placed no frame for ``timeout`` seconds is stalled; the next tracking stream then drives.
  The primary takes the drive back on its first placed frame after it returns: it is the camera the
  user trusts most (named so), and the hand-back, like every hand-over, is continuous.
* **Continuity.** Every hand-over carries an offset: the new driver's world pose is composed with
  ``O_new = O_old R_old(t') R_new(t')^-1``, where ``t'`` is the new driver's latest frame within the
  old driver's recent frames and ``R_old(t')`` the old driver's pose interpolated there, so the body
  pose does not jump; what the offset holds is the two streams' disagreement at one instant.

Pure float64 NumPy; one thread (the node's inference thread) owns a ``Rig``.
"""
from __future__ import annotations

import bisect
import collections
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from .geometry import odom_correction, quaternion_to_matrix, quaternion_xyzw_from_matrix, rigid_inverse, se3_inverse

HISTORY = 64  # world poses kept per stream for hand-overs and anchoring (a few seconds of frames)


def scaled(pose: np.ndarray, unit: float) -> np.ndarray:
    """``pose`` with its translation times ``unit`` (rotation unchanged)."""
    out = np.array(pose, dtype=np.float64)
    out[:3, 3] *= unit
    return out


@dataclass(frozen=True)
class RigPlacement:
    """A stream's frame in the one world."""

    camera: np.ndarray  # [4, 4] T_world_cam: ~/<name>/pose, its points
    body: np.ndarray  # [4, 4] T_world_base by this stream (its own anchoring, no hand-over offset)
    drives: bool  # this frame is the body pose's (published on ~/pose, ~/odom, ~/path, /tf)
    published_body: Optional[np.ndarray]  # [4, 4] what ~/pose carries (offset applied); None unless drives
    handed_over: str  # "" or the hand-over this frame made ("rear drives: front stalled")
    unit: float = 1.0  # the stream's translation (and depth) unit in the world's
    # [4, 4] T_world_odom of ``published_body`` (``odom_correction``) when it drives with odometry: the /tf
    # edge world -> odom, computed once here for the held pose and the edge alike
    correction: Optional[np.ndarray] = None


@dataclass(frozen=True)
class StreamReport:
    """A camera in ``/diagnostics``."""

    state: str  # waiting | tracking | driving | stalled | unit_estimating
    age_s: float  # seconds since its last placed frame (inf: none)
    unit: float  # its translation unit in the world's (nan while estimating)
    travel: tuple[float, float]  # (held body travel, its own travel) of the unit estimate
    anchored: bool


def pose_at(history: Sequence[tuple[float, np.ndarray]], t: float) -> np.ndarray:
    """The pose of ``history`` ((stamp, [4, 4]) in stamp order) at ``t``: interpolated between the two
    frames around it (translation linear, rotation along the great circle), clamped to its ends."""
    stamps = [s for s, _ in history]
    i = bisect.bisect_left(stamps, t)
    if i <= 0:
        return history[0][1]
    if i >= len(stamps):
        return history[-1][1]
    (t0, p0), (t1, p1) = history[i - 1], history[i]
    a = 0.0 if t1 <= t0 else (t - t0) / (t1 - t0)
    q0, q1 = quaternion_xyzw_from_matrix(p0[:3, :3]), quaternion_xyzw_from_matrix(p1[:3, :3])
    if float(np.dot(q0, q1)) < 0.0:
        q1 = -q1
    angle = float(np.arccos(np.clip(np.dot(q0, q1), -1.0, 1.0)))
    if angle < 1e-12:
        q = q0
    else:
        q = (np.sin((1 - a) * angle) * q0 + np.sin(a * angle) * q1) / np.sin(angle)
    out = np.eye(4)
    out[:3, :3] = quaternion_to_matrix(q)
    out[:3, 3] = (1 - a) * p0[:3, 3] + a * p1[:3, 3]
    return out


class _Stream:
    def __init__(self) -> None:
        self.anchor: Optional[np.ndarray] = None  # A_s
        self.first: Optional[tuple[float, np.ndarray, np.ndarray]] = None  # (stamp, H(t1), B_s(t1))
        self.unit: Optional[float] = None
        self.travel_held = 0.0
        self.travel_own = 0.0
        self.last_positions: Optional[tuple[np.ndarray, np.ndarray]] = None  # (held, own) positions
        self.seen = -np.inf  # monotonic time of its last placed frame
        self.history: collections.deque = collections.deque(maxlen=HISTORY)  # (stamp, world body R_s)


class Rig:
    """The streams' anchors, units, the driver and its offset (see the module docstring)."""

    def __init__(self, names: Sequence[str], primary: str, timeout: float, unit_from_primary: bool,
                 min_travel: float) -> None:
        self.names = list(names)
        self.primary = primary or self.names[0]
        self.timeout = float(timeout)
        self.unit_from_primary = bool(unit_from_primary)
        self.min_travel = float(min_travel)
        self.reset()

    def reset(self) -> None:
        """A new world: every stream is anchored again, the first one to place a frame creates it."""
        self._streams = {n: _Stream() for n in self.names}
        self.driver: Optional[str] = None
        self._offset = np.eye(4)
        self._published: collections.deque = collections.deque(maxlen=HISTORY)  # (stamp, body)
        self._correction: Optional[np.ndarray] = None  # T_world_odom of the last published body pose
        self.handovers = 0
        self.last_handover = ""

    def begin_stream(self, name: str) -> None:
        """``name`` started a new session (its own world and unit): anchor it again at its next frame."""
        old = self._streams[name]
        fresh = _Stream()
        fresh.seen = old.seen
        self._streams[name] = fresh
        if self.driver == name:  # its next frame, re-anchored by the held pose, drives on continuously
            self._offset = np.eye(4)

    @property
    def has_world(self) -> bool:
        return bool(self._published) or any(s.anchor is not None for s in self._streams.values())

    # ------------------------------------------------------------------ the held pose
    def held(self, stamp: float, base_in_odom: Optional[np.ndarray] = None) -> Optional[np.ndarray]:
        """H(stamp): the body pose the node holds at ``stamp`` (None before the first published one)."""
        if base_in_odom is not None and self._correction is not None:
            return self._correction @ base_in_odom
        if not self._published:
            return None
        stamps = [s for s, _ in self._published]
        i = bisect.bisect_left(stamps, stamp)
        near = [j for j in (i - 1, i) if 0 <= j < len(stamps)]
        j = min(near, key=lambda k: abs(stamps[k] - stamp))
        return self._published[j][1]

    # ------------------------------------------------------------------ per frame
    def place(self, name: str, stamp: float, body: np.ndarray, camera: np.ndarray, now: float,
              base_in_odom: Optional[np.ndarray] = None) -> RigPlacement | str:
        """Stream ``name``'s frame at ``stamp`` (seconds): ``body`` and ``camera`` in its own world. Returns
        where it goes, or the reason it is withheld (its unit is still being estimated)."""
        s = self._streams[name]
        body = np.asarray(body, np.float64)
        camera = np.asarray(camera, np.float64)
        extrinsic = rigid_inverse(body) @ camera  # T_base_cam
        s.seen = now
        if s.anchor is None and s.first is None:
            if not self.has_world:  # the first stream creates the world, in its own unit
                s.first, s.unit = (stamp, np.eye(4), body), 1.0
                s.anchor = se3_inverse(body)
            else:
                held = self.held(stamp, base_in_odom)
                if held is None:  # cannot happen once a world exists; be safe: wait for one
                    return "waiting for the body pose of the camera that created the world"
                s.first = (stamp, held, body)
                if not self.unit_from_primary:
                    s.unit = 1.0
        if s.unit is None:
            reason = self._estimate_unit(s, stamp, body, base_in_odom)
            if reason:
                return reason
        if s.anchor is None:
            _, held_first, body_first = s.first  # type: ignore[misc]
            s.anchor = held_first @ se3_inverse(scaled(body_first, s.unit))
        # [4, 4]; a unit of 1 (the world's creator, a metric source) scales nothing: no copy to scale
        world_body = s.anchor @ (body if s.unit == 1.0 else scaled(body, s.unit))
        s.history.append((stamp, world_body))
        note = self._drive(name, now)
        drives = self.driver == name
        published = correction = None
        if drives:
            published = self._offset @ world_body
            self._published.append((stamp, published))
            if base_in_odom is not None:
                correction = self._correction = odom_correction(published, base_in_odom)
        return RigPlacement(camera=world_body @ extrinsic, body=world_body, drives=drives, published_body=published,
                            handed_over=note, unit=float(s.unit), correction=correction)

    def _estimate_unit(self, s: _Stream, stamp: float, body: np.ndarray, base_in_odom) -> str:
        """The held body's travel over this stream's own, over the same stamps ("" once locked)."""
        held = self.held(stamp, base_in_odom)
        if held is None:
            return "waiting for the body pose"
        positions = (held[:3, 3].copy(), body[:3, 3].copy())
        if s.last_positions is not None:
            s.travel_held += float(np.linalg.norm(positions[0] - s.last_positions[0]))
            s.travel_own += float(np.linalg.norm(positions[1] - s.last_positions[1]))
        s.last_positions = positions
        if s.travel_held >= self.min_travel and s.travel_own > 0.0:
            s.unit = s.travel_held / s.travel_own
            return ""
        return (f"unit from the primary camera: the body travelled {s.travel_held:.3f} of {self.min_travel:.3f} "
                "(scale_min_travel) since this camera was anchored; its poses are withheld until then")

    def _tracking(self, name: str, now: float) -> bool:
        s = self._streams[name]
        return s.anchor is not None and now - s.seen <= self.timeout

    def _drive(self, name: str, now: float) -> str:
        """Decide who drives after ``name`` placed a frame; a hand-over sets the carried offset."""
        driver = self.driver
        if driver == name:
            return ""
        take = (driver is None
                or name == self.primary  # the primary takes the drive back on its first frame
                or not self._tracking(driver, now))  # the driver stalled: the next tracking camera
        if not take:
            return ""
        new = self._streams[name]
        if driver is not None and self._streams[driver].history:
            # both streams' world poses at one instant: the new driver's latest frame inside the old
            # one's span (else its frame nearest to that span), the old one's pose there interpolated
            old_history = self._streams[driver].history
            first, last = old_history[0][0], old_history[-1][0]
            inside = [entry for entry in new.history if first <= entry[0] <= last]
            t_new, pose_new = inside[-1] if inside else min(
                new.history, key=lambda entry: min(abs(entry[0] - first), abs(entry[0] - last)))
            self._offset = self._offset @ pose_at(old_history, t_new) @ se3_inverse(pose_new)
        else:
            self._offset = np.eye(4)
        self.driver = name
        if driver is None:
            return ""
        self.handovers += 1
        why = "the primary camera is back" if name == self.primary else f"{driver} stalled"
        self.last_handover = f"{name} drives: {why}"
        return self.last_handover

    # ------------------------------------------------------------------ reporting
    def report(self, now: float) -> dict[str, StreamReport]:
        out = {}
        for name, s in self._streams.items():
            age = now - s.seen
            if s.seen == -np.inf:
                state = "waiting"
            elif age > self.timeout:
                state = "stalled"
            elif s.unit is None:
                state = "unit_estimating"
            elif self.driver == name:
                state = "driving"
            else:
                state = "tracking"
            out[name] = StreamReport(state=state, age_s=float(age), unit=float("nan") if s.unit is None else s.unit,
                                     travel=(s.travel_held, s.travel_own), anchored=s.anchor is not None)
        return out

    # ------------------------------------------------------------------ saved sessions
    def state_dict(self) -> dict:
        def m(x):
            return None if x is None else np.asarray(x, np.float64).tolist()

        streams = {n: {"anchor": m(s.anchor), "unit": s.unit,
                       "first": None if s.first is None else [s.first[0], m(s.first[1]), m(s.first[2])],
                       "travel": [s.travel_held, s.travel_own]} for n, s in self._streams.items()}
        return {"names": self.names, "driver": self.driver, "offset": m(self._offset),
                "published": [[t, m(p)] for t, p in self._published], "correction": m(self._correction),
                "streams": streams}

    def load_state(self, state: dict) -> None:
        """Continue a saved rig (the same camera names: the caller checks them)."""
        def a(x):
            return None if x is None else np.asarray(x, np.float64)

        self.reset()
        self.driver = state.get("driver")
        self._offset = a(state.get("offset")) if state.get("offset") is not None else np.eye(4)
        self._published.extend((float(t), a(p)) for t, p in state.get("published", []))
        self._correction = a(state.get("correction"))
        for name, saved in state.get("streams", {}).items():
            if name not in self._streams:
                continue
            s = self._streams[name]
            s.anchor, s.unit = a(saved.get("anchor")), saved.get("unit")
            first = saved.get("first")
            s.first = None if first is None else (float(first[0]), a(first[1]), a(first[2]))
            s.travel_held, s.travel_own = (float(v) for v in saved.get("travel", [0.0, 0.0]))


__all__ = ["HISTORY", "Rig", "RigPlacement", "StreamReport", "pose_at", "scaled"]
