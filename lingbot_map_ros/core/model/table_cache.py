"""A small least-recently-used cache for tables that depend on the frame size (RoPE, DPT position codes).

The model is shared by every session of a node, and sessions may run at different frame sizes (a
camera re-configured, an out-of-memory attempt at a huge size). An unbounded dict keyed by size
would keep the tables of every size ever seen; this keeps the ``max_entries`` most recently used.

Safe with CUDA graphs: a captured graph reads the tables of its session's size, which that session
uses every frame, so they are always the most recently used and never the ones evicted (a new size
only appears in a new session, which drops the old graph first).
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Generic, Hashable, TypeVar

V = TypeVar("V")


class TableCache(Generic[V]):
    def __init__(self, max_entries: int) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1 (got {max_entries})")
        self.max_entries = max_entries
        self._entries: OrderedDict[Hashable, V] = OrderedDict()

    def get_or_build(self, key: Hashable, build: Callable[[], V]) -> V:
        """The entry for ``key``, built on a miss; the least recently used entry goes when full."""
        if key in self._entries:
            self._entries.move_to_end(key)
            return self._entries[key]
        value = build()
        self._entries[key] = value
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
        return value

    def __len__(self) -> int:
        return len(self._entries)

    def keys(self) -> list[Hashable]:
        return list(self._entries)
