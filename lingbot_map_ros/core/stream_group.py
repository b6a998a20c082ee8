"""StreamGroup: several camera streams over one model and one K/V page pool, in batched steps.

Each stream is a ``SessionManager`` of its own - its session, page table, window FIFO, special
pages, RoPE index, camera-head cache, long-run policy, saved sessions - over the ONE model the group
holds (the weights once). What the streams share besides the weights is the memory of their global
caches: one pool tensor, cut into a static share per stream (``cache/pool.py`` says why static
shares and not a common free list), built for the first frame size a stream brings. A stream whose
frames have another size (or whose geometry was changed alone) keeps pages of its own: it could not
be batched with the others anyway, since a batch is one frame size.

``step({name: (frame, stamp), ...})`` runs the frames it is given:

* **batched**: the phase-2 frames of two or more streams (same frame size and head settings) go
  through ONE model call - eager (``_forward``), or under CUDA graphs the captured step of that
  batch size (``_forward_graphed``; ``core/batched_graph.py`` also owns the
  choice between them and its reason: ``decision``, ``batch_path``). The image encoder, the frame
  blocks, every linear layer and the depth head see ``[B, ...]``; global attention is per stream
  (each frame's queries against its own stream's visible pages, ``cache/batched.py``), the camera
  head's attention per stream's cache. Each stream's step is opened, closed and finished by its own
  session (``StreamingSession``'s ``prepare_step`` / ``open_step`` / ``close_step`` /
  ``finish_step``), so its results are those of the same stream run alone
  (``test/test_stream_group.py`` and ``test/test_batched_graph.py`` check it to 1e-6).
* **alone**, through the stream's ``SessionManager.push`` exactly as a single-camera node does: a
  stream in phase 1 (scale frames, buffered and run together), a frame at the stored-frame limit
  (the long-run policy's window switch or new session), a frame refused, and the only phase-2 frame
  of a step (a batch of one is the lone path, CUDA graph included: N = 1 is today's speed).

Fault containment (every frame ends with exactly one result or one failure):

* a batched model call that raises (an out-of-memory, say; a captured step's capture or replay
  alike, and a failed capture also refuses its batch size from then on) cannot be blamed on one
  stream, so every stream of the batch is taken back to its state before the step (``abort_step``:
  the page tables to their marks; the step wrote only free pages and unused slots) and **re-run
  alone**; a stream whose lone run raises too gets what a lone stream gets (a new session,
  ``InferenceFailed``). A stream whose step cannot be undone exactly (an append that reused a page
  it evicted, the split backend's ``lowest`` order) gets a new session and the failure at once;
* a non-finite output stays in its stream (rows of a batch never mix outside attention, and
  attention is per stream): the result is handed out as a lone stream's would be, and the caller
  (the node) gives it ``NON_FINITE_OUTPUT`` and counts it per stream (``StreamOutcome.non_finite``).

Not thread-safe, like the managers: one thread owns the group.
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import torch

from .batched_graph import (
    BatchDecision,
    BatchGraphs,
    BatchKey,
    CaptureFailed,
    Capturer,
    CudaGraphCapturer,
    GraphedBatchStep,
    decide_batching,
)
from .cache.batched import GroupCameraAttention, GroupGlobalAttention
from .cache.pool import SharedKVPool, batched_index_capacity, batched_page_request
from .cache.sdpa_backend import BatchedSdpaBackend
from .config import SPECIAL_TOKENS_PER_FRAME, StreamConfig
from .cuda_graph import side_stream
from .footprint import Footprint, footprint, worst_case_height
from .memory_budget import MemoryBudget
from .model_host import ModelHost
from .readback import StagedReadback
from .results import FrameResult
from .session_errors import SessionError, StoredFrameLimit
from .session_events import InferenceFailed, SessionCause
from .session_manager import SessionManager, settings_problems
from .stream import PhaseTwoStep

BATCHED_ATTENTION = ("auto", "loop", "flashinfer", "pool-sdpa")


@dataclass(frozen=True)
class StreamOutcome:
    """What one stream's frame of a step came to: results (none while scale frames are buffered) or
    an error - ``SessionError`` (refused, nothing changed) or ``InferenceFailed`` (a new session)."""

    results: tuple[FrameResult, ...] = ()
    error: Optional[BaseException] = None
    batched: bool = False  # the frame ran in a batched model call

    @property
    def non_finite(self) -> bool:
        return any(r.non_finite_fields() for r in self.results)


@dataclass
class _Entry:
    name: str
    manager: SessionManager
    step: PhaseTwoStep
    frame: Any
    stamp: Any


def group_footprint(host: ModelHost, stream: StreamConfig, streams: int,
                    hw: Optional[tuple[int, int]] = None) -> Footprint:
    """The memory of ``streams`` streams of ``stream`` over ``host``'s model (the weights once), at
    ``hw`` or the tallest frame of the configured width (what the budget is held to, as for one stream)."""
    h, w = hw if hw is not None else (worst_case_height(stream.image_width), stream.image_width)
    return footprint(host.cfg, host.resolved, stream, h, w, streams)


class StreamGroup:
    """N camera streams, one model, one page pool per frame size, batched phase-2 steps."""

    def __init__(self, host: ModelHost, stream: StreamConfig, names: Sequence[str],
                 log: Callable[[str], None] = print, *, batched_attention: str = "auto",
                 batch: Optional[bool] = None, capturer: Optional[Capturer] = None) -> None:
        """``host``: the model every stream runs (``core/model_host.py``, the weights once); ``stream``:
        the settings of every stream (the pool's shares are cut for its geometry); ``names``: the
        streams, in order.
        ``batched_attention``: ``loop`` (each stream's own backend inside the attention call),
        ``flashinfer`` (one FlashInfer call over the pool), ``pool-sdpa`` (the same request over the
        pool through SDPA: the FlashInfer form's reference, any device), ``auto`` (FlashInfer when the
        runtime's backend is FlashInfer on CUDA, else the loop). ``batch``: run the phase-2 frames of
        several streams as one call (True: captured per batch size under CUDA graphs,
        ``core/batched_graph.py``) or each alone (False); None: batched, and each stream's own captured
        step where the batched form cannot be captured (``batched_graph.decide_batching`` decides, with
        its reason in ``decision``). ``capturer``: how batched steps are captured (default: CUDA graphs
        when the runtime has them; the CPU tests hand in a stand-in, which also selects the path)."""
        names = list(names)
        if not names or len(set(names)) != len(names):
            raise ValueError(f"stream names must be given, each once (got {names})")
        if batched_attention not in BATCHED_ATTENTION:
            raise ValueError(f"batched_attention must be one of {BATCHED_ATTENTION} (got {batched_attention!r})")
        self.host = host
        self.log = log
        self.names = names
        rt = host.resolved
        if batched_attention == "auto":
            batched_attention = "flashinfer" if rt.backend == "flashinfer" and rt.device.type == "cuda" else "loop"
        if batched_attention == "flashinfer":
            try:
                import flashinfer  # noqa: F401 - optional: refuse here, not at every batched step
            except ImportError as exc:
                raise ValueError(f"batched_attention 'flashinfer' needs the flashinfer package ({exc})") from None
        self.batched_attention = batched_attention
        # Checked before any stream allocates its caches, for all streams at once: with fit_window every
        # stream's window shrinks to what fits (one geometry for every share of the pool), else
        # MemoryBudgetExceeded says by how much.
        stream, warning = MemoryBudget().fit(host.cfg, rt, stream, lambda s: settings_problems(host.settings, s),
                                             len(names))
        if warning:
            log(warning)
        self.stream = stream
        self.decision: BatchDecision = decide_batching(batch=batch, cuda_graphs=rt.cuda_graphs or capturer is not None,
                                                       batched_attention=batched_attention)
        self.batch = self.decision.path != "alone"
        self._graphs: Optional[BatchGraphs] = None
        if self.decision.path == "graphed":
            self._graphs = BatchGraphs(rt.device, capturer if capturer is not None else CudaGraphCapturer(rt.device),
                                       self._encode)
        self._graph_backends: dict[tuple[int, int], Any] = {}  # (batch, tokens) -> FlashInfer's CUDA-graph form
        log(f"streams {names}: {self.decision.path} - {self.decision.reason}")
        self.footprint = group_footprint(host, stream, len(names))
        self._pools: dict[tuple[int, ...], SharedKVPool] = {}
        self._batched_backend = None
        self._readback = StagedReadback()
        self._managers: dict[str, SessionManager] = {}
        for name in names:
            manager = SessionManager(host, stream, log)
            if len(names) > 1:  # one stream keeps its own pages: exactly the single-camera cache
                manager.session.page_storage = self._share_provider(name)
            self._managers[name] = manager
        self.last_step_ms = 0.0
        self.last_batch = 0
        self.last_path = ""  # the path of the last batch of a step ("graphed", "eager", "alone")
        self.path_counts: Counter[str] = Counter()  # batches of two or more streams per path they ran

    # ------------------------------------------------------------------ streams
    def manager(self, name: str) -> SessionManager:
        """The stream's own manager: its reset, settings, save and load touch that stream only."""
        return self._managers[name]

    @property
    def managers(self) -> dict[str, SessionManager]:
        return dict(self._managers)

    @property
    def pools(self) -> list[SharedKVPool]:
        return list(self._pools.values())

    def reset(self, name: str, reason: str = "reset requested"):
        return self._managers[name].reset(reason)

    def pool_bytes(self) -> int:
        return sum(p.nbytes for p in self._pools.values())

    def _share_provider(self, name: str) -> Callable[[tuple[int, ...], torch.dtype], Optional[torch.Tensor]]:
        def provide(shape: tuple[int, ...], dtype: torch.dtype) -> Optional[torch.Tensor]:
            blocks, _, pages, page, heads, dim = shape
            key = (blocks, pages, page, heads, dim)
            pool = self._pools.get(key)
            if pool is None and self._pools:  # another frame size or geometry than the pool's: never batched
                self.log(f"stream {name}: its {page}-token pages do not fit the group's pool; its cache "
                         "allocates its own pages (its frames run alone)")
                return None
            if pool is None:
                pool = self._pools[key] = SharedKVPool(
                    num_shares=len(self.names), num_blocks=blocks, pages_per_share=pages, page_size=page,
                    num_heads=heads, head_dim=dim, dtype=dtype, device=self.host.resolved.device)
                self.log(f"page pool for {page}-token pages: {len(self.names)} shares of {pages} pages, "
                         f"{pool.nbytes / 1e9:.3f} GB")
            if pool.storage.dtype != dtype:
                return None
            return pool.share(name)
        return provide

    # ------------------------------------------------------------------ the step
    def step(self, frames: dict[str, tuple[Any, Any]]) -> dict[str, StreamOutcome]:
        """One tick: ``frames`` maps a stream's name to ``(frame [3, H, W], stamp)``; streams without a
        frame wait for none. Returns one ``StreamOutcome`` per frame given."""
        unknown = [n for n in frames if n not in self._managers]
        if unknown:
            raise KeyError(f"unknown streams {unknown} (the group has {self.names})")
        outcomes: dict[str, StreamOutcome] = {}
        batches: dict[tuple, list[_Entry]] = {}
        for name, (frame, stamp) in frames.items():
            manager = self._managers[name]
            session = manager.session
            if not session.in_phase2:
                outcomes[name] = self._alone(name, frame, stamp)
                continue
            try:
                manager.policy.admit()
                step = session.prepare_step(frame, stamp)
            except StoredFrameLimit:  # the policy acts: alone, through the manager
                outcomes[name] = self._alone(name, frame, stamp)
                continue
            except SessionError as exc:  # refused: nothing changed
                outcomes[name] = StreamOutcome(error=exc)
                continue
            cfg = session.stream_cfg
            key = (session.image_hw, cfg.camera_iterations, cfg.max_frame_num, cfg.depth_chunk,
                   id(self._pool_of(session.global_cache)) if self.batched_attention != "loop" else 0)
            batches.setdefault(key, []).append(_Entry(name, manager, step, frame, stamp))
        self.last_batch = 0
        if self._graphs is not None and batches:
            self._graphs.prune(self._current_caches())
        for entries in batches.values():
            path, _ = self.batch_path(entries)
            if len(entries) > 1:
                self.path_counts[path] += 1
                self.last_path = path
            if path == "alone":  # a batch of one is the lone path (CUDA graph included)
                for e in entries:
                    outcomes[e.name] = self._alone(e.name, e.frame, e.stamp)
            elif path == "graphed":
                outcomes.update(self._run_batch(entries, graphed=True))
            else:
                outcomes.update(self._run_batch(entries))
        return {name: outcomes[name] for name in frames}

    def batch_path(self, entries: Sequence[_Entry]) -> tuple[str, str]:
        """How these prepared phase-2 frames run, and why: the group's ``decision``, narrowed per batch."""
        if len(entries) < 2:
            return "alone", "a batch of one is the stream's own step (its CUDA graph included)"
        if self.decision.path != "graphed":
            return self.decision.path, self.decision.reason
        assert self._graphs is not None
        refused = self._graphs.refused.get(len(entries))
        if refused:
            return "alone", refused
        if self.host.resolved.cuda_graphs and not all(e.manager.session.use_cuda_graphs for e in entries):
            return "eager", "a stream's CUDA graphs are off for now (the benchmark's kernel profile): one eager call"
        return "graphed", self.decision.reason

    @property
    def batch_graphs(self) -> Optional[BatchGraphs]:
        """The captured batched steps (None: the group does not capture them)."""
        return self._graphs

    def graph_stats(self) -> dict:
        """Per batch size: captures, replays and encoder captures of the batched steps (empty: none)."""
        return {} if self._graphs is None else self._graphs.stats()

    def _current_caches(self) -> dict[str, tuple[int, int]]:
        out = {}
        for name, manager in self._managers.items():
            s = manager.session
            if s.global_cache is not None and s.camera_cache is not None:
                out[name] = (id(s.global_cache), id(s.camera_cache))
        return out

    def flush(self, name: str) -> StreamOutcome:
        """A stream's buffered scale frames processed now (its input ended early)."""
        try:
            return StreamOutcome(tuple(self._managers[name].flush()))
        except (SessionError, InferenceFailed) as exc:
            return StreamOutcome(error=exc)

    def _alone(self, name: str, frame: Any, stamp: Any) -> StreamOutcome:
        try:
            return StreamOutcome(tuple(self._managers[name].push(frame, stamp)))
        except (SessionError, InferenceFailed) as exc:
            return StreamOutcome(error=exc)

    def _fail(self, entry: _Entry, exc: BaseException) -> StreamOutcome:
        """The stream's failure as a lone stream's: a new session, ``InferenceFailed``."""
        start = entry.manager.reset(f"inference failed: {type(exc).__name__}: {exc}", SessionCause.FAILURE)
        return StreamOutcome(error=InferenceFailed(exc, start))

    def _run_batch(self, entries: list[_Entry], graphed: bool = False) -> dict[str, StreamOutcome]:
        outcomes: dict[str, StreamOutcome] = {}
        began = None
        start = time.perf_counter()
        if graphed:
            entries = sorted(entries, key=lambda e: not e.step.with_depth)  # stable: the depth frames lead
            try:  # the frames in and the encoder queued first: the device encodes while the host opens the steps
                began = self._begin_graphed(entries)
            except Exception as exc:  # noqa: BLE001 - nothing is open yet: each stream alone
                if isinstance(exc, CaptureFailed):
                    self._refuse(exc)
                else:
                    self.log(f"batched step of {[e.name for e in entries]} failed before it began "
                             f"({type(exc).__name__}: {exc}): each stream alone")
                return {e.name: self._alone(e.name, e.frame, e.stamp) for e in entries}
        opened: list[_Entry] = []
        for e in entries:
            try:
                e.manager.session.open_step(e.step)
            except SessionError as exc:  # a cache cannot take the frame: refused, nothing changed
                outcomes[e.name] = StreamOutcome(error=exc)
                continue
            except Exception as exc:  # noqa: BLE001 - a fault of this stream's caches: its own failure
                outcomes[e.name] = self._fail(e, exc)
                continue
            opened.append(e)
        if not opened:
            return outcomes
        if graphed and len(opened) == 1:  # the others were refused: a batch of one is the stream's own step
            e = opened[0]
            outcomes[e.name] = (self._alone(e.name, e.frame, e.stamp) if e.manager.session.abort_step()
                                else self._fail(e, RuntimeError("its batch partner was refused")))
            return outcomes
        if not graphed:
            start = time.perf_counter()
        try:
            if graphed:  # the encoder ran on the frames of ``entries``: again when some were refused
                same = len(opened) == len(entries)
                pose, depth, conf, depth_rows = self._forward_graphed(opened, began if same else None)
            else:
                pose, depth, conf, depth_rows = self._forward(opened)
        except Exception as exc:  # noqa: BLE001 - not attributable to one stream: undo, re-run alone
            if isinstance(exc, CaptureFailed):  # batches of this size run alone from now on
                self._refuse(exc)
                exc = exc.cause  # type: ignore[assignment]
            cause = f"{type(exc).__name__}: {exc}"
            exc.__traceback__ = None  # its frames hold the failed step's activations
            if isinstance(exc, torch.OutOfMemoryError):
                torch.cuda.empty_cache()
            exact = {e.name: e.manager.session.abort_step() for e in opened}
            self.log(f"batched step of {[e.name for e in opened]} failed ({cause}): each stream alone")
            for e in opened:
                outcomes[e.name] = self._alone(e.name, e.frame, e.stamp) if exact[e.name] else self._fail(e, exc)
            return outcomes
        for e in opened:
            e.manager.session.close_step()
        elapsed_ms = (time.perf_counter() - start) * 1e3
        self.last_step_ms, self.last_batch = elapsed_ms, len(opened)
        for i, e in enumerate(opened):
            rows = (pose[i:i + 1], None, None)
            d = depth_rows[i]
            if d is not None and depth is not None:
                rows = (pose[i:i + 1], depth[d:d + 1], None if conf is None else conf[d:d + 1])
            processed = e.manager.session.finish_step(e.step, rows, elapsed_ms)
            outcomes[e.name] = StreamOutcome(tuple(e.manager.policy.to_world(p) for p in processed), batched=True)
        return outcomes

    def _forward(self, entries: list[_Entry]):
        """ONE model call over the entries' frames ``[B, 3, H, W]``; their steps are open. Returns
        host arrays: pose_enc [B, 9], depth and confidence [n, H, W] of the frames with depth (or None),
        and each frame's row of them (None: no depth for it)."""
        sessions = [e.manager.session for e in entries]
        first = sessions[0]
        device = self.host.resolved.device
        b = len(entries)
        h, w = first.image_hw  # type: ignore[misc]
        tokens = SPECIAL_TOKENS_PER_FRAME + (h // self.host.cfg.patch_size) * (w // self.host.cfg.patch_size)
        caches = [s.global_cache for s in sessions]
        pool, batched = None, None
        if self.batched_attention != "loop" and self._pool_of(caches[0]) is not None:  # else: pages of their own
            pool, batched = self._plan_batched(entries, tokens)
        attention = GroupGlobalAttention(caches, tokens, pool, batched)  # type: ignore[arg-type]
        camera = GroupCameraAttention([s.camera_cache for s in sessions])  # type: ignore[misc]
        images = torch.stack([e.step.image for e in entries])  # [B, 3, H, W]
        ones = torch.ones(b, dtype=torch.long, device=device)  # phase 2: camera and scale variant 1
        depth_frames = [i for i, e in enumerate(entries) if e.step.with_depth]
        cfg = first.stream_cfg
        with first.inference():
            out = self.host.model(
                images.to(device, non_blocking=True),
                rope_frames=torch.tensor([e.step.rope_index for e in entries], device=device),
                camera_variant=ones, scale_variant=ones, global_attention=attention, camera_attention=camera,
                num_iterations=cfg.camera_iterations, with_depth=bool(depth_frames),
                max_positions=cfg.max_frame_num, depth_frames=depth_frames,
            )
            pose, depth, conf = self._readback.fetch((out.pose_enc, out.depth, out.depth_conf))
        rows = {i: r for r, i in enumerate(depth_frames)}
        return pose, depth, conf, [rows.get(i) for i in range(b)]

    def _encode(self, images: torch.Tensor, variants: torch.Tensor) -> torch.Tensor:
        """The image encoder of a batched graph: frames ``[B, 3, H, W]`` -> tokens ``[B, P, C]``."""
        with self._managers[self.names[0]].session.graph_inference():
            return self.host.model.embed(images, variants, variants)

    def _refuse(self, exc: CaptureFailed) -> None:
        assert self._graphs is not None
        self._graphs.capture_failed(exc.batch, exc.cause)
        self.log(self._graphs.refused[exc.batch])

    def _begin_graphed(self, entries: list[_Entry]) -> GraphedBatchStep:
        """The captured step of this batch size with the entries' frames in and its encoder queued."""
        assert self._graphs is not None
        graph = self._graphs.step_for(len(entries), entries[0].manager.session.image_hw)  # type: ignore[arg-type]
        graph.begin([e.step.image for e in entries])
        return graph

    def _forward_graphed(self, entries: list[_Entry], began: Optional[GraphedBatchStep] = None):
        """The batched step of the entries (their steps open, the frames with depth first: the depth head
        reads a leading slice of the batch) as a captured graph of its batch size (``core/batched_graph.py``):
        captured on its key's first use, replayed after. ``began``: the step whose ``begin`` took these
        frames already (None: begin here). Returns what ``_forward`` returns."""
        assert self._graphs is not None
        depth_count = sum(e.step.with_depth for e in entries)
        if any(e.step.with_depth for e in entries[depth_count:]):
            raise ValueError("the frames with depth must lead the batch")
        sessions = [e.manager.session for e in entries]
        first = sessions[0]
        b, hw, cfg = len(entries), first.image_hw, first.stream_cfg
        patch = self.host.cfg.patch_size
        tokens_per_frame = SPECIAL_TOKENS_PER_FRAME + (hw[0] // patch) * (hw[1] // patch)  # type: ignore[index]
        graph = began if began is not None else self._begin_graphed(entries)
        caches = [s.global_cache for s in sessions]
        cameras = [s.camera_cache for s in sessions]
        pool, batched = None, None
        if self.batched_attention != "loop" and self._pool_of(caches[0]) is not None:
            pool, batched = self._plan_batched(entries, tokens_per_frame, graphed=True)
        if batched is not None:
            signatures: tuple = (getattr(batched, "plan_signature", ()),)
        else:
            signatures = tuple(getattr(c.single_frame_backend, "plan_signature", ()) for c in caches)  # type: ignore[union-attr]
        key = BatchKey(tuple((e.name, id(c), id(m)) for e, c, m in zip(entries, caches, cameras)), signatures,
                       depth_count, cfg.camera_iterations)
        depth_frames = None if depth_count in (0, b) else list(range(depth_count))  # None: every frame or none
        device = self.host.resolved.device
        depth_stream = side_stream(device, "depth") if device.type == "cuda" else None
        model = self.host.model

        def run_model(tokens: torch.Tensor, rope: torch.Tensor):
            attention = GroupGlobalAttention(caches, tokens_per_frame, pool, batched)  # type: ignore[arg-type]
            camera = GroupCameraAttention(cameras)  # type: ignore[arg-type]
            with first.graph_inference():
                return model.forward_embedded(tokens, hw, rope_frames=rope, global_attention=attention,  # type: ignore[arg-type]
                                              camera_attention=camera, num_iterations=cfg.camera_iterations,
                                              with_depth=depth_count > 0, max_positions=cfg.max_frame_num,
                                              depth_stream=depth_stream, depth_frames=depth_frames)

        out = graph.finish(key, [e.step.rope_index for e in entries], run_model, keep=(*caches, *cameras))
        pose, depth, conf = self._readback.fetch((out.pose_enc, out.depth, out.depth_conf))
        if device.type != "cuda":  # CPU fp32 arrays are views of the outputs the next replay overwrites
            pose, depth, conf = (None if a is None else a.copy() for a in (pose, depth, conf))
        return pose, depth, conf, [i if i < depth_count else None for i in range(b)]

    def _pool_of(self, cache) -> Optional[SharedKVPool]:
        """The pool whose share ``cache``'s pages are (None: pages of its own)."""
        if cache is None:
            return None
        ptr = cache.storage.data_ptr()
        return next((p for p in self._pools.values()
                     if p.storage.data_ptr() <= ptr < p.storage.data_ptr() + p.nbytes), None)

    def _plan_batched(self, entries: list[_Entry], tokens: int, graphed: bool = False):
        """The pool and FlashInfer's one plan of this step over every stream's visible pages (``graphed``:
        the CUDA-graph wrapper of this batch size, its buffers written here, outside the graph)."""
        caches = [e.manager.session.global_cache for e in entries]
        pool = self._pool_of(caches[0])
        if pool is None:
            raise RuntimeError("the batched FlashInfer step needs the streams' pages in one pool")
        backend = self._graph_backend(len(entries), tokens, pool) if graphed else self._eager_backend()
        request = batched_page_request([c.table for c in caches],  # type: ignore[union-attr]
                                       [pool.shares.first_page(e.name) for e in entries], tokens,
                                       token_pages=backend.token_pages)
        backend.plan(request, pool.page_size)
        return pool.storage, backend

    def _eager_backend(self):
        rt, cfg = self.host.resolved, self.host.cfg
        if self._batched_backend is None and self.batched_attention == "pool-sdpa":
            self._batched_backend = BatchedSdpaBackend(device=rt.device)
        if self._batched_backend is None:
            from .cache.flashinfer_backend import BatchedFlashInferBackend

            self._batched_backend = BatchedFlashInferBackend(num_heads=cfg.num_heads, head_dim=cfg.head_dim,
                                                             dtype=rt.dtype, device=rt.device,
                                                             kernel=rt.flashinfer_kernel)
        return self._batched_backend

    def _graph_backend(self, batch: int, tokens: int, pool: SharedKVPool):
        """FlashInfer's CUDA-graph wrapper for ``batch`` streams of ``tokens`` queries each (made once):
        FlashInfer fixes both for a wrapper's life. Its index buffer holds ``batch`` full shares."""
        backend = self._graph_backends.get((batch, tokens))
        if backend is None:
            if self.batched_attention != "flashinfer":  # decide_batching never captures pool-sdpa
                raise RuntimeError(f"batched attention {self.batched_attention!r} has no CUDA-graph form")
            from .cache.flashinfer_backend import BatchedFlashInferBackend

            rt, cfg = self.host.resolved, self.host.cfg
            token_pages = rt.flashinfer_kernel == "fa3"
            backend = self._graph_backends[(batch, tokens)] = BatchedFlashInferBackend(
                num_heads=cfg.num_heads, head_dim=cfg.head_dim, dtype=rt.dtype, device=rt.device,
                kernel=rt.flashinfer_kernel, batch_size=batch,
                max_indices=batched_index_capacity(batch, pool.shares.pages_per_share, pool.page_size,
                                                   token_pages=token_pages))
        return backend


__all__ = ["BATCHED_ATTENTION", "StreamGroup", "StreamOutcome", "group_footprint"]
