"""MaskedDenseBackend (whole page storage + visibility mask) and the backend factory, on the CPU.

The masked backend is driven through a tightly pooled ``PagedKVCache`` over a random stream
(phase 1, keyframes, non-keyframes, eviction, specials spanning pages) and every one-frame step is
compared with float64 attention over the visible set rebuilt from the spec's rules alone.
"""
from __future__ import annotations

import pytest
import torch
from attention_reference import SPECIALS, drive_one_frame_backend

from lingbot_map_ros.core.cache import PagedKVCache, factory
from lingbot_map_ros.core.cache.dense_backend import MaskedDenseBackend
from lingbot_map_ros.core.config import StreamConfig, model_config
from lingbot_map_ros.core.runtime import resolve_for

H, D, BLOCKS = 2, 8, 2


@pytest.mark.parametrize("page_size", [5, 7])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_masked_dense_backend_matches_float64(page_size: int, dtype: torch.dtype) -> None:
    scale, window, steps = 2, 3, 16
    special_pages = -(-SPECIALS * (scale + steps + 1) // page_size)
    cache = PagedKVCache(BLOCKS, H, D, page_size, scale, window, max_frame_num=64, dtype=dtype, device="cpu",
                         num_patch_pages=scale + window + 1, special_pages=special_pages)
    masked = MaskedDenseBackend(page_size=page_size, num_pages=cache.table.num_pages, num_heads=H, head_dim=D,
                                dtype=dtype, device="cpu", kernel="math")
    drive_one_frame_backend(cache, masked, page_size=page_size, dtype=dtype, scale=scale, window=window, steps=steps,
                            seed=page_size, keyframe_share=0.55, heads=H, head_dim=D)
    assert int((masked.mask == 0).sum()) == masked.num_keys  # the last step's mask: exactly its visible keys


def test_masked_dense_backend_rejects_bad_plans() -> None:
    be = MaskedDenseBackend(page_size=5, num_pages=4, num_heads=H, head_dim=D, dtype=torch.float32, device="cpu",
                            kernel="math")
    with pytest.raises(ValueError):
        be.plan([], 5, 11)
    with pytest.raises(ValueError):
        be.plan([0, 4], 5, 11)  # page 4 does not exist
    with pytest.raises(ValueError):
        MaskedDenseBackend(page_size=5, num_pages=4, num_heads=H, head_dim=D, dtype=torch.float32, device="cpu",
                           kernel="fa9")


def test_factory_builds_from_the_resolved_runtime_only() -> None:
    cfg = model_config("tiny")
    stream = StreamConfig(scale_frames=2, sliding_window=3, max_frame_num=64, max_stored_frames=40)
    rt = resolve_for(torch.device("cpu"), torch.float32, backend="sdpa")
    assert not rt.cuda_graphs and not rt.compile_blocks and rt.autocast
    cache = factory.build_global_cache(rt, cfg, stream, page_size=12)
    assert cache.single_frame_backend is None and cache.backend.name == "sdpa"
    assert cache.table.num_patch_pages == 2 + 3 + 16  # the official pools without the masked path
    # the masked path's pools: exactly what can be visible
    masked_rt = resolve_for(torch.device("cpu"), torch.float32, backend="sdpa")
    object.__setattr__(masked_rt, "cuda_graphs", True)
    object.__setattr__(masked_rt, "sdpa_kernel", "cudnn")
    assert factory.pool_layout(masked_rt, stream, 12) == factory.PoolLayout(2 + 3 + 1, -(-6 * 41 // 12), "lifo")
    camera = factory.build_camera_cache(rt, cfg, stream)
    assert camera.capacity == 41 and not camera.static
