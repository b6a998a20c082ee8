"""The page pool of a stream group: static shares, one stream's pages never another's, the batched
page request against each stream's own table, and the undo of a failed step (``PageTable.mark``)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lingbot_map_ros.core.cache.paged import PagedKVCache
from lingbot_map_ros.core.cache.pages import PageTable
from lingbot_map_ros.core.cache.pool import PoolShares, SharedKVPool, batched_page_request


def table(**kw) -> PageTable:
    args = dict(scale_frames=2, sliding_window=3, page_size=5, num_patch_pages=6, special_pages=40)
    return PageTable(**{**args, **kw})


def test_shares_are_disjoint_fixed_and_cover_the_pool() -> None:
    shares = PoolShares(3, 10)
    assert [shares.assign(n) for n in ("a", "b", "c")] == [0, 1, 2]
    assert shares.assign("b") == 1  # the same share on every call
    with pytest.raises(RuntimeError, match="no share for stream 'd'"):
        shares.assign("d")
    pages = [set(shares.global_pages(n, range(10))) for n in ("a", "b", "c")]
    assert set().union(*pages) == set(range(30)) and sum(map(len, pages)) == 30
    with pytest.raises(ValueError, match="0..9"):
        shares.global_pages("a", [10])
    shares.release("b")
    assert shares.assign("d") == 1  # a released share is handed out again


def test_a_stream_writes_only_its_share_and_its_reset_touches_no_other() -> None:
    pool = SharedKVPool(num_shares=2, num_blocks=2, pages_per_share=20, page_size=5, num_heads=2, head_dim=4,
                        dtype=torch.float32, device="cpu")
    caches = {n: PagedKVCache(2, 2, 4, 5, scale_frames=2, sliding_window=3, max_frame_num=64, dtype=torch.float32,
                              device="cpu", num_patch_pages=6, special_pages=14, storage=pool.share(n))
              for n in ("a", "b")}
    assert pool.share_shape() == tuple(caches["a"].storage.shape)
    g = torch.Generator().manual_seed(0)
    for n, cache in caches.items():
        for _ in range(3):  # the scale frames, then one window frame
            frames = 2 if cache.table.frames_stored == 0 else 1
            cache.begin_step(frames, store=True)
            t = frames * 11
            q, k, v = (torch.randn(t, 2, 4, generator=g) for _ in range(3))
            for block in range(2):
                cache(block, q, k, v)
            cache.end_step()
    before_b = caches["b"].storage.clone()
    assert pool.storage[:, :, 20:].data_ptr() == caches["b"].storage.data_ptr()  # b's share is the pool's second half
    caches["a"].reset()
    for _ in range(5):  # a starts over and overwrites its own pages several times
        caches["a"].begin_step(2 if caches["a"].table.frames_stored == 0 else 1, store=True)
        t = (2 if caches["a"].table.frames_stored == 2 else 1) * 11
        x = torch.full((t, 2, 4), 7.0)
        for block in range(2):
            caches["a"](block, x, x, x)
        caches["a"].end_step()
    assert torch.equal(caches["b"].storage, before_b)
    assert (pool.storage[:, :, :20] == 7.0).any()
    with pytest.raises(ValueError, match="storage must be"):
        PagedKVCache(2, 2, 4, 5, scale_frames=2, sliding_window=3, max_frame_num=64, dtype=torch.float32, device="cpu",
                     num_patch_pages=7, special_pages=14, storage=pool.share("a"))


def test_a_share_is_accepted_whatever_way_its_device_is_written() -> None:
    """Torch compares devices as written while tensors report one form (``cpu``; ``cuda:0`` on a GPU): a
    cache asked for ``cpu:0`` (``cuda`` on a GPU, where this refused every share) takes its share."""
    pool = SharedKVPool(num_shares=1, num_blocks=2, pages_per_share=20, page_size=5, num_heads=2, head_dim=4,
                        dtype=torch.float32, device="cpu")
    cache = PagedKVCache(2, 2, 4, 5, scale_frames=2, sliding_window=3, max_frame_num=64, dtype=torch.float32,
                         device="cpu:0", num_patch_pages=6, special_pages=14, storage=pool.share("a"))
    assert cache.storage.data_ptr() == pool.storage.data_ptr()


@settings(max_examples=40, deadline=None)
@given(steps=st.lists(st.tuples(st.integers(0, 2), st.booleans()), min_size=1, max_size=40),
       token_pages=st.booleans())
def test_batched_request_equals_each_streams_own_table(steps, token_pages) -> None:
    """Three tables moved on independently; the request's segment i is table i's visible set moved
    to its share, with its own last-page length and key count."""
    tables = [table(), table(), table()]
    for i, store in steps:
        t = tables[i]
        if t.frames_stored == 0:
            t.append(2)
        elif store and t.frames_stored < 30:  # 40 special pages of 5 slots: 33 frames at most
            t.append(1)
    live = [t for t in tables if t.frames_stored]
    if not live:
        return
    firsts = [100 * (i + 1) for i in range(len(live))]
    req = batched_page_request(live, firsts, 41, token_pages=token_pages)
    assert req.qo_indptr.tolist() == [41 * i for i in range(len(live) + 1)]
    for i, (t, first) in enumerate(zip(live, firsts)):
        seg = req.indices[req.kv_indptr[i]:req.kv_indptr[i + 1]].tolist()
        pages = [first + p for p in t.visible_pages()]
        keys = (len(pages) - 1) * t.page_size + t.last_page_len
        assert req.keys[i] == keys == t.visible_key_count
        if token_pages:
            slots = [p * t.page_size + o for p in pages for o in range(t.page_size)][:keys]
            assert seg == slots and req.last_page_len[i] == 1
        else:
            assert seg == pages and req.last_page_len[i] == t.last_page_len
    assert req.indices.dtype == np.int32 and req.kv_indptr[-1] == req.indices.size


def _state(t: PageTable) -> tuple:
    return t.scale_pages, t.window_pages, t.free_list, t.visible_pages(), t.last_page_len, t.stats()


@settings(max_examples=60, deadline=None)
@given(before=st.lists(st.booleans(), max_size=20), store=st.booleans(), allocation=st.sampled_from(["lifo", "lowest"]))
def test_restore_returns_the_table_exactly(before, store, allocation) -> None:
    t = table(allocation=allocation)
    t.append(2)
    for kf in before:
        if kf:
            t.append(1)
    mark, state = t.mark(), _state(t)
    plan = t.append(1, defer_eviction=not store)
    t.restore(mark)
    assert _state(t) == state and not t.pending_rollback
    # an append that reused a page it evicted is only possible with ``lowest``, once the window is full
    reused = PageTable.overwrote_visible(plan)
    assert reused == (allocation == "lowest" and store and len(state[1]) == t.sliding_window)


def test_abort_step_says_when_the_pages_are_not_as_before() -> None:
    for allocation, exact in (("lifo", True), ("lowest", False)):
        cache = PagedKVCache(1, 1, 4, 3, scale_frames=1, sliding_window=2, max_frame_num=64, dtype=torch.float32,
                             device="cpu", num_patch_pages=4, special_pages=20, allocation=allocation)
        for _ in range(3):  # scale frame + a full window
            cache.begin_step(1, store=True)
            cache.end_step()
        before = _state(cache.table)
        cache.begin_step(1, store=True, undoable=True)  # evicts the oldest window frame
        assert cache.abort_step() is exact
        assert _state(cache.table) == before
        cache.begin_step(1, store=False, undoable=True)  # a non-keyframe never overwrites a visible page
        assert cache.abort_step() is True


def test_batched_flashinfer_plan_passes_the_request(monkeypatch) -> None:
    """FlashInfer is GPU-only: a stand-in module records what the batched backend hands its wrapper's
    ``plan`` and ``run`` (the request's arrays, page size 1 for fa3's token pages, the pool's views)."""
    import sys
    import types

    calls = {}

    class Wrapper:
        def __init__(self, workspace, layout, backend):
            calls["init"] = (layout, backend)

        def plan(self, *args, **kw):
            calls["plan"] = (args, kw)

        def run(self, q, kv):
            calls["run"] = (q.shape, kv[0].shape)
            return q

    monkeypatch.setitem(sys.modules, "flashinfer", types.SimpleNamespace(BatchPrefillWithPagedKVCacheWrapper=Wrapper))
    from lingbot_map_ros.core.cache.flashinfer_backend import BatchedFlashInferBackend

    tables = [table(), table()]
    tables[0].append(2)
    tables[1].append(2)
    tables[1].append(1)
    for kernel, token_pages in (("fa2", False), ("fa3", True)):
        backend = BatchedFlashInferBackend(num_heads=2, head_dim=4, dtype=torch.bfloat16, device="cpu", kernel=kernel)
        assert backend.token_pages is token_pages and calls["init"] == ("NHD", kernel)
        req = batched_page_request(tables, [0, 46], 11, token_pages=token_pages)
        backend.plan(req, page_size=5)
        args, kw = calls["plan"]
        assert [a.tolist() for a in args[:4]] == [req.qo_indptr.tolist(), req.kv_indptr.tolist(), req.indices.tolist(),
                                                  req.last_page_len.tolist()]
        assert args[4:8] == (2, 2, 4, 1 if token_pages else 5) and kw["causal"] is False
        pages = torch.zeros(92, 5, 2, 4, dtype=torch.bfloat16)  # [pool pages, page, H, D]
        backend.run((pages, pages), torch.zeros(22, 2, 4))
        assert calls["run"] == ((22, 2, 4), (460, 1, 2, 4) if token_pages else (92, 5, 2, 4))
        with pytest.raises(ValueError, match="planned 22 query rows"):
            backend.run((pages, pages), torch.zeros(11, 2, 4))
