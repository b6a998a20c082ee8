"""Long-run policies around the streaming session (docs/model.md §15; issue 5).

A camera never stops, but one streaming session cannot run forever: the RoPE table has
``max_frame_num`` rows, the camera-head cache never evicts and is preallocated for
``max_frame_num`` frames, the special-token pool is sized from ``max_frame_num``, and quality
degrades past the ~320 stored views the model was trained on. The base session stops at
``max_stored_frames`` (<= ``max_frame_num - 1``, checked in ``config.validate_stream``), which keeps
all three caches inside their preallocated capacity by construction; ``long_run_policy`` says what
happens there:

* ``reset`` / ``stop`` — handled by ``StreamingSession`` itself (new world frame / refuse frames);
* ``window`` — ``WindowedSession`` below: the official windowed mode of §15 made online. The same
  caches are emptied and refilled with the last ``overlap_frames`` frames, the new window is mapped
  onto the chained world frame by a similarity transform, and every later pose is published in
  the first window's world frame, so the trajectory continues without a jump and memory stays flat
  (the caches are reused, the overlap buffer is a bounded deque, no per-frame history is kept).

``make_session`` is the one factory the node and the tools use, so the policy in force is chosen in
one place.
"""
from __future__ import annotations

import dataclasses
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np
import torch

from .config import RuntimeConfig, StreamConfig, validate_stream
from .geometry import alignment_scale, sim3_apply_to_poses, umeyama_sim3, window_alignment
from .results import FrameResult
from .stream import SessionError, StreamingSession

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


class WindowedSession(StreamingSession):
    """A streaming session that chains windows inside one world frame instead of stopping.

    At the stored-frame limit (the base class calls ``_on_stored_frame_limit`` for the keyframe that
    would pass ``max_stored_frames``):

    1. the KV and camera caches are emptied (``session_id`` kept: same world frame) and
       ``window_index`` increments;
    2. the last ``overlap_frames`` frames are fed again - a joint phase-1 call on the first
       ``scale_frames`` of them, then one by one with keyframes counted afresh; their outputs are
       only used for the alignment, never published again;
    3. the Sim(3) mapping the new window onto the chained world frame is fitted on the overlap
       (``_fit_alignment``);
    4. the current frame and every later one are processed in the new window and published with
       that Sim(3) applied to ``c2w`` (and depth multiplied by its scale). ``pose_enc`` stays raw
       (the model's own output in the window's frame).

    ``FrameResult.c2w`` therefore always lives in the first window's world frame and
    ``frame_index`` keeps counting within the session. A user ``reset()`` starts a new world frame
    and clears the chain.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        problems = validate_window(self.stream_cfg) if self.stream_cfg.long_run_policy == "window" else []
        if problems:
            raise ValueError("; ".join(problems))
        self.window_switches = 0  # since construction (across resets): diagnostics
        self._reset_chain()

    # ------------------------------------------------------------------ public API
    @property
    def window_index(self) -> int:
        """Windows chained in the current world frame so far (0 = the first window)."""
        return self._window_index

    @property
    def transform(self) -> Sim3:
        """Current window -> world frame."""
        return self._sim3

    @property
    def last_alignment(self) -> Optional[WindowAlignment]:
        return self._last_alignment

    @property
    def overlap_buffered(self) -> int:
        """Frames held for the next window (never more than ``overlap_frames``)."""
        return len(self._overlap)

    def reset(self) -> None:
        """User reset: new world frame, new session id, window chain cleared."""
        self._reset_chain()
        super().reset()

    def reconfigure(self, stream: StreamConfig) -> None:
        problems = validate_stream(stream)
        if not problems and stream.long_run_policy == "window":
            problems = validate_window(stream)
        if problems:
            raise ValueError("; ".join(problems))
        super().reconfigure(stream)  # calls self.reset(): the chain is cleared too

    def warnings(self) -> list[str]:
        """The base warnings, minus the approach to ``max_stored_frames``, plus alignment trouble.

        Under the window policy reaching ``max_stored_frames`` is routine (a window switch), not a
        limit about to be hit, so that line would keep the diagnostics at WARN forever.
        """
        out = super().warnings()
        if self.stream_cfg.long_run_policy == "window":
            out = [w for w in out if not w.startswith("stored frames ")]
            a = self._last_alignment
            if a is not None and a.method == "pose-fallback":
                out.append(
                    f"window {a.window_index} (switch {self.window_switches}): the overlap's motion could not "
                    f"fix the scale ({a.note}); kept the previous window's scale"
                )
        return out

    # ------------------------------------------------------------------ hooks into the base session
    def _process_scale_frames(self) -> list[FrameResult]:
        self._call_images = [p.image for p in self._pending]
        return super()._process_scale_frames()

    def _process_phase2(self, image: torch.Tensor, stamp: Any) -> list[FrameResult]:
        self._call_images = [image]
        return super()._process_phase2(image, stamp)

    def _make_result(self, out, j: int, **kwargs) -> FrameResult:
        raw = super()._make_result(out, j, **kwargs)
        if self._refeeding:
            return raw  # window-local; only the alignment sees it
        result = self._to_world(raw)
        if self._switch_note is not None:  # the first frame published by a new window says so
            result = dataclasses.replace(result, frame_extra={**result.frame_extra, "window_switch": self._switch_note})
            self._switch_note = None
        if self.stream_cfg.long_run_policy == "window":
            self._overlap.append(
                _OverlapFrame(self._call_images[j], raw.stamp, result.c2w, result.depth, raw.is_keyframe)
            )
        self._published += 1
        return result

    def _on_stored_frame_limit(self, image: torch.Tensor, stamp: Any) -> list[FrameResult]:
        if self.stream_cfg.long_run_policy != "window":
            return super()._on_stored_frame_limit(image, stamp)
        if self._refeeding or self._switching:
            # Cannot happen with validated settings (overlap < max_stored_frames); never loop.
            raise SessionError(
                f"stored-frame limit reached while starting window {self._window_index}: "
                f"overlap_frames={self.stream_cfg.overlap_frames} leaves no room below "
                f"max_stored_frames={self.stream_cfg.max_stored_frames}"
            )
        self._switching = True
        try:
            try:
                self._start_next_window()
            except Exception as exc:
                # A half-built window would publish poses in an unaligned frame. Start over honestly:
                # a new world frame (session_id + 1), like the reset policy, and refuse this frame.
                self.log(f"window {self._window_index} could not start ({exc}); starting a new session")
                self.reset()
                raise SessionError(f"window switch failed, new session {self.session_id} started: {exc}") from exc
            return self._process_phase2(image, stamp)
        finally:
            self._switching = False

    # ------------------------------------------------------------------ window switch
    def _reset_chain(self) -> None:
        maxlen = max(1, self.stream_cfg.overlap_frames)
        self._overlap: deque[_OverlapFrame] = deque(maxlen=maxlen)
        self._window_index = 0
        self._sim3 = Sim3()
        self._last_alignment: Optional[WindowAlignment] = None
        self._published = 0  # frames published in this session: the continuing frame_index
        self._refeeding = False
        self._switching = False
        self._call_images: list[torch.Tensor] = []
        self._switch_note: Optional[dict] = None

    def _start_next_window(self) -> None:
        start = time.perf_counter()
        overlap = list(self._overlap)
        if len(overlap) < self.stream_cfg.scale_frames:
            raise SessionError(
                f"only {len(overlap)} frames buffered for the next window, scale_frames="
                f"{self.stream_cfg.scale_frames} needed"
            )
        previous = self._sim3
        self._new_session_state()  # empties both caches and the counters; session_id unchanged
        self._window_index += 1
        self.window_switches += 1
        raw: list[FrameResult] = []
        self._refeeding = True
        try:
            for frame in overlap:
                raw += self.push(frame.image, frame.stamp)
            raw += self.flush()
        finally:
            self._refeeding = False
        if len(raw) != len(overlap):  # every re-fed frame yields exactly one result
            raise SessionError(f"re-feeding {len(overlap)} overlap frames gave {len(raw)} results")
        alignment = self._fit_alignment(overlap, raw, previous, start)
        self._sim3 = alignment.transform
        self._last_alignment = alignment
        # The next window's overlap must be seen by the window that is current then (§15 chains
        # window w-1's own aligned poses), so the re-fed frames are re-recorded from this window.
        self._overlap.clear()
        for frame, r in zip(overlap, raw):
            world = self._to_world(r)
            self._overlap.append(_OverlapFrame(frame.image, frame.stamp, world.c2w, world.depth, r.is_keyframe))
        self._switch_note = {
            "window_index": self._window_index,
            "method": alignment.method,
            "scale": alignment.transform.scale,
            "relative_scale": alignment.relative_scale,
            "switch_ms": alignment.switch_ms,
        }
        self.log(
            f"window {self._window_index} started on {len(overlap)} overlap frames: {alignment.method} "
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
          new raw depth, over all pixels of the paired frames;
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
        with_depth = all(f.depth is not None for f in overlap) and all(r.depth is not None for r in raw)
        if with_depth:
            use = paired or [anchor]
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
            window_index=self._window_index,
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
        changes: dict[str, Any] = {"window_index": self._window_index, "frame_index": self._published}
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


def session_class(policy: str) -> type[StreamingSession]:
    """The one place that maps a long-run policy to the session class that implements it:
    ``window`` chains windows (``WindowedSession``); ``reset`` and ``stop`` are handled by the base
    session at its stored-frame limit."""
    return WindowedSession if policy == "window" else StreamingSession


def make_session(runtime: RuntimeConfig, stream: StreamConfig, log: Callable[[str], None] = print) -> StreamingSession:
    """Build the model and the session for ``stream.long_run_policy``.

    Window settings are validated here too, so a bad ``overlap_frames`` is rejected with a reason
    before the model is built.
    """
    if stream.long_run_policy == "window":
        problems = validate_window(stream)
        if problems:
            raise ValueError("; ".join(problems))
    return session_class(stream.long_run_policy).from_config(runtime, stream, log=log)


__all__ = ["Sim3", "WindowAlignment", "WindowedSession", "make_session", "session_class", "validate_window"]
