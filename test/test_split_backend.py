"""SplitPrefixBackend (contiguous patch prefix + masked tail, merged by log-sum-exp) on the CPU.

Driven through a ``PagedKVCache`` with the pools and the ``lowest`` allocation the factory pairs it
with, over a random stream (phase 1, keyframes, non-keyframes, eviction, specials spanning pages);
every one-frame step is compared with float64 attention over the visible set rebuilt from the
spec's rules alone, and the backend's mode is checked: masked while the window fills, unmasked
prefix once it is full.
"""
from __future__ import annotations

import importlib.util
import math

import pytest
import torch
from attention_reference import SPECIALS, dense_reference, drive_one_frame_backend

from lingbot_map_ros.core.cache import PagedKVCache, factory
from lingbot_map_ros.core.cache.merge import merge_partials
from lingbot_map_ros.core.cache.split_backend import (
    SplitPrefixBackend,
    attend_with_lse,
    key_ranges,
    usable_splits,
)
from lingbot_map_ros.core.config import StreamConfig, model_config
from lingbot_map_ros.core.runtime import resolve_for

H, D, BLOCKS = 2, 8, 2


def _stream(page_size: int, dtype: torch.dtype, allocation: str, seed: int, steps: int = 18,
            scale: int = 2, window: int = 3, kv_splits: int = 1) -> tuple[list[str], SplitPrefixBackend, PagedKVCache]:
    special_pages = -(-SPECIALS * (scale + steps + 1) // page_size)
    cache = PagedKVCache(BLOCKS, H, D, page_size, scale, window, max_frame_num=64, dtype=dtype, device="cpu",
                         num_patch_pages=scale + window + 1, special_pages=special_pages, allocation=allocation)
    split = SplitPrefixBackend(page_size=page_size, num_patch_pages=cache.table.num_patch_pages,
                               num_pages=cache.table.num_pages, num_heads=H, head_dim=D, dtype=dtype, device="cpu",
                               kernel="cpu", kv_splits=kv_splits)
    seen = drive_one_frame_backend(cache, split, page_size=page_size, dtype=dtype, scale=scale, window=window,
                                   steps=steps, seed=seed, keyframe_share=0.6, heads=H, head_dim=D)
    return [mode for _, mode in seen], split, cache


@pytest.mark.parametrize("page_size", [5, 7])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("kv_splits", [1, 5], ids=["one-range", "five-ranges"])
def test_split_backend_matches_float64_and_reads_the_full_prefix_unmasked(page_size: int, dtype: torch.dtype,
                                                                           kv_splits: int) -> None:
    modes, split, cache = _stream(page_size, dtype, "lowest", seed=page_size, kv_splits=kv_splits)
    # the window (3) fills after the first 3 keyframes; from then on every step reads the prefix unmasked
    first_full = modes.index("full")
    assert "filling" in modes[:first_full] and set(modes[first_full:]) == {"full"}
    assert split.plan_signature == (SPECIALS + page_size, "full", 5)


@pytest.mark.parametrize("bucket_pages", [1, 2, 3])
@pytest.mark.parametrize("kv_splits", [1, 3, 4])
def test_filling_window_is_cut_at_bucket_boundaries(bucket_pages: int, kv_splits: int) -> None:
    """A longer window (scale 2 + window 7 = 9 prefix pages): while it fills, the head read unmasked
    is the last bucket boundary below the visible pages, leaving 1..bucket_pages of them masked; with
    ``kv_splits`` the unmasked head is read as a batch of key ranges (3 for the full 9 pages, 4 asked)."""
    gen = torch.Generator().manual_seed(bucket_pages)
    page, R = 4, 9
    be = SplitPrefixBackend(page_size=page, num_patch_pages=R + 1, num_pages=R + 1 + 3, num_heads=H, head_dim=D,
                            dtype=torch.float64, device="cpu", kernel="cpu", bucket_pages=bucket_pages,
                            kv_splits=kv_splits)
    k = torch.randn(R + 4, page, H, D, generator=gen, dtype=torch.float64)
    v = torch.randn(R + 4, page, H, D, generator=gen, dtype=torch.float64)
    q = torch.randn(SPECIALS + page, H, D, generator=gen, dtype=torch.float64)
    seen = set()
    for m in range(1, R + 1):
        visible = list(range(m)) + [R + 1, R + 2]  # prefix 0..m-1, then two special pages (the last one partial)
        be.plan(visible, 3, q.shape[0])
        slots = torch.cat([torch.arange(p * page, (p + 1) * page) for p in visible])[: -(page - 3)]
        ref = dense_reference(q, [k.view(-1, H, D)[slots]], [v.view(-1, H, D)[slots]])
        torch.testing.assert_close(be.run((k, v), q), ref, atol=1e-10, rtol=1e-10)
        if m == R:
            assert (be.mode, be.head_pages) == ("full", R)
            assert be._regions[0].splits == min(kv_splits, 3)
        else:
            assert be.mode == "filling" and be.head_pages % bucket_pages == 0 and 1 <= m - be.head_pages <= bucket_pages
            seen.add(be.head_pages)
    assert seen == set(range(0, R - 1, bucket_pages))  # one graph signature per bucket


def test_split_backend_is_exact_with_holes_in_the_prefix() -> None:
    """Under the official LIFO allocation the visible pages have holes: the masked prefix keeps it exact."""
    modes, _, _ = _stream(5, torch.float32, "lifo", seed=3, steps=24)
    assert "masked" in modes[4:]  # no contiguous prefix: the backend falls back to the mask, still exact


def test_tail_only_and_bad_plans() -> None:
    be = SplitPrefixBackend(page_size=4, num_patch_pages=3, num_pages=5, num_heads=H, head_dim=D,
                            dtype=torch.float32, device="cpu", kernel="cpu")
    # scale_frames 1 with an empty cache: page 0 is not in the prefix view until stored... here only
    # the spare page (2) and one special page are visible: no prefix key at all
    be.plan([2, 3], 3, 7)
    assert be.mode == "tail" and be.num_keys == 7
    k = torch.randn(5, 4, H, D)
    v = torch.randn(5, 4, H, D)
    q = torch.randn(7, H, D)
    flat_k, flat_v = k.view(-1, H, D), v.view(-1, H, D)
    out = be.run((k, v), q)
    torch.testing.assert_close(out.double(), dense_reference(q, [flat_k[8:15]], [flat_v[8:15]]), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="after the prefix"):
        be.plan([0, 1], 4, 7)  # nothing after the prefix
    with pytest.raises(ValueError):
        be.plan([0, 5], 4, 7)  # page 5 does not exist
    with pytest.raises(ValueError):
        be.plan([], 4, 7)
    with pytest.raises(ValueError, match="kernel"):
        SplitPrefixBackend(page_size=4, num_patch_pages=3, num_pages=5, num_heads=H, head_dim=D,
                           dtype=torch.float32, device="cpu", kernel="fa9")


def test_merge_of_two_parts_equals_attention_over_their_union() -> None:
    gen = torch.Generator().manual_seed(7)
    q = torch.randn(1, H, 9, D, generator=gen)
    k = torch.randn(1, H, 30, D, generator=gen)
    v = torch.randn(1, H, 30, D, generator=gen)
    out_a, lse_a = attend_with_lse("cpu", q, k[:, :, :21], v[:, :, :21], None)
    out_b, lse_b = attend_with_lse("cpu", q, k[:, :, 21:], v[:, :, 21:], None)
    # the log-sum-exp is of the scaled scores, natural log
    ref_lse = torch.logsumexp(q.double() @ k[:, :, :21].double().transpose(-1, -2) / math.sqrt(D), dim=-1)
    torch.testing.assert_close(lse_a.double(), ref_lse, atol=1e-5, rtol=1e-5)
    merged = merge_partials([out_a, out_b], [lse_a, lse_b])  # [T, H, D]
    ref = dense_reference(q[0].transpose(0, 1), [k[0].transpose(0, 1)], [v[0].transpose(0, 1)])
    torch.testing.assert_close(merged.double(), ref, atol=1e-5, rtol=1e-5)


def test_factory_pairs_the_split_backend_with_its_pools_and_allocation() -> None:
    cfg = model_config("tiny")
    stream = StreamConfig(scale_frames=2, sliding_window=3, max_frame_num=64, max_stored_frames=40)
    rt = resolve_for(torch.device("cpu"), torch.float32, backend="sdpa")
    object.__setattr__(rt, "cuda_graphs", True)
    object.__setattr__(rt, "sdpa_kernel", "split")
    layout = factory.pool_layout(rt, stream, 12)
    assert (layout.num_patch_pages, layout.special_pages, layout.allocation) == (2 + 3 + 1, -(-6 * 41 // 12), "lowest")
    cache = factory.build_global_cache(rt, cfg, stream, page_size=12)
    assert isinstance(cache.single_frame_backend, SplitPrefixBackend)
    assert cache.table.allocation == "lowest" and cache.single_frame_backend.prefix_pages == 5
    official = resolve_for(torch.device("cpu"), torch.float32, backend="sdpa")
    assert factory.pool_layout(official, stream, 12).allocation == "lifo"


def test_key_ranges_are_views_of_consecutive_keys_and_splits_divide() -> None:
    storage = torch.randn(6, 5, H, D, dtype=torch.float64)  # [pages, page, H, D]
    keys = storage.view(1, -1, H, D).transpose(1, 2)  # [1, H, 30, D], the backend's strided view
    ranges = key_ranges(keys[:, :, 5:25], 4)  # [4, H, 5, D]
    assert ranges.shape == (4, H, 5, D) and ranges.data_ptr() == keys[:, :, 5:].data_ptr()
    for s in range(4):
        torch.testing.assert_close(ranges[s], keys[0, :, 5 + 5 * s: 10 + 5 * s], rtol=0, atol=0)
    with pytest.raises(ValueError, match="equal ranges"):
        key_ranges(keys, 7)
    assert [usable_splits(72, w) for w in (1, 4, 5, 7, 100)] == [1, 4, 4, 6, 72]
    assert usable_splits(13, 4) == 1
    with pytest.raises(ValueError, match="kv_splits"):
        SplitPrefixBackend(page_size=4, num_patch_pages=3, num_pages=5, num_heads=H, head_dim=D,
                           dtype=torch.float32, device="cpu", kernel="cpu", kv_splits=0)


def test_auto_key_ranges_follow_the_waves_of_thread_blocks() -> None:
    """The wave model against what the H200 showed: 1005 queries x 16 heads (128 blocks of 128
    queries, one wave on 132 SMs) want one range; 1042 queries (144 blocks: two waves, the call took
    twice as long) want several, which end the call in fewer, shorter waves."""
    from lingbot_map_ros.core.cache.split_backend import auto_kv_splits, waves_time

    assert auto_kv_splits(1005, 16, 132, 72) == 1
    assert waves_time(1, 144, 132) == 2.0 and waves_time(1, 128, 132) == 1.0
    shapes = [(1042, 16, 132, 72), (594, 16, 132, 72), (306, 16, 132, 21), (1375, 16, 108, 40)]
    for queries, heads, sms, pages in shapes:
        blocks = -(-queries // 128) * heads
        chosen = auto_kv_splits(queries, heads, sms, pages)
        assert pages % chosen == 0 and 1 < chosen <= 12
        times = {s: waves_time(s, blocks, sms) for s in range(1, 13) if pages % s == 0}
        assert times[chosen] == min(times.values()) < times[1]
    assert auto_kv_splits(1042, 16, 0, 72) == 1  # no SM count (the CPU kernel): one range
    assert auto_kv_splits(1042, 16, 132, 13) == 1  # 13 pages: no divisor but 1 and 13 (> 12)


def test_the_runs_plan_cuts_only_frames_whose_programs_spill_into_another_wave(monkeypatch) -> None:
    """``plan_runs`` against the wave model and what the H200 runs: 518x378 (1005 queries) and 518x294
    (777) keep one call in the parts ``auto_kv_splits`` picks; 518x392 (1042) is cut into the 1024 rows
    that 8 two-warpgroup tiles x 16 heads hold in one wave of 132 SMs (Triton's one-warpgroup kernel: 16
    tiles of 64, two a SM) and an 18-row tail whose 16 programs a part fill one short wave as 16 parts,
    on a side stream beside the whole tiles (``TAIL_BESIDE``; off, the same calls). Every plan's calls
    cover each row once, in order, and the cut is chosen only where the model says it is faster than the
    one call."""
    from lingbot_map_ros.core.cache import runs_plan
    from lingbot_map_ros.core.cache.runs_plan import plan_runs
    from lingbot_map_ros.core.cache.split_backend import auto_kv_splits, waves_time

    def plan(queries, heads=16, sms=132, pair_tile=128, pages=72):
        parts = auto_kv_splits(queries, heads, sms, pages, query_tile=64, blocks_per_sm=2)
        return plan_runs(queries, heads, sms, parts, query_tile=64, blocks_per_sm=2, pair_tile=pair_tile), parts

    for queries in (1005, 777):
        p, parts = plan(queries)
        assert [(c.start, c.rows, c.parts) for c in p.calls] == [(0, queries, parts)] and not p.ragged
    for pair_tile in (128, 0):
        p, parts = plan(1042, pair_tile=pair_tile)
        assert parts == 12 and [(c.start, c.rows, c.parts) for c in p.calls] == [(0, 1024, 1), (1024, 18, 16)]
        assert "1024 rows" in p.reason and "16 key ranges" in p.reason
    assert not plan(1042, sms=0)[0].ragged  # no SM count (the CPU): one call
    assert not plan(1042)[0].fused_tail  # no fuse_tail (Triton's kernel): the tail call
    assert plan(1042)[0].tail_beside and "beside them on a side stream" in plan(1042)[0].reason
    assert not plan(1005)[0].tail_beside  # one call: nothing beside it
    monkeypatch.setattr(runs_plan, "TAIL_BESIDE", False)  # the bench's +tailafter: the same calls, in series
    after = plan(1042)[0]
    assert not after.tail_beside and "side stream" not in after.reason and after.calls == plan(1042)[0].calls
    monkeypatch.undo()
    for queries in range(200, 3000, 37):
        for heads, sms in ((16, 132), (16, 108), (12, 78)):
            p, parts = plan(queries, heads, sms)
            rows = [r for c in p.calls for r in range(c.start, c.start + c.rows)]
            assert rows == list(range(queries)), (queries, p)
            whole = min(waves_time(parts, -(-queries // 64) * heads, 2 * sms),
                        waves_time(parts, -(-queries // 128) * heads, sms)
                        if -(-queries // 128) * heads * parts <= sms else float("inf"))
            if p.ragged:  # the whole tiles fill one wave, the tail's parts at most one more
                head, tail = p.calls
                assert head.parts == 1 and -(-head.rows // 128) * heads <= sms and head.rows % 128 == 0
                assert 1.0 + waves_time(tail.parts, -(-tail.rows // 64) * heads, 2 * sms) < whole


def test_the_gluon_kernels_whole_tiles_carry_a_tail_of_at_most_half_a_tile(monkeypatch) -> None:
    """``fuse_tail`` with ``FUSED_TAIL`` on (the default; off, the bench's ``+tailcall``, the same cut keeps the tail
    call): at 518x392 on 132 SMs the 18-row tail rides in the 8 whole tiles' programs of each head as their third
    warpgroups' 8 key shares (modelled 1 + 1/16 + the merge, against 1.18 waves for one call); a tail of more than
    one warpgroup's 64 rows, or a kernel without two-warpgroup tiles, keeps a call of its own; every fused plan
    covers each row once, its tail parts are the tiles a head, and it is chosen only where the model says it is
    faster than one call."""
    from lingbot_map_ros.core.cache import runs_plan
    from lingbot_map_ros.core.cache.runs_plan import FUSED_MERGE_COST, plan_runs
    from lingbot_map_ros.core.cache.split_backend import auto_kv_splits, waves_time

    def plan(queries, heads=16, sms=132, pair_tile=128):
        parts = auto_kv_splits(queries, heads, sms, 72, query_tile=64, blocks_per_sm=2)
        return plan_runs(queries, heads, sms, parts, query_tile=64, blocks_per_sm=2, pair_tile=pair_tile,
                         fuse_tail=True), parts

    assert runs_plan.FUSED_TAIL is True
    p, _ = plan(1042)
    assert p.fused_tail and [(c.start, c.rows, c.parts) for c in p.calls] == [(0, 1024, 1), (1024, 18, 8)]
    assert "carry the last 18 rows as 8 key shares" in p.reason
    monkeypatch.setattr(runs_plan, "FUSED_TAIL", False)  # the bench's +tailcall: the same cut, a call of its own
    call = plan(1042)[0]
    assert not call.fused_tail and [(c.start, c.rows, c.parts) for c in call.calls] == [(0, 1024, 1), (1024, 18, 16)]
    monkeypatch.setattr(runs_plan, "FUSED_TAIL", True)
    assert not plan(1042, pair_tile=0)[0].fused_tail  # Triton's kernel: the tail call
    p, _ = plan(1024 + 65)  # one row more than a warpgroup's tile: its own call
    assert p.ragged and not p.fused_tail
    assert plan(1024 + 64)[0].fused_tail
    for queries in range(200, 3000, 37):
        for heads, sms in ((16, 132), (16, 108), (12, 78)):
            p, parts = plan(queries, heads, sms)
            rows = [r for c in p.calls for r in range(c.start, c.start + c.rows)]
            assert rows == list(range(queries)), (queries, p)
            if p.fused_tail:
                head, tail = p.calls
                tiles = head.rows // 128
                assert head.rows % 128 == 0 and tiles * heads <= sms and tail.rows <= 64 and tail.parts == tiles
                whole = min(waves_time(parts, -(-queries // 64) * heads, 2 * sms),
                            waves_time(parts, -(-queries // 128) * heads, sms)
                            if -(-queries // 128) * heads * parts <= sms else float("inf"))
                assert 1.0 + 1.0 / (2 * tail.parts) + FUSED_MERGE_COST < whole


def test_the_factory_plans_our_kernels_calls_and_only_theirs() -> None:
    """``factory.split_kernel_calls``: cuDNN's prefix gets key ranges by its 128-query tiles and no runs
    plan; our kernel (Triton, Gluon) gets ranges by its 64-query tiles and a plan that cuts 518x392
    frames on 132 SMs (Gluon's two-warpgroup tiles make the same 1024-row cut and carry the tail; Triton's
    tail is a call beside them); the CPU (no SM count) one call in one range."""
    pytest.importorskip("triton")  # scripts/setup_env.sh installs it; a robot without Triton runs cuDNN's prefix
    from lingbot_map_ros.core.cache.factory import split_kernel_calls
    from lingbot_map_ros.core.cache.split_backend import auto_kv_splits

    assert split_kernel_calls("sdpa", 1042, 16, 132, 72) == (auto_kv_splits(1042, 16, 132, 72), None)
    kernels = ["triton"] + (["gluon"] if importlib.util.find_spec("triton.experimental.gluon") else [])
    for kernel in kernels:
        splits, plan = split_kernel_calls(kernel, 1042, 16, 132, 72)
        carried = kernel == "gluon"  # runs_plan.FUSED_TAIL on: Gluon's third warpgroups; Triton: a call beside
        tail_parts = 8 if carried else 16
        calls = [(c.start, c.rows, c.parts) for c in plan.calls]
        assert splits == 12 and calls == [(0, 1024, 1), (1024, 18, tail_parts)]
        assert plan.fused_tail == carried and plan.tail_beside != carried
        splits, plan = split_kernel_calls(kernel, 1005, 16, 132, 72)
        assert splits == 1 and not plan.ragged and plan.calls[0].rows == 1005
        splits, plan = split_kernel_calls(kernel, 1042, 16, 0, 72)
        assert splits == 1 and not plan.ragged


def test_the_runs_plan_keeps_one_call_where_one_wave_holds_no_tile_of_every_head() -> None:
    """More heads than one wave's programs: no whole-tile call can hold a tile of every head, so one call."""
    from lingbot_map_ros.core.cache.runs_plan import plan_runs

    plan = plan_runs(1042, 300, 132, 1, query_tile=64, blocks_per_sm=2, pair_tile=128)
    assert not plan.ragged and "less than a tile" in plan.reason
