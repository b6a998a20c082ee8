"""The model's two attention seams over the caches of several streams: one batched step of a group.

A batched step (``core/stream_group.py``) runs the phase-2 frames of B streams as ONE model call:
the image encoder, the frame blocks, every linear layer and the depth head see ``[B, ...]``. Only
attention must keep the streams apart (cameras never attend to each other's frames), and these two
callables do that: rows ``[i·T, (i+1)·T)`` of the step's q, k, v belong to the ``i``-th stream of
the batch (``T`` = tokens of one frame), and go to that stream's own caches.

* ``GroupGlobalAttention`` - each stream's k, v written into its own pages (its share of the pool),
  then either a loop over the streams' own backends (SDPA on the CPU, the split/runs kernels and any
  other backend: one kernel call per stream, unchanged) or ONE call of a batched backend over the
  whole pool (``BatchedFlashInferBackend``: one ``plan`` per step with ``qo_indptr = [0, T, 2T, ...]``
  and each stream's pages, one ``run`` per block).
* ``GroupCameraAttention`` - the camera head's trunk: row ``i`` (one token per frame) against stream
  ``i``'s camera-head cache; a loop (16 tiny decodes per stream and step).
"""
from __future__ import annotations

from typing import Optional, Protocol, Sequence

import torch

from .camera_cache import CameraKVCache
from .paged import PagedKVCache
from .pool import BatchedPageRequest


class BatchedBackend(Protocol):
    """Attention of B streams' queries over one pool, planned once per step."""

    def plan(self, request: BatchedPageRequest, page_size: int) -> None: ...

    def run(self, kv_pages: tuple[torch.Tensor, torch.Tensor], q: torch.Tensor) -> torch.Tensor: ...


class GroupGlobalAttention:
    """``GlobalAttention`` of a batched step: q, k, v ``[B·T, H, D]``, stream ``i`` on rows ``i·T..``."""

    def __init__(self, caches: Sequence[PagedKVCache], tokens_per_frame: int,
                 pool_storage: Optional[torch.Tensor] = None, batched: Optional[BatchedBackend] = None) -> None:
        """``pool_storage`` ``[blocks, 2, pages, page, H, D]`` and ``batched``: attend over the pool in
        one call (the caches must be shares of that pool); else each cache attends with its own backend."""
        if (pool_storage is None) != (batched is None):
            raise ValueError("a batched backend needs the pool's storage, and the other way round")
        self.caches = list(caches)
        self.tokens = tokens_per_frame
        self.pool_storage = pool_storage
        self.batched = batched

    def __call__(self, block: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        t = self.tokens
        if q.shape[0] != t * len(self.caches):
            raise ValueError(f"a step of {len(self.caches)} streams x {t} tokens got {q.shape[0]} rows")
        if self.batched is None:
            outs = [cache(block, q[i * t:(i + 1) * t], k[i * t:(i + 1) * t], v[i * t:(i + 1) * t])
                    for i, cache in enumerate(self.caches)]  # [T, H, D] each
            return torch.cat(outs)  # [B·T, H, D]
        for i, cache in enumerate(self.caches):
            cache.write(block, q[i * t:(i + 1) * t], k[i * t:(i + 1) * t], v[i * t:(i + 1) * t])
        kv = self.pool_storage[block]  # type: ignore[index]  # [2, pages, page, H, D]
        return self.batched.run((kv[0], kv[1]), q)  # [B·T, H, D]


class GroupCameraAttention:
    """``CameraAttention`` of a batched step: q, k, v ``[B, H, D]``, row ``i`` to stream ``i``'s cache."""

    def __init__(self, caches: Sequence[CameraKVCache]) -> None:
        self.caches = list(caches)

    def __call__(self, iteration: int, block: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if q.shape[0] != len(self.caches):
            raise ValueError(f"a step of {len(self.caches)} streams got {q.shape[0]} camera tokens")
        outs = [cache(iteration, block, q[i:i + 1], k[i:i + 1], v[i:i + 1]) for i, cache in enumerate(self.caches)]
        return torch.cat(outs)  # [B, H, D]


__all__ = ["BatchedBackend", "GroupCameraAttention", "GroupGlobalAttention"]
