"""Long-run policies: what happens at a session's stored-frame limit (docs/model.md §15).

A camera never stops, but one streaming session cannot run forever: the RoPE table has
``max_frame_num`` rows, the camera-head cache never evicts and is preallocated for
``max_frame_num`` frames, the special-token pool is sized from ``max_frame_num``, and quality
degrades past the ~320 stored views the model was trained on. The session signals the limit
(``StoredFrameLimit``) before ``max_stored_frames`` (<= ``max_frame_num - 1``, checked in
``config.validate_stream``), which keeps all three caches inside their preallocated capacity by
construction; ``long_run_policy`` says what happens there.

Each policy is a small object that the session manager owns and calls from outside the session
(``LongRunPolicy``): ``admit`` before every frame, ``at_limit`` when the session signals the limit,
``to_world`` on every result handed out, ``reset`` on every new world frame, ``warnings`` for the
diagnostics. A policy never starts a session itself: it tells the manager (``AtLimit``), which starts
every session through one path. Composition instead of session subclasses because the policy is a
setting that changes at runtime: swapping one small object keeps the session's model, caches and
resolved runtime, and each policy can be read and tested on its own.

* ``StopPolicy`` — refuses frames from the limit on until reset (``SessionStopped``);
* ``ResetPolicy`` — asks for a new session (new world frame) whose first frame is the one at the limit;
* ``WindowPolicy`` — the official windowed mode of §15 made online. The same caches are emptied and
  refilled with the last ``overlap_frames`` frames, the new window is mapped onto the chained world
  frame by a similarity transform, and every later pose is handed out in the first window's world
  frame, so the trajectory continues without a jump and memory stays flat (the caches are reused,
  the overlap buffer is a bounded deque, no per-frame history is kept).

``policy_class`` is the one place that maps a policy name to its class; ``make_policy`` builds one.
"""
from __future__ import annotations

import dataclasses
import enum
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple, Optional

import numpy as np
import torch

from .config import StreamConfig
from .geometry import alignment_scale, sim3_apply_to_poses, umeyama_sim3, window_alignment
from .results import FrameResult
from .session_errors import SessionStopped, StoredFrameLimit
from .stream import Processed, StreamingSession

# Camera-centre spread (RMS distance from the mean, in the model's normalised units: the model
# scales each window so that scene depths are of order 1) below which the overlap's motion cannot
# fix a scale: a camera turning in place or standing still. Then the pose fit keeps the previous
# window's scale.
MIN_OVERLAP_MOTION = 1e-2
# A pose-based similarity whose residual exceeds this fraction of the overlap's spread is noise,
# not motion: the scale is not trusted either.
MAX_FIT_RESIDUAL = 0.25
SCALE_LIMITS = (1e-3, 1e3)  # as the depth-median scale of §15
# Relative scale (new window / previous) a pose fit may claim. Consecutive windows share their
# overlap frames, so their normalisations differ by a modest factor; a larger claim from camera
# centres alone is more likely a bad fit, and an accepted error multiplies into every later window.
POSE_FIT_RELATIVE_LIMITS = (0.1, 10.0)


@dataclass(frozen=True, eq=False)
class Sim3:
    """``X_world = s R X_window + t``: maps one window's raw poses into the chained world frame."""

    scale: float = 1.0
    rot: np.ndarray = dataclasses.field(default_factory=lambda: np.eye(3))
    trans: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(3))

    def apply_c2w(self, c2w: np.ndarray) -> np.ndarray:
        return sim3_apply_to_poses(self.scale, self.rot, self.trans, c2w)

    @property
    def is_identity(self) -> bool:
        return self.scale == 1.0 and np.array_equal(self.rot, np.eye(3)) and not self.trans.any()


@dataclass(frozen=True, eq=False)
class WindowAlignment:
    """How the latest window was attached to the chain (diagnostics, tests)."""

    window_index: int
    transform: Sim3
    method: str  # depth-median | pose-fit | pose-fallback (scale of the previous window kept)
    relative_scale: float  # new window scale / previous window scale
    anchor_offset: int  # overlap offset whose pose pins rotation and centre
    paired_frames: int  # overlap frames that are keyframes in both windows
    overlap_frames: int
    switch_ms: float  # wall time of the re-feed + alignment
    note: str = ""


@dataclass
class _OverlapFrame:
    """One recent frame as the next window will need it."""

    image: torch.Tensor  # preprocessed [3, H, W]: re-fed into the next window
    stamp: Any
    c2w: np.ndarray  # [4, 4] pose in the chained world frame, as the current window sees it
    depth: Optional[np.ndarray]  # [H, W] in world units (raw depth x chain scale), when the depth head ran
    is_keyframe: bool  # stored in the window that produced ``c2w`` (pairing rule of §15)


def validate_window(stream: StreamConfig) -> list[str]:
    """Reasons why the window policy cannot run with ``stream``; empty when it can."""
    problems: list[str] = []
    if stream.overlap_frames < stream.scale_frames:
        problems.append(
            f"overlap_frames ({stream.overlap_frames}) must be >= scale_frames ({stream.scale_frames}): "
            "a new window starts with a joint scale-frame call on the first overlap frames"
        )
    if stream.overlap_frames >= stream.max_stored_frames:
        problems.append(
            f"overlap_frames ({stream.overlap_frames}) must be < max_stored_frames ({stream.max_stored_frames}): "
            "each window must have room for new frames after re-feeding the overlap"
        )
    return problems


class LimitAction(enum.Enum):
    PUSH_AGAIN = "push the frame again"  # the policy made room in the same world frame (a new window)
    NEW_SESSION = "new session"  # a new world frame whose first frame is the one at the limit


class AtLimit(NamedTuple):
    """A policy's answer to ``StoredFrameLimit``: what the manager does next, and why."""

    action: LimitAction
    reason: str


@dataclass(frozen=True)
class Refeed:
    """The stamp of a frame the window policy feeds again into the next window. Its result is used
    for the alignment only; the frame already had its final outcome, so a reset that discards a
    ``Refeed`` must not report it again (the manager leaves them out of ``SessionStart.discarded``)."""

    stamp: Any


class LongRunPolicy:
    """The hooks the session manager calls. Every policy defines ``at_limit``; the other defaults
    leave frames, results and warnings as they are, so a policy overrides only what it changes.

    A policy is built from the ``StreamConfig`` (``problems`` lists settings it cannot run with, so
    they are refused before a model is built) and is handed the session in the one hook that needs
    it instead of keeping a reference: no reference cycle, so dropping a session frees its caches and
    model at once, not at the next garbage collection.

    The window chain attributes below are what the node's diagnostics and the tests read through the
    manager; a policy without windows hands results out in the session's own frame (window 0, identity).
    """

    name: ClassVar[str] = ""
    window_index: int = 0  # windows chained in the current world frame so far (0 = the first window)
    window_switches: int = 0  # since the policy was built (across resets): diagnostics
    last_alignment: Optional[WindowAlignment] = None

    def __init__(self, stream: StreamConfig) -> None:
        problems = self.problems(stream)
        if problems:
            raise ValueError("; ".join(problems))

    @staticmethod
    def problems(stream: StreamConfig) -> list[str]:
        """Reasons why this policy cannot run with ``stream``; empty when it can."""
        return []

    @property
    def transform(self) -> Sim3:
        """Current window -> world frame."""
        return Sim3()

    @property
    def overlap_buffered(self) -> int:
        """Frames held for the next window."""
        return 0

    # ------------------------------------------------------------------ hooks
    def admit(self) -> None:
        """Before each frame: raise a ``SessionError`` to refuse it (nothing has changed yet)."""

    def at_limit(self, session: StreamingSession, limit: StoredFrameLimit) -> AtLimit:
        """The session signalled ``limit`` for a keyframe. Raise ``SessionStopped`` to refuse the frame
        (then nothing may have changed), or say what the manager does next. Any other exception is a
        fault: the manager's failure path starts a new session."""
        raise NotImplementedError

    def to_world(self, processed: Processed) -> FrameResult:
        """Every result before the manager hands it out, in the order processed."""
        return processed.result

    def reset(self, stream: StreamConfig) -> None:
        """A new world frame starts (every new session, whoever asked for it)."""

    def warnings(self, out: list[str]) -> list[str]:
        """The session's warnings as this policy sees them."""
        return out


    def next_frame_index(self, session: StreamingSession) -> int:
        """The ``frame_index`` the next frame handed out gets."""
        return session.frames_pushed

    # ------------------------------------------------------------------ saved sessions
    def state_dict(self) -> dict:
        """The policy's state as JSON data (its tensors: ``state_tensors``)."""
        return {"name": self.name, "window_index": self.window_index, "window_switches": self.window_switches}

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return {}

    def load_state(self, state: dict, tensors: dict[str, torch.Tensor]) -> None:
        """Continue from ``state_dict``/``state_tensors`` of a policy of the same name."""
        if state["name"] != self.name:
            raise ValueError(f"long_run_policy {state['name']!r} != {self.name!r}")
        self.window_index = int(state["window_index"])
        self.window_switches = int(state["window_switches"])


class StopPolicy(LongRunPolicy):
    """At the limit the session refuses frames (``SessionStopped``, the node's ``REFUSED_POLICY``)
    until reset: for a user who wants one world frame and no silent change of it."""

    name = "stop"

    def __init__(self, stream: StreamConfig) -> None:
        super().__init__(stream)
        self.stopped = False

    def admit(self) -> None:
        if self.stopped:
            raise SessionStopped("long-run policy 'stop' reached; reset the session to continue")

    def at_limit(self, session: StreamingSession, limit: StoredFrameLimit) -> AtLimit:
        self.stopped = True
        raise SessionStopped(
            f"{limit.stored} stored frames reached the limit (max_stored_frames="
            f"{session.stream_cfg.max_stored_frames}); long_run_policy '{self.name}' refuses further frames "
            "until reset"
        )

    def reset(self, stream: StreamConfig) -> None:
        self.stopped = False

    def state_dict(self) -> dict:
        return {**super().state_dict(), "stopped": self.stopped}

    def load_state(self, state: dict, tensors: dict[str, torch.Tensor]) -> None:
        super().load_state(state, tensors)
        self.stopped = bool(state["stopped"])

    def warnings(self, out: list[str]) -> list[str]:
        if self.stopped:
            return out + ["long-run policy 'stop' reached: frames are refused until reset"]
        return out


class ResetPolicy(LongRunPolicy):
    """At the limit a new session starts (new world frame, the next session id) and the frame that
    hit the limit becomes its first scale frame: the stream goes on, the trajectory jumps."""

    name = "reset"

    def at_limit(self, session: StreamingSession, limit: StoredFrameLimit) -> AtLimit:
        return AtLimit(LimitAction.NEW_SESSION,
                       f"stored-frame limit {limit.limit} reached: long_run_policy '{self.name}' starts a new "
                       "session (new world frame)")


class WindowPolicy(LongRunPolicy):
    """Chains windows inside one world frame instead of stopping.

    At the stored-frame limit (``at_limit``, for the keyframe that would pass ``max_stored_frames``):

    1. the KV and camera caches are emptied (``session_id`` kept: same world frame) and
       ``window_index`` increments;
    2. the last ``overlap_frames`` frames are fed again - a joint phase-1 call on the first
       ``scale_frames`` of them, then one by one with keyframes counted afresh; their outputs are
       only used for the alignment, never handed out again;
    3. the Sim(3) mapping the new window onto the chained world frame is fitted on the overlap
       (``_fit_alignment``);
    4. the manager pushes the current frame again: it and every later one are processed in the new
       window and handed out with that Sim(3) applied to ``c2w`` (and depth multiplied by its scale).
       ``pose_enc`` stays raw (the model's own output in the window's frame).

    ``FrameResult.c2w`` therefore always lives in the first window's world frame and
    ``frame_index`` keeps counting within the session. A new session starts a new world frame and
    clears the chain. A fault during the switch is not caught here: the manager's failure path
    starts a new session, so no pose is ever handed out in a half-built window's frame.
    """

    name = "window"

    def __init__(self, stream: StreamConfig) -> None:
        super().__init__(stream)
        self.window_switches = 0
        self._reset_chain(stream.overlap_frames)

    @staticmethod
    def problems(stream: StreamConfig) -> list[str]:
        return validate_window(stream)

    @property
    def transform(self) -> Sim3:
        return self._sim3

    @property
    def overlap_buffered(self) -> int:
        """Frames held for the next window (never more than ``overlap_frames``)."""
        return len(self._overlap)

    # ------------------------------------------------------------------ hooks
    def reset(self, stream: StreamConfig) -> None:
        self._reset_chain(stream.overlap_frames)

    def warnings(self, out: list[str]) -> list[str]:
        """The session's warnings minus the approach to ``max_stored_frames``, plus alignment trouble.

        Here reaching ``max_stored_frames`` is routine (a window switch), not a limit about to be
        hit, so that line would keep the diagnostics at WARN forever.
        """
        out = [w for w in out if not w.startswith("stored frames ")]
        a = self.last_alignment
        if a is not None and a.method == "pose-fallback":
            out.append(
                f"window {a.window_index} (switch {self.window_switches}): the overlap's motion could not "
                f"fix the scale ({a.note}); kept the previous window's scale"
            )
        return out

    def to_world(self, processed: Processed) -> FrameResult:
        raw = processed.result
        result = self._to_world(raw)
        if self._switch_note is not None:  # the first frame handed out by a new window says so
            result = dataclasses.replace(result, frame_extra={**result.frame_extra, "window_switch": self._switch_note})
            self._switch_note = None
        self._overlap.append(_OverlapFrame(processed.image, raw.stamp, result.c2w, result.depth, raw.is_keyframe))
        self._published += 1
        return result

    def at_limit(self, session: StreamingSession, limit: StoredFrameLimit) -> AtLimit:
        scale_frames = session.stream_cfg.scale_frames
        if len(self._overlap) < scale_frames:  # nothing has changed yet: a new world frame, honestly
            return AtLimit(LimitAction.NEW_SESSION,
                           f"only {len(self._overlap)} frames buffered for window {self.window_index + 1}, "
                           f"scale_frames={scale_frames} needed: a new session instead of a window switch")
        self._start_next_window(session)
        # the re-fed overlap (>= scale_frames frames) finished phase 1: the frame is a phase-2 frame now
        return AtLimit(LimitAction.PUSH_AGAIN, f"window {self.window_index} started")

    def next_frame_index(self, session: StreamingSession) -> int:
        return self._published

    # ------------------------------------------------------------------ saved sessions
    def state_dict(self) -> dict:
        """The chain (Sim(3), frames handed out, the pending switch note) and the overlap buffer's
        poses; the overlap's images and depths are ``state_tensors``. The overlap stamps are not
        kept: re-fed frames only feed the alignment, their stamps are never handed out."""
        sim = self._sim3
        overlap = list(self._overlap)
        return {
            **super().state_dict(),
            "sim3": {"scale": sim.scale, "rot": sim.rot.tolist(), "trans": sim.trans.tolist()},
            "published": self._published, "switch_note": self._switch_note,
            "overlap_maxlen": self._overlap.maxlen,
            "overlap_c2w": [f.c2w.tolist() for f in overlap],
            "overlap_keyframe": [bool(f.is_keyframe) for f in overlap],
            "overlap_depth": bool(overlap) and all(f.depth is not None for f in overlap),
        }

    def state_tensors(self) -> dict[str, torch.Tensor]:
        overlap = list(self._overlap)
        if not overlap:
            return {}
        out = {"overlap_images": torch.stack([f.image for f in overlap]).contiguous()}  # [N, 3, H, W]
        if all(f.depth is not None for f in overlap):
            out["overlap_depth"] = torch.from_numpy(np.stack([f.depth for f in overlap]))  # [N, H, W]
        return out

    def load_state(self, state: dict, tensors: dict[str, torch.Tensor]) -> None:
        super().load_state(state, tensors)
        sim = state["sim3"]
        self._sim3 = Sim3(float(sim["scale"]), np.asarray(sim["rot"], dtype=np.float64),
                          np.asarray(sim["trans"], dtype=np.float64))
        self._published = int(state["published"])
        self._switch_note = state["switch_note"]
        self.last_alignment = None  # diagnostics of a switch before the save: not kept
        self._overlap = deque(maxlen=int(state["overlap_maxlen"]))
        images = tensors.get("overlap_images")
        depth = tensors.get("overlap_depth") if state["overlap_depth"] else None
        for i, (c2w, is_kf) in enumerate(zip(state["overlap_c2w"], state["overlap_keyframe"])):
            assert images is not None
            self._overlap.append(_OverlapFrame(
                images[i].clone(), None, np.asarray(c2w, dtype=np.float64),
                None if depth is None else depth[i].numpy().copy(), bool(is_kf)))

    # ------------------------------------------------------------------ window switch
    def _reset_chain(self, overlap_frames: int) -> None:
        self._overlap: deque[_OverlapFrame] = deque(maxlen=max(1, overlap_frames))
        self.window_index = 0
        self._sim3 = Sim3()
        self.last_alignment = None
        self._published = 0  # frames handed out in this world frame: the continuing frame_index
        self._switch_note: Optional[dict] = None

    def _start_next_window(self, session: StreamingSession) -> None:
        start = time.perf_counter()
        overlap = list(self._overlap)
        previous = self._sim3
        session.begin_window()  # empties both caches and the counters; session_id unchanged
        self.window_index += 1
        self.window_switches += 1
        raw: list[FrameResult] = []
        for frame in overlap:  # window-local results: only the alignment sees them
            raw += [p.result for p in session.push(frame.image, Refeed(frame.stamp))]
        raw += [p.result for p in session.flush()]
        if len(raw) != len(overlap):  # every re-fed frame yields exactly one result
            raise RuntimeError(f"re-feeding {len(overlap)} overlap frames gave {len(raw)} results")
        alignment = self._fit_alignment(overlap, raw, previous, start)
        self._sim3 = alignment.transform
        self.last_alignment = alignment
        # The next window's overlap must be seen by the window that is current then (§15 chains
        # window w-1's own aligned poses), so the re-fed frames are re-recorded from this window.
        self._overlap.clear()
        for frame, r in zip(overlap, raw):
            world = self._to_world(r)
            self._overlap.append(_OverlapFrame(frame.image, frame.stamp, world.c2w, world.depth, r.is_keyframe))
        self._switch_note = {
            "window_index": self.window_index,
            "method": alignment.method,
            "scale": alignment.transform.scale,
            "relative_scale": alignment.relative_scale,
            "switch_ms": alignment.switch_ms,
        }
        session.log(
            f"window {self.window_index} started on {len(overlap)} overlap frames: {alignment.method} "
            f"scale {alignment.transform.scale:.4g} (x{alignment.relative_scale:.4g}), anchor offset "
            f"{alignment.anchor_offset}, {alignment.switch_ms:.0f} ms"
        )

    def _fit_alignment(
        self, overlap: list[_OverlapFrame], raw: list[FrameResult], previous: Sim3, start: float
    ) -> WindowAlignment:
        """Sim(3) of the new window onto the chained world frame, from the overlap frames.

        Rotation and centre follow §15: pinned by an anchor frame (the last overlap frame that is a
        keyframe in both windows; the last frame if there is none, so the pose about to be published
        continues exactly from the last published one). Scale, by preference:

        * ``depth-median`` (§15) when both windows have depth: median of world-scaled old depth over
          new raw depth, over all pixels of the paired frames that have a depth map in both windows
          (``depth_every`` > 1 runs the depth head on some frames only);
        * ``pose-fit``: the least-squares similarity (Umeyama) between the overlap's camera centres
          in both windows, when they span enough motion and fit well;
        * ``pose-fallback``: otherwise the previous window's scale (relative scale 1): a camera
          standing still or turning in place carries no scale information, and successive windows
          of a continuous stream see nearly the same scene, hence nearly the same normalisation.
        """
        n = len(overlap)
        paired = [i for i in range(n) if overlap[i].is_keyframe and raw[i].is_keyframe]
        anchor = paired[-1] if paired else n - 1
        method, note = "pose-fallback", ""
        scale = previous.scale
        use = [i for i in (paired or [anchor]) if overlap[i].depth is not None and raw[i].depth is not None]
        if use:
            scale = alignment_scale(
                np.stack([overlap[i].depth for i in use]), np.stack([raw[i].depth for i in use]),
                limits=SCALE_LIMITS,
            )
            method = "depth-median"
        else:
            fitted, note = _centre_scale(
                np.stack([r.c2w[:3, 3] for r in raw]),
                np.stack([f.c2w[:3, 3] for f in overlap]),
                previous.scale,
            )
            if fitted is not None:
                scale, method = fitted, "pose-fit"
        s, rot, trans = window_alignment(overlap[anchor].c2w, raw[anchor].c2w, scale)
        return WindowAlignment(
            window_index=self.window_index,
            transform=Sim3(s, rot, trans),
            method=method,
            relative_scale=s / previous.scale,
            anchor_offset=anchor,
            paired_frames=len(paired),
            overlap_frames=n,
            switch_ms=(time.perf_counter() - start) * 1e3,
            note=note,
        )

    def _to_world(self, raw: FrameResult) -> FrameResult:
        """Window-local result -> published result: c2w (and depth) in the chained world frame."""
        sim = self._sim3
        changes: dict[str, Any] = {"window_index": self.window_index, "frame_index": self._published}
        if not sim.is_identity:
            changes["c2w"] = sim.apply_c2w(raw.c2w)
            if raw.depth is not None and sim.scale != 1.0:
                changes["depth"] = (raw.depth * sim.scale).astype(np.float32)
        return dataclasses.replace(raw, **changes)


def _centre_scale(src: np.ndarray, dst: np.ndarray, previous_scale: float) -> tuple[Optional[float], str]:
    """Scale of the similarity ``dst ~ s R src + t`` between camera centres [N, 3], or ``None`` + why.

    ``src`` are the new window's raw centres, ``dst`` the same frames in the world frame (whose units
    are the previous window's units times ``previous_scale``).
    """
    n = src.shape[0]
    if n < 2:
        return None, f"{n} overlap frame"
    spread_src = float(np.sqrt(((src - src.mean(0)) ** 2).sum(1).mean()))
    spread_dst = float(np.sqrt(((dst - dst.mean(0)) ** 2).sum(1).mean()))
    if spread_src < MIN_OVERLAP_MOTION or spread_dst < MIN_OVERLAP_MOTION * previous_scale:
        return None, f"camera centres spread {spread_src:.3g} (window units) < {MIN_OVERLAP_MOTION}"
    if n == 2:
        scale = float(np.linalg.norm(dst[1] - dst[0]) / np.linalg.norm(src[1] - src[0]))
        residual = 0.0
    else:
        scale, rot, trans = umeyama_sim3(src, dst)
        fitted = scale * src @ rot.T + trans
        residual = float(np.sqrt(((fitted - dst) ** 2).sum(1).mean()))
    if residual > MAX_FIT_RESIDUAL * spread_dst:
        return None, f"similarity residual {residual:.3g} > {MAX_FIT_RESIDUAL} x spread {spread_dst:.3g}"
    lo, hi = POSE_FIT_RELATIVE_LIMITS
    if not (np.isfinite(scale) and lo * previous_scale <= scale <= hi * previous_scale):
        return None, f"fitted scale {scale:.3g} outside {POSE_FIT_RELATIVE_LIMITS} x the previous {previous_scale:.3g}"
    return scale, ""


_POLICIES: dict[str, type[LongRunPolicy]] = {cls.name: cls for cls in (WindowPolicy, ResetPolicy, StopPolicy)}


def policy_class(name: str) -> type[LongRunPolicy]:
    """The one place that maps a ``long_run_policy`` name to the class that implements it."""
    try:
        return _POLICIES[name]
    except KeyError:
        raise ValueError(f"long_run_policy must be one of {tuple(_POLICIES)} (got {name!r})") from None


def make_policy(stream: StreamConfig) -> LongRunPolicy:
    """A fresh policy for ``stream.long_run_policy``; ``ValueError`` with the reasons when the name is
    unknown or the policy cannot run with ``stream`` (window: ``overlap_frames``)."""
    return policy_class(stream.long_run_policy)(stream)


__all__ = [
    "AtLimit", "LimitAction", "LongRunPolicy", "Refeed", "ResetPolicy", "Sim3", "StopPolicy", "WindowAlignment",
    "WindowPolicy", "make_policy", "policy_class", "validate_window",
]
