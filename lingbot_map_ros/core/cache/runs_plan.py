"""How one frame's queries are cut into calls of our kernel over the runs (``triton_prefix.py``,
``gluon_runs.py``), so that its programs fill the GPU's SMs in whole waves.

Why: each program of the kernel takes one query tile of one head and walks it over its share of the
keys, so a call lasts as many waves as its programs need on the SMs. At 518x378 (1005 queries, 16
heads) the warp-specialised kernel's 128-query tiles make 8 x 16 = 128 programs: one wave on an
H200's 132 SMs. A 640x480 camera gives 518x392, 1042 queries: 9 x 16 = 144 programs, two waves, the
second holding 12 programs while 120 SMs wait. Reading the keys as ``P`` ranges (``auto_kv_splits``)
fills the last wave better, but every program then pays its start and every query its merge, on all
of the frame's rows.

The plan cuts the rows instead, where that is modelled faster:

* **whole tiles**: the most whole query tiles that one wave holds (``SMs // heads`` tiles of the
  kernel's widest layout: 8 x 128 = 1024 rows at 16 heads on 132 SMs), one call, one part, written
  straight into the frame's output;
* **the ragged tail**: the rows left over (18 at 1042). Where the kernel can carry them (``fused_tail``:
  the Gluon kernel's two-warpgroup programs, up to one warpgroup's tile of rows) they ride in the whole
  tiles' programs: a third warpgroup of each of a head's ``G`` programs meets them against every
  ``G``-th key block the program streams anyway, and the ``G`` parts merge by log-sum-exp. That spares
  a second read of the layer's keys (memory-bound: 18 rows cost ~17 % of the 1024 rows' time on an
  H100) for ~6 % more tensor-core work beside the pair's (28.91 against 29.44 ms a frame for the call of
  its own at 518x392, depth + camera, on an H100). Elsewhere (Triton's kernel), one more call
  with its keys cut into as many ranges as fill one more, short wave (16 heads x 16 parts = 256
  one-warpgroup programs on 264 slots), merged the same way, on a side stream beside the whole tiles
  (``tail_beside``): its programs are memory-bound and take the SMs the whole tiles leave idle, then
  each SM they give back.

Measured and not kept: the tail folded into the pair's own warpgroups (synchronously, in halves of a
block: it held the stages its partner waits for), a range of the blocks for the third warpgroup instead
of every ``G``-th (no faster than the call), and the tail read by programs of its own in the whole
tiles' launch (30.78 against 29.59 ms a frame on an H100).

Exact either way: a query's attention does not depend on which call reads it, and the tail's parts
merge as the split backend's always do. The model (``waves_time``, in units of one wave of
programs that each read every key) compares the whole-frame call with its chosen parts against the
cut: at 1042 queries 1.18 waves against 1.07 + the tail call's fixed cost, or 1 + 1/16 + a merge for the
carried tail. Frame sizes whose
programs fit one wave (518x378, 518x294) keep the one call they had.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .waves import fits_one_wave, waves_time

# None: cut where the model says it is faster; False: never (the bench's ``+wholerows``, or a forced
# ``+partsN``, which names the parts of one call over every row); True: wherever it can.
RAGGED_TAIL: Optional[bool] = None
# True: the tail rides in the whole tiles' programs where the kernel can carry it, by a third warpgroup
# (faster than the call of its own on an H100: 28.91 against 29.44 ms a frame at 518x392);
# False: a call of its own (the bench's ``+tailcall``).
FUSED_TAIL = True
# True: the tail's call runs on a side stream beside the whole tiles' call (the bench's ``+sidetail``;
# ``+tailafter``: after it, on the frame's stream), so that its memory-bound programs take the SMs the whole
# tiles leave idle (4 of 132 at 16 heads) and the rest of them as those finish (measured faster on an
# H200: 28.43 against 28.59 ms a frame at 518x392).
TAIL_BESIDE = True
FUSED_MERGE_COST = 0.01  # the carried tail's merge of its parts, in waves (~5 us)
TAIL_CALL_COST = 0.03  # the tail's launch, merge and copy, in waves (~20 us of a ~0.65 ms layer on an H200)
MAX_TAIL_PARTS = 32


@dataclass(frozen=True)
class RunsCall:
    """One kernel call: query rows ``[start, start + rows)``, their keys read as ``parts`` ranges. The
    Gluon kernel's layout stays its own rule (``gluon_runs.use_pairs``): the whole tiles of a cut fit
    one wave of its two-warpgroup programs, so it picks those; the tail's many parts do not."""

    start: int
    rows: int
    parts: int


@dataclass(frozen=True)
class RunsPlan:
    """The calls that together read one frame of ``num_queries`` queries; ``reason`` says why."""

    num_queries: int
    calls: tuple[RunsCall, ...]
    reason: str
    fused_tail: bool = False  # the second call's rows ride in the first call's programs (one launch)
    tail_beside: bool = False  # the second call runs on a side stream, beside the first

    @property
    def ragged(self) -> bool:
        return len(self.calls) > 1


def whole_call(num_queries: int, parts: int, reason: str) -> RunsPlan:
    """Every row in one call."""
    return RunsPlan(num_queries, (RunsCall(0, num_queries, parts),), reason)


def plan_runs(num_queries: int, num_heads: int, num_sms: int, whole_parts: int, *, query_tile: int,
              blocks_per_sm: int, pair_tile: int = 0, fuse_tail: bool = False) -> RunsPlan:
    """The calls for ``num_queries`` queries x ``num_heads`` heads on ``num_sms`` SMs.

    ``whole_parts``: the parts of one call over every row (``auto_kv_splits``'s choice); ``query_tile``
    and ``blocks_per_sm``: the one-warpgroup kernel's tile and programs per SM; ``pair_tile``: the
    warp-specialised kernel's tile, one program per SM (0: the kernel has no such layout, Triton's);
    ``fuse_tail``: those programs can carry up to half a tile of tail rows by a third warpgroup (Gluon's),
    used where ``FUSED_TAIL`` is on."""
    if num_sms <= 0:
        return whole_call(num_queries, whole_parts, "no SM count (CPU): one call")
    if RAGGED_TAIL is False:
        return whole_call(num_queries, whole_parts, "one call over every row, as asked (bench: +wholerows, +partsN)")
    slots = num_sms * blocks_per_sm
    whole_pairs = pair_tile > 0 and fits_one_wave(num_queries, pair_tile, num_heads, whole_parts, num_sms)
    if whole_pairs:
        whole = waves_time(whole_parts, -(-num_queries // pair_tile) * num_heads, num_sms)
    else:
        whole = waves_time(whole_parts, -(-num_queries // query_tile) * num_heads, slots)
    head_tile, head_slots = (pair_tile, num_sms) if pair_tile > 0 else (query_tile, slots)
    head_rows = head_slots // num_heads * head_tile
    tail_rows = num_queries - head_rows
    if tail_rows <= 0:
        return whole_call(num_queries, whole_parts, f"one call: its programs fit one wave ({whole:.2f} waves)")
    if head_rows <= 0:
        return whole_call(num_queries, whole_parts, "one call: one wave holds less than a tile of every head")
    if fuse_tail and FUSED_TAIL and pair_tile > 0 and tail_rows <= pair_tile // 2:
        tiles = head_slots // num_heads  # whole tiles a head: each program's third warpgroup, a 1/tiles share
        fused = 1.0 + 1.0 / (2 * tiles) + FUSED_MERGE_COST  # + a tile's half (64 rows) on 1/tiles of the blocks
        if RAGGED_TAIL is None and fused >= whole:
            return whole_call(num_queries, whole_parts, f"one call in {whole_parts} part(s): {whole:.2f} waves "
                                                        f"against {fused:.2f} for whole tiles carrying the tail")
        calls = (RunsCall(0, head_rows, 1), RunsCall(head_rows, tail_rows, tiles))
        return RunsPlan(num_queries, calls, f"{head_rows} rows in one wave of whole tiles, whose programs carry the "
                                            f"last {tail_rows} rows as {tiles} key shares: {fused:.2f} waves "
                                            f"against {whole:.2f} for one call in {whole_parts} part(s)",
                        fused_tail=True)
    tail_blocks = -(-tail_rows // query_tile) * num_heads
    tail_parts = min(range(1, MAX_TAIL_PARTS + 1), key=lambda p: (waves_time(p, tail_blocks, slots), p))
    cut = 1.0 + waves_time(tail_parts, tail_blocks, slots) + TAIL_CALL_COST
    if RAGGED_TAIL is None and cut >= whole:
        return whole_call(num_queries, whole_parts, f"one call in {whole_parts} part(s): {whole:.2f} waves against "
                                                    f"{cut:.2f} for whole tiles + a tail")
    calls = (RunsCall(0, head_rows, 1), RunsCall(head_rows, tail_rows, tail_parts))
    beside = ", beside them on a side stream" if TAIL_BESIDE else ""
    return RunsPlan(num_queries, calls, f"{head_rows} rows in one wave of whole tiles, the last {tail_rows} as "
                                        f"{tail_parts} key ranges{beside}: {cut:.2f} waves against {whole:.2f} for "
                                        f"one call in {whole_parts} part(s)", tail_beside=TAIL_BESIDE)


__all__ = ["RunsCall", "RunsPlan", "plan_runs", "whole_call", "FUSED_TAIL", "RAGGED_TAIL", "TAIL_BESIDE"]
