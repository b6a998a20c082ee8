"""The wave model of an attention call on the GPU: how long a call lasts when its programs (thread
blocks) run in waves on the SMs, and its keys are read as several ranges merged by log-sum-exp.

Both the split backend's choice of key ranges (``split_backend.auto_kv_splits``) and the cut of a
frame's query rows into calls of our kernel (``runs_plan.plan_runs``) compare candidates with it.
"""
from __future__ import annotations

import math

SPLIT_OVERHEAD = 0.008  # per extra key range (H200, 518x378: 782 us a layer at 1 range, 845 at 8)


def waves_time(splits: int, blocks: int, sms: int) -> float:
    """The time of one call read as ``splits`` key ranges, relative to one range in one full wave:
    ``ceil(splits x blocks / sms)`` waves of blocks each ``1 / splits`` as long, plus the merge's share.
    ``sms``: the slots programs run in at once (SMs x programs per SM)."""
    return math.ceil(splits * blocks / sms) / splits * (1.0 + SPLIT_OVERHEAD * (splits - 1))


def fits_one_wave(num_queries: int, query_tile: int, heads: int, parts: int, slots: int) -> bool:
    """Whether a call's programs (a tile of ``query_tile`` queries x a head x a key range) all run at once
    on ``slots`` (SMs x programs per SM)."""
    return -(-num_queries // query_tile) * heads * parts <= slots


__all__ = ["SPLIT_OVERHEAD", "fits_one_wave", "waves_time"]
