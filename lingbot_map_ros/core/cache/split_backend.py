"""One-frame attention as two dense calls, the contiguous patch prefix and a short tail, merged by
log-sum-exp.

Why: the fastest exact kernel PyTorch ships for one frame's global attention (cuDNN fused attention;
1005 queries x 16 heads x d 64 over ~73k keys) is fastest on a contiguous key range without a
mask (812 us/layer on an H200 against 1178 with the additive mask of ``MaskedDenseBackend`` and
954 for FlashInfer fa3 over token pages, docs/benchmarks.md), and it re-plans whenever the key
length changes. The streaming cache can give it exactly that, because attention does not depend on
the order of the keys:

* With the pool of ``scale + window + 1`` patch pages and ``PageTable(allocation="lowest")``
  (``factory.py`` pairs them), the stored patch pages are always pages ``0 .. n-1``; once the window
  is full a one-frame step sees *all* of pages ``0 .. R-1`` (``R = scale + window``): the
  **prefix**, a fixed-length contiguous region, read unmasked.
* The **tail** is everything after it in the block's storage: page ``R`` (the pool's spare page,
  where a non-keyframe's own frame sits in the steady state) and the special pages (6 tokens per
  stored frame, growing). It is short (one page + the special pool), read with a ``[1, 1, 1, N]``
  visibility mask, so its length is fixed too.

The two partial results combine exactly: with ``lse = log Σ exp(s)`` of each part,
``softmax over (prefix ∪ tail) · V = σ·out_prefix + (1-σ)·out_tail`` where
``σ = sigmoid(lse_prefix - lse_tail)``. While the window fills (the prefix not yet all visible) the
prefix call takes a mask as well; the mode is part of ``plan_signature``, so the CUDA graph is
captured once for the filling window and once for the full one. Masked slots always hold finite
values (storage starts zeroed and is only overwritten with K/V), so ``exp(-inf) = 0`` removes them
exactly.

The merge is a handful of elementwise ops on ``[T, H, D]``; with ``fuse_merge`` it is one
``torch.compile``-d kernel (compiled in the warm-up before the graph capture).
"""
from __future__ import annotations

import functools
from typing import Callable, Optional, Sequence

import torch
from torch import Tensor

from .backend import visible_token_slots

KERNELS = ("cudnn", "efficient", "cpu")
MODES = ("full", "masked", "tail")  # prefix unmasked / prefix masked / no visible prefix key


def attend_with_lse(kernel: str, q: Tensor, k: Tensor, v: Tensor, bias: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    """``softmax(q kᵀ/√D + bias) v`` and its log-sum-exp, from one fused kernel.

    q ``[1, H, T, D]``, k/v ``[1, H, N, D]`` (strided views are fine), bias ``[1, 1, 1, N]`` or None.
    Returns out ``[1, H, T, D]`` in q's dtype and lse ``[1, H, T]`` in float32 (natural log, the
    scores already scaled by 1/√D). Both parts of a merge must come from the same kernel.
    """
    B, H, T, _ = q.shape
    if kernel == "cudnn":
        out, lse = torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, bias, True)[:2]  # lse [B, H, T, 1]
    elif kernel == "efficient":
        out, lse = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, bias, True)[:2]  # lse [B, H, ceil32(T)]
    elif kernel == "cpu":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, attn_mask=bias)  # lse [B, H, T]
    else:
        raise ValueError(f"kernel must be one of {KERNELS} (got {kernel!r})")
    return out, lse.reshape(B, H, -1)[..., :T].float()  # [B, H, T, D], [B, H, T]


def merge_partials(out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor) -> Tensor:
    """Attention over the union of two disjoint key sets from the parts: ``[1, H, T, D]`` x 2 -> ``[T, H, D]`` fp32."""
    share_a = torch.sigmoid(lse_a - lse_b).unsqueeze(-1)  # [1, H, T, 1]: exp(lse_a) / (exp(lse_a) + exp(lse_b))
    b = out_b.float()
    merged = b + (out_a.float() - b) * share_a  # [1, H, T, D]
    return merged[0].transpose(0, 1)  # [T, H, D]


@functools.lru_cache(maxsize=1)
def _fused_merge() -> Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]:
    return torch.compile(merge_partials, fullgraph=True, dynamic=False)


class SplitPrefixBackend:
    """Prefix (pages ``0 .. R-1``) and tail (page ``R`` + special pages) attended apart, merged exactly."""

    name = "sdpa"

    def __init__(
        self,
        *,
        page_size: int,
        num_patch_pages: int,
        num_pages: int,
        num_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
        kernel: str = "cudnn",
        fuse_merge: bool = False,
    ) -> None:
        """``num_patch_pages``: the patch pool (``scale + window + 1``; the prefix is all but its last
        page); ``num_pages``: patch + special pages of a block. ``kernel``: ``cudnn`` on the GPU,
        ``efficient`` (CUDA, any dtype) or ``cpu`` for tests."""
        if kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {KERNELS} (got {kernel!r})")
        if page_size < 1 or num_patch_pages < 2 or num_pages <= num_patch_pages:
            raise ValueError(
                f"need page_size >= 1, num_patch_pages >= 2 and special pages after them "
                f"(got {page_size}, {num_patch_pages}, {num_pages})"
            )
        self.page_size = page_size
        self.num_pages = num_pages
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.device = torch.device(device)
        self.kernel = kernel
        self.prefix_pages = num_patch_pages - 1  # R = scale + window
        self.prefix_slots = self.prefix_pages * page_size
        self.tail_slots = (num_pages - self.prefix_pages) * page_size
        self._merge = _fused_merge() if fuse_merge else merge_partials
        self._offsets = torch.arange(page_size, dtype=torch.long, device=self.device)  # [page]
        # additive biases in the compute dtype (cuDNN reads the bias in q's dtype): 0 visible, -inf not
        self._prefix_mask = torch.full((1, 1, 1, self.prefix_slots), float("-inf"), dtype=dtype, device=self.device)
        self._tail_mask = torch.full((1, 1, 1, self.tail_slots), float("-inf"), dtype=dtype, device=self.device)
        self._mode = "masked"
        self._num_queries = 0
        self._num_keys = 0

    @property
    def mode(self) -> str:
        """``full`` (prefix read unmasked), ``masked`` (window still filling) or ``tail`` (no prefix key)."""
        return self._mode

    @property
    def num_keys(self) -> int:
        return self._num_keys

    @property
    def plan_signature(self) -> tuple:
        """A captured graph holds one mode's calls: re-capture when the mode changes."""
        return (self._num_queries, self._mode)

    def plan(self, visible_pages: Sequence[int], last_page_len: int, num_query_tokens: int) -> None:
        if not visible_pages:
            raise ValueError("cannot plan attention over an empty visible set")
        ps = self.page_size
        if not 1 <= last_page_len <= ps:
            raise ValueError(f"last_page_len must be in 1..{ps} (got {last_page_len})")
        if max(visible_pages) >= self.num_pages or min(visible_pages) < 0:
            raise ValueError(f"visible pages must lie in 0..{self.num_pages - 1} (got {min(visible_pages)}..{max(visible_pages)})")
        R = self.prefix_pages
        prefix = [p for p in visible_pages if p < R]
        tail = [p - R for p in visible_pages if p >= R]  # page ids within the tail region
        last_in_prefix = visible_pages[-1] < R
        if not tail:
            raise ValueError("the split backend needs a visible key after the prefix (every step has its own specials)")
        prefix_keys = len(prefix) * ps - (ps - last_page_len if last_in_prefix else 0)
        tail_keys = len(tail) * ps - (0 if last_in_prefix else ps - last_page_len)
        if prefix_keys == self.prefix_slots:
            mode = "full"
        elif prefix_keys == 0:
            mode = "tail"
        else:
            mode = "masked"
            flat = self._prefix_mask.view(-1)  # [prefix_slots]
            flat.fill_(float("-inf"))
            flat.index_fill_(0, visible_token_slots(prefix, last_page_len if last_in_prefix else ps, self._offsets), 0.0)
        flat = self._tail_mask.view(-1)  # [tail_slots]
        flat.fill_(float("-inf"))
        flat.index_fill_(0, visible_token_slots(tail, ps if last_in_prefix else last_page_len, self._offsets), 0.0)
        self._mode = mode
        self._num_queries = num_query_tokens
        self._num_keys = prefix_keys + tail_keys

    def run(self, kv_pages: tuple[Tensor, Tensor], q: Tensor) -> Tensor:
        """``q [T, H, D]`` over the planned keys of one block's ``(K, V)``, each ``[pages, page, H, D]``."""
        k_pages, v_pages = kv_pages
        num_slots = k_pages.shape[0] * k_pages.shape[1]
        if num_slots != self.prefix_slots + self.tail_slots:
            raise ValueError(f"backend built for {self.prefix_slots + self.tail_slots} slots, pages hold {num_slots}")
        H, D, n = self.num_heads, self.head_dim, self.prefix_slots
        k = k_pages.view(1, num_slots, H, D).transpose(1, 2)  # [1, H, N, D] strided view, no copy
        v = v_pages.view(1, num_slots, H, D).transpose(1, 2)  # [1, H, N, D]
        qh = q.to(k.dtype).transpose(0, 1).unsqueeze(0)  # [1, H, T, D]
        out_t, lse_t = attend_with_lse(self.kernel, qh, k[:, :, n:], v[:, :, n:], self._tail_mask)  # [1, H, T, D], [1, H, T]
        if self._mode == "tail":
            return out_t[0].transpose(0, 1).to(q.dtype)  # [T, H, D]
        bias = None if self._mode == "full" else self._prefix_mask
        out_p, lse_p = attend_with_lse(self.kernel, qh, k[:, :, :n], v[:, :, :n], bias)  # [1, H, T, D], [1, H, T]
        return self._merge(out_p, lse_p, out_t, lse_t).to(q.dtype)  # [T, H, D]


__all__ = ["SplitPrefixBackend", "attend_with_lse", "merge_partials", "KERNELS", "MODES"]
