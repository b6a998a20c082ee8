"""CUDA-graph replay of the one-frame (phase-2) model step.

Eager PyTorch launches ~4,000 small kernels per frame and is host-bound on the GPU (docs/benchmarks.md). A
phase-2 step always has the same shapes (one frame of the session's size), so it is captured once
and replayed. What changes from frame to frame reaches the graph through buffers with fixed
addresses, all written *outside* the graph before the replay:

* the frame and its RoPE index: static input tensors copied into;
* where this frame's K/V go: ``PagedKVCache``'s persistent write-slot buffer (``begin_step``);
* what it attends to: the single-frame attention backend's plan (FlashInfer's CUDA-graph wrapper
  buffers, or ``StaticSdpaBackend``'s slot list and device-held key count);
* the camera head's cache slot and visible length: ``CameraKVCache(static=True)`` buffers.

A FlashInfer plan also fixes some host-side launch parameters (its split-KV schedule); the graph is
re-captured whenever those change (``plan_signature``), which happens a few times while the window
fills and rarely after.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from .model import LingBotMap, ModelOutput


@dataclass
class GraphStats:
    captures: int = 0
    replays: int = 0


class GraphedFrameStep:
    """Captures ``model(one frame)`` with the caches' static buffers; replays it per frame."""

    def __init__(
        self,
        model: LingBotMap,
        image_hw: tuple[int, int],
        device: torch.device,
        run_model: Callable[..., ModelOutput],
        plan_signature: Callable[[], tuple],
    ) -> None:
        self.model = model
        self.device = device
        self._run_model = run_model  # run_model(images, rope_frames) -> ModelOutput; called eagerly or captured
        self._plan_signature = plan_signature
        h, w = image_hw
        self.static_image = torch.zeros(1, 3, h, w, device=device)  # [1, 3, H, W]
        self.static_rope = torch.zeros(1, dtype=torch.long, device=device)  # [1]
        self._graph: Optional[torch.cuda.CUDAGraph] = None
        self._signature: Optional[tuple] = None
        self._output: Optional[ModelOutput] = None
        self._pool = None
        self.stats = GraphStats()

    def __call__(self, image: torch.Tensor, rope_frame: int) -> ModelOutput:
        """Run one frame. The returned tensors are the graph's static outputs: copy before the next call."""
        self.static_image.copy_(image.view_as(self.static_image), non_blocking=True)
        self.static_rope.fill_(rope_frame)
        signature = self._plan_signature()
        if self._graph is None or signature != self._signature:
            self._capture()
            self._signature = signature
        self._graph.replay()  # type: ignore[union-attr]
        self.stats.replays += 1
        return self._output  # type: ignore[return-value]

    def _capture(self) -> None:
        # Warm up on a side stream first (allocator pools, cuBLAS/cuDNN handles, lazily built RoPE
        # tables): capture must see no first-time work. The warm-up really runs this frame's step,
        # which is harmless: the replay recomputes the same values into the same slots.
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            self._run_model(self.static_image, self.static_rope)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        with torch.cuda.graph(graph, pool=self._pool):
            self._output = self._run_model(self.static_image, self.static_rope)
        self._graph = graph
        self.stats.captures += 1
