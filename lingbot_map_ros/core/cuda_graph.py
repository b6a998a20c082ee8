"""CUDA-graph replay of the one-frame (phase-2) model step.

Eager PyTorch launches ~4,000 small kernels per frame and is host-bound on the GPU. A
phase-2 step always has the same shapes (one frame of the session's size), so it is captured once
and replayed. What changes from frame to frame reaches the graph through buffers with fixed
addresses, all written *outside* the graph before the replay:

* the frame and its RoPE index: static input tensors copied into;
* where this frame's K/V go: ``PagedKVCache``'s persistent write-slot buffer (``begin_step``);
* what it attends to: the single-frame attention backend's plan (FlashInfer's CUDA-graph wrapper
  buffers, or ``StaticSdpaBackend``'s slot list and device-held key count);
* the camera head's cache slot and visible length: ``CameraKVCache(static=True)`` buffers.

Some plans also fix host-side launch parameters: FlashInfer's split-KV schedule, or the split
backend's mode (prefix masked while the window fills, unmasked once it is full). A graph is captured
per such ``plan_signature`` and heads (with or without the depth head: ``depth_every`` runs it on
some frames only) and kept (at most ``MAX_GRAPHS``, least recently used dropped), so the switch back
and forth at every new session or long-run window costs a capture only the first time.

The image encoder (DINO, ``LingBotMap.embed``) reads the frame and nothing else, so it is a graph of
its own: its replay is queued as soon as the frame is in, and the device encodes it while the host
plans the step and launches the second graph. As one graph, the device would wait for the whole plan
(0.6-0.9 ms a frame on an H200's host).

All graphs of a step share one memory pool. That is safe here because every replay's outputs are
read (copied to the host) before the next replay: a later capture may reuse blocks that an earlier
graph only needs *during* its replay, and outputs of one graph may sit in another's scratch memory,
which only matters to outputs that are still needed when the other graph replays. The encoder's
tokens are such outputs: they stay referenced for the step's life, so no capture reuses their
blocks, and the step graphs that read them replay after the encoder in stream order.
"""
from __future__ import annotations

import gc
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from .model import LingBotMap, ModelOutput


def warm_up(device: torch.device, run: Callable[[], Any]) -> None:
    """``run()`` once on the warm-up side stream: capture must see no first-time work (allocator pools,
    cuBLAS/cuDNN handles, lazily built RoPE tables, compiled kernels). It really runs the step, which is
    harmless: the replay recomputes the same values into the same slots."""
    side = side_stream(device, "warmup")
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        run()
    torch.cuda.current_stream(device).wait_stream(side)


def capture_into(pool: Any, run: Callable[[], Any]) -> tuple[torch.cuda.CUDAGraph, Any]:
    """``run()`` captured into the graph memory pool ``pool``: the graph and its outputs. An aborted
    capture resets its graph and raises; what else must go with it (graphs sharing the pool) is the
    caller's to drop.

    The garbage collector stays off while the capture is open. A dead session in a reference cycle
    holds graphs, attention wrappers and device tensors; collected in the middle of a capture, their
    release is an operation the capturing stream forbids and invalidates the capture
    (``cudaErrorStreamCaptureInvalidated``: seen on an H200 when a third one-stream session captured
    after two dead ones). They are left to the next collection after the capture: a full collection
    before each capture would cost ~0.1-0.3 s with torch loaded, at every capture of the filling window."""
    graph = torch.cuda.CUDAGraph()
    collecting = gc.isenabled()
    gc.disable()
    try:
        with torch.cuda.graph(graph, pool=pool):
            output = run()
    except BaseException:
        graph.reset()
        raise
    finally:
        if collecting:
            gc.enable()
    return graph, output


def side_stream(device: torch.device, role: str) -> torch.cuda.Stream:
    """The one side stream of this process per ``role`` on ``device``: ``warmup`` for capture
    warm-ups, ``depth`` for the depth head beside the camera head inside the frame step.

    Why one per role: cuBLAS keeps a workspace (~33 MiB on Hopper) for every stream it has run on and
    never gives it back, so a fresh stream per capture leaked that much at every new session size
    (seen as memory growth after out-of-memory faults)."""
    index = torch.device(device).index
    index = torch.cuda.current_device() if index is None else index
    stream = _SIDE_STREAMS.get((index, role))
    if stream is None:
        stream = _SIDE_STREAMS[(index, role)] = torch.cuda.Stream(index)
    return stream


_SIDE_STREAMS: dict[tuple[int, str], torch.cuda.Stream] = {}
# graphs kept: the split backend's 8 filling buckets + full, with and without the depth head; FlashInfer's few
# schedules. They share one memory pool, so a graph kept costs its executable, not its activations.
MAX_GRAPHS = 20


@dataclass
class GraphStats:
    captures: int = 0  # graphs of the step (per plan signature and heads)
    replays: int = 0
    encoder_captures: int = 0  # graphs of the image encoder (one per step object)


class GraphedFrameStep:
    """Captures ``model(one frame)`` with the caches' static buffers per plan signature; replays it per frame.

    A frame is two graphs: the image encoder, which reads the frame alone, and the rest, which reads
    the step's plan. ``begin(image)`` queues the encoder's replay at once, so the device encodes the
    frame while the host plans the cache's step (page table, write slots, the attention plan and their
    uploads) and launches the second graph: that host work does not leave the device idle between two
    frames. ``__call__`` does both halves."""

    def __init__(
        self,
        model: LingBotMap,
        image_hw: tuple[int, int],
        device: torch.device,
        encode: Callable[[torch.Tensor], torch.Tensor],
        run_model: Callable[..., ModelOutput],
        plan_signature: Callable[[], tuple],
    ) -> None:
        """``encode(images [1, 3, H, W]) -> tokens [1, P, C]``; ``run_model(tokens, rope_frames, with_depth)
        -> ModelOutput``: the rest of the step from the encoder's tokens."""
        self.model = model
        self.device = device
        self._run_model = run_model  # eager (warm-up) or captured
        self._encode = encode
        self._plan_signature = plan_signature
        h, w = image_hw
        self.static_image = torch.zeros(1, 3, h, w, device=device)  # [1, 3, H, W]
        self.static_rope = torch.zeros(1, dtype=torch.long, device=device)  # [1]
        self._encoder: Optional[tuple[torch.cuda.CUDAGraph, torch.Tensor]] = None  # its graph and tokens [1, P, C]
        # (plan signature, with_depth) -> (graph, its static outputs), most recently used last
        self._graphs: OrderedDict[tuple[tuple, bool], tuple[torch.cuda.CUDAGraph, ModelOutput]] = OrderedDict()
        self._pool = None
        self._begun = False
        self.stats = GraphStats()

    @property
    def signatures(self) -> list[tuple]:
        """Plan signatures with a captured graph, least recently used first (one per heads variant)."""
        return [signature for signature, _ in self._graphs]

    def __call__(self, image: torch.Tensor, rope_frame: int, with_depth: bool) -> ModelOutput:
        """Run one frame. The returned tensors are the graph's static outputs: copy before the next call."""
        self.begin(image)
        return self.finish(rope_frame, with_depth)

    def begin(self, image: torch.Tensor) -> None:
        """Take the frame ``[3, H, W]`` (or ``[1, 3, H, W]``) and queue the encoder graph's replay.
        Nothing here reads the caches, so it may come before their ``begin_step``."""
        self.static_image.copy_(image.view_as(self.static_image), non_blocking=True)
        if self._encoder is None:
            self._encoder = self._capture_encoder()
        self._encoder[0].replay()
        self._begun = True

    def finish(self, rope_frame: int, with_depth: bool) -> ModelOutput:
        """The rest of the frame after ``begin``, with the plan of the caches' current step."""
        if not self._begun:
            raise RuntimeError("finish() without begin(): the frame is not in the step")
        self._begun = False
        self.static_rope.fill_(rope_frame)
        key = (self._plan_signature(), with_depth)
        if key in self._graphs:
            self._graphs.move_to_end(key)
        else:
            self._graphs[key] = self._capture(with_depth)
            while len(self._graphs) > MAX_GRAPHS:
                self._graphs.popitem(last=False)
        graph, output = self._graphs[key]
        graph.replay()
        self.stats.replays += 1
        return output

    def _capture_encoder(self) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        encode = self._encode
        graph, tokens = self._capture_graph(lambda: encode(self.static_image))
        self.stats.encoder_captures += 1
        return graph, tokens

    def _capture(self, with_depth: bool) -> tuple[torch.cuda.CUDAGraph, ModelOutput]:
        assert self._encoder is not None, "begin() captures the encoder first"
        tokens = self._encoder[1]  # [1, P, C]
        graph, output = self._capture_graph(lambda: self._run_model(tokens, self.static_rope, with_depth))
        self.stats.captures += 1
        return graph, output

    def _capture_graph(self, run: Callable[[], Any]) -> tuple[torch.cuda.CUDAGraph, Any]:
        """``run()`` warmed up, then captured into the step's pool; returns the graph and its outputs."""
        warm_up(self.device, run)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        try:
            graph, output = capture_into(self._pool, run)
        except BaseException:
            # An aborted capture (e.g. out of memory: the capture allocates in its own pool, so it needs
            # more memory than the eager warm-up) leaves blocks in the pool; they are only given back
            # when no graph uses the pool any more, so drop every graph of this step with it (the
            # encoder's too: its tokens live in the pool).
            self._graphs.clear()
            self._encoder = None
            self._begun = False
            self._pool = None
            torch.cuda.empty_cache()
            raise
        return graph, output
