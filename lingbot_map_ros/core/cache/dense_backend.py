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

from .backend import DenseStorageBackend, check_plan, visible_token_slots

KERNELS = {
    "cudnn": (SDPBackend.CUDNN_ATTENTION,),
    "efficient": (SDPBackend.EFFICIENT_ATTENTION,),
    "math": (SDPBackend.MATH,),
}


class MaskedDenseBackend(DenseStorageBackend):
    """SDPA over all ``num_pages * page_size`` slots of a block with a device-held visibility mask."""

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
        super().__init__(page_size=page_size, num_pages=num_pages, num_heads=num_heads, head_dim=head_dim,
                         dtype=dtype, device=device)
        self.kernel = kernel
        self._kernels = list(KERNELS[kernel])
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
        check_plan(visible_pages, last_page_len, self.page_size, self.num_pages)
        slots = visible_token_slots(visible_pages, last_page_len, self._offsets)  # [N_visible]
        flat = self._mask.view(-1)  # [N]
        flat.fill_(float("-inf"))
        flat.index_fill_(0, slots, 0.0)
        self._num_keys = slots.numel()
        self._num_queries = num_query_tokens

    def run(self, kv_pages: tuple[torch.Tensor, torch.Tensor], q: torch.Tensor) -> torch.Tensor:
        """``q [T, H, D]`` over every slot of ``(k_pages, v_pages)`` (each ``[pages, page, H, D]``), masked."""
        k, v = self._key_views(kv_pages)  # [1, H, N, D] each
        qh = q.to(k.dtype).transpose(0, 1).unsqueeze(0)  # [1, H, T, D]
        with sdpa_kernel(self._kernels):
            out = F.scaled_dot_product_attention(qh, k, v, attn_mask=self._mask.to(k.dtype))  # [1, H, T, D]
        return out[0].transpose(0, 1).to(q.dtype)  # [T, H, D]


__all__ = ["MaskedDenseBackend", "KERNELS"]
