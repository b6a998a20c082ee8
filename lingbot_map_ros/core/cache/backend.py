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
because exact token-granular paging (FlashInfer fa3 with page size 1) needs each of them viewable as ``[pages*page, 1, H, D]``. The visible keys are all
``page_size`` slots of every visible page except the last, then the first ``last_page_len`` slots of
the last one. There is no mask.
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


__all__ = ["AttentionBackend", "visible_key_count", "visible_token_slots"]
