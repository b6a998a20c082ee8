"""Paged attention through ``torch.nn.functional.scaled_dot_product_attention`` (CPU or GPU, any dtype).

The portable backend and the oracle for faster ones. It avoids the three costs of the official SDPA
fallback (docs/model.md §9.4): no ``torch.cat`` of the whole cache per frame (K/V stay in preallocated pages and
are gathered with one ``index_select`` per block), no fp32 K cache (pages are in the model dtype),
and the gather index is built once per step in ``plan`` and shared by every block.

Kernel choice on CUDA (measured on an H200, 24 blocks, 1005 queries x ~73k keys, bf16): the key
length grows by 6 specials at every keyframe, and cuDNN attention builds a new plan for every new
length (~37 ms of host time per step: 59 ms/step vs 22 ms with a cached plan). Flash attention has
no plan and runs ~1.4 ms/block (34 ms/step), so on CUDA cuDNN is excluded unless asked for.
"""
from __future__ import annotations

import contextlib
from typing import ContextManager, Sequence

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from .backend import check_plan, visible_key_count, visible_token_slots


def default_sdpa_kernels(device: torch.device) -> tuple[SDPBackend, ...] | None:
    """SDPA kernels to allow: on CUDA everything but cuDNN (re-plans per key length), else no restriction."""
    if device.type == "cuda":
        return (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH)
    return None


def sdpa_kernel_context(kernels: Sequence[SDPBackend] | None) -> ContextManager:
    """``sdpa_kernel(kernels)``, or a no-op when any kernel may be used."""
    return contextlib.nullcontext() if kernels is None else sdpa_kernel(list(kernels))


class SdpaBackend:
    """Gathers the visible K/V slots of a block's pages and runs dense SDPA over them (no mask)."""

    name = "sdpa"

    def __init__(
        self,
        *,
        page_size: int,
        device: torch.device | str,
        kernels: Sequence[SDPBackend] | None | str = "auto",
    ) -> None:
        """``kernels``: SDPA kernels to allow; ``"auto"`` = ``default_sdpa_kernels(device)``, None = any."""
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1 (got {page_size})")
        self.page_size = page_size
        self.device = torch.device(device)
        self.kernels = default_sdpa_kernels(self.device) if kernels == "auto" else kernels
        self._offsets = torch.arange(page_size, dtype=torch.long, device=self.device)  # [page]
        self._slots: torch.Tensor | None = None  # [N] visible token slots (rows of k_pages.view(-1, H, D))
        self._num_keys = 0
        self._num_queries = 0

    @property
    def num_keys(self) -> int:
        """Visible keys of the planned step."""
        return self._num_keys

    def plan(self, visible_pages: Sequence[int], last_page_len: int, num_query_tokens: int) -> None:
        """Build the gather index of the visible slots once for all blocks of this step.

        Slot ``o`` of page ``p`` is row ``p·page + o`` of ``k_pages.view(-1, H, D)`` (and of V's).
        """
        check_plan(visible_pages, last_page_len, self.page_size)
        if num_query_tokens < 1:
            raise ValueError(f"num_query_tokens must be >= 1 (got {num_query_tokens})")
        self._slots = visible_token_slots(visible_pages, last_page_len, self._offsets)  # [N]
        self._num_keys = self._slots.numel()
        self._num_queries = num_query_tokens

    def run(self, kv_pages: tuple[torch.Tensor, torch.Tensor], q: torch.Tensor) -> torch.Tensor:
        """Attention of ``q [T, H, D]`` over the planned slots of ``(k_pages, v_pages)``.

        Each of ``k_pages`` and ``v_pages`` is ``[pages, page, H, D]``.
        """
        if self._slots is None:
            raise RuntimeError("run() before plan()")
        if q.shape[0] != self._num_queries:
            raise ValueError(f"planned {self._num_queries} query tokens, got q of shape {tuple(q.shape)}")
        k_pages, v_pages = kv_pages
        num_heads, head_dim = k_pages.shape[-2:]
        k = k_pages.view(-1, num_heads, head_dim).index_select(0, self._slots)  # [N, H, D]
        v = v_pages.view(-1, num_heads, head_dim).index_select(0, self._slots)  # [N, H, D]
        # 4-D [1, H, ·, D] views: PyTorch's fused CUDA kernels (flash, efficient, cuDNN) accept only 4-D
        # inputs and silently fall back to the O(T·N) memory math kernel otherwise (~30x slower).
        k = k.transpose(0, 1).unsqueeze(0)  # [1, H, N, D]
        v = v.transpose(0, 1).unsqueeze(0)  # [1, H, N, D]
        qh = q.to(k.dtype).transpose(0, 1).unsqueeze(0)  # [1, H, T, D]
        with sdpa_kernel_context(self.kernels):
            out = F.scaled_dot_product_attention(qh, k, v)  # [1, H, T, D]
        return out[0].transpose(0, 1).to(q.dtype)  # [T, H, D]


class StaticSdpaBackend:
    """CUDA-graph-capturable variant for one-frame steps: every tensor it touches has a fixed address.

    ``plan`` (outside the graph) writes the visible slots into a fixed-size index buffer (padded with
    slot 0) and the key count into a device ``cu_seqlens_k = [0, N]``. ``run`` (inside the graph)
    gathers a fixed ``max_keys`` rows into preallocated K/V buffers and calls PyTorch's varlen flash
    kernel, which reads the true length ``N`` from ``cu_seqlens_k`` on the device: the padding rows
    are never attended, the key length can change every frame without re-planning or re-capturing,
    and no mask is needed. fp16/bf16 on CUDA only (flash attention).
    """

    name = "sdpa"

    def __init__(self, *, page_size: int, num_heads: int, head_dim: int, max_keys: int, num_query_tokens: int,
                 dtype: torch.dtype, device: torch.device | str) -> None:
        self.page_size = page_size
        self.device = torch.device(device)
        self.max_keys = max_keys
        self.num_query_tokens = num_query_tokens
        self.scale = head_dim**-0.5
        self._offsets = torch.arange(page_size, dtype=torch.long, device=self.device)  # [page]
        self._slots = torch.zeros(max_keys, dtype=torch.long, device=self.device)  # [max_keys]
        self._cu_q = torch.tensor([0, num_query_tokens], dtype=torch.int32, device=self.device)  # [2]
        self._cu_k = torch.zeros(2, dtype=torch.int32, device=self.device)  # [2] = [0, N]
        self._k = torch.zeros(max_keys, num_heads, head_dim, dtype=dtype, device=self.device)  # [max_keys, H, D]
        self._v = torch.zeros_like(self._k)
        self._num_keys = 0

    @property
    def num_keys(self) -> int:
        return self._num_keys

    def plan(self, visible_pages: Sequence[int], last_page_len: int, num_query_tokens: int) -> None:
        check_plan(visible_pages, last_page_len, self.page_size)
        if num_query_tokens != self.num_query_tokens:
            raise ValueError(f"planned for {self.num_query_tokens} query tokens (got {num_query_tokens})")
        num_keys = visible_key_count(len(visible_pages), last_page_len, self.page_size)
        if num_keys > self.max_keys:
            raise ValueError(f"{num_keys} visible keys exceed the static capacity {self.max_keys}")
        slots = visible_token_slots(visible_pages, last_page_len, self._offsets)  # [N]
        self._slots[:num_keys].copy_(slots)
        self._slots[num_keys:].zero_()
        self._cu_k[1].fill_(num_keys)
        self._num_keys = num_keys

    def run(self, kv_pages: tuple[torch.Tensor, torch.Tensor], q: torch.Tensor) -> torch.Tensor:
        k_pages, v_pages = kv_pages
        num_heads, head_dim = k_pages.shape[-2:]
        torch.index_select(k_pages.view(-1, num_heads, head_dim), 0, self._slots, out=self._k)  # [max_keys, H, D]
        torch.index_select(v_pages.view(-1, num_heads, head_dim), 0, self._slots, out=self._v)
        out = torch.ops.aten._flash_attention_forward(
            q.to(self._k.dtype).contiguous(), self._k, self._v, self._cu_q, self._cu_k,
            self.num_query_tokens, self.max_keys, 0.0, False, False, scale=self.scale,
        )[0]  # [T, H, D]
        return out.to(q.dtype)


class BatchedSdpaBackend:
    """The pooled batched step through SDPA: the reference of ``BatchedFlashInferBackend``.

    It reads exactly what the FlashInfer form reads - the pool's K and V through one
    ``pool.BatchedPageRequest`` (``qo_indptr``, each stream's pool page ids, last-page lengths) - and
    attends each stream's query rows to its own segment with PyTorch SDPA, one call per stream. On the
    CPU it checks the pool's addressing end to end against each stream's own cache
    (``test/test_stream_group.py``); any device, any dtype."""

    name = "sdpa"
    token_pages = False

    def __init__(self, *, device: torch.device | str, kernels: Sequence[SDPBackend] | None | str = "auto") -> None:
        self.device = torch.device(device)
        self.kernels = default_sdpa_kernels(self.device) if kernels == "auto" else kernels
        self._segments: list[tuple[int, int, torch.Tensor]] = []  # (first query row, end, slots [N])

    def plan(self, request, page_size: int) -> None:
        """``request``: a ``pool.BatchedPageRequest`` of pool page ids (not token pages)."""
        offsets = torch.arange(page_size, dtype=torch.long, device=self.device)  # [page]
        self._segments = []
        for i in range(len(request.last_page_len)):
            pages = request.indices[request.kv_indptr[i]:request.kv_indptr[i + 1]]
            slots = visible_token_slots(pages.tolist(), int(request.last_page_len[i]), offsets)  # [N_i]
            self._segments.append((int(request.qo_indptr[i]), int(request.qo_indptr[i + 1]), slots))

    def run(self, kv_pages: tuple[torch.Tensor, torch.Tensor], q: torch.Tensor) -> torch.Tensor:
        """``q [B·T, H, D]`` over the planned segments of one block's pool ``(K, V)``."""
        k_pages, v_pages = kv_pages
        num_heads, head_dim = k_pages.shape[-2:]
        k_rows, v_rows = k_pages.view(-1, num_heads, head_dim), v_pages.view(-1, num_heads, head_dim)
        outs = []
        for start, end, slots in self._segments:
            k = k_rows.index_select(0, slots).transpose(0, 1).unsqueeze(0)  # [1, H, N, D]
            v = v_rows.index_select(0, slots).transpose(0, 1).unsqueeze(0)  # [1, H, N, D]
            qh = q[start:end].to(k.dtype).transpose(0, 1).unsqueeze(0)  # [1, H, T, D]
            with sdpa_kernel_context(self.kernels):
                out = F.scaled_dot_product_attention(qh, k, v)  # [1, H, T, D]
            outs.append(out[0].transpose(0, 1))  # [T, H, D]
        return torch.cat(outs).to(q.dtype)  # [B·T, H, D]


__all__ = ["BatchedSdpaBackend", "SdpaBackend", "StaticSdpaBackend", "default_sdpa_kernels", "sdpa_kernel_context"]
