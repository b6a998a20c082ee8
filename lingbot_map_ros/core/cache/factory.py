"""The one place that turns a ``ResolvedRuntime`` into attention backends and KV caches.

The session asks for its caches here (``build_global_cache``, ``build_camera_cache``) once per
frame size; everything that depends on the runtime choice — which backend serves multi-frame steps,
which one serves the one-frame CUDA-graph steps, how large the page pools are — is decided below
and nowhere else.

Pool sizes: the default pools are the official ones (``scale + window + 16`` patch pages and
``ceil((max_frame_num + 100)·6 / page) + 16`` special pages). The dense one-frame backends (split,
masked) read the whole storage of a block, so with them the pools are exactly what can ever be
visible: ``scale + window + 1`` patch pages (the +1 holds a non-keyframe until its rollback) and
enough special pages for the specials of ``max_stored + 1`` frames; the session never stores more
(its long-run policy acts before ``max_stored_frames``). The split backend also needs the page
table's ``lowest`` allocation, which keeps the stored patch pages a contiguous prefix.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional

import torch

from ..config import SPECIAL_TOKENS_PER_FRAME, ModelConfig, StreamConfig, special_pages_capacity
from ..runtime import ResolvedRuntime
from .backend import AttentionBackend
from .camera_cache import CameraKVCache
from .paged import PagedKVCache
from .pages import EXTRA_PATCH_PAGES, PageTable, visible_patch_pages
from .sdpa_backend import SdpaBackend, StaticSdpaBackend

if TYPE_CHECKING:
    from .runs_plan import RunsPlan

# The StreamConfig fields the caches' allocations depend on (pools, camera cache, RoPE rows): a session
# whose settings change one of them gets new caches. Each is a "session" field of the settings table.
CACHE_SIZING_FIELDS = ("scale_frames", "sliding_window", "camera_iterations", "max_frame_num", "max_stored_frames")


def max_stored_frames(stream: StreamConfig) -> int:
    """Frames a session can hold in the cache at once, the in-flight non-keyframe included."""
    return min(stream.max_stored_frames, stream.max_frame_num - 1) + 1


@dataclass(frozen=True)
class PoolLayout:
    """Page pools and allocation order of a global cache (the cache and ``core/footprint.py`` read them)."""

    num_patch_pages: int
    special_pages: int
    allocation: str = "lifo"


def reads_whole_storage(rt: ResolvedRuntime) -> bool:
    """True when one-frame steps read every slot of a block (``split`` or ``cudnn``): pools sized tightly."""
    return rt.backend == "sdpa" and rt.cuda_graphs and rt.sdpa_kernel in ("split", "cudnn")


def pool_layout(rt: ResolvedRuntime, stream: StreamConfig, page_size: int) -> PoolLayout:
    """The pools ``PagedKVCache`` gets. The dense one-frame backends read whole pools, so theirs hold
    exactly what can be visible; the split backend also needs the stored pages kept as a prefix."""
    if not reads_whole_storage(rt):  # the official pools
        return PoolLayout(stream.scale_frames + stream.sliding_window + EXTRA_PATCH_PAGES,
                          special_pages_capacity(stream.max_frame_num, page_size))
    patch = visible_patch_pages(stream.scale_frames, stream.sliding_window)
    special = max(1, math.ceil(SPECIAL_TOKENS_PER_FRAME * max_stored_frames(stream) / page_size))
    return PoolLayout(patch, special, "lowest" if rt.sdpa_kernel == "split" else "lifo")


def make_eager_backend(rt: ResolvedRuntime, model: ModelConfig, page_size: int) -> AttentionBackend:
    """Backend of steps that are not captured (phase 1; every step when CUDA graphs are off)."""
    if rt.backend == "flashinfer":
        from .flashinfer_backend import FlashInferBackend  # optional dependency

        return FlashInferBackend(page_size=page_size, num_heads=model.num_heads, head_dim=model.head_dim,
                                 dtype=rt.dtype, device=rt.device, kernel=rt.flashinfer_kernel)
    return SdpaBackend(page_size=page_size, device=rt.device)


def make_single_frame_backend(
    rt: ResolvedRuntime, model: ModelConfig, stream: StreamConfig, page_size: int, table: PageTable
) -> Optional[AttentionBackend]:
    """Backend of one-frame steps inside the CUDA graph (fixed buffer addresses); None without graphs.
    ``table``: the cache's page table, whose pools the dense backends read whole."""
    if not rt.cuda_graphs:
        return None
    patch_pages = visible_patch_pages(stream.scale_frames, stream.sliding_window)
    max_specials = SPECIAL_TOKENS_PER_FRAME * max_stored_frames(stream)
    tokens = SPECIAL_TOKENS_PER_FRAME + page_size
    common = dict(num_heads=model.num_heads, head_dim=model.head_dim, dtype=rt.dtype, device=rt.device)
    if rt.backend == "flashinfer":
        from .flashinfer_backend import FlashInferBackend

        return FlashInferBackend(
            page_size=page_size, use_cuda_graph=True, kernel=rt.flashinfer_kernel,
            max_visible_pages=patch_pages + -(-max_specials // page_size) + 1, max_query_tokens=tokens, **common,
        )
    if rt.sdpa_kernel == "split":
        from .split_backend import SplitPrefixBackend

        kernel = "cudnn" if rt.device.type == "cuda" else "cpu"  # cpu: only reached in tests
        # the frame size decides the key ranges: one frame's query tiles x heads against the SMs
        sms = torch.cuda.get_device_properties(rt.device).multi_processor_count if kernel == "cudnn" else 0
        splits, runs = split_kernel_calls(rt.prefix_kernel, tokens, model.num_heads, sms, table.num_patch_pages - 1)
        return SplitPrefixBackend(page_size=page_size, num_patch_pages=table.num_patch_pages, num_pages=table.num_pages,
                                  kernel=kernel, fuse_merge=rt.compile_blocks, kv_splits=splits,
                                  prefix_kernel=rt.prefix_kernel, runs_plan=runs, **common)
    if rt.sdpa_kernel == "cudnn":
        from .dense_backend import MaskedDenseBackend

        return MaskedDenseBackend(page_size=page_size, num_pages=table.num_pages, kernel="cudnn", **common)
    return StaticSdpaBackend(page_size=page_size, max_keys=patch_pages * page_size + max_specials,
                             num_query_tokens=tokens, **common)


def split_kernel_calls(prefix_kernel: str, queries: int, num_heads: int, num_sms: int,
                       prefix_pages: int) -> tuple[int, Optional["RunsPlan"]]:
    """The split backend's key ranges for a frame of ``queries`` queries (``auto_kv_splits``, by the
    prefix kernel's tiles) and, for our kernel over the runs (``prefix_kernel`` triton or gluon), its
    calls (``runs_plan.plan_runs``: one call in those ranges, or whole query tiles in one wave and a
    ragged tail, which Gluon's two-warpgroup programs carry); ``num_sms`` 0: no SM count (the CPU). Also
    what ``bench/attention_bench.py`` runs."""
    from .split_backend import auto_kv_splits

    if prefix_kernel == "sdpa":
        return auto_kv_splits(queries, num_heads, num_sms, prefix_pages), None
    from .runs_plan import plan_runs
    from .triton_prefix import BLOCK_M, PROGRAMS_PER_SM  # resolve_for made sure Triton imports

    tiles = dict(query_tile=BLOCK_M, blocks_per_sm=PROGRAMS_PER_SM)
    splits = auto_kv_splits(queries, num_heads, num_sms, prefix_pages, **tiles)
    pair_tile = 0  # Triton's kernel has one layout; Gluon's two-warpgroup programs take twice its rows
    if prefix_kernel == "gluon":
        from .gluon_runs import BLOCK_M as GLUON_BLOCK_M

        pair_tile = 2 * GLUON_BLOCK_M
    return splits, plan_runs(queries, num_heads, num_sms, splits, pair_tile=pair_tile, fuse_tail=pair_tile > 0,
                             **tiles)


def build_global_cache(rt: ResolvedRuntime, model: ModelConfig, stream: StreamConfig, page_size: int,
                       storage: Optional[Callable[[tuple[int, ...], torch.dtype], Optional[torch.Tensor]]] = None,
                       ) -> PagedKVCache:
    """The paged global-attention cache of every aggregator block, with both backends attached.
    ``storage(shape, dtype)``: its pages as a view of a group's pool (``cache/pool.py``), or None to
    allocate them."""
    layout = pool_layout(rt, stream, page_size)
    shape = (model.depth, 2, layout.num_patch_pages + layout.special_pages, page_size, model.num_heads, model.head_dim)
    cache = PagedKVCache(
        num_blocks=model.depth, num_heads=model.num_heads, head_dim=model.head_dim, page_size=page_size,
        scale_frames=stream.scale_frames, sliding_window=stream.sliding_window, max_frame_num=stream.max_frame_num,
        dtype=rt.dtype, device=rt.device, backend=make_eager_backend(rt, model, page_size),
        num_patch_pages=layout.num_patch_pages, special_pages=layout.special_pages, allocation=layout.allocation,
        write_kernel="triton" if rt.cuda_graphs and rt.step_kernels == "triton" else "torch",
        storage=storage(shape, rt.dtype) if storage is not None else None,
    )
    cache.single_frame_backend = make_single_frame_backend(rt, model, stream, page_size, cache.table)
    return cache


def camera_cache_capacity(stream: StreamConfig) -> int:
    """Frames the camera-head cache holds: stored frames never exceed max_stored_frames (the long-run
    policy acts first), plus one scratch slot for a non-keyframe; a tight capacity keeps the graph's
    masked attention short."""
    return min(stream.max_frame_num, stream.max_stored_frames + 1)


def camera_cache_shape(rt: ResolvedRuntime, model: ModelConfig, stream: StreamConfig) -> dict:
    """The camera-head trunk cache's shapes (what a saved one is checked against)."""
    return dict(num_iterations=stream.camera_iterations, num_blocks=model.camera_trunk_depth,
                num_heads=model.camera_num_heads, head_dim=model.camera_head_dim,
                capacity=camera_cache_capacity(stream))


def build_camera_cache(rt: ResolvedRuntime, model: ModelConfig, stream: StreamConfig) -> CameraKVCache:
    """The camera-head trunk cache (fp32, the head's dtype); static buffers when graphs are on."""
    shape = camera_cache_shape(rt, model, stream)
    capacity = shape.pop("capacity")
    decode = "triton" if rt.cuda_graphs and rt.step_kernels == "triton" else "sdpa"
    return CameraKVCache(**shape, capacity_frames=capacity, dtype=torch.float32, device=rt.device,
                         static=rt.cuda_graphs, decode_kernel=decode)


def saved_state_problems(rt: ResolvedRuntime, model: ModelConfig, stream: StreamConfig, dtype: torch.dtype,
                         state: dict, hw: tuple[int, int]) -> list[str]:
    """Why a saved session's caches (``state``: a ``StreamingSession.state_dict``) of frame size ``hw``
    cannot go into the caches these settings would build (empty: they can); checked without building
    them, for a session whose caches do not exist yet or have another frame size."""
    from ..config import PATCH_SIZE
    from .camera_cache import camera_state_problems
    from .paged import cache_state_problems

    rows = SPECIAL_TOKENS_PER_FRAME + max(hw) // PATCH_SIZE  # spatial RoPE rows (as the session's caches)
    if hw[0] % PATCH_SIZE or hw[1] % PATCH_SIZE or rows > stream.max_frame_num:
        return [f"frame size {hw[1]}x{hw[0]} does not fit this session (patch {PATCH_SIZE}, max_frame_num "
                f"{stream.max_frame_num})"]
    page_size = (hw[0] // PATCH_SIZE) * (hw[1] // PATCH_SIZE)
    layout = pool_layout(rt, stream, page_size)
    table = PageTable(scale_frames=stream.scale_frames, sliding_window=stream.sliding_window, page_size=page_size,
                      num_patch_pages=layout.num_patch_pages,
                      special_pages=layout.special_pages or special_pages_capacity(stream.max_frame_num, page_size),
                      allocation=layout.allocation)
    return (cache_state_problems(state["global_cache"], num_blocks=model.depth, num_heads=model.num_heads,
                                 head_dim=model.head_dim, dtype=dtype, table=table)
            + camera_state_problems(state["camera_cache"], **camera_cache_shape(rt, model, stream)))


__all__ = [
    "build_camera_cache", "build_global_cache", "camera_cache_capacity", "camera_cache_shape", "make_eager_backend",
    "make_single_frame_backend",
    "max_stored_frames", "pool_layout", "PoolLayout", "reads_whole_storage", "saved_state_problems",
]
