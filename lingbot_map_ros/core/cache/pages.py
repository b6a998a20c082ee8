"""Page bookkeeping of the global KV cache: plain Python on small integers, no tensors.

Every global block appends, evicts and rolls back exactly the same frames at the same step
(docs/model.md §9.3), so one ``PageTable`` describes the page layout of all blocks; only the
physical K/V storage is per block (``paged.PagedKVCache``). Keeping the bookkeeping free of
tensors lets it be property-tested on its own against a list model.

Layout (docs/model.md §9.3, the official FlashInfer two-stream layout):

* Patch pool: physical page ids ``0 .. num_patch_pages-1``. One page holds one frame's
  ``page_size`` patch tokens. Free pages sit on a LIFO free list; initially ordered so that the
  first pops return 0, 1, 2, ... A page joins the *scale list* while that list holds fewer than
  ``scale_frames`` pages (kept forever), otherwise the *window FIFO*; eviction moves the oldest
  window pages back to the free list while the window holds more than ``sliding_window`` pages.
* Special pool: page ids ``num_patch_pages .. num_patch_pages+special_pages-1``, filled
  sequentially with ``specials_per_frame`` tokens per frame packed back to back (a frame's
  specials may straddle two pages). Special pages are never freed: the specials of evicted
  frames stay visible (``kv_cache_cross_frame_special``).

Allocation order (``allocation``), the one physical choice that is not the official layout's:

* ``"lifo"`` (default, the official pool): pops from the LIFO free list above, then evicts.
* ``"lowest"``: a stored append first evicts what it will push out of the window, then takes the
  lowest free page ids. The visible set is the same (an evicted frame is invisible to the step
  that evicts it either way), but the stored patch pages are then always pages ``0 .. n-1``: once
  the window is full a keyframe step sees exactly pages ``0 .. scale+window-1``, one contiguous
  fixed-length region that a dense kernel reads without a mask or an index
  (``split_backend.py``); a non-keyframe's temporary page is then always page
  ``scale + window``, the pool's one spare page.

A non-keyframe attends to the cache plus itself and is then forgotten (§9.5). That is an append
with eviction deferred (``append(..., defer_eviction=True)``) followed by ``rollback()``; because
nothing was evicted in between, the rollback restores the state exactly, free-list order included.
A non-keyframe therefore temporarily holds one patch page beyond ``scale_frames + sliding_window``,
which is why the patch pool must have at least one page more than that.

Pool exhaustion raises ``PoolExhausted`` before any state changes, so the owner (the streaming
session) can decide what to do (reset, start a new window) with the table still consistent.
"""
from __future__ import annotations

import bisect
import operator
from collections import deque
from dataclasses import dataclass

from ..config import SPECIAL_TOKENS_PER_FRAME  # camera, 4 registers, scale (docs/model.md §6)

EXTRA_PATCH_PAGES = 16  # the official pool: n_sc + W + 16 patch pages


def visible_patch_pages(scale_frames: int, sliding_window: int) -> int:
    """The most patch pages one step can see, and so the smallest pool: the scale frames, the window
    and one more for a non-keyframe, whose page is held until it is rolled back. Every pool size and
    every bound on visible keys (the backends' buffers, the footprint) is built on this count."""
    return scale_frames + sliding_window + 1
ALLOCATIONS = ("lifo", "lowest")


class CacheFull(RuntimeError):
    """A KV cache cannot take the requested frames; raised before any state changes."""


class PoolExhausted(CacheFull):
    """The page table ran out of patch pages or special slots; the table is unchanged."""


@dataclass(frozen=True)
class AppendPlan:
    """Where the frames of one append go, in the order the frames were given.

    ``special_slots`` are flat slot indices ``page * page_size + offset`` (``specials_per_frame``
    per frame, frame-major); the patch tokens of frame ``i`` fill page ``patch_pages[i]`` entirely.
    ``evicted`` lists the window pages returned to the free list by this append (oldest first);
    it is always empty for a deferred append.
    """

    patch_pages: tuple[int, ...]
    special_slots: tuple[int, ...]
    evicted: tuple[int, ...]
    deferred: bool


@dataclass(frozen=True)
class PageStats:
    """A snapshot of the table for diagnostics (docs/model.md §9.6).

    During a deferred (non-keyframe) step the snapshot includes the in-flight frame.
    """

    page_size: int
    frames_stored: int  # scale + window + evicted frames
    scale_frames: int  # == scale pages
    window_frames: int  # == window pages
    frames_evicted: int  # frames whose patch pages were freed (their specials stay visible)
    free_pages: int
    patch_pages_total: int
    special_pages: int  # special pages in use (the tail one may be partly filled)
    special_pages_capacity: int
    special_tokens: int
    special_tokens_capacity: int
    visible_keys: int  # (scale + window) * page_size + special_tokens


@dataclass(frozen=True)
class TableMark:
    """The whole table at one moment (``PageTable.mark``), for undoing a step that failed half way.

    A batched step of several streams (``core/stream_group.py``) appends to every stream's table
    before one forward; when that forward raises, each table goes back to its mark. Whether the
    K/V storage is then exact too is ``PageTable.overwrote_visible``'s answer."""

    free: tuple[int, ...]
    scale: tuple[int, ...]
    window: tuple[int, ...]
    special_tokens: int
    frames_stored: int


@dataclass(frozen=True)
class _Undo:
    """What a deferred append changed, so ``rollback`` can restore it exactly."""

    taken: tuple[int, ...]  # patch pages in the order they were popped from the free list
    joined_scale: int  # how many of them joined the scale list (the rest joined the window)
    special_tokens_before: int
    frames_stored_before: int


class PageTable:
    """Scale list, window FIFO, LIFO free list and packed special stream of the global KV cache.

    Geometry is fixed at construction (page size = patch tokens per frame); a different image
    size or window needs a new table.
    """

    def __init__(
        self,
        *,
        scale_frames: int,
        sliding_window: int,
        page_size: int,
        num_patch_pages: int | None = None,
        special_pages: int,
        specials_per_frame: int = SPECIAL_TOKENS_PER_FRAME,
        allocation: str = "lifo",
    ) -> None:
        if allocation not in ALLOCATIONS:
            raise ValueError(f"allocation must be one of {ALLOCATIONS} (got {allocation!r})")
        if scale_frames < 1:
            raise ValueError(f"scale_frames must be >= 1 (got {scale_frames})")
        if sliding_window < 1:
            raise ValueError(f"sliding_window must be >= 1 (got {sliding_window})")
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1 (got {page_size})")
        if specials_per_frame < 1:
            raise ValueError(f"specials_per_frame must be >= 1 (got {specials_per_frame})")
        if special_pages < 1:
            raise ValueError(f"special_pages must be >= 1 (got {special_pages})")
        minimum = visible_patch_pages(scale_frames, sliding_window)
        if num_patch_pages is None:
            num_patch_pages = scale_frames + sliding_window + EXTRA_PATCH_PAGES  # the official pool
        if num_patch_pages < minimum:
            raise ValueError(
                f"num_patch_pages ({num_patch_pages}) must be >= scale_frames + sliding_window + 1 "
                f"({minimum}): a non-keyframe holds one page beyond the window until it is rolled back"
            )
        self.scale_frames = scale_frames
        self.sliding_window = sliding_window
        self.page_size = page_size
        self.num_patch_pages = num_patch_pages
        self.special_pages = special_pages
        self.specials_per_frame = specials_per_frame
        self.allocation = allocation
        self.reset()

    # ------------------------------------------------------------------ state

    def reset(self) -> None:
        """Empty the table: every patch page free again, in the initial pop order 0, 1, 2, ..."""
        # pop() from the end: LIFO order, or (``lowest``) kept sorted descending so the end is the lowest id
        self._free: list[int] = list(range(self.num_patch_pages - 1, -1, -1))
        self._scale: list[int] = []
        self._window: deque[int] = deque()
        self._special_tokens = 0
        self._frames_stored = 0
        self._undo: _Undo | None = None

    @property
    def num_pages(self) -> int:
        """Physical pages per block: patch pool followed by special pool."""
        return self.num_patch_pages + self.special_pages

    @property
    def special_tokens_capacity(self) -> int:
        return self.special_pages * self.page_size

    @property
    def frames_stored(self) -> int:
        """Frames appended and not rolled back (scale + window + evicted)."""
        return self._frames_stored

    @property
    def frames_evicted(self) -> int:
        return self._frames_stored - len(self._scale) - len(self._window)

    @property
    def special_tokens(self) -> int:
        return self._special_tokens

    @property
    def special_pages_used(self) -> int:
        return -(-self._special_tokens // self.page_size)  # ceil

    @property
    def scale_pages(self) -> list[int]:
        return list(self._scale)

    @property
    def window_pages(self) -> list[int]:
        """Oldest first."""
        return list(self._window)

    @property
    def free_list(self) -> list[int]:
        """Free patch pages in pop order (the next page handed out first)."""
        return self._free[::-1]

    @property
    def pending_rollback(self) -> bool:
        """True between a deferred append and its ``rollback``."""
        return self._undo is not None

    # ------------------------------------------------------------ operations

    def append(self, num_frames: int, *, defer_eviction: bool = False) -> AppendPlan:
        """Take one patch page and ``specials_per_frame`` special slots per frame.

        With ``defer_eviction`` the window may exceed ``sliding_window`` until ``rollback()``,
        which is then the only operation allowed besides ``reset()`` and the read-only queries.
        Raises ``PoolExhausted`` (state unchanged) when pages or special slots would run out.
        """
        if num_frames < 1:
            raise ValueError(f"num_frames must be >= 1 (got {num_frames})")
        if self._undo is not None:
            raise RuntimeError("append() after a deferred append: call rollback() first")
        specials_needed = num_frames * self.specials_per_frame
        if self._special_tokens + specials_needed > self.special_tokens_capacity:
            raise PoolExhausted(
                f"special pool full: {self._special_tokens} of {self.special_tokens_capacity} special "
                f"slots used, {num_frames} frame(s) need {specials_needed} more "
                f"({self._frames_stored} frames stored); start a new session"
            )
        joined_scale = min(num_frames, self.scale_frames - len(self._scale))
        # ``lowest`` frees the pages this append pushes out of the window before taking any
        evict_first = 0 if defer_eviction or self.allocation == "lifo" else max(
            0, min(len(self._window), len(self._window) + num_frames - joined_scale - self.sliding_window))
        if num_frames > len(self._free) + evict_first:
            raise PoolExhausted(
                f"patch pool exhausted: {num_frames} page(s) needed, {len(self._free)} free of "
                f"{self.num_patch_pages}"
            )

        evicted: list[int] = []
        for _ in range(evict_first):
            evicted.append(self._evict_oldest())
        taken = tuple(self._free.pop() for _ in range(num_frames))
        self._scale.extend(taken[:joined_scale])
        self._window.extend(taken[joined_scale:])

        first = self._special_tokens
        specials = tuple(self.num_patch_pages * self.page_size + first + i for i in range(specials_needed))
        undo = _Undo(taken, joined_scale, self._special_tokens, self._frames_stored)
        self._special_tokens += specials_needed
        self._frames_stored += num_frames

        if defer_eviction:
            self._undo = undo
        else:
            while len(self._window) > self.sliding_window:
                evicted.append(self._evict_oldest())
        return AppendPlan(patch_pages=taken, special_slots=specials, evicted=tuple(evicted), deferred=defer_eviction)

    def _evict_oldest(self) -> int:
        """Move the oldest window page to the free list (``lowest``: at its sorted place)."""
        page = self._window.popleft()
        self._release(page)
        return page

    def _release(self, page: int) -> None:
        if self.allocation == "lifo":
            self._free.append(page)
        else:  # kept descending: the lowest id sits at the end, where pop() takes it
            bisect.insort(self._free, page, key=operator.neg)

    def rollback(self) -> None:
        """Undo the last deferred append exactly (free-list order, special tail, counters)."""
        undo = self._undo
        if undo is None:
            raise RuntimeError("rollback() is only allowed right after a deferred append")
        joined_window = len(undo.taken) - undo.joined_scale
        for _ in range(joined_window):
            self._window.pop()
        for _ in range(undo.joined_scale):
            self._scale.pop()
        if self.allocation == "lifo":
            self._free.extend(reversed(undo.taken))  # the first page taken is popped first again
        else:
            for page in undo.taken:
                self._release(page)
        self._special_tokens = undo.special_tokens_before
        self._frames_stored = undo.frames_stored_before
        self._undo = None

    # ------------------------------------------------------------ undo of a failed step

    def mark(self) -> TableMark:
        """The table now, outside a deferred append (``restore`` brings it back)."""
        if self._undo is not None:
            raise RuntimeError("mark() during a deferred append: roll it back first")
        return TableMark(tuple(self._free), tuple(self._scale), tuple(self._window), self._special_tokens,
                         self._frames_stored)

    def restore(self, mark: TableMark) -> None:
        """Go back to ``mark`` exactly (free-list order included), whatever was appended since."""
        self._free, self._scale, self._window = list(mark.free), list(mark.scale), deque(mark.window)
        self._special_tokens, self._frames_stored, self._undo = mark.special_tokens, mark.frames_stored, None

    @staticmethod
    def overwrote_visible(plan: AppendPlan) -> bool:
        """Whether the append of ``plan`` handed out a page it evicted in the same append (the
        ``lowest`` order evicts first): that page's old frame was visible before the append, and the
        step's K/V write overwrites it, so restoring the table alone would not restore the cache.
        Every other append writes only free pages and unused special slots."""
        return bool(set(plan.patch_pages) & set(plan.evicted))

    # ------------------------------------------------------------ saved sessions

    def state_dict(self) -> dict:
        """The table as plain JSON data (``core/session_store.py`` writes it into the manifest)."""
        if self._undo is not None:
            raise RuntimeError("state_dict() during a deferred append: end the step first")
        return {
            "page_size": self.page_size, "scale_frames": self.scale_frames, "sliding_window": self.sliding_window,
            "specials_per_frame": self.specials_per_frame, "num_patch_pages": self.num_patch_pages,
            "special_pages": self.special_pages, "allocation": self.allocation,
            "scale": list(self._scale), "window": list(self._window), "free": list(self._free),
            "special_tokens": self._special_tokens, "frames_stored": self._frames_stored,
        }

    def load_state_dict(self, state: dict) -> list[int]:
        """Restore a saved table; returns the pages the saved scale + window pages go to, in order.

        The same pools and allocation order: every page id and the free-list order come back exactly
        (the next frames take the same pages as in the saved run). Other pools (a session saved with
        the GPU's tight pools, loaded on a CPU): the stored pages are laid out afresh as a prefix -
        attention reads the visible pages in the table's order, not by their ids, so results match.
        Raises ``ValueError`` (table unchanged) when the geometry differs or the pools are too small."""
        for key in ("page_size", "scale_frames", "sliding_window", "specials_per_frame"):
            if int(state[key]) != getattr(self, key):
                raise ValueError(f"page table {key} {state[key]} != {getattr(self, key)}")
        scale, window = [int(p) for p in state["scale"]], [int(p) for p in state["window"]]
        special_tokens, frames_stored = int(state["special_tokens"]), int(state["frames_stored"])
        stored = len(scale) + len(window)
        if stored + 1 > self.num_patch_pages or special_tokens > self.special_tokens_capacity:
            raise ValueError(f"{stored} pages and {special_tokens} special tokens do not fit pools of "
                             f"{self.num_patch_pages} pages / {self.special_tokens_capacity} special slots")
        if frames_stored < stored or special_tokens != frames_stored * self.specials_per_frame:
            raise ValueError(f"inconsistent page table: {frames_stored} frames, {stored} pages, "
                             f"{special_tokens} special tokens")
        same_pools = (int(state["num_patch_pages"]) == self.num_patch_pages
                      and state["allocation"] == self.allocation)
        if same_pools:
            free = [int(p) for p in state["free"]]
            if sorted(free + scale + window) != list(range(self.num_patch_pages)):
                raise ValueError("inconsistent page table: pages lost or duplicated")
        else:
            scale, window = list(range(len(scale))), list(range(len(scale), stored))
            free = list(range(self.num_patch_pages - 1, stored - 1, -1))  # pop order stored, stored+1, ...
        self._free, self._scale, self._window = free, scale, deque(window)
        self._special_tokens, self._frames_stored, self._undo = special_tokens, frames_stored, None
        return scale + window

    # --------------------------------------------------------------- queries

    def visible_pages(self) -> list[int]:
        """Page table of one attention request: scale pages, window pages, used special pages."""
        first_special = self.num_patch_pages
        specials = range(first_special, first_special + self.special_pages_used)
        return [*self._scale, *self._window, *specials]

    @property
    def last_page_len(self) -> int:
        """Valid tokens in the last visible page (docs/model.md §9.3).

        Specials in the tail special page, ``page_size`` when it is exactly full, and
        ``page_size`` when there is no special page (the last page is then a full patch page).
        """
        rest = self._special_tokens % self.page_size
        return rest if rest else self.page_size

    @property
    def visible_key_count(self) -> int:
        return (len(self._scale) + len(self._window)) * self.page_size + self._special_tokens

    def stats(self) -> PageStats:
        return PageStats(
            page_size=self.page_size,
            frames_stored=self._frames_stored,
            scale_frames=len(self._scale),
            window_frames=len(self._window),
            frames_evicted=self.frames_evicted,
            free_pages=len(self._free),
            patch_pages_total=self.num_patch_pages,
            special_pages=self.special_pages_used,
            special_pages_capacity=self.special_pages,
            special_tokens=self._special_tokens,
            special_tokens_capacity=self.special_tokens_capacity,
            visible_keys=self.visible_key_count,
        )

    def __repr__(self) -> str:
        return (
            f"PageTable(scale={self._scale}, window={list(self._window)}, free={len(self._free)}, "
            f"special_tokens={self._special_tokens}, pending_rollback={self.pending_rollback})"
        )


__all__ = [
    "SPECIAL_TOKENS_PER_FRAME",
    "CacheFull",
    "PoolExhausted",
    "AppendPlan",
    "PageStats",
    "PageTable",
    "TableMark",
    "ALLOCATIONS",
]
