"""PagedKVCache + SdpaBackend against float64 dense attention over the docs/model.md §9.2/§9.5 visible set.

The test keeps every frame's raw K/V per block and rebuilds each step's visible set from the spec's
rules alone (no pages): all tokens of the scale frames and of the last W stored frames, the 6
specials of every stored frame, and for a non-keyframe its own tokens on top.
"""
from __future__ import annotations

import random

import pytest
import torch
from attention_reference import SPECIALS, SpecModel, dense_reference

from lingbot_map_ros.core.cache import AttentionBackend, PagedKVCache, SdpaBackend
from lingbot_map_ros.core.config import special_pages_capacity

NUM_BLOCKS, NUM_HEADS, HEAD_DIM = 3, 2, 8


def _drive(page_size: int, dtype: torch.dtype, seed: int, *, scale_frames: int, window: int,
           phase1: int, steps: int, backend: str | AttentionBackend = "sdpa") -> PagedKVCache:
    """Phase 1 of ``phase1`` frames, then ``steps`` single frames (random keyframe flags)."""
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    tokens = SPECIALS + page_size
    cache = PagedKVCache(
        NUM_BLOCKS, NUM_HEADS, HEAD_DIM, page_size, scale_frames, window,
        max_frame_num=64, dtype=dtype, device="cpu", backend=backend,
    )
    assert cache.storage.dtype == dtype  # K/V kept in the model dtype (no fp32 K cache)
    assert cache.storage.shape == (NUM_BLOCKS, 2, cache.table.num_pages, page_size, NUM_HEADS, HEAD_DIM)
    spec = SpecModel(scale_frames, window)
    # block -> frame -> (k, v)
    raw: list[dict[int, tuple[torch.Tensor, torch.Tensor]]] = [{} for _ in range(NUM_BLOCKS)]
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)

    schedule = [(list(range(phase1)), True)]
    next_id = phase1
    for i in range(steps):
        store = i == 0 or rng.random() < 0.55
        schedule.append(([next_id], store))
        next_id += 1

    for frames, store in schedule:
        s = len(frames)
        cache.begin_step(s, store=store)
        full, specials_only = spec.visible(frames, store)
        for block in range(NUM_BLOCKS):
            q, k, v = (torch.randn(s * tokens, NUM_HEADS, HEAD_DIM, generator=gen).to(dtype) for _ in range(3))
            for j, f in enumerate(frames):
                raw[block][f] = (k[j * tokens : (j + 1) * tokens], v[j * tokens : (j + 1) * tokens])  # [P, H, D]
            keys = [raw[block][f][0] for f in full] + [raw[block][f][0][:SPECIALS] for f in specials_only]
            values = [raw[block][f][1] for f in full] + [raw[block][f][1][:SPECIALS] for f in specials_only]
            expected = dense_reference(q, keys, values)
            out = cache(block, q, k, v)
            assert out.shape == q.shape and out.dtype == dtype
            assert cache.visible_key_count == sum(x.shape[0] for x in keys)
            torch.testing.assert_close(out.double(), expected, **tol)
        cache.end_step()
        if store:
            spec.stored += frames
        else:
            for block in range(NUM_BLOCKS):
                del raw[block][frames[0]]  # forgotten: never visible again
        stats = cache.stats()
        assert stats.frames_stored == len(spec.stored)
        assert stats.special_tokens == SPECIALS * len(spec.stored)
        assert stats.window_frames == min(window, max(0, len(spec.stored) - scale_frames))
    return cache


@pytest.mark.parametrize("page_size", [5, 7, 13])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_paged_attention_matches_dense_reference(page_size: int, dtype: torch.dtype) -> None:
    seed = page_size * 10 + (dtype == torch.bfloat16)
    cache = _drive(page_size, dtype, seed, scale_frames=2, window=3, phase1=2, steps=14)
    stats = cache.stats()
    assert stats.frames_evicted > 0  # eviction (and page reuse) was exercised
    assert stats.special_pages > 2  # the special stream spans several pages


def test_short_phase1_fills_scale_list_later() -> None:
    """Phase 1 with fewer frames than scale_frames (a short stream): later keyframes join the scale list."""
    cache = _drive(7, torch.float32, 3, scale_frames=3, window=2, phase1=1, steps=10)
    assert cache.stats().scale_frames == 3


class CountingBackend:
    """A backend object through the seam: counts plan/run calls around the SDPA backend."""

    name = "counting"

    def __init__(self, page_size: int) -> None:
        self.inner = SdpaBackend(page_size=page_size, device="cpu")
        self.plans = 0
        self.runs = 0

    def plan(self, visible_pages, last_page_len, num_query_tokens) -> None:
        self.plans += 1
        self.inner.plan(visible_pages, last_page_len, num_query_tokens)

    def run(self, kv_pages, q):
        self.runs += 1
        return self.inner.run(kv_pages, q)


def test_backend_object_planned_once_per_step() -> None:
    backend = CountingBackend(5)
    assert isinstance(backend, AttentionBackend)
    _drive(5, torch.float32, 7, scale_frames=2, window=2, phase1=2, steps=6, backend=backend)
    assert backend.plans == 7
    assert backend.runs == 7 * NUM_BLOCKS


def test_geometry_and_step_errors() -> None:
    cache = PagedKVCache(2, 2, 4, 5, 2, 3, max_frame_num=10, dtype=torch.float32, device="cpu")
    assert cache.table.special_pages == special_pages_capacity(10, 5)
    assert cache.table.num_patch_pages == 2 + 3 + 16
    q = torch.randn(11, 2, 4)
    with pytest.raises(RuntimeError):
        cache(0, q, q, q)  # outside a step
    with pytest.raises(RuntimeError):
        cache.end_step()
    with pytest.raises(ValueError, match="evict its own frames"):
        cache.begin_step(6, store=True)  # 2 scale + 4 window frames > window 3
    assert cache.stats().frames_stored == 0
    cache.begin_step(1, store=True)
    with pytest.raises(RuntimeError):
        cache.begin_step(1, store=True)
    with pytest.raises(ValueError):
        cache(0, torch.randn(12, 2, 4), q, q)  # wrong token count
    with pytest.raises(IndexError):
        cache(2, q, q, q)
    cache.end_step()
    cache.reset()
    assert cache.stats().frames_stored == 0 and not cache.in_step
    with pytest.raises(ValueError):
        PagedKVCache(2, 2, 4, 5, 2, 3, max_frame_num=10, dtype=torch.float32, device="cpu", backend="nope")
