"""FlashInfer paged attention over the cache's pages: ``plan`` once per frame step, ``run`` per block.

Two kernel families read the same physical pages (K and V as separate ``[pages, page, H, D]``
tensors, see ``paged.py``):

* ``fa2`` (default, the official layout): FlashInfer pages = our pages, ``page_size`` = patches
  per frame (non-power-of-two is fine for fa2); the visible table is scale → window → special pages.
* ``fa3`` (Hopper): FlashInfer's fa3 paged kernel only takes power-of-two pages, and the official
  fa3 mode rounds pages up and then attends zero-filled slots (docs/model.md §16 #8). We instead hand
  it *token-granular* pages (page_size 1) over the same storage viewed as ``[pages*page, 1, H, D]``:
  the indices list exactly the visible token slots, so lengths are exact and nothing is padded.

Both run without a mask or positional encoding (RoPE is already in K, docs/model.md §9.3). With
``use_cuda_graph`` the index buffers are preallocated at their maximum size so that ``run`` can be
captured in a CUDA graph and re-planned between replays.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch

from .backend import check_plan, visible_key_count, visible_token_slots

_WORKSPACE_BYTES = 256 * 1024 * 1024


class FlashInferBackend:
    name = "flashinfer"

    def __init__(
        self,
        *,
        page_size: int,
        num_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
        kernel: str = "fa2",
        use_cuda_graph: bool = False,
        max_visible_pages: int = 0,
        max_query_tokens: int = 0,
    ) -> None:
        import flashinfer  # optional dependency: imported only when this backend is built

        if dtype not in (torch.float16, torch.bfloat16):
            raise ValueError(f"FlashInfer needs float16 or bfloat16 pages (got {dtype})")
        if kernel not in ("fa2", "fa3"):
            raise ValueError(f"kernel must be fa2 or fa3 (got {kernel!r})")
        self.page_size = page_size
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.device = torch.device(device)
        self.kernel = kernel
        self.use_cuda_graph = use_cuda_graph
        self._token_pages = kernel == "fa3"
        self._offsets = torch.arange(page_size, dtype=torch.int32, device=self.device)  # [page]
        self._workspace = torch.empty(_WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
        kwargs = {}
        if use_cuda_graph:
            if max_visible_pages < 1 or max_query_tokens < 1:
                raise ValueError("CUDA-graph mode needs max_visible_pages and max_query_tokens")
            max_indices = max_visible_pages * (page_size if self._token_pages else 1)
            kwargs = dict(
                use_cuda_graph=True,
                qo_indptr_buf=torch.zeros(2, dtype=torch.int32, device=self.device),
                paged_kv_indptr_buf=torch.zeros(2, dtype=torch.int32, device=self.device),
                paged_kv_indices_buf=torch.zeros(max_indices, dtype=torch.int32, device=self.device),
                paged_kv_last_page_len_buf=torch.zeros(1, dtype=torch.int32, device=self.device),
            )
        self._wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
            self._workspace, "NHD", backend=kernel, **kwargs
        )
        self._num_queries = 0
        self._num_keys = 0
        self._max_query_tokens = max_query_tokens

    @property
    def num_keys(self) -> int:
        return self._num_keys

    @property
    def plan_signature(self) -> tuple:
        """Host-side launch parameters fixed by ``plan``: a captured graph is valid while it is unchanged."""
        info = getattr(self._wrapper, "_plan_info", None)
        return (self._num_queries, tuple(int(x) for x in info) if info is not None else None)

    def plan(self, visible_pages: Sequence[int], last_page_len: int, num_query_tokens: int) -> None:
        check_plan(visible_pages, last_page_len, self.page_size)
        ps = self.page_size
        num_keys = visible_key_count(len(visible_pages), last_page_len, ps)
        if self._token_pages:
            # exact token slots of the visible pages: slot = page * page_size + offset
            indices = visible_token_slots(visible_pages, last_page_len, self._offsets)  # [N] int32
            kv_len, page_size, last = num_keys, 1, 1
        else:
            indices = torch.tensor(list(visible_pages), dtype=torch.int32)  # [V] host
            kv_len, page_size, last = len(visible_pages), ps, last_page_len
        if self.use_cuda_graph and num_query_tokens != self._max_query_tokens:
            raise ValueError(
                f"CUDA-graph FlashInfer plans exactly {self._max_query_tokens} queries (got {num_query_tokens})"
            )
        self._wrapper.plan(
            torch.tensor([0, num_query_tokens], dtype=torch.int32),
            torch.tensor([0, kv_len], dtype=torch.int32),
            indices,
            torch.tensor([last], dtype=torch.int32),
            self.num_heads,
            self.num_heads,
            self.head_dim,
            page_size,
            causal=False,
            pos_encoding_mode="NONE",
            sm_scale=1.0 / math.sqrt(self.head_dim),
            q_data_type=self.dtype,
            kv_data_type=self.dtype,
        )
        self._num_queries = num_query_tokens
        self._num_keys = num_keys

    def run(self, kv_pages: tuple[torch.Tensor, torch.Tensor], q: torch.Tensor) -> torch.Tensor:
        """``q [T, H, D]`` over the planned pages of one block's ``(K, V)``, each ``[pages, page, H, D]``."""
        k_pages, v_pages = kv_pages
        if self._token_pages:
            k_pages = k_pages.view(-1, 1, self.num_heads, self.head_dim)  # [pages*page, 1, H, D]
            v_pages = v_pages.view(-1, 1, self.num_heads, self.head_dim)
        out = self._wrapper.run(q.to(self.dtype), (k_pages, v_pages))  # [T, H, D]
        return out.to(q.dtype)





class BatchedFlashInferBackend:
    """The frames of several streams in ONE FlashInfer call over a group's pool (``cache/pool.py``).

    ``plan`` takes a ``BatchedPageRequest`` (``pool.batched_page_request``: ``qo_indptr = [0, T, 2T,
    ...]``, each stream's visible pages as pool page ids, or its token slots for ``fa3``) once per
    step; ``run`` attends every block's ``[B·T, H, D]`` queries over the pool's K and V. FlashInfer's
    scheduler packs (stream, query tile, key chunk) work over all streams and merges the partial
    states, so streams of different lengths cost one launch.

    ``batch_size`` > 0: the CUDA-graph form for exactly that many streams (FlashInfer fixes a captured
    wrapper's batch size, and its query rows at the first plan, for its life: a group keeps one per
    batch size). ``qo_indptr`` / ``paged_kv_indptr`` / ``last_page_len`` / ``paged_kv_indices`` are
    preallocated (``max_indices``: ``pool.batched_index_capacity``) and ``plan`` writes them outside
    the graph before each replay; ``run`` is what the graph captures."""

    name = "flashinfer"

    def __init__(self, *, num_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device | str,
                 kernel: str = "fa2", batch_size: int = 0, max_indices: int = 0) -> None:
        import flashinfer  # optional dependency: imported only when this backend is built

        if dtype not in (torch.float16, torch.bfloat16):
            raise ValueError(f"FlashInfer needs float16 or bfloat16 pages (got {dtype})")
        if kernel not in ("fa2", "fa3"):
            raise ValueError(f"kernel must be fa2 or fa3 (got {kernel!r})")
        self.num_heads, self.head_dim, self.dtype, self.kernel = num_heads, head_dim, dtype, kernel
        self.device = torch.device(device)
        self.token_pages = kernel == "fa3"  # fa3 takes power-of-two pages only: one key per index (exact)
        self._workspace = torch.empty(_WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
        self.batch_size, self.max_indices = batch_size, max_indices
        kwargs = {}
        if batch_size:
            if batch_size < 1 or max_indices < 1:
                raise ValueError(f"the CUDA-graph form needs batch_size and max_indices >= 1 "
                                 f"(got {batch_size}, {max_indices})")
            i32 = dict(dtype=torch.int32, device=self.device)
            kwargs = dict(use_cuda_graph=True, qo_indptr_buf=torch.zeros(batch_size + 1, **i32),
                          paged_kv_indptr_buf=torch.zeros(batch_size + 1, **i32),
                          paged_kv_indices_buf=torch.zeros(max_indices, **i32),
                          paged_kv_last_page_len_buf=torch.zeros(batch_size, **i32))
        self._wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self._workspace, "NHD", backend=kernel,
                                                                       **kwargs)
        self._num_queries = 0

    @property
    def plan_signature(self) -> tuple:
        """Host-side launch parameters fixed by ``plan`` (a captured graph is valid while it is unchanged)."""
        info = getattr(self._wrapper, "_plan_info", None)
        return (self._num_queries, tuple(int(x) for x in info) if info is not None else None)

    def plan(self, request, page_size: int) -> None:
        """``request``: a ``pool.BatchedPageRequest`` built with ``token_pages`` = this backend's."""
        if self.batch_size:
            b = len(request.last_page_len)
            if b != self.batch_size or request.indices.size > self.max_indices:
                raise ValueError(f"this CUDA-graph plan is for {self.batch_size} streams and {self.max_indices} "
                                 f"indices (got {b} streams, {request.indices.size} indices)")
            if self._num_queries and int(request.qo_indptr[-1]) != self._num_queries:
                raise ValueError(f"this CUDA-graph plan has {self._num_queries} query rows "
                                 f"(got {int(request.qo_indptr[-1])})")
        self._wrapper.plan(
            torch.from_numpy(request.qo_indptr), torch.from_numpy(request.kv_indptr),
            torch.from_numpy(request.indices).to(self.device, non_blocking=True),
            torch.from_numpy(request.last_page_len),
            self.num_heads, self.num_heads, self.head_dim, 1 if self.token_pages else page_size,
            causal=False, pos_encoding_mode="NONE", sm_scale=1.0 / math.sqrt(self.head_dim),
            q_data_type=self.dtype, kv_data_type=self.dtype,
        )
        self._num_queries = int(request.qo_indptr[-1])

    def run(self, kv_pages: tuple[torch.Tensor, torch.Tensor], q: torch.Tensor) -> torch.Tensor:
        """``q [B·T, H, D]`` over the planned pages of one block's pool ``(K, V)``, each ``[pages, page, H, D]``."""
        k_pages, v_pages = kv_pages
        if q.shape[0] != self._num_queries:
            raise ValueError(f"planned {self._num_queries} query rows, got {q.shape[0]}")
        if self.token_pages:
            k_pages = k_pages.reshape(-1, 1, self.num_heads, self.head_dim)  # [pages*page, 1, H, D]
            v_pages = v_pages.reshape(-1, 1, self.num_heads, self.head_dim)
        return self._wrapper.run(q.to(self.dtype), (k_pages, v_pages)).to(q.dtype)  # [B·T, H, D]

__all__ = ["BatchedFlashInferBackend", "FlashInferBackend"]
