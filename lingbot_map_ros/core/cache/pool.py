"""One K/V page pool for several streams: static shares, and the batched attention request over them.

Every global block of a ``StreamGroup`` (``core/stream_group.py``) keeps the pages of all its
streams in ONE tensor ``[blocks, 2, shares x pages_per_share, page, H, D]``. Stream ``i`` owns the
pages ``[i·n, (i+1)·n)`` of it, ``n`` = one stream's patch pool + special pool: its
``PagedKVCache`` is built over that slice (a view, no copy) and its ``PageTable`` (``pages.py``)
keeps its own page ids ``0 .. n-1``, exactly as a lone stream's. A page id of the pool is then the
share's first page plus the stream's own id (``PoolShares.global_pages``).

Why static shares and not one free list for all streams: every stream of a group has the same
window geometry (scale frames, window, pool sizes), so each needs the same number of pages at its
worst, and nothing can be lent without being taken back at the next keyframe. Fixed shares give

* isolation: a stream's reset, fault, window switch, load or eviction touches its own pages only,
  by construction (no page id of one table can name another stream's page), and a failed step is
  undone per stream (``PageTable.restore``) without looking at the others;
* a bound known at configure: N shares are allocated once, so the footprint (``core/footprint.py``)
  and the memory budget count exactly what is held, and no stream can exhaust the pool for another;
* each share the same layout as a lone stream's pool, so every attention backend (SDPA, split, the
  CUDA-graph ones) serves a stream of a group unchanged, and a stream alone (N = 1) is today's cache.

A common free list would only pay for streams with different windows or an over-committed pool; it
would also lose the split backend's contiguous prefix per stream (``allocation="lowest"``).

``batched_page_request`` builds the one request of a batched step over the pool, the arrays
FlashInfer's ``BatchPrefillWithPagedKVCacheWrapper.plan`` takes (``qo_indptr = [0, T, 2T, ...]``,
each stream's visible pages as pool page ids); plain NumPy, so the CPU tests check it against the
streams' own tables.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from .pages import PageTable


class PoolShares:
    """Which share of the pool each stream holds (plain Python, no tensors)."""

    def __init__(self, num_shares: int, pages_per_share: int) -> None:
        if num_shares < 1 or pages_per_share < 1:
            raise ValueError(f"num_shares and pages_per_share must be >= 1 (got {num_shares}, {pages_per_share})")
        self.num_shares = num_shares
        self.pages_per_share = pages_per_share
        self._owner: dict[str, int] = {}

    @property
    def num_pages(self) -> int:
        return self.num_shares * self.pages_per_share

    def assign(self, stream: str) -> int:
        """The share of ``stream`` (the lowest free one on its first call, then always the same)."""
        if stream in self._owner:
            return self._owner[stream]
        taken = set(self._owner.values())
        free = [i for i in range(self.num_shares) if i not in taken]
        if not free:
            raise RuntimeError(f"every one of the {self.num_shares} pool shares is held "
                               f"({sorted(self._owner)}): no share for stream {stream!r}")
        self._owner[stream] = free[0]
        return free[0]

    def release(self, stream: str) -> None:
        self._owner.pop(stream, None)

    def owner(self, stream: str) -> int:
        return self._owner[stream]

    def streams(self) -> dict[str, int]:
        return dict(self._owner)

    def first_page(self, stream: str) -> int:
        return self._owner[stream] * self.pages_per_share

    def global_pages(self, stream: str, pages: Sequence[int]) -> list[int]:
        """The stream's own page ids as page ids of the pool."""
        base = self.first_page(stream)
        if any(not 0 <= p < self.pages_per_share for p in pages):
            raise ValueError(f"page ids must lie in 0..{self.pages_per_share - 1} (got {list(pages)})")
        return [base + p for p in pages]


class SharedKVPool:
    """The pool tensor of one frame size and the shares cut from it."""

    def __init__(self, *, num_shares: int, num_blocks: int, pages_per_share: int, page_size: int, num_heads: int,
                 head_dim: int, dtype: torch.dtype, device: torch.device | str) -> None:
        self.shares = PoolShares(num_shares, pages_per_share)
        self.page_size = page_size
        # [blocks, 2 (K, V), pages of every share, page, H, D]; zero-filled like a lone cache's pages
        self.storage = torch.zeros((num_blocks, 2, self.shares.num_pages, page_size, num_heads, head_dim),
                                   dtype=dtype, device=torch.device(device))

    @property
    def nbytes(self) -> int:
        return self.storage.numel() * self.storage.element_size()

    def share_shape(self) -> tuple[int, ...]:
        """The shape of one stream's storage (what ``PagedKVCache`` would allocate for itself)."""
        b, two, _, page, h, d = self.storage.shape
        return (b, two, self.shares.pages_per_share, page, h, d)

    def share(self, stream: str) -> torch.Tensor:
        """``stream``'s pages as a view ``[blocks, 2, pages_per_share, page, H, D]`` of the pool."""
        first = self.shares.first_page(stream) if stream in self.shares.streams() else (
            self.shares.assign(stream) * self.shares.pages_per_share)
        return self.storage[:, :, first:first + self.shares.pages_per_share]


@dataclass(frozen=True)
class BatchedPageRequest:
    """One attention request over the pool for the frames of several streams, in batch order.

    ``qo_indptr [B+1]``: stream ``i``'s queries are rows ``qo_indptr[i]:qo_indptr[i+1]`` of the step;
    ``kv_indptr [B+1]``: its visible pages are ``indices[kv_indptr[i]:kv_indptr[i+1]]`` (pool ids, or
    with ``token_pages`` the pool's token slots, one key each); ``last_page_len [B]``."""

    qo_indptr: np.ndarray
    kv_indptr: np.ndarray
    indices: np.ndarray
    last_page_len: np.ndarray
    keys: tuple[int, ...]  # visible keys per stream


def batched_page_request(tables: Sequence[PageTable], first_pages: Sequence[int], queries_per_stream: int,
                         *, token_pages: bool = False) -> BatchedPageRequest:
    """The arrays of one batched ``plan``: each table's visible pages moved to its share of the pool
    (``first_pages[i]``), concatenated in batch order. ``token_pages``: one index per visible key
    (``page·page_size + offset``; FlashInfer's fa3 with page size 1)."""
    if len(tables) != len(first_pages) or not tables:
        raise ValueError(f"one first page per table needed (got {len(tables)} tables, {len(first_pages)} first pages)")
    segments, lasts, keys = [], [], []
    for table, first in zip(tables, first_pages):
        pages = np.asarray(table.visible_pages(), dtype=np.int64) + first  # [V] pool page ids
        if pages.size == 0:
            raise ValueError("a stream of the batch has no visible page")
        ps, last = table.page_size, table.last_page_len
        count = (pages.size - 1) * ps + last
        keys.append(count)
        if token_pages:
            slots = (pages[:, None] * ps + np.arange(ps, dtype=np.int64)).reshape(-1)[:count]  # [N]
            segments.append(slots)
            lasts.append(1)
        else:
            segments.append(pages)
            lasts.append(last)
    lengths = np.array([s.size for s in segments], dtype=np.int64)
    b = len(tables)
    return BatchedPageRequest(
        qo_indptr=np.arange(b + 1, dtype=np.int32) * queries_per_stream,
        kv_indptr=np.concatenate(([0], np.cumsum(lengths))).astype(np.int32),
        indices=np.concatenate(segments).astype(np.int32),
        last_page_len=np.asarray(lasts, dtype=np.int32),
        keys=tuple(keys),
    )


def batched_index_capacity(batch: int, pages_per_share: int, page_size: int, *, token_pages: bool = False) -> int:
    """Indices a batched plan of ``batch`` streams can ever need: what a CUDA-graph plan preallocates.

    A stream's visible pages are pages of its share, each at most once, so ``pages_per_share`` bounds
    them whatever the window, eviction or special pages do (a non-keyframe's own page included: it is a
    free page of the share). With ``token_pages`` one index per key: at most ``page_size`` per page."""
    if batch < 1 or pages_per_share < 1 or page_size < 1:
        raise ValueError(f"batch, pages_per_share and page_size must be >= 1 (got {batch}, {pages_per_share}, "
                         f"{page_size})")
    return batch * pages_per_share * (page_size if token_pages else 1)


__all__ = ["BatchedPageRequest", "PoolShares", "SharedKVPool", "batched_index_capacity", "batched_page_request"]
