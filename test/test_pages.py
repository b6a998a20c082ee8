"""Page bookkeeping of the global KV cache: exact page ids, free-list order and special slots, then
property tests against a list model written here (docs/model.md §9.3, §9.5)."""
from __future__ import annotations

import copy
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lingbot_map_ros.core.cache.pages import AppendPlan, CacheFull, PageTable, PoolExhausted


def _state(table: PageTable) -> tuple:
    """Everything observable about a table, for exact before/after comparisons."""
    return (
        table.scale_pages,
        table.window_pages,
        table.free_list,
        table.visible_pages(),
        table.last_page_len,
        table.frames_stored,
        table.special_tokens,
        table.pending_rollback,
        table.stats(),
    )


# ------------------------------------------------------------------------------- exact scenarios


def test_construction_defaults_and_minimum_pool() -> None:
    table = PageTable(scale_frames=2, sliding_window=3, page_size=7, special_pages=4)
    assert table.num_patch_pages == 2 + 3 + 16
    assert table.num_pages == 21 + 4
    assert table.free_list == list(range(21))  # first pops are 0, 1, 2, ...
    assert table.visible_pages() == []
    assert table.last_page_len == 7  # no special page: a full patch page would be last
    assert table.visible_key_count == 0
    PageTable(scale_frames=2, sliding_window=3, page_size=7, num_patch_pages=6, special_pages=4)
    with pytest.raises(ValueError, match="num_patch_pages"):
        PageTable(scale_frames=2, sliding_window=3, page_size=7, num_patch_pages=5, special_pages=4)


def test_scale_window_eviction_specials_and_rollback_exact() -> None:
    """scale 2, window 3, page 7, 7 patch pages (ids 0..6), special pages 7..16 (flat slots from 49)."""
    t = PageTable(scale_frames=2, sliding_window=3, page_size=7, num_patch_pages=7, special_pages=10)

    # Phase 1: two scale frames; frame 1's specials straddle special pages 7 and 8.
    plan = t.append(2)
    assert plan == AppendPlan(
        patch_pages=(0, 1), special_slots=tuple(range(49, 61)), evicted=(), deferred=False
    )
    assert (t.scale_pages, t.window_pages, t.free_list) == ([0, 1], [], [2, 3, 4, 5, 6])
    assert t.visible_pages() == [0, 1, 7, 8]
    assert t.last_page_len == 5  # 12 specials = 7 + 5
    assert t.visible_key_count == 2 * 7 + 12

    # Keyframes fill the window.
    assert t.append(1) == AppendPlan((2,), tuple(range(61, 67)), (), False)
    assert t.append(1) == AppendPlan((3,), tuple(range(67, 73)), (), False)
    assert t.append(1) == AppendPlan((4,), tuple(range(73, 79)), (), False)
    assert t.window_pages == [2, 3, 4]
    assert t.visible_pages() == [0, 1, 2, 3, 4, 7, 8, 9, 10, 11]
    assert t.last_page_len == 2  # 30 = 4*7 + 2

    # The fourth window frame evicts the oldest one; its page goes back on top of the free list.
    assert t.append(1) == AppendPlan((5,), tuple(range(79, 85)), (2,), False)
    assert (t.window_pages, t.free_list) == ([3, 4, 5], [2, 6])
    assert t.last_page_len == 1  # 36 = 5*7 + 1
    assert t.stats().frames_evicted == 1

    # Non-keyframe: reuses page 2, no eviction, 42 specials fill page 12 exactly.
    before = _state(t)
    plan = t.append(1, defer_eviction=True)
    assert plan == AppendPlan((2,), tuple(range(85, 91)), (), True)
    assert t.window_pages == [3, 4, 5, 2]
    assert t.free_list == [6]
    assert t.visible_pages() == [0, 1, 3, 4, 5, 2, 7, 8, 9, 10, 11, 12]
    assert t.last_page_len == 7
    assert t.visible_key_count == 6 * 7 + 42
    t.rollback()
    assert _state(t) == before
    assert t.free_list == [2, 6]

    # The next keyframe takes the same slots the non-keyframe had.
    assert t.append(1) == AppendPlan((2,), tuple(range(85, 91)), (3,), False)
    assert t.append(1) == AppendPlan((3,), tuple(range(91, 97)), (4,), False)
    assert (t.scale_pages, t.window_pages, t.free_list) == ([0, 1], [5, 2, 3], [4, 6])
    stats = t.stats()
    assert (stats.frames_stored, stats.scale_frames, stats.window_frames, stats.frames_evicted) == (8, 2, 3, 3)
    assert (stats.special_tokens, stats.special_pages) == (48, 7)  # special pages 7..13
    assert t.last_page_len == 6  # 48 = 6*7 + 6
    assert stats.free_pages == 2 and stats.patch_pages_total == 7
    assert stats.special_pages_capacity == 10 and stats.special_tokens_capacity == 70
    assert stats.visible_keys == 5 * 7 + 48

    t.reset()
    fresh = PageTable(scale_frames=2, sliding_window=3, page_size=7, num_patch_pages=7, special_pages=10)
    assert _state(t) == _state(fresh)


def test_special_page_exactly_full_and_small_pages() -> None:
    """page_size 4 < 6 specials: every frame's specials straddle pages; 12 specials fill 3 pages exactly."""
    t = PageTable(scale_frames=1, sliding_window=1, page_size=4, num_patch_pages=3, special_pages=5)
    plan = t.append(1)
    assert plan.special_slots == (12, 13, 14, 15, 16, 17)  # pages 3 and 4 (flat = page*4 + offset)
    assert t.visible_pages() == [0, 3, 4]
    assert t.last_page_len == 2
    t.append(1)
    assert t.visible_pages() == [0, 1, 3, 4, 5]
    assert t.last_page_len == 4  # exactly full tail page
    assert t.visible_key_count == 2 * 4 + 12


def test_non_keyframe_joining_scale_list_rolls_back() -> None:
    """A short phase 1 leaves room in the scale list; a non-keyframe joins it temporarily."""
    t = PageTable(scale_frames=3, sliding_window=2, page_size=5, special_pages=8)
    t.append(1)
    before = _state(t)
    t.append(2, defer_eviction=True)
    assert (t.scale_pages, t.window_pages) == ([0, 1, 2], [])
    t.rollback()
    assert _state(t) == before
    assert t.free_list[:3] == [1, 2, 3]


def test_pool_exhausted_leaves_state_unchanged() -> None:
    # Specials: 2 pages of 7 = 14 slots hold two frames (12), not three.
    t = PageTable(scale_frames=1, sliding_window=1, page_size=7, special_pages=2)
    t.append(2)
    before = _state(t)
    with pytest.raises(PoolExhausted, match="special"):
        t.append(1)
    with pytest.raises(PoolExhausted):
        t.append(1, defer_eviction=True)
    assert _state(t) == before
    assert issubclass(PoolExhausted, CacheFull)

    # Patch pages: a minimal pool (3 pages) cannot take 4 frames at once.
    t = PageTable(scale_frames=1, sliding_window=1, page_size=2, num_patch_pages=3, special_pages=40)
    before = _state(t)
    with pytest.raises(PoolExhausted, match="patch pool"):
        t.append(4)
    assert _state(t) == before


def test_rollback_only_after_deferred_append() -> None:
    t = PageTable(scale_frames=1, sliding_window=2, page_size=3, special_pages=20)
    with pytest.raises(RuntimeError):
        t.rollback()
    t.append(1)
    with pytest.raises(RuntimeError):
        t.rollback()
    t.append(1, defer_eviction=True)
    with pytest.raises(RuntimeError):
        t.append(1)  # a pending non-keyframe must be rolled back first
    t.rollback()
    with pytest.raises(RuntimeError):
        t.rollback()
    with pytest.raises(ValueError):
        t.append(0)


# --------------------------------------------------------------------------- property tests


@dataclass
class ListModel:
    """The table as plain lists: what docs/model.md §9.3 says, written without the implementation's tricks."""

    scale_frames: int
    window: int
    page_size: int
    patch_pages: int
    special_pages: int
    scale: list[int] = field(default_factory=list)
    recent: list[int] = field(default_factory=list)  # oldest first
    free: list[int] = field(default_factory=list)  # pop order: free[0] is handed out next
    specials: int = 0
    stored: int = 0

    def __post_init__(self) -> None:
        self.free = list(range(self.patch_pages))

    def append(self, n: int, defer: bool) -> AppendPlan | None:
        """The expected plan, or None when the pools cannot take the frames."""
        if self.specials + 6 * n > self.special_pages * self.page_size or n > len(self.free):
            return None
        taken = []
        for _ in range(n):
            page = self.free.pop(0)
            taken.append(page)
            (self.scale if len(self.scale) < self.scale_frames else self.recent).append(page)
        base = self.patch_pages * self.page_size + self.specials
        self.specials += 6 * n
        self.stored += n
        evicted = []
        while not defer and len(self.recent) > self.window:
            page = self.recent.pop(0)
            self.free.insert(0, page)
            evicted.append(page)
        return AppendPlan(tuple(taken), tuple(range(base, base + 6 * n)), tuple(evicted), defer)

    def visible(self) -> list[int]:
        used = -(-self.specials // self.page_size)
        return self.scale + self.recent + list(range(self.patch_pages, self.patch_pages + used))

    def last_page_len(self) -> int:
        return self.specials % self.page_size or self.page_size


def _check_against_model(table: PageTable, model: ListModel) -> None:
    used = set(table.scale_pages) | set(table.window_pages)
    free = table.free_list
    assert not used & set(free), "a page is both free and used"
    assert len(free) == len(set(free))
    assert len(table.scale_pages) + len(table.window_pages) + len(free) == table.num_patch_pages
    assert used | set(free) == set(range(table.num_patch_pages))
    assert table.scale_pages == model.scale
    assert table.window_pages == model.recent
    assert free == model.free
    assert table.visible_pages() == model.visible()
    assert table.last_page_len == model.last_page_len()
    assert table.special_tokens == model.specials
    assert table.frames_stored == model.stored
    stats = table.stats()
    assert stats.frames_evicted == model.stored - len(model.scale) - len(model.recent)
    assert stats.special_pages == -(-model.specials // model.page_size)
    assert stats.visible_keys == (len(model.scale) + len(model.recent)) * model.page_size + model.specials
    assert stats.free_pages == len(model.free)


geometry = st.fixed_dictionaries(
    {
        "scale_frames": st.integers(1, 3),
        "sliding_window": st.integers(1, 4),
        "page_size": st.integers(1, 9),
        "extra_pages": st.integers(1, 3),
        "special_pages": st.integers(1, 14),
    }
)
operation = st.one_of(
    st.tuples(st.just("append"), st.integers(1, 3)),
    st.tuples(st.just("non_keyframe"), st.integers(1, 2)),
    st.tuples(st.just("bad_rollback"), st.just(0)),
    st.tuples(st.just("reset"), st.just(0)),
)


@settings(max_examples=250, deadline=None)
@given(geometry, st.lists(operation, max_size=40))
def test_table_matches_list_model(geo: dict, ops: list[tuple[str, int]]) -> None:
    patch_pages = geo["scale_frames"] + geo["sliding_window"] + geo["extra_pages"]
    kwargs = dict(
        scale_frames=geo["scale_frames"],
        sliding_window=geo["sliding_window"],
        page_size=geo["page_size"],
        num_patch_pages=patch_pages,
        special_pages=geo["special_pages"],
    )
    table = PageTable(**kwargs)
    fresh = ListModel(geo["scale_frames"], geo["sliding_window"], geo["page_size"], patch_pages, geo["special_pages"])
    model = copy.deepcopy(fresh)
    _check_against_model(table, model)

    for op, n in ops:
        if op == "append":
            expected = model.append(n, defer=False)
            if expected is None:
                before = _state(table)
                with pytest.raises(PoolExhausted):
                    table.append(n)
                assert _state(table) == before
            else:
                assert table.append(n) == expected
                assert len(table.window_pages) <= geo["sliding_window"]
        elif op == "non_keyframe":
            snapshot = copy.deepcopy(model)
            before = _state(table)
            expected = model.append(n, defer=True)
            if expected is None:
                with pytest.raises(PoolExhausted):
                    table.append(n, defer_eviction=True)
                assert _state(table) == before
                continue
            assert table.append(n, defer_eviction=True) == expected
            assert table.pending_rollback
            _check_against_model(table, model)  # the non-keyframe's visible set, window may exceed W
            table.rollback()
            model = snapshot
            assert _state(table) == before
        elif op == "bad_rollback":
            before = _state(table)
            with pytest.raises(RuntimeError):
                table.rollback()
            assert _state(table) == before
        else:
            table.reset()
            model = copy.deepcopy(fresh)
        _check_against_model(table, model)


# ------------------------------------------------------------------ allocation "lowest" (split backend)


def test_lowest_allocation_exact_pages() -> None:
    """scale 2, window 3, pool 6 = scale + window + 1: evict before taking, lowest free id first."""
    t = PageTable(
        scale_frames=2, sliding_window=3, page_size=7, num_patch_pages=6, special_pages=10, allocation="lowest"
    )
    assert t.append(2).patch_pages == (0, 1)
    assert [t.append(1).patch_pages for _ in range(3)] == [(2,), (3,), (4,)]
    assert (t.window_pages, t.free_list) == ([2, 3, 4], [5])
    # a non-keyframe in the full window takes the spare page 5 and gives it back
    assert t.append(1, defer_eviction=True).patch_pages == (5,)
    assert t.visible_pages()[:6] == [0, 1, 2, 3, 4, 5]
    t.rollback()
    assert t.free_list == [5]
    # keyframes now reuse the page they evict (oldest window page first): no hole, no copy
    plans = [t.append(1) for _ in range(4)]
    assert [(p.patch_pages, p.evicted) for p in plans] == [((2,), (2,)), ((3,), (3,)), ((4,), (4,)), ((2,), (2,))]
    assert (t.scale_pages, t.window_pages, t.free_list) == ([0, 1], [3, 4, 2], [5])
    # a non-keyframe while filling takes the lowest free page, and the rollback restores the order
    u = PageTable(
        scale_frames=1, sliding_window=4, page_size=3, num_patch_pages=6, special_pages=10, allocation="lowest"
    )
    u.append(1)
    assert u.append(1, defer_eviction=True).patch_pages == (1,)
    u.rollback()
    assert u.free_list == [1, 2, 3, 4, 5]
    with pytest.raises(ValueError, match="allocation"):
        PageTable(scale_frames=1, sliding_window=1, page_size=3, special_pages=2, allocation="fifo")


@settings(max_examples=200, deadline=None)
@given(geometry, st.lists(operation, max_size=40))
def test_lowest_allocation_keeps_a_prefix_and_the_same_visible_frames(geo: dict, ops: list[tuple[str, int]]) -> None:
    """Against the official (LIFO) table driven identically: the same frames and specials are visible
    at every step, and the pages in use are always exactly ``0 .. n-1``."""
    kwargs = dict(scale_frames=geo["scale_frames"], sliding_window=geo["sliding_window"], page_size=geo["page_size"],
                  num_patch_pages=geo["scale_frames"] + geo["sliding_window"] + geo["extra_pages"],
                  special_pages=geo["special_pages"])
    tables = {name: PageTable(**kwargs, allocation=name) for name in ("lifo", "lowest")}
    frame_of: dict[str, dict[int, int]] = {name: {} for name in tables}
    next_frame = 0
    self_evicted = False

    def visible_frames(name: str) -> tuple[list[int], list[int], int]:
        t = tables[name]
        pages = t.visible_pages()
        patch = sorted(frame_of[name][p] for p in pages if p < t.num_patch_pages)
        return patch, [p for p in pages if p >= t.num_patch_pages], t.last_page_len

    def check() -> None:
        assert visible_frames("lifo") == visible_frames("lowest")
        low = tables["lowest"]
        used = low.scale_pages + low.window_pages
        if not self_evicted:
            assert sorted(used) == list(range(len(used)))
        assert low.free_list == sorted(low.free_list)

    for op, n in ops:
        if op in ("append", "non_keyframe"):
            defer = op == "non_keyframe"
            results = {}
            for name, t in tables.items():
                try:
                    results[name] = t.append(n, defer_eviction=defer)
                except PoolExhausted:
                    results[name] = None
            lifo, low = results["lifo"], results["lowest"]
            if lifo is None or low is None:
                # the pools cannot take this append in at least one order (lowest evicts before it
                # takes, so it can fit where lifo cannot): start both afresh, still in step
                for t in tables.values():
                    t.reset()
                frame_of = {name: {} for name in tables}
                self_evicted = False
                continue
            # an append of more new window frames than the window evicts some of its own frames:
            # the cache never does that (PagedKVCache.begin_step refuses it), and it breaks the prefix
            self_evicted |= bool(set(lifo.evicted) & set(lifo.patch_pages))
            assert lifo.special_slots == low.special_slots and len(lifo.evicted) == len(low.evicted)
            for name in tables:
                for i, page in enumerate(results[name].patch_pages):
                    frame_of[name][page] = next_frame + i
            next_frame += n
            check()
            if defer:
                for t in tables.values():
                    t.rollback()
        elif op == "bad_rollback":
            for t in tables.values():
                with pytest.raises(RuntimeError):
                    t.rollback()
        else:
            for t in tables.values():
                t.reset()
            frame_of = {name: {} for name in tables}
            self_evicted = False
        check()
