"""StreamingSession: preprocessed frames in, FrameResults out, over one model and its caches (docs/model.md §9, §12).

The session owns the model's caches and the streaming state machine of ONE world frame:

* phase 1 — the first ``scale_frames`` frames are buffered and processed in one call, all
  attending to each other; they become the scale frames, kept forever;
* phase 2 — every later frame alone; keyframes (every ``keyframe_interval``-th) are stored in the
  KV cache, non-keyframes attend to the cache plus themselves and are forgotten (the FlashInfer
  semantics of §9.5, in every backend);
* the stored-frame limit — the RoPE frame index never reaches ``max_frame_num``; before a keyframe
  would pass ``max_stored_frames`` the session raises ``StoredFrameLimit`` *before changing any
  state*, and the session manager asks the long-run policy what happens (``core/session_manager.py``).

Its results are in its own first frame: the long-run policy (``long_run.py``), which chains windows
into one world frame, is the manager's, not the session's. So the session has no policy branch, no
callbacks up and no nested calls; one constructor takes the resolved runtime, and the manager is the
only code that builds one (``SessionManager``). It imports no rclpy: the node hands in preprocessed
tensors and publishes what comes back.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Optional

import numpy as np
import torch

from .cache import CacheFull, CameraKVCache, PagedKVCache
from .cache.factory import CACHE_SIZING_FIELDS, build_camera_cache, build_global_cache, saved_state_problems
from .config import (
    PATCH_SIZE,
    SPECIAL_TOKENS_PER_FRAME,
    ModelConfig,
    StreamConfig,
    replace,
    stored_frame_limit,
    validate_stream,
)
from .cuda_graph import GraphedFrameStep, side_stream
from .geometry import decode_pose_encoding
from .model import LingBotMap
from .model.fusion import BlockFusion, fused_blocks
from .readback import StagedReadback
from .results import CacheSnapshot, FrameResult
from .runtime import ResolvedRuntime
from .session_errors import FrameSizeChanged, SessionError, StoredFrameLimit

TRAINING_RANGE_STORED_FRAMES = 320  # README of the official model: quality degrades beyond this


class Processed(NamedTuple):
    """One processed frame and the input it came from (the window policy keeps recent inputs)."""

    result: FrameResult
    image: torch.Tensor  # [3, H, W] the preprocessed frame


@dataclass
class _PendingFrame:
    image: torch.Tensor  # [3, H, W]
    stamp: Any


@dataclass(frozen=True)
class PhaseTwoStep:
    """A phase-2 frame between ``prepare_step`` and ``finish_step``: what its model call needs.

    A lone session runs ``prepare -> open -> model call -> close -> finish`` inside ``push``; a
    ``StreamGroup`` (``core/stream_group.py``) prepares and opens the steps of several sessions, runs
    ONE model call over their frames, then closes and finishes each (or aborts each, on a fault)."""

    image: torch.Tensor  # [3, H, W]
    stamp: Any
    rope_index: int  # F: the frame's RoPE index (stored frames before it)
    store: bool  # a keyframe (stored) or not
    with_depth: bool  # the depth head runs on this frame


class StreamingSession:
    """One camera stream through LingBot-Map with a paged KV cache, in one world frame."""

    def __init__(self, model: LingBotMap, model_cfg: ModelConfig, stream_cfg: StreamConfig,
                 runtime: ResolvedRuntime, log: Callable[[str], None] = print) -> None:
        """``runtime`` (``runtime.resolve_runtime`` / ``resolve_for``) decides device, dtype, the
        attention backend and kernel, CUDA graphs, block fusion and autocast: one owner of those."""
        problems = validate_stream(stream_cfg)
        if problems:
            raise ValueError("; ".join(problems))
        self.model = model
        self.model_cfg = model_cfg
        self.stream_cfg = stream_cfg
        self.runtime = runtime
        self.device = runtime.device
        self.dtype = runtime.dtype
        self.log = log
        self.session_id = 0  # set by the manager (``reset``): monotonic over every session it starts
        self.use_cuda_graphs = runtime.cuda_graphs  # the benchmark's kernel profile turns it off for a while
        ours = runtime.step_kernels == "triton"
        self._fusion: Optional[BlockFusion] = (
            BlockFusion(triton_kernels=ours, depth_head=True, frame_tiles=runtime.prefix_kernel == "gluon")
            if runtime.compile_blocks else None)
        self._graph_step: Optional[GraphedFrameStep] = None
        self._graph_key: Optional[tuple] = None
        self._readback = StagedReadback()
        self._kv: Optional[PagedKVCache] = None  # allocated for the first frame's size
        self._camera_kv: Optional[CameraKVCache] = None
        self._kv_hw: Optional[tuple[int, int]] = None
        # False: localization against the map in the cache - every frame gets a pose, none is stored
        # (a non-keyframe's step: the cache's map bytes, page table and counters stay as they are)
        self.mapping = True
        # Where the global cache's pages live: None, its own tensor; a group hands out shares of its
        # pool (``StreamGroup``: ``shape, dtype -> view or None``)
        self.page_storage: Optional[Callable[[tuple[int, ...], torch.dtype], Optional[torch.Tensor]]] = None
        self._new_session_state()

    # ------------------------------------------------------------------ public API
    @property
    def buffered(self) -> int:
        """Frames waiting for the joint scale-frame call."""
        return len(self._pending)

    def pending_stamps(self) -> list[Any]:
        """Stamps of the frames buffered for the joint scale-frame call, oldest first: the frames a
        reset or a new session discards (the caller gives each its final status)."""
        return [f.stamp for f in self._pending]

    @property
    def frames_stored(self) -> int:
        """F: frames stored in the KV cache in this session (the next keyframe's RoPE index)."""
        return self._stored

    @property
    def frames_pushed(self) -> int:
        """Frames processed in this session so far (the next frame's ``frame_index``)."""
        return self._frame_index

    @property
    def cache_frame_size(self) -> Optional[tuple[int, int]]:
        """The frame size (H, W) the caches are allocated for; None before the first frame."""
        return self._kv_hw

    def caches(self) -> list:
        """The allocated caches (the memory report counts their pools)."""
        return [c for c in (self._kv, self._camera_kv) if c is not None]

    def push(self, frame: torch.Tensor | np.ndarray, stamp: Any = None) -> list[Processed]:
        """Take one preprocessed frame ``[3, H, W]`` in [0, 1]; return the frames processed now.

        ``SessionError`` for a frame the session refuses, ``StoredFrameLimit`` for a keyframe that
        would pass the stored-frame limit; both leave the session exactly as it was."""
        image, hw = self._checked_frame(frame)
        if self._phase1_done:
            return self._process_phase2(image, stamp)
        if not self.mapping:
            raise SessionError("mapping is off and the session has no map yet (no scale frames): load a "
                               "session or turn mapping on")
        self._image_hw = hw
        self._pending.append(_PendingFrame(image, stamp))
        if len(self._pending) >= self.stream_cfg.scale_frames:
            try:
                return self._process_scale_frames()
            except SessionError:  # refused: this frame is not taken, the earlier ones stay buffered
                self._pending.pop()
                raise
        return []

    def _checked_frame(self, frame: torch.Tensor | np.ndarray) -> tuple[torch.Tensor, tuple[int, int]]:
        """The frame as a float32 ``[3, H, W]`` tensor and its size; ``SessionError`` when refused."""
        image = torch.as_tensor(frame, dtype=torch.float32)
        if image.ndim != 3 or image.shape[0] != 3:
            raise SessionError(f"expected a [3, H, W] frame, got shape {tuple(image.shape)}")
        hw = (int(image.shape[1]), int(image.shape[2]))
        if hw[0] % PATCH_SIZE or hw[1] % PATCH_SIZE or hw[0] <= 0 or hw[1] <= 0:
            raise SessionError(f"frame size {hw[1]}x{hw[0]} is not a positive multiple of {PATCH_SIZE}")
        if self._image_hw is not None and hw != self._image_hw:
            raise FrameSizeChanged(
                f"frame size changed from {self._image_hw[1]}x{self._image_hw[0]} to {hw[1]}x{hw[0]} "
                "within a session; reset the session to change resolution"
            )
        return image, hw

    # ------------------------------------------------------------------ a phase-2 step in parts (StreamGroup)
    @property
    def in_phase2(self) -> bool:
        """The next frame is a phase-2 frame (one model call each; a group batches these)."""
        return self._phase1_done

    @property
    def image_hw(self) -> Optional[tuple[int, int]]:
        """The session's frame size (None before its first frame)."""
        return self._image_hw

    def prepare_step(self, frame: torch.Tensor | np.ndarray, stamp: Any = None) -> PhaseTwoStep:
        """Check a phase-2 frame and decide its step (keyframe, RoPE index, depth); nothing changes.
        Raises what ``push`` raises for it (``SessionError``, ``StoredFrameLimit``), and
        ``SessionError`` when the session is not in phase 2."""
        image, _ = self._checked_frame(frame)
        if not self._phase1_done:
            raise SessionError("the session has no map yet: its frame goes through push (phase 1)")
        return self._prepare_phase2(image, stamp)

    def open_step(self, step: PhaseTwoStep) -> None:
        """Append the step's frame to both caches and plan their attention (``SessionError``:
        nothing changed). Then the model call, then ``close_step`` (or ``abort_step``)."""
        self._open_caches(1, store=step.store, undoable=True)

    def close_step(self) -> None:
        """End both caches' step after the model call (a non-keyframe is rolled back)."""
        assert self._kv is not None and self._camera_kv is not None
        self._kv.end_step()
        self._camera_kv.end_step()

    def abort_step(self) -> bool:
        """End an open step whose model call failed, as if it never ran. True when the caches are
        exactly as before it (``PagedKVCache.abort_step``); False: the session needs a reset."""
        assert self._kv is not None and self._camera_kv is not None
        exact = self._kv.abort_step()
        return self._camera_kv.abort_step() and exact

    def finish_step(self, step: PhaseTwoStep, out, latency_ms: float) -> list[Processed]:
        """The step's result from its model outputs (``out``: pose_enc [1, 9], depth and confidence
        [1, H, W] or None, host arrays), counters advanced."""
        if step.store:
            self._stored += 1
        result = self._make_result(out, 0, stamp=step.stamp, is_keyframe=step.store, is_scale=False,
                                   rope_index=step.rope_index, latency_ms=latency_ms)
        self._frame_index += 1
        return [Processed(result, step.image)]

    @property
    def global_cache(self) -> Optional[PagedKVCache]:
        return self._kv

    @property
    def camera_cache(self) -> Optional[CameraKVCache]:
        return self._camera_kv

    def inference(self):
        """The context every model call of this session runs in (inference mode, the runtime's autocast)."""
        return self._inference(None)

    def graph_inference(self):
        """The context of a captured step: ``inference`` with the session's compiled block bodies (when
        the runtime fuses blocks), as its own graphed step runs; a group's batched graph uses it."""
        return self._inference(self._fusion)

    def flush(self) -> list[Processed]:
        """Process buffered scale frames now, fewer than ``scale_frames`` if the stream ended early."""
        if self._phase1_done or not self._pending:
            return []
        return self._process_scale_frames()

    def reset(self, session_id: int) -> None:
        """Start session ``session_id``: caches emptied, counters zeroed, a new world frame."""
        self.session_id = session_id
        self._new_session_state()

    def begin_window(self) -> None:
        """Empty the caches and counters but keep ``session_id``: the window policy's next window,
        whose results it maps into the same world frame."""
        self._new_session_state()

    def reconfigure(self, stream: StreamConfig) -> None:
        """New stream settings for the next session (the manager starts it); the caches are dropped
        when their geometry changes. Nothing changes when the settings are refused."""
        problems = validate_stream(stream)
        if problems:
            raise ValueError("; ".join(problems))
        old = self.stream_cfg
        self.stream_cfg = stream
        if any(getattr(stream, name) != getattr(old, name) for name in CACHE_SIZING_FIELDS):
            self._release_caches()

    def set_keyframe_interval(self, keyframe_interval: int) -> None:
        """Change kf from the next frame on, without a new session (core/settings.py: "next_frame")."""
        if keyframe_interval < 1:
            raise ValueError(f"keyframe_interval must be >= 1 (got {keyframe_interval})")
        # Keyframe phase restarts at the next frame so that it is a keyframe (a fresh anchor).
        self._kf_origin = self._frame_index
        self.stream_cfg = replace(self.stream_cfg, keyframe_interval=keyframe_interval)

    def snapshot(self) -> CacheSnapshot:
        return self._snapshot(visible_keys=self._last_visible_keys)

    def warnings(self) -> list[str]:
        """Limits being approached, for the node's diagnostics (WARN before anything is hit); the
        long-run policy edits them (``LongRunPolicy.warnings``)."""
        return limit_warnings(self.stream_cfg, self._stored, self._kv)

    # ------------------------------------------------------------------ saved sessions
    def state_problem(self) -> str:
        """Why the session cannot be saved now ("" when it can): a map exists and no step is half done."""
        if not self._phase1_done or self._kv is None or self._camera_kv is None:
            return (f"the session has no map yet ({len(self._pending)} of {self.stream_cfg.scale_frames} scale "
                    "frames buffered): nothing to save")
        return ""

    def state_dict(self) -> dict:
        """The streaming state machine and the caches' layout as JSON data; the K/V themselves come
        from ``block_tensors`` / ``camera_tensor``. Raises ``SessionError`` with ``state_problem``."""
        problem = self.state_problem()
        if problem:
            raise SessionError(problem)
        assert self._kv is not None and self._camera_kv is not None and self._image_hw is not None
        return {
            "image_hw": list(self._image_hw), "frame_index": self._frame_index, "stored": self._stored,
            "scale_count": self._scale_count, "kf_origin": self._kf_origin,
            "last_visible_keys": self._last_visible_keys, "keyframe_interval": self.stream_cfg.keyframe_interval,
            "global_cache": self._kv.state_dict(), "camera_cache": self._camera_kv.state_dict(),
        }

    @property
    def num_cache_blocks(self) -> int:
        return self.model_cfg.depth

    def block_tensors(self, block: int, on_device: bool = False) -> dict[str, torch.Tensor]:
        assert self._kv is not None
        return self._kv.block_tensors(block, on_device)

    def camera_tensor(self, on_device: bool = False) -> torch.Tensor:
        assert self._camera_kv is not None
        return self._camera_kv.stored_tensor(on_device)

    def bytes_in_use(self) -> int:
        """The bytes a save copies of both caches (0 before the caches exist)."""
        if self._kv is None or self._camera_kv is None:
            return 0
        return self._kv.bytes_in_use() + self._camera_kv.bytes_in_use()

    def check_state(self, state: dict) -> list[str]:
        """Why a saved state cannot go into this session (empty: it can). Nothing changes: for a frame
        size the session has no caches for, the caches it would build are checked without building them."""
        hw = (int(state["image_hw"][0]), int(state["image_hw"][1]))
        if self._kv is not None and self._camera_kv is not None and self._kv_hw == hw:
            return self._kv.check_state(state["global_cache"]) + self._camera_kv.check_state(state["camera_cache"])
        return saved_state_problems(self.runtime, self.model_cfg, self.stream_cfg, self.dtype, state, hw)

    def load_state(self, state: dict, block_tensors: Callable[[int], dict], camera: torch.Tensor) -> None:
        """Continue a saved session: counters, keyframe phase and both caches restored in place (the
        preallocated pools and their addresses stay, so captured CUDA graphs are replayed as after a
        window switch: their plan comes from the page table at every step). Raises ``ValueError``
        when the state does not fit (``check_state``)."""
        problems = self.check_state(state)
        if problems:
            raise ValueError("; ".join(problems))
        self._ensure_caches((int(state["image_hw"][0]), int(state["image_hw"][1])))  # the pools stay when they fit
        assert self._kv is not None and self._camera_kv is not None
        self._new_session_state()
        self._kv.load_state(state["global_cache"], block_tensors)
        self._camera_kv.load_state(state["camera_cache"], camera)
        self._image_hw = (int(state["image_hw"][0]), int(state["image_hw"][1]))
        self._phase1_done = True
        self._frame_index, self._stored = int(state["frame_index"]), int(state["stored"])
        self._scale_count, self._kf_origin = int(state["scale_count"]), int(state["kf_origin"])
        self._last_visible_keys = int(state["last_visible_keys"])

    # ------------------------------------------------------------------ internals
    def _new_session_state(self) -> None:
        self._pending: list[_PendingFrame] = []
        self._phase1_done = False
        self._image_hw: Optional[tuple[int, int]] = None
        self._frame_index = 0  # frames pushed into this session
        self._stored = 0  # F
        self._scale_count = 0  # frames processed in phase 1 (== scale_frames unless flushed early)
        self._kf_origin = 0  # session frame index of the first phase-2 frame (kf phase origin)
        self._last_visible_keys = 0
        if self._kv is not None:
            self._kv.reset()
        if self._camera_kv is not None:
            self._camera_kv.reset()

    def _release_caches(self) -> None:
        self._graph_step = None
        self._graph_key = None
        self._kv = None
        self._camera_kv = None
        self._kv_hw = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _ensure_caches(self, hw: tuple[int, int]) -> None:
        """Allocate the caches for this frame size (page size = patches per frame) once."""
        if self._kv is not None and self._kv_hw == hw:
            return
        self._release_caches()
        cfg, scfg = self.model_cfg, self.stream_cfg
        page_size = (hw[0] // PATCH_SIZE) * (hw[1] // PATCH_SIZE)
        if SPECIAL_TOKENS_PER_FRAME + max(hw[0], hw[1]) // PATCH_SIZE > scfg.max_frame_num:
            raise SessionError(
                f"frame {hw[1]}x{hw[0]} needs more spatial RoPE rows than max_frame_num={scfg.max_frame_num}"
            )
        # which backends, how large the pools: cache/factory.py decides from the resolved runtime
        self._kv = build_global_cache(self.runtime, cfg, scfg, page_size, storage=self.page_storage)
        self._camera_kv = build_camera_cache(self.runtime, cfg, scfg)
        self._kv_hw = hw
        backend = self._kv.single_frame_backend
        plan = getattr(backend, "runs_plan", None)
        splits = getattr(backend, "kv_splits", 1)
        if plan is not None and plan.ragged:
            self.log(f"{hw[1]}x{hw[0]} frames: our attention kernel reads {plan.reason}")
        elif splits > 1:
            self.log(f"{hw[1]}x{hw[0]} frames: the split kernel reads its prefix as {splits} key ranges "
                     "(fewer, fuller waves of thread blocks on the GPU)")

    def _graphed_step(self) -> GraphedFrameStep:
        """The captured one-frame step for the current size and head settings (built on first use)."""
        key = (self._kv_hw, self.stream_cfg.camera_iterations)
        if self._graph_step is None or self._graph_key != key:
            kv = self._kv
            ones = torch.ones(1, dtype=torch.long, device=self.device)  # phase 2: camera and scale variant 1
            fusion = self._fusion  # compiled block bodies (None: eager blocks), compiled in the warm-up run
            depth_stream = side_stream(self.device, "depth")  # the depth head beside the camera head
            image_hw = self._kv_hw

            def encode(images: torch.Tensor) -> torch.Tensor:
                with self._inference(fusion):
                    return self.model.embed(images, ones, ones)  # [1, P, C]

            def run_from_tokens(tokens: torch.Tensor, rope_frames: torch.Tensor, with_depth: bool):
                with self._inference(fusion):
                    return self.model.forward_embedded(
                        tokens, image_hw, rope_frames=rope_frames, global_attention=self._kv,
                        camera_attention=self._camera_kv, num_iterations=self.stream_cfg.camera_iterations,
                        with_depth=with_depth, max_positions=self.stream_cfg.max_frame_num, depth_stream=depth_stream)

            backend = kv.single_frame_backend
            self._graph_step = GraphedFrameStep(
                self.model, self._kv_hw, self.device, encode, run_from_tokens,
                lambda: getattr(backend, "plan_signature", ()),
            )
            self._graph_key = key
        return self._graph_step

    @property
    def _with_depth(self) -> bool:
        return self.stream_cfg.with_depth and self.model.depth_head is not None

    def _depth_on(self, frame_index: int) -> bool:
        """Whether the depth head runs on this phase-2 frame: frames 0, N, 2N, ... of the session
        (``depth_every``; the scale frames, processed together, always have it)."""
        return self._with_depth and frame_index % self.stream_cfg.depth_every == 0

    def _is_keyframe(self, frame_index: int) -> bool:
        return (frame_index - self._kf_origin) % self.stream_cfg.keyframe_interval == 0

    def _process_scale_frames(self) -> list[Processed]:
        frames = self._pending
        images = torch.stack([f.image for f in frames])  # [S, 3, H, W]
        s = images.shape[0]
        rope_frames = torch.arange(s)  # f = 0..S-1
        camera_variant = (torch.arange(s) > 0).long()  # frame 0 of the session is the reference
        scale_variant = torch.zeros(s, dtype=torch.long)  # jointly processed scale frames
        # The frames stay in ``_pending`` until the call succeeds: if allocating the caches or the
        # model raises (out of memory, a fault), whoever resets the session accounts for them.
        self._ensure_caches(self._image_hw)  # type: ignore[arg-type]
        out, elapsed_ms = self._run_model(images, rope_frames, camera_variant, scale_variant, store=True,
                                          with_depth=self._with_depth)
        self._pending = []
        self._stored = s
        self._scale_count = s
        self._phase1_done = True
        self._kf_origin = s
        processed = []
        for j, frame in enumerate(frames):
            result = self._make_result(
                out, j, stamp=frame.stamp, is_keyframe=True, is_scale=True, rope_index=j, latency_ms=elapsed_ms / s
            )
            processed.append(Processed(result, frame.image))
            self._frame_index += 1
        return processed

    def _prepare_phase2(self, image: torch.Tensor, stamp: Any) -> PhaseTwoStep:
        is_kf = self.mapping and self._is_keyframe(self._frame_index)
        f = self._stored
        # Never feed f >= max_frame_num (the official model crashes there, docs/model.md §16 #3); the
        # long-run policy acts before the configured stored-frame limit is passed.
        limit = stored_frame_limit(self.stream_cfg)
        if is_kf and f + 1 > limit:
            raise StoredFrameLimit(f, limit)
        return PhaseTwoStep(image, stamp, f, is_kf, self._depth_on(self._frame_index))

    def _process_phase2(self, image: torch.Tensor, stamp: Any) -> list[Processed]:
        step = self._prepare_phase2(image, stamp)
        out, elapsed_ms = self._run_model(
            image[None],
            torch.tensor([step.rope_index]),
            torch.ones(1, dtype=torch.long),  # every phase-2 frame: camera/register variant 1
            torch.ones(1, dtype=torch.long),  # and scale variant 1 (docs/model.md §6)
            store=step.store,
            with_depth=step.with_depth,
            one_frame_step=True,
        )
        return self.finish_step(step, out, elapsed_ms)

    def _run_model(
        self,
        images: torch.Tensor,
        rope_frames: torch.Tensor,
        camera_variant: torch.Tensor,
        scale_variant: torch.Tensor,
        *,
        store: bool,
        with_depth: bool,
        one_frame_step: bool = False,
    ):
        """One model step over the caches. ``one_frame_step``: a phase-2 frame (camera and scale variant
        1), which the CUDA graphs serve; the scale frames (even a single one) take the eager path."""
        assert self._kv is not None and self._camera_kv is not None
        s = images.shape[0]
        self._check_camera_room(s)
        start = time.perf_counter()
        graphed = self._graphed_step() if self.use_cuda_graphs and one_frame_step else None
        if graphed is not None:
            # The frame in first: with an encoder graph the device encodes it while the host plans the
            # step below (a refused step leaves only the encoder's scratch tokens written).
            graphed.begin(images)
        self._open_caches(s, store=store, room_checked=True)
        try:
            if graphed is not None:
                out = graphed.finish(int(rope_frames[0]), with_depth)
            else:
                out = self._call_model(images, rope_frames, camera_variant, scale_variant, with_depth)
            # [S, 9], [S, H, W] x 2 or None: one wait for the step and the copies (readback.py)
            pose_enc, depth, conf = self._readback.fetch((out.pose_enc, out.depth, out.depth_conf))
        finally:
            self._kv.end_step()
            self._camera_kv.end_step()
        elapsed_ms = (time.perf_counter() - start) * 1e3
        return (pose_enc, depth, conf), elapsed_ms

    def _check_camera_room(self, frames: int) -> None:
        """Refuse a step the camera cache cannot take, before either cache changes."""
        assert self._camera_kv is not None
        if self._camera_kv.length + frames > self._camera_kv.capacity:
            raise SessionError(
                f"camera-head cache full ({self._camera_kv.length} of {self._camera_kv.capacity} frames)"
            )

    def _open_caches(self, frames: int, *, store: bool, room_checked: bool = False, undoable: bool = False) -> None:
        """Both caches' ``begin_step`` for a step of ``frames`` frames (``SessionError``: nothing changed;
        ``undoable``: ``abort_step`` can take it back)."""
        assert self._kv is not None and self._camera_kv is not None
        if not room_checked:
            self._check_camera_room(frames)
        try:
            self._kv.begin_step(frames, store=store, undoable=undoable)
        except CacheFull as exc:
            raise SessionError(f"KV cache full: {exc}") from exc
        self._camera_kv.begin_step(frames, store=store)
        self._last_visible_keys = self._kv.visible_key_count

    def _call_model(self, images, rope_frames, camera_variant, scale_variant, with_depth: bool):
        """The eager model call of a step (multi-frame steps, and one-frame steps without CUDA graphs).
        The caches are the session's current ones."""
        with self._inference(None):
            return self.model(
                images.to(self.device, non_blocking=True),
                rope_frames=rope_frames.to(self.device),
                camera_variant=camera_variant.to(self.device),
                scale_variant=scale_variant.to(self.device),
                global_attention=self._kv,
                camera_attention=self._camera_kv,
                num_iterations=self.stream_cfg.camera_iterations,
                with_depth=with_depth,
                max_positions=self.stream_cfg.max_frame_num,
            )

    @contextlib.contextmanager
    def _inference(self, fusion: Optional[BlockFusion]):
        """Where every model call runs: inference mode, the official autocast and, with ``fusion``, the
        compiled block bodies (None keeps what the caller set: the benchmark's profile runs eager steps fused)."""
        fused = fused_blocks(fusion) if fusion is not None else contextlib.nullcontext()
        if hasattr(self.model.depth_head, "frame_chunk"):  # frames per depth-head call (the budget's choice)
            self.model.depth_head.frame_chunk = self.stream_cfg.depth_chunk
            self.model.depth_head.use_channels_last(self.runtime.depth_channels_last)
        compute = self.dtype if self.runtime.autocast else torch.float32
        with torch.inference_mode(), _autocast(self.device, compute), fused:
            yield

    def _make_result(self, out, j: int, **flags: Any) -> FrameResult:
        """Frame ``j`` of a model call's output (``flags``: stamp, is_keyframe, is_scale, rope_index,
        latency_ms) as this session reports it."""
        return frame_result(out, j, frame_index=self._frame_index, session_id=self.session_id,
                            image_hw=self._image_hw, cache=self._snapshot(visible_keys=self._last_visible_keys),
                            **flags)

    def _snapshot(self, visible_keys: int) -> CacheSnapshot:
        return cache_snapshot(self._kv, self._camera_kv, stored=self._stored, visible_keys=visible_keys,
                              max_frame_num=self.stream_cfg.max_frame_num)


def frame_result(out, j: int, *, frame_index: int, session_id: int, image_hw: Any, cache: CacheSnapshot,
                 stamp: Any, is_keyframe: bool, is_scale: bool, rope_index: int, latency_ms: float) -> FrameResult:
    """One frame's ``FrameResult`` from the model's outputs (``out``: pose_enc [S, 9], depth and
    confidence [S, H, W] or None); the pose is decoded in float64."""
    pose_enc, depth, conf = out
    c2w, intrinsics = decode_pose_encoding(pose_enc[j].astype(np.float64), image_hw)
    return FrameResult(
        frame_index=frame_index,
        session_id=session_id,
        stamp=stamp,
        pose_enc=pose_enc[j].astype(np.float32),
        c2w=c2w,
        intrinsics=intrinsics,
        image_hw=image_hw,
        is_keyframe=is_keyframe,
        is_scale_frame=is_scale,
        rope_frame_index=rope_index,
        cache=cache,
        latency_ms=latency_ms,
        depth=None if depth is None else depth[j],
        depth_conf=None if conf is None else conf[j],
    )


def limit_warnings(cfg: StreamConfig, stored: int, kv: Optional[PagedKVCache]) -> list[str]:
    """The session's limits being approached (stored frames, the training range, special pages)."""
    out: list[str] = []
    limit = stored_frame_limit(cfg)
    if stored >= 0.9 * limit:
        out.append(
            f"stored frames {stored} of {limit} before the long-run policy '{cfg.long_run_policy}' acts"
        )
    if stored > TRAINING_RANGE_STORED_FRAMES:
        out.append(f"{stored} stored frames exceed the ~{TRAINING_RANGE_STORED_FRAMES}-view training range")
    if kv is not None:
        st = kv.stats()
        if st.special_pages_capacity and st.special_pages >= 0.9 * st.special_pages_capacity:
            out.append(f"special pages {st.special_pages} of {st.special_pages_capacity}")
    return out


def cache_snapshot(kv: Optional[PagedKVCache], camera_kv: Optional[CameraKVCache], *, stored: int,
                   visible_keys: int, max_frame_num: int) -> CacheSnapshot:
    """The caches' statistics as one frame reports them (an empty snapshot before the caches exist)."""
    if kv is None or camera_kv is None:
        return CacheSnapshot(max_frame_num=max_frame_num)
    st = kv.stats()
    return CacheSnapshot(
        frames_stored=stored,
        scale_frames=st.scale_frames,
        window_frames=st.window_frames,
        frames_evicted=st.frames_evicted,
        page_size=st.page_size,
        patch_pages_total=st.patch_pages_total,
        scale_pages=st.scale_frames,
        window_pages=st.window_frames,
        free_pages=st.free_pages,
        special_pages=st.special_pages,
        special_pages_capacity=st.special_pages_capacity,
        special_tokens=st.special_tokens,
        visible_keys=visible_keys,
        camera_cache_frames=camera_kv.length,
        camera_cache_capacity=camera_kv.capacity,
        max_frame_num=max_frame_num,
        kv_bytes=kv.nbytes + camera_kv.nbytes,
    )


def _autocast(device: torch.device, dtype: torch.dtype):
    """The official GPU recipe: aggregator weights in bf16/fp16 under autocast (docs/model.md §14)."""
    if dtype == torch.float32:
        return torch.autocast(device_type=device.type, enabled=False)
    return torch.autocast(device_type=device.type, dtype=dtype)


__all__ = ["PhaseTwoStep", "Processed", "StreamingSession", "TRAINING_RANGE_STORED_FRAMES"]
