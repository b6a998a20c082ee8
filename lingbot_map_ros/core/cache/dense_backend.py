"""Attention over a block's whole page storage as one fixed-shape key set, with an additive key mask.

Why: the fastest exact attention kernel PyTorch ships for this shape (cuDNN's fused attention; one
frame = ~1005 queries x 16 heads x d 64 over ~73k keys) builds a new execution plan for every new
key length, and the visible set of the streaming cache grows by 6 special tokens at every keyframe.
Reading the *entire* per-block storage ``[pages * page, H, D]`` instead keeps the key length
constant for the life of the cache; the slots that are not visible (free patch pages, unused
special slots) get ``-inf`` in a ``[1, 1, 1, N]`` bias. That gives:

* no gather copy (the kernel reads a strided ``[1, H, N, D]`` view of the pages),
* one plan per cache (and per query count), so the call is CUDA-graph capturable,
* exact semantics: ``exp(-inf) = 0``, so masked slots contribute nothing whatever they hold
  (they are always finite: storage starts zeroed and is only ever overwritten with K/V).

It only pays when the pools are sized tightly (``PagedKVCache(..., num_patch_pages=scale +
window + 1, special_pages=…)``: the factory does this), so that the masked share stays small:
at the full model's defaults 75 pages x 999 slots of which ≥ 72 x 999 + 6·F are visible.

``plan`` (host side, once per step, outside any graph) rewrites the mask in place: two small
device kernels and one copy of the visible page list.
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from .backend import visible_token_slots

KERNELS = {
    "cudnn": (SDPBackend.CUDNN_ATTENTION,),
    "efficient": (SDPBackend.EFFICIENT_ATTENTION,),
    "math": (SDPBackend.MATH,),
}


class MaskedDenseBackend:
    """SDPA over all ``num_pages * page_size`` slots of a block with a device-held visibility mask."""

    name = "sdpa"

    def __init__(
        self,
        *,
        page_size: int,
        num_pages: int,
        num_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
        kernel: str = "cudnn",
    ) -> None:
        """``kernel``: the SDPA kernel to force (``cudnn``; ``efficient``/``math`` for tests and CPU)."""
        if kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {sorted(KERNELS)} (got {kernel!r})")
        if page_size < 1 or num_pages < 1:
            raise ValueError(f"page_size and num_pages must be >= 1 (got {page_size}, {num_pages})")
        self.page_size = page_size
        self.num_pages = num_pages
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.device = torch.device(device)
        self.kernel = kernel
        self._kernels = list(KERNELS[kernel])
        self.num_slots = num_pages * page_size
        self._offsets = torch.arange(page_size, dtype=torch.long, device=self.device)  # [page]
        # [1, 1, 1, N] additive bias in the compute dtype (cuDNN reads the bias in q's dtype)
        self._mask = torch.full((1, 1, 1, self.num_slots), float("-inf"), dtype=dtype, device=self.device)
        self._num_keys = 0
        self._num_queries = 0

    @property
    def num_keys(self) -> int:
        """Visible keys of the planned step (the kernel itself always reads ``num_slots``)."""
        return self._num_keys

    @property
    def plan_signature(self) -> tuple:
        """Nothing host-side changes between plans: a captured graph stays valid."""
        return (self._num_queries,)

    @property
    def mask(self) -> torch.Tensor:
        """``[1, 1, 1, N]`` additive bias of the planned step (0 visible, -inf not)."""
        return self._mask

    def plan(self, visible_pages: Sequence[int], last_page_len: int, num_query_tokens: int) -> None:
        if not visible_pages:
            raise ValueError("cannot plan attention over an empty visible set")
        if not 1 <= last_page_len <= self.page_size:
            raise ValueError(f"last_page_len must be in 1..{self.page_size} (got {last_page_len})")
        if max(visible_pages) >= self.num_pages or min(visible_pages) < 0:
            raise ValueError(f"visible pages must lie in 0..{self.num_pages - 1} (got {min(visible_pages)}..{max(visible_pages)})")
        slots = visible_token_slots(visible_pages, last_page_len, self._offsets)  # [N_visible]
        flat = self._mask.view(-1)  # [N]
        flat.fill_(float("-inf"))
        flat.index_fill_(0, slots, 0.0)
        self._num_keys = slots.numel()
        self._num_queries = num_query_tokens

    def run(self, kv_pages: tuple[torch.Tensor, torch.Tensor], q: torch.Tensor) -> torch.Tensor:
        """``q [T, H, D]`` over every slot of ``(k_pages, v_pages)`` (each ``[pages, page, H, D]``), masked."""
        k_pages, v_pages = kv_pages
        if k_pages.shape[0] * k_pages.shape[1] != self.num_slots:
            raise ValueError(f"backend built for {self.num_slots} slots, pages hold {k_pages.shape[0] * k_pages.shape[1]}")
        H, D = self.num_heads, self.head_dim
        k = k_pages.view(1, self.num_slots, H, D).transpose(1, 2)  # [1, H, N, D] strided view, no copy
        v = v_pages.view(1, self.num_slots, H, D).transpose(1, 2)  # [1, H, N, D]
        qh = q.to(k.dtype).transpose(0, 1).unsqueeze(0)  # [1, H, T, D]
        with sdpa_kernel(self._kernels):
            out = F.scaled_dot_product_attention(qh, k, v, attn_mask=self._mask.to(k.dtype))  # [1, H, T, D]
        return out[0].transpose(0, 1).to(q.dtype)  # [T, H, D]


__all__ = ["MaskedDenseBackend", "KERNELS"]
