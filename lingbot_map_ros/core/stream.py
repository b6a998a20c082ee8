"""StreamingSession: frames in, FrameResults out (docs/model.md §9, §12).

The session owns the model's caches and the streaming state machine:

* phase 1 — the first ``scale_frames`` frames are buffered and processed in one call, all
  attending to each other; they become the scale frames, kept forever;
* phase 2 — every later frame alone; keyframes (every ``keyframe_interval``-th) are stored in the
  KV cache, non-keyframes attend to the cache plus themselves and are forgotten (the FlashInfer
  semantics of §9.5, in every backend);
* limits — the RoPE frame index never reaches ``max_frame_num``; before ``max_stored_frames``
  stored frames the long-run policy acts.

The long-run policy (stop, reset or window) is an object the session owns (``long_run``, built by
``long_run.make_policy`` from ``long_run_policy``) and calls at fixed hook points: before a phase-2
frame (``admit``), at the stored-frame limit (``at_limit``), on every result it hands out
(``publish``: the window policy's world-frame transform and overlap buffer), on reset and for the
warnings. So the session has no branch on the policy's name, one session class serves every policy,
and a runtime change of the policy swaps that object on the same model and caches (``reconfigure``).

It imports no rclpy: the node hands in preprocessed tensors and publishes what comes back.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np
import torch

from .cache import CacheFull, CameraKVCache, PagedKVCache
from .cache.factory import build_camera_cache, build_global_cache
from .config import (
    PATCH_SIZE,
    SPECIAL_TOKENS_PER_FRAME,
    ModelConfig,
    RuntimeConfig,
    StreamConfig,
    model_config,
    replace,
    validate_runtime,
    validate_stream,
)
from .cuda_graph import GraphedFrameStep
from .geometry import decode_pose_encoding
from .long_run import LongRunPolicy, Sim3, WindowAlignment, make_policy, policy_class
from .model import LingBotMap, build_model
from .model.fusion import BlockFusion, fused_blocks
from .results import CacheSnapshot, FrameResult
from .runtime import ResolvedRuntime, resolve_for, resolve_runtime
from .session_errors import FrameSizeChanged, SessionError, SessionStopped  # noqa: F401 - re-exported: callers catch them from here

TRAINING_RANGE_STORED_FRAMES = 320  # README of the official model: quality degrades beyond this


@dataclass(frozen=True)
class SessionInfo:
    backend: str  # attention backend in use: flashinfer | sdpa
    backend_reason: str  # why that backend was chosen
    dtype: str  # compute dtype of the aggregator
    device: str
    model_preset: str
    depth_available: bool
    random_weights: bool


@dataclass
class _PendingFrame:
    image: torch.Tensor  # [3, H, W]
    stamp: Any


class StreamingSession:
    """One camera stream through LingBot-Map with a paged KV cache."""

    def __init__(
        self,
        model: LingBotMap,
        model_cfg: ModelConfig,
        stream_cfg: StreamConfig,
        *,
        device: torch.device,
        dtype: torch.dtype,
        backend: str = "sdpa",
        info: Optional[SessionInfo] = None,
        log: Callable[[str], None] = print,
        cuda_graphs: bool = True,
        flashinfer_kernel: str = "auto",
        autocast: bool = True,
        sdpa_kernel: str = "auto",
        compile_blocks: str | bool = "off",
        runtime: Optional[ResolvedRuntime] = None,
    ) -> None:
        """``runtime``: the resolved runtime (``runtime.resolve_runtime``); when given it decides
        backend, kernels, graphs, fusion and autocast, and the keyword settings below are ignored.
        Without it they are resolved here by the same function (``runtime.resolve_for``):
        ``autocast`` = the official mixed-precision recipe (``False`` runs the aggregator purely in
        ``dtype``: faster, further from the official bf16 numbers); ``compile_blocks`` defaults to
        off on this path so that direct constructions (tests) never pay a compile."""
        problems = validate_stream(stream_cfg)
        if problems:
            raise ValueError("; ".join(problems))

        self.long_run: LongRunPolicy = make_policy(stream_cfg)  # raises for settings the policy cannot run with
        self.model = model
        self.model_cfg = model_cfg
        self.stream_cfg = stream_cfg
        if runtime is None:
            runtime = resolve_for(
                device, dtype, backend=backend, flashinfer_kernel=flashinfer_kernel, sdpa_kernel=sdpa_kernel,
                cuda_graphs=cuda_graphs, compile_blocks=compile_blocks, autocast=autocast,
            )
        self.runtime = runtime
        self.device = runtime.device
        self.dtype = runtime.dtype
        self.backend = runtime.backend
        self.log = log
        self.info = info or SessionInfo(
            backend=self.backend,
            backend_reason="chosen by the caller",
            dtype=str(dtype).replace("torch.", ""),
            device=str(device),
            model_preset=model_cfg.preset,
            depth_available=model.depth_head is not None,
            random_weights=True,
        )
        self.session_id = 0
        # all resolved by runtime.resolve_for (one owner); kept as attributes for the callers
        self.use_cuda_graphs = runtime.cuda_graphs
        self.flashinfer_kernel = runtime.flashinfer_kernel
        self.autocast = runtime.autocast
        self._fusion: Optional[BlockFusion] = BlockFusion() if runtime.compile_blocks else None
        self._graph_step: Optional[GraphedFrameStep] = None
        self._graph_key: Optional[tuple] = None
        self._kv: Optional[PagedKVCache] = None  # allocated for the first frame's size
        self._camera_kv: Optional[CameraKVCache] = None
        self._kv_hw: Optional[tuple[int, int]] = None
        self._new_session_state()

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_config(
        cls, runtime: RuntimeConfig, stream: StreamConfig, log: Callable[[str], None] = print
    ) -> "StreamingSession":
        """Build model and session from the settings users give (node parameters, CLI options).

        Every setting is checked before the model is built, the long-run policy's own ones too."""

        problems = validate_runtime(runtime) + validate_stream(stream)
        if not problems:  # the policy name is known now
            problems = policy_class(stream.long_run_policy).problems(stream)
        if problems:
            raise ValueError("; ".join(problems))
        resolved = resolve_runtime(runtime)
        preset = runtime.resolved_preset()
        cfg = model_config(preset)
        model, report = build_model(
            cfg,
            checkpoint=runtime.checkpoint,
            seed=runtime.seed,
            device=resolved.device,
            dtype=resolved.dtype,  # the aggregator is built/loaded in the compute dtype: one copy, no fp32 detour
            enable_depth=True,
            allow_unsafe=runtime.allow_unsafe_checkpoint,
        )
        if not runtime.checkpoint:
            log(
                f"NO CHECKPOINT: using random weights of the '{preset}' preset (seed {runtime.seed}); "
                "poses are NOT meaningful"
            )
        else:
            log(f"checkpoint {runtime.checkpoint}: {report.summary()}")
        _cast_for_inference(model, resolved.dtype)
        info = SessionInfo(
            backend=resolved.backend,
            backend_reason=resolved.backend_reason,
            dtype=str(resolved.dtype).replace("torch.", ""),
            device=str(resolved.device),
            model_preset=preset,
            depth_available=model.depth_head is not None,
            random_weights=not runtime.checkpoint,
        )
        log(f"attention backend {info.backend} ({info.backend_reason}); dtype {info.dtype}; device {info.device}")
        session = cls(model, cfg, stream, device=resolved.device, dtype=resolved.dtype, info=info, log=log,
                      runtime=resolved)
        if session.device.type == "cuda":
            log(f"one-frame steps: {resolved.summary()}")
        return session

    # ------------------------------------------------------------------ public API
    @property
    def buffered(self) -> int:
        """Frames waiting for the joint scale-frame call."""
        return len(self._pending)

    def pending_stamps(self) -> list[Any]:
        """Stamps of the frames buffered for the joint scale-frame call, oldest first: the frames a
        reset or a new session discards (the caller gives each its final status)."""
        return [f.stamp for f in self._pending]

    # The long-run window chain, read by the node's diagnostics and the tests; delegated to the policy
    # (a policy without windows: window 0, no switches, identity transform, nothing buffered).
    @property
    def window_index(self) -> int:
        """Windows chained in the current world frame so far (0 = the first window)."""
        return self.long_run.window_index

    @property
    def window_switches(self) -> int:
        """Window switches since the policy was built (across resets)."""
        return self.long_run.window_switches

    @property
    def transform(self) -> Sim3:
        """Current window -> world frame."""
        return self.long_run.transform

    @property
    def last_alignment(self) -> Optional[WindowAlignment]:
        """How the latest window was attached to the chain (``None`` before the first switch)."""
        return self.long_run.last_alignment

    @property
    def overlap_buffered(self) -> int:
        """Frames held for the next window (never more than ``overlap_frames``)."""
        return self.long_run.overlap_buffered

    @property
    def frames_stored(self) -> int:
        """F: frames stored in the KV cache in this session (the next keyframe's RoPE index)."""
        return self._stored

    def push(self, frame: torch.Tensor | np.ndarray, stamp: Any = None) -> list[FrameResult]:
        """Take one preprocessed frame ``[3, H, W]`` in [0, 1]; return the frames processed now."""
        image = torch.as_tensor(frame, dtype=torch.float32)
        if image.ndim != 3 or image.shape[0] != 3:
            raise SessionError(f"expected a [3, H, W] frame, got shape {tuple(image.shape)}")
        hw = (int(image.shape[1]), int(image.shape[2]))
        if hw[0] % PATCH_SIZE or hw[1] % PATCH_SIZE or hw[0] <= 0 or hw[1] <= 0:
            raise SessionError(f"frame size {hw[1]}x{hw[0]} is not a positive multiple of {PATCH_SIZE}")
        if self._image_hw is None:
            self._image_hw = hw
        elif hw != self._image_hw:
            raise FrameSizeChanged(
                f"frame size changed from {self._image_hw[1]}x{self._image_hw[0]} to {hw[1]}x{hw[0]} "
                "within a session; reset the session to change resolution"
            )
        if self._phase1_done:
            return self._process_phase2(image, stamp)
        self._pending.append(_PendingFrame(image, stamp))
        if len(self._pending) >= self.stream_cfg.scale_frames:
            try:
                return self._process_scale_frames()
            except SessionError:  # refused: this frame is not taken, the earlier ones stay buffered
                self._pending.pop()
                raise
        return []

    def flush(self) -> list[FrameResult]:
        """Process buffered scale frames now, fewer than ``scale_frames`` if the stream ended early."""
        if self._phase1_done or not self._pending:
            return []
        return self._process_scale_frames()

    def reset(self) -> None:
        """Start a new session: caches emptied, counters zeroed, a new world frame (the policy's
        state too: the window chain, a reached 'stop')."""
        self.long_run.reset(self)
        self.session_id += 1
        self._new_session_state()

    def begin_window(self) -> None:
        """Empty the caches and counters but keep ``session_id``: the window policy's next window
        continues the same world frame."""
        self._new_session_state()

    def reconfigure(self, stream: StreamConfig) -> None:
        """Apply new stream settings by starting a new session (cache geometry may change).

        A changed ``long_run_policy`` swaps the policy object; the same policy keeps its object,
        reset like on any new session (its ``window_switches`` keep counting). Nothing changes when
        the settings are refused."""

        problems = validate_stream(stream)
        if problems:
            raise ValueError("; ".join(problems))
        policy = make_policy(stream)  # raises for settings the policy cannot run with: nothing changed yet
        if type(policy) is not type(self.long_run):
            self.long_run = policy
        geometry_changed = (
            stream.scale_frames != self.stream_cfg.scale_frames
            or stream.sliding_window != self.stream_cfg.sliding_window
            or stream.camera_iterations != self.stream_cfg.camera_iterations
            or stream.max_frame_num != self.stream_cfg.max_frame_num
        )
        self.stream_cfg = stream
        if geometry_changed:
            self._release_caches()
        self.reset()

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
        """Limits being approached, for the node's diagnostics (WARN before anything is hit)."""
        out: list[str] = []
        cfg = self.stream_cfg
        limit = min(cfg.max_stored_frames, cfg.max_frame_num - 1)
        if self._stored >= 0.9 * limit:
            out.append(
                f"stored frames {self._stored} of {limit} before the long-run policy '{cfg.long_run_policy}' acts"
            )
        if self._stored > TRAINING_RANGE_STORED_FRAMES:
            out.append(f"{self._stored} stored frames exceed the ~{TRAINING_RANGE_STORED_FRAMES}-view training range")
        if self._kv is not None:
            st = self._kv.stats()
            if st.special_pages_capacity and st.special_pages >= 0.9 * st.special_pages_capacity:
                out.append(f"special pages {st.special_pages} of {st.special_pages_capacity}")
        return self.long_run.warnings(out)

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
        self._kv = build_global_cache(self.runtime, cfg, scfg, page_size)
        self._camera_kv = build_camera_cache(self.runtime, cfg, scfg)
        self._kv_hw = hw

    def _graphed_step(self) -> GraphedFrameStep:
        """The captured one-frame step for the current size and head settings (built on first use)."""
        key = (self._kv_hw, self.stream_cfg.camera_iterations, self._with_depth)
        if self._graph_step is None or self._graph_key != key:
            kv = self._kv
            ones = torch.ones(1, dtype=torch.long, device=self.device)

            fusion = self._fusion  # compiled block bodies (None: eager blocks), compiled in the warm-up run

            def run(images: torch.Tensor, rope_frames: torch.Tensor):
                return self._call_model(images, rope_frames, ones, ones, fusion=fusion, validate=False)

            backend = kv.single_frame_backend
            self._graph_step = GraphedFrameStep(
                self.model, self._kv_hw, self.device, run, lambda: getattr(backend, "plan_signature", ())
            )
            self._graph_key = key
        return self._graph_step

    @property
    def _with_depth(self) -> bool:
        return self.stream_cfg.with_depth and self.model.depth_head is not None

    def _is_keyframe(self, frame_index: int) -> bool:
        return (frame_index - self._kf_origin) % self.stream_cfg.keyframe_interval == 0

    def _process_scale_frames(self) -> list[FrameResult]:
        frames = self._pending
        images = torch.stack([f.image for f in frames])  # [S, 3, H, W]
        s = images.shape[0]
        rope_frames = torch.arange(s)  # f = 0..S-1
        camera_variant = (torch.arange(s) > 0).long()  # frame 0 of the session is the reference
        scale_variant = torch.zeros(s, dtype=torch.long)  # jointly processed scale frames
        # The frames stay in ``_pending`` until the call succeeds: if allocating the caches or the
        # model raises (out of memory, a fault), whoever resets the session accounts for them.
        self._ensure_caches(self._image_hw)  # type: ignore[arg-type]
        out, elapsed_ms = self._run_model(images, rope_frames, camera_variant, scale_variant, store=True)
        self._pending = []
        self._stored = s
        self._scale_count = s
        self._phase1_done = True
        self._kf_origin = s
        results = []
        for j, frame in enumerate(frames):
            raw = self._make_result(
                out, j, stamp=frame.stamp, is_keyframe=True, is_scale=True, rope_index=j, latency_ms=elapsed_ms / s
            )
            results.append(self.long_run.publish(self, raw, frame.image))  # frame.image: [3, H, W]
            self._frame_index += 1
        return results

    def _process_phase2(self, image: torch.Tensor, stamp: Any) -> list[FrameResult]:
        self.long_run.admit()  # a policy that refuses frames (stop, once reached) raises here
        cfg = self.stream_cfg
        is_kf = self._is_keyframe(self._frame_index)
        f = self._stored
        # Never feed f >= max_frame_num (the official model crashes there, docs/model.md §16 #3); the
        # long-run policy acts before the configured stored-frame limit is passed.
        if is_kf and (f + 1 > cfg.max_stored_frames or f + 1 >= cfg.max_frame_num):
            return self.long_run.at_limit(self, image, stamp)
        out, elapsed_ms = self._run_model(
            image[None],
            torch.tensor([f]),
            torch.ones(1, dtype=torch.long),  # every phase-2 frame: camera/register variant 1
            torch.ones(1, dtype=torch.long),  # and scale variant 1 (docs/model.md §6)
            store=is_kf,
        )
        if is_kf:
            self._stored += 1
        raw = self._make_result(
            out, 0, stamp=stamp, is_keyframe=is_kf, is_scale=False, rope_index=f, latency_ms=elapsed_ms
        )
        result = self.long_run.publish(self, raw, image)  # image: [3, H, W]
        self._frame_index += 1
        return [result]

    def _run_model(
        self,
        images: torch.Tensor,
        rope_frames: torch.Tensor,
        camera_variant: torch.Tensor,
        scale_variant: torch.Tensor,
        *,
        store: bool,
    ):
        assert self._kv is not None and self._camera_kv is not None
        s = images.shape[0]
        # Check the camera cache's room first so that a refusal leaves both caches untouched.
        if self._camera_kv.length + s > self._camera_kv.capacity:
            raise SessionError(
                f"camera-head cache full ({self._camera_kv.length} of {self._camera_kv.capacity} frames)"
            )
        try:
            self._kv.begin_step(s, store=store)
        except CacheFull as exc:
            raise SessionError(f"KV cache full: {exc}") from exc
        self._camera_kv.begin_step(s, store=store)
        self._last_visible_keys = self._kv.visible_key_count
        start = time.perf_counter()
        try:
            if self.use_cuda_graphs and s == 1:
                out = self._graphed_step()(images, int(rope_frames[0]))
            else:
                out = self._call_model(images, rope_frames, camera_variant, scale_variant)
            pose_enc = out.pose_enc.float().cpu().numpy()  # [S, 9]; synchronises with the GPU
            depth = None if out.depth is None else out.depth.float().cpu().numpy()
            conf = None if out.depth_conf is None else out.depth_conf.float().cpu().numpy()
        finally:
            self._kv.end_step()
            self._camera_kv.end_step()
        elapsed_ms = (time.perf_counter() - start) * 1e3
        return (pose_enc, depth, conf), elapsed_ms

    def _call_model(self, images, rope_frames, camera_variant, scale_variant, *, fusion=None, validate: bool = True):
        """The one model call of a step, eager or captured into the one-frame CUDA graph (``fusion``:
        the compiled block bodies, graph step only; ``validate=False`` there: no host checks in a graph).
        The caches are the session's current ones; rebuilding them drops the captured graph."""
        # fusion None keeps what the caller set (the benchmark's kernel profile runs eager steps fused)
        fused = fused_blocks(fusion) if fusion is not None else contextlib.nullcontext()
        with torch.inference_mode(), _autocast(self.device, self.dtype if self.autocast else torch.float32), fused:
            return self.model(
                images.to(self.device, non_blocking=True),
                rope_frames=rope_frames.to(self.device),
                camera_variant=camera_variant.to(self.device),
                scale_variant=scale_variant.to(self.device),
                global_attention=self._kv,
                camera_attention=self._camera_kv,
                num_iterations=self.stream_cfg.camera_iterations,
                with_depth=self._with_depth,
                max_positions=self.stream_cfg.max_frame_num,
                validate=validate,
            )

    def _make_result(
        self, out, j: int, *, stamp: Any, is_keyframe: bool, is_scale: bool, rope_index: int, latency_ms: float
    ) -> FrameResult:
        pose_enc, depth, conf = out
        hw = self._image_hw
        c2w, intrinsics = decode_pose_encoding(pose_enc[j].astype(np.float64), hw)
        return FrameResult(
            frame_index=self._frame_index,
            session_id=self.session_id,
            stamp=stamp,
            pose_enc=pose_enc[j].astype(np.float32),
            c2w=c2w,
            intrinsics=intrinsics,
            image_hw=hw,  # type: ignore[arg-type]
            is_keyframe=is_keyframe,
            is_scale_frame=is_scale,
            rope_frame_index=rope_index,
            cache=self._snapshot(visible_keys=self._last_visible_keys),
            latency_ms=latency_ms,
            depth=None if depth is None else depth[j],
            depth_conf=None if conf is None else conf[j],
        )

    def _snapshot(self, visible_keys: int) -> CacheSnapshot:
        if self._kv is None or self._camera_kv is None:
            return CacheSnapshot(max_frame_num=self.stream_cfg.max_frame_num)
        st = self._kv.stats()
        return CacheSnapshot(
            frames_stored=self._stored,
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
            camera_cache_frames=self._camera_kv.length,
            camera_cache_capacity=self._camera_kv.capacity,
            max_frame_num=self.stream_cfg.max_frame_num,
            kv_bytes=self._kv.nbytes + self._camera_kv.nbytes,
        )


def make_session(runtime: RuntimeConfig, stream: StreamConfig, log: Callable[[str], None] = print) -> StreamingSession:
    """Model and session from the settings users give: the one builder of the node (through
    ``SessionManager``) and the tools; the long-run policy comes with the session."""
    return StreamingSession.from_config(runtime, stream, log=log)


def _autocast(device: torch.device, dtype: torch.dtype):
    """The official GPU recipe: aggregator weights in bf16/fp16 under autocast (docs/model.md §14)."""
    if dtype == torch.float32:
        return torch.autocast(device_type=device.type, enabled=False)
    return torch.autocast(device_type=device.type, dtype=dtype)


def _cast_for_inference(model: LingBotMap, dtype: torch.dtype) -> None:
    """Aggregator in the compute dtype; camera and depth heads stay fp32 (docs/model.md §14)."""
    model.eval()
    model.aggregator.to(dtype)
