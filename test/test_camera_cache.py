"""CameraKVCache against float64 dense attention over the docs/model.md §10.3 visible set, and its capacity."""
from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

from lingbot_map_ros.core.cache import CacheFull, CameraKVCache

ITERATIONS, BLOCKS, HEADS, HEAD_DIM = 2, 3, 2, 4


def _dense_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q kᵀ/√D) v in float64; q [S, H, D], k/v [N, H, D]."""
    logits = torch.einsum("shd,nhd->hsn", q.double(), k.double()) / math.sqrt(q.shape[-1])  # [H, S, N]
    return torch.einsum("hsn,nhd->shd", logits.softmax(-1), v.double())  # [S, H, D]


def _step(cache: CameraKVCache, stored: dict, num_frames: int, store: bool, gen: torch.Generator, dtype) -> None:
    """One step over every (iteration, block); ``stored`` holds the test's own copy of each stored token."""
    tol = dict(atol=1e-6, rtol=1e-6) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    cache.begin_step(num_frames, store=store)
    for it in range(ITERATIONS):
        for blk in range(BLOCKS):
            q, k, v = (torch.randn(num_frames, HEADS, HEAD_DIM, generator=gen).to(dtype) for _ in range(3))
            old_k, old_v = stored[it, blk]  # [L, H, D]
            expected = _dense_reference(q, torch.cat((old_k, k)), torch.cat((old_v, v)))
            out = cache(it, blk, q, k, v)
            assert out.shape == q.shape and out.dtype == dtype
            torch.testing.assert_close(out.double(), expected, **tol)
            if store:
                stored[it, blk] = (torch.cat((old_k, k)), torch.cat((old_v, v)))
    cache.end_step()


def _empty(dtype) -> dict:
    return {
        (it, blk): (torch.empty(0, HEADS, HEAD_DIM, dtype=dtype),) * 2
        for it in range(ITERATIONS)
        for blk in range(BLOCKS)
    }


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_camera_cache_matches_dense_reference(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(11)
    rng = random.Random(11)
    cache = CameraKVCache(ITERATIONS, BLOCKS, HEADS, HEAD_DIM, capacity_frames=12, dtype=dtype, device="cpu")
    assert cache.storage.shape == (ITERATIONS, BLOCKS, 2, 12, HEADS, HEAD_DIM)
    assert cache.storage.dtype == dtype
    stored = _empty(dtype)

    _step(cache, stored, 3, True, gen, dtype)  # phase 1: the 3 tokens attend to each other, stored
    assert cache.length == 3
    keyframes = 0
    for i in range(14):
        store = i == 0 or rng.random() < 0.5
        if store and cache.length == 11:
            break  # keep one slot: a later non-keyframe still needs its scratch slot
        _step(cache, stored, 1, store, gen, dtype)
        keyframes += store
        assert cache.length == 3 + keyframes  # non-keyframes store nothing
    assert keyframes >= 3

    cache.reset()
    assert cache.length == 0
    _step(cache, _empty(dtype), 2, True, gen, dtype)  # after reset nothing old is visible
    assert cache.length == 2


def test_capacity_raises_before_changing_state() -> None:
    gen = torch.Generator().manual_seed(5)
    cache = CameraKVCache(ITERATIONS, BLOCKS, HEADS, HEAD_DIM, capacity_frames=4, dtype=torch.float32, device="cpu")
    stored = _empty(torch.float32)
    with pytest.raises(CacheFull):
        cache.begin_step(5, store=True)
    assert cache.length == 0 and not cache.in_step
    _step(cache, stored, 3, True, gen, torch.float32)
    _step(cache, stored, 1, True, gen, torch.float32)
    assert cache.length == 4
    for store in (True, False):  # a non-keyframe needs room for its own token too
        with pytest.raises(CacheFull):
            cache.begin_step(1, store=store)
        assert cache.length == 4 and not cache.in_step
    stored_before = cache.storage.clone()
    cache.reset()
    assert torch.equal(cache.storage, stored_before)  # reset empties logically, no reallocation


def test_step_protocol_errors() -> None:
    cache = CameraKVCache(1, 1, HEADS, HEAD_DIM, capacity_frames=4, dtype=torch.float32, device="cpu")
    x = torch.randn(1, HEADS, HEAD_DIM)
    with pytest.raises(RuntimeError):
        cache(0, 0, x, x, x)
    with pytest.raises(RuntimeError):
        cache.end_step()
    cache.begin_step(1, store=True)
    with pytest.raises(RuntimeError):
        cache.begin_step(1, store=True)
    with pytest.raises(IndexError):
        cache(1, 0, x, x, x)
    with pytest.raises(ValueError):
        cache(0, 0, torch.randn(2, HEADS, HEAD_DIM), x, x)
    with pytest.raises(ValueError):
        CameraKVCache(1, 1, HEADS, HEAD_DIM, capacity_frames=0, dtype=torch.float32, device="cpu")


def test_static_mode_equals_dynamic_mode():
    """The CUDA-graph-safe mode (device-held slot, masked full-capacity attention) computes the same."""
    torch.manual_seed(3)
    dynamic = CameraKVCache(2, 2, 2, 8, 16, torch.float32, "cpu")
    static = CameraKVCache(2, 2, 2, 8, 16, torch.float32, "cpu", static=True)
    for num_frames, store in [(3, True), (1, True), (1, False), (1, True), (1, False), (1, True)]:
        dynamic.begin_step(num_frames, store=store)
        static.begin_step(num_frames, store=store)
        for iteration in range(2):
            for block in range(2):
                q, k, v = torch.randn(3, num_frames, 2, 8).unbind(0)
                torch.testing.assert_close(static(iteration, block, q, k, v), dynamic(iteration, block, q, k, v),
                                           rtol=1e-5, atol=1e-6)
        dynamic.end_step()
        static.end_step()
    assert static.length == dynamic.length == 6


def test_static_mask_follows_random_steps_resets_and_loads():
    """The incrementally updated mask equals one built from scratch after every begin_step."""
    rng = np.random.default_rng()
    capacity = 12
    cache = CameraKVCache(1, 1, 1, 4, capacity, torch.float32, "cpu", static=True)
    saved = None
    for _ in range(200):
        action = rng.choice(["stored", "unstored", "reset", "save", "load"], p=[0.45, 0.3, 0.05, 0.1, 0.1])
        if action == "reset":
            cache.reset()
            continue
        if action == "save":
            saved = (cache.state_dict(), cache.stored_tensor())
            continue
        if action == "load":
            if saved is not None:
                cache.load_state(*saved)
            continue
        if cache.length + 1 >= capacity:  # as in a session: a stored frame always leaves the scratch slot free
            cache.reset()
        cache.begin_step(1, store=action == "stored")
        reference = np.where(np.arange(capacity) <= cache.length, 0.0, -np.inf)  # [capacity]
        np.testing.assert_array_equal(cache._mask.view(-1).numpy(), reference)
        cache.end_step()
