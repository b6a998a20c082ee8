"""CUDA-graph replay of a group's batched phase-2 step: one captured step per batch size, captured lazily.

A ``StreamGroup`` (``core/stream_group.py``) runs the phase-2 frames of B streams as one model call.
Eager, that call is host-bound like any eager step (thousands of launches), so under CUDA graphs it
is captured and replayed as the one-stream step is (``cuda_graph.py``). B = 1 never comes here: a
batch of one is the stream's own captured step, unchanged. For B = 2..N:

* **static inputs per batch size**: the frames ``[B, 3, H, W]``, their RoPE indices ``[B]`` and the
  camera/scale variants ``[B]``, copied in before every replay (``GraphedBatchStep``);
* **the image encoder** reads the frames alone, so it is one graph per batch size, whoever fills it;
* **the rest of the step** reads the streams' caches through their fixed-address buffers, written
  outside the graph before the replay by each stream's ``open_step``: its write-slot buffer
  (``PagedKVCache``), its single-frame backend's plan (split/runs, cuDNN, static SDPA, FlashInfer's
  one-stream wrapper) and its camera-head cache's slot and mask (``CameraKVCache(static=True)``);
  with FlashInfer's batched attention, one CUDA-graph wrapper per batch size whose ``qo_indptr`` /
  ``paged_kv_indptr`` / ``paged_kv_indices`` / ``last_page_len`` buffers are preallocated for B
  streams' largest visible sets and re-planned outside the graph every tick
  (``BatchedFlashInferBackend(batch_size=B)``; FlashInfer fixes the batch size for a wrapper's life).

What a captured step is keyed by (``BatchKey``), precisely: the batch's streams in order, each with the
identity of its two caches (a new cache object - a frame-size change, a new geometry - has new buffer
addresses, so graphs naming the old ones are dropped by ``prune``), the plan signatures (each stream's
single-frame backend's, or the batched FlashInfer wrapper's: host-side launch parameters a plan fixes,
like the split backend's filling buckets or FlashInfer's split-KV schedule), how many leading frames
the depth head runs on, and the camera iterations. Which streams fill a batch is part of the key because the streams'
caches own the buffers the graph reads; making the step independent of them would need every
per-stream buffer (write slots, camera-head caches, the split backend's dense views) gathered into
per-slot buffers of the batch, a copy per tick for what is at most one capture per subset of streams:
cameras at one rate give one key per batch size in the steady state, a camera that drops a frame
one more. The image encoder's graph is per batch size only. Every graph shares one memory pool (a
kept graph costs its executable, not its activations; the LRU keeps ``MAX_GRAPHS`` per batch size).

The depth head runs on the frames whose stream asks for it at this step (``depth_every``), as in
the eager batched call: the group puts those frames first in the batch, so the head reads a leading
slice of the layers (a view: no index tensor is uploaded inside the graph), and the key holds how
many they are.

The split/runs and cuDNN paths attend in a loop over the B streams inside the one graph (each
stream's own kernel call on its own pages). Inside a graph the loop costs no launch gaps, only each
call's tail wave: the runs kernel is compute-bound (a frame's 1,005 queries x 16 heads are ~128
query tiles per key range on 132 SMs, split into key ranges to fill the waves), so B calls do B
times the work in B times the full waves plus B partial tail waves, against one tail for a fused
call. A fused grid over streams x query tiles (one launch whose programs each pick a stream's page
run) is the remaining lever there; FlashInfer's batched plan is that grid already.

Capture is injected (``Capturer``): ``CudaGraphCapturer`` on the GPU; the CPU tests hand in one that
re-runs the step eagerly into the captured outputs, so the bookkeeping - a step per batch size made
once and reused, the static inputs refreshed before every replay, the keys - is tested in CI.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Optional, Protocol, Sequence

import torch

from .cuda_graph import MAX_GRAPHS, capture_into, warm_up

BATCH_PATHS = ("graphed", "eager", "alone")


@dataclass(frozen=True)
class BatchDecision:
    """How a group runs the phase-2 frames of several streams, and why (``decide_batching``)."""

    path: str  # "graphed": one captured step per batch size; "eager": one eager call; "alone": each stream alone
    reason: str


def decide_batching(*, batch: Optional[bool], cuda_graphs: bool, batched_attention: str) -> BatchDecision:
    """The one owner of a group's batching decision. ``batch``: the caller's wish (True: batched,
    captured where it can be; False: alone; None: the default - batched, captured under CUDA graphs,
    and each stream's own captured step where the batched form cannot be captured); ``cuda_graphs``:
    the runtime captures (or a test injects a capturer); ``batched_attention``: the resolved form
    (``loop``, ``flashinfer``, ``pool-sdpa``).

    Why the captured batched step is the default under CUDA graphs: on the H200 it took less time
    than the same streams' own captured steps in turn in every configuration measured (two and four
    streams, windows 16 and 64: docs/performance.md, "Several streams"), with each stream's results
    within the official spread of its lone run (``test_gpu_streams``)."""
    if batch is False:
        return BatchDecision("alone", "batching off (batch=False): every frame runs alone through its stream's manager")
    if not cuda_graphs:
        return BatchDecision("eager", "no CUDA graphs: the phase-2 frames of a tick run as one eager model call")
    if batched_attention == "pool-sdpa":
        if batch:
            return BatchDecision("eager", "pool-sdpa's request changes shape with the visible keys, so it cannot be "
                                          "captured: one eager model call, as asked (batch=True)")
        return BatchDecision("alone", "pool-sdpa's request changes shape with the visible keys, so it cannot be "
                                      "captured: each stream replays its own captured step")
    form = ("one FlashInfer plan over the pool per tick" if batched_attention == "flashinfer"
            else "a loop over the streams' own kernels inside the graph")
    return BatchDecision("graphed", f"CUDA graphs: one captured step per batch size 2..N, captured on first use; "
                                    f"attention: {form}")


class Capturer(Protocol):
    """Turns ``run()`` into a replayable step: returns ``(replay, outputs)``; every ``replay()``
    recomputes ``outputs`` in place from the inputs' current contents."""

    def capture(self, run: Callable[[], Any]) -> tuple[Callable[[], None], Any]: ...

    def reset(self) -> None: ...


class CudaGraphCapturer:
    """``torch.cuda.CUDAGraph`` capture into one memory pool shared by every graph it makes.

    The pool is shared safely for the reason ``cuda_graph.py`` gives: every replay's outputs are read
    back before the next replay, and the encoder's tokens, which a later step graph reads, stay
    referenced (so no capture reuses their blocks)."""

    def __init__(self, device: torch.device) -> None:
        self.device = torch.device(device)
        self._pool = None

    def capture(self, run: Callable[[], Any]) -> tuple[Callable[[], None], Any]:
        warm_up(self.device, run)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph, output = capture_into(self._pool, run)
        return graph.replay, output

    def reset(self) -> None:
        """Forget the pool (its blocks go back once no graph of it is left; the caller drops them)."""
        self._pool = None
        torch.cuda.empty_cache()


@dataclass
class BatchGraphStats:
    captures: int = 0  # graphs of the step (per key)
    replays: int = 0
    encoder_captures: int = 0  # graphs of the image encoder (one per batch size)


@dataclass(frozen=True)
class BatchKey:
    """What a captured batched step is valid for (the module docstring says why each part)."""

    streams: tuple[tuple[str, int, int], ...]  # (name, id(global cache), id(camera cache)) in batch order
    signatures: tuple[Hashable, ...]
    depth_frames: int  # the depth head runs on the first this many frames of the batch
    camera_iterations: int

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s[0] for s in self.streams)


@dataclass
class _Captured:
    replay: Callable[[], None]
    output: Any
    keep: tuple = field(default=())  # the caches the graph reads: alive while it is kept (ids stay unique)


class GraphedBatchStep:
    """The captured steps of one batch size B and frame size: static inputs, the encoder graph, an LRU
    of step graphs per ``BatchKey``."""

    def __init__(self, batch: int, image_hw: tuple[int, int], device: torch.device, capturer: Capturer,
                 encode: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
        """``encode(images [B, 3, H, W], variants [B]) -> tokens [B, P, C]`` (camera and scale variant 1)."""
        if batch < 2:
            raise ValueError(f"a batched step has two or more streams (got {batch}); one runs its own graph")
        self.batch = batch
        self.image_hw = image_hw
        self.device = torch.device(device)
        self._capturer = capturer
        self._encode = encode
        h, w = image_hw
        self.static_images = torch.zeros(batch, 3, h, w, device=self.device)  # [B, 3, H, W]
        self.static_rope = torch.zeros(batch, dtype=torch.long, device=self.device)  # [B]
        # the RoPE indices go in from pinned memory without a wait: a pageable copy would hold the host
        # until the encoder's replay is done, and the device would idle while the host then queues the step
        self._rope_host = torch.zeros(batch, dtype=torch.long, pin_memory=self.device.type == "cuda")  # [B]
        self.static_variants = torch.ones(batch, dtype=torch.long, device=self.device)  # [B] phase 2: variant 1
        self._encoder: Optional[_Captured] = None  # its tokens [B, P, C]
        self._graphs: OrderedDict[BatchKey, _Captured] = OrderedDict()
        self._begun = False
        self.stats = BatchGraphStats()

    @property
    def keys(self) -> list[BatchKey]:
        """Keys with a captured step, least recently used first."""
        return list(self._graphs)

    def begin(self, images: Sequence[torch.Tensor]) -> None:
        """The batch's frames ``[3, H, W]`` each into the static input, and the encoder's replay queued."""
        if len(images) != self.batch:
            raise ValueError(f"a step of {self.batch} streams got {len(images)} frames")
        for i, image in enumerate(images):
            self.static_images[i].copy_(image.view_as(self.static_images[i]), non_blocking=True)
        if self._encoder is None:
            encode = self._encode
            replay, tokens = self._capture(lambda: encode(self.static_images, self.static_variants))
            self._encoder = _Captured(replay, tokens)
            self.stats.encoder_captures += 1
        self._encoder.replay()
        self._begun = True

    def finish(self, key: BatchKey, rope_indices: Sequence[int],
               run_model: Callable[[torch.Tensor, torch.Tensor], Any], keep: tuple = ()) -> Any:
        """The rest of the step after ``begin``: ``run_model(tokens [B, P, C], rope [B])`` captured once per
        ``key`` (``keep``: what the graph reads, held while it is kept), replayed. Returns the graph's
        static outputs: read them before the next replay."""
        if not self._begun:
            raise RuntimeError("finish() without begin(): the frames are not in the step")
        self._begun = False
        if len(key.streams) != self.batch or len(rope_indices) != self.batch:
            raise ValueError(f"a step of {self.batch} streams got the key of {len(key.streams)} and "
                             f"{len(rope_indices)} RoPE indices")
        # safe to overwrite: the previous step's copy ran before its outputs were read back
        self._rope_host.copy_(torch.as_tensor(list(rope_indices), dtype=torch.long))
        self.static_rope.copy_(self._rope_host, non_blocking=True)
        captured = self._graphs.get(key)
        if captured is not None:
            self._graphs.move_to_end(key)
        else:
            assert self._encoder is not None
            tokens = self._encoder.output
            replay, output = self._capture(lambda: run_model(tokens, self.static_rope))
            captured = self._graphs[key] = _Captured(replay, output, keep)
            self.stats.captures += 1
            while len(self._graphs) > MAX_GRAPHS:
                self._graphs.popitem(last=False)
        captured.replay()
        self.stats.replays += 1
        return captured.output

    def _capture(self, run: Callable[[], Any]) -> tuple[Callable[[], None], Any]:
        try:
            return self._capturer.capture(run)
        except Exception as exc:  # noqa: BLE001 - the group tells a failed capture from a failed replay
            self._begun = False
            raise CaptureFailed(self.batch, exc) from exc

    def prune(self, current: dict[str, tuple[int, int]]) -> int:
        """Drop the graphs that name a stream's caches other than its ``current`` ``(id(global), id(camera))``:
        their buffers are gone or another stream's. Returns how many were dropped."""
        stale = [k for k in self._graphs if any(current.get(n) != (g, c) for n, g, c in k.streams)]
        for k in stale:
            del self._graphs[k]
        return len(stale)

    def drop(self) -> None:
        """Forget every graph (after a failed capture: the pool they share is given up)."""
        self._graphs.clear()
        self._encoder = None
        self._begun = False


class BatchGraphs:
    """The group's captured batched steps: one ``GraphedBatchStep`` per (batch size, frame size), made
    on first use; the batch sizes whose capture failed, with the reason (those batches run alone)."""

    def __init__(self, device: torch.device, capturer: Capturer,
                 encode: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
        self.device = torch.device(device)
        self.capturer = capturer
        self._encode = encode
        self._steps: dict[tuple[int, tuple[int, int]], GraphedBatchStep] = {}
        self.refused: dict[int, str] = {}  # batch size -> why it runs alone

    def step_for(self, batch: int, image_hw: tuple[int, int]) -> GraphedBatchStep:
        key = (batch, tuple(image_hw))
        step = self._steps.get(key)
        if step is None:
            step = self._steps[key] = GraphedBatchStep(batch, key[1], self.device, self.capturer, self._encode)
        return step

    @property
    def steps(self) -> dict[tuple[int, tuple[int, int]], GraphedBatchStep]:
        return dict(self._steps)

    def prune(self, current: dict[str, tuple[int, int]]) -> int:
        return sum(step.prune(current) for step in self._steps.values())

    def capture_failed(self, batch: int, exc: BaseException) -> None:
        """A capture of ``batch`` failed (out of memory, say): every graph goes (they share the pool), and
        batches of this size run alone from now on - their own captured steps need less memory."""
        for step in self._steps.values():
            step.drop()
        self._steps.clear()
        self.capturer.reset()
        self.refused[batch] = (f"the capture of the batched step of {batch} streams failed "
                               f"({type(exc).__name__}: {exc}): batches of {batch} run alone")

    def stats(self) -> dict[int, BatchGraphStats]:
        """Per batch size, summed over frame sizes."""
        out: dict[int, BatchGraphStats] = {}
        for (b, _), step in self._steps.items():
            s = out.setdefault(b, BatchGraphStats())
            s.captures += step.stats.captures
            s.replays += step.stats.replays
            s.encoder_captures += step.stats.encoder_captures
        return out


class CaptureFailed(RuntimeError):
    """A batched step's capture raised; ``cause`` is what it raised."""

    def __init__(self, batch: int, cause: BaseException) -> None:
        super().__init__(f"capture of the batched step of {batch} streams failed: {type(cause).__name__}: {cause}")
        self.batch = batch
        self.cause = cause


__all__ = ["BATCH_PATHS", "BatchDecision", "BatchGraphStats", "BatchGraphs", "BatchKey", "CaptureFailed", "Capturer",
           "CudaGraphCapturer", "GraphedBatchStep", "decide_batching"]
