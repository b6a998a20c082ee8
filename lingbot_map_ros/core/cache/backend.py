"""The seam between the paged KV cache and the attention kernel that reads its pages.

All global blocks share one page table at a given step (docs/model.md §9.3), so a backend does its
per-step work (index building, kernel planning) once in ``plan`` and only launches the kernel
per block in ``run``. This is exactly the shape of FlashInfer's
``BatchPrefillWithPagedKVCacheWrapper`` (``plan`` once, ``run`` per layer), so a FlashInfer
backend only has to implement these two methods. This module imports no backend: they import its
helpers, and ``factory.py`` picks and builds them.

Physical layout handed to ``run`` (per block, owned by ``paged.PagedKVCache``): a pair
``(k_pages, v_pages)``, each a contiguous ``[num_pages, page_size, H, D]`` tensor ("NHD"), page ids
as in ``pages.PageTable``; token slot ``page * page_size + offset`` is row ``page*page_size+offset``
of ``k_pages.view(-1, H, D)``. K and V are separate (not one ``[pages, 2, page, H, D]`` tensor)
because exact token-granular paging (FlashInfer fa3 with page size 1) needs each of them viewable
as ``[pages*page, 1, H, D]``. The visible keys are all ``page_size`` slots of every visible page
except the last, then the first ``last_page_len`` slots of the last one. There is no mask.
"""
from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

import torch


@runtime_checkable
class AttentionBackend(Protocol):
    """Attention of one request (the current step's queries) over a paged visible set."""

    name: str

    def plan(self, visible_pages: Sequence[int], last_page_len: int, num_query_tokens: int) -> None:
        """Prepare the step: called once per frame step, after the page table was updated."""
        ...

    def run(self, kv_pages: tuple[torch.Tensor, torch.Tensor], q: torch.Tensor) -> torch.Tensor:
        """``softmax(q kᵀ/√D) v`` over the planned pages of one block.

        kv_pages: ``(k_pages, v_pages)``, each ``[num_pages, page_size, H, D]``; q: ``[T, H, D]`` with
        T the planned query count. Returns ``[T, H, D]`` in q's dtype.
        """
        ...


class DenseStorageBackend:
    """What the backends that read a block's whole storage as dense key ranges (``dense_backend``,
    ``split_backend``) share: the storage geometry, and the page offsets their masks are built from."""

    name = "sdpa"

    def __init__(self, *, page_size: int, num_pages: int, num_heads: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device | str) -> None:
        if page_size < 1 or num_pages < 1:
            raise ValueError(f"page_size and num_pages must be >= 1 (got {page_size}, {num_pages})")
        self.page_size = page_size
        self.num_pages = num_pages
        self.num_slots = num_pages * page_size
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.device = torch.device(device)
        self._offsets = torch.arange(page_size, dtype=torch.long, device=self.device)  # [page]

    def _key_views(self, kv_pages: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(k, v)`` of one block as ``[1, H, N, D]`` strided views of its pages (no copy)."""
        k_pages, v_pages = kv_pages
        if k_pages.shape[0] * k_pages.shape[1] != self.num_slots:
            raise ValueError(
                f"backend built for {self.num_slots} slots, pages hold {k_pages.shape[0] * k_pages.shape[1]}"
            )
        H, D = self.num_heads, self.head_dim
        k = k_pages.view(1, self.num_slots, H, D).transpose(1, 2)  # [1, H, N, D]
        v = v_pages.view(1, self.num_slots, H, D).transpose(1, 2)  # [1, H, N, D]
        return k, v


def check_plan(visible_pages: Sequence[int], last_page_len: int, page_size: int, num_pages: int | None = None) -> None:
    """The one check of a plan request every backend makes (``num_pages``: also check the page ids)."""
    if not visible_pages:
        raise ValueError("cannot plan attention over an empty visible set")
    if not 1 <= last_page_len <= page_size:
        raise ValueError(f"last_page_len must be in 1..{page_size} (got {last_page_len})")
    if num_pages is not None and (max(visible_pages) >= num_pages or min(visible_pages) < 0):
        raise ValueError(
            f"visible pages must lie in 0..{num_pages - 1} (got {min(visible_pages)}..{max(visible_pages)})"
        )


def visible_key_count(num_pages: int, last_page_len: int, page_size: int) -> int:
    """Keys of a visible table: every slot of each page but the last, ``last_page_len`` of the last."""
    return (num_pages - 1) * page_size + last_page_len


def visible_token_slots(
    visible_pages: Sequence[int], last_page_len: int, offsets: torch.Tensor
) -> torch.Tensor:
    """Flat token slots (``page * page_size + offset``) of the visible keys, in table order.

    ``offsets`` is ``arange(page_size)`` on the target device, in the index dtype wanted (long for
    ``index_select``, int32 for FlashInfer); the result ``[N]`` lives there too.
    """
    page_size = offsets.numel()
    num_keys = visible_key_count(len(visible_pages), last_page_len, page_size)
    pages = torch.tensor(list(visible_pages), dtype=offsets.dtype).to(offsets.device, non_blocking=True)  # [V]
    return (pages[:, None] * page_size + offsets).reshape(-1)[:num_keys]  # [N]


__all__ = ["AttentionBackend", "DenseStorageBackend", "check_plan", "visible_key_count", "visible_token_slots"]
