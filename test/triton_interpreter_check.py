"""Run by test_triton_prefix.py in a child process with ``TRITON_INTERPRET=1`` (Triton reads it when
the kernel module is imported): the Triton prefix kernel, on the CPU, against float64.

Prints one JSON object: the worst errors of the kernel alone, the modes the split backend went
through with the kernel reading its steps (its outputs are checked inside the drive) and the runs of
one page list."""
from __future__ import annotations

import json
import math
import os
import sys
from typing import Optional

import torch

sys.path.insert(0, os.path.dirname(__file__))
import triton_interpreter  # noqa: E402,F401  (first: the interpreter, mended)
from attention_reference import drive_one_frame_backend  # noqa: E402

from lingbot_map_ros.core.cache import PagedKVCache, triton_prefix  # noqa: E402
from lingbot_map_ros.core.cache.runs_plan import RunsCall, RunsPlan  # noqa: E402
from lingbot_map_ros.core.cache.split_backend import SplitPrefixBackend  # noqa: E402
from lingbot_map_ros.core.cache.triton_prefix import contiguous_runs, runs_attention  # noqa: E402
from lingbot_map_ros.core.config import SPECIAL_TOKENS_PER_FRAME  # noqa: E402


def kernel_errors() -> dict[str, float]:
    """37 queries (not a multiple of the 16-query tile) x 2 heads x d 64 over three runs of a 600-slot
    storage (lengths 150, 71 and 33: whole 32-key blocks, masked ends, a run shorter than a block),
    read as 1, 3 and 300 parts (more parts than keys: empty parts must not count), each checked in
    float64; the slots outside the runs hold huge values that must never leak in."""
    gen = torch.Generator().manual_seed(0)
    t, slots, h, d = 37, 600, 2, 64
    q = torch.randn(t, h, d, generator=gen)  # [T, H, D]
    k, v = (torch.full((slots, h, d), 1e4) for _ in range(2))  # [slots, H, D], poisoned
    runs = [(10, 150), (300, 71), (520, 33)]
    for start, length in runs:
        k[start:start + length] = torch.randn(length, h, d, generator=gen)
        v[start:start + length] = torch.randn(length, h, d, generator=gen)
    order = torch.cat([torch.arange(start, start + length) for start, length in runs])  # visible slots in run order
    table = torch.tensor(runs + [(0, 0)], dtype=torch.int32)  # an unused row: length 0
    errors: dict[str, float] = {}
    for parts in (1, 3, 300):
        out, lse = runs_attention(q, k, v, table, parts=parts, block_m=16, block_n=32, num_stages=2)
        total = order.numel()
        pieces = [order[p * total // parts:(p + 1) * total // parts] for p in range(parts)]
        out_err = lse_err = 0.0
        for p, piece in enumerate(pieces):
            if piece.numel() == 0:
                assert torch.isneginf(lse[p]).all() and (out[p] == 0).all(), "an empty part must contribute nothing"
                continue
            scores = torch.einsum("thd,nhd->htn", q.double(), k[piece].double()) / math.sqrt(d)  # [H, T, n]
            ref = torch.einsum("htn,nhd->thd", scores.softmax(-1), v[piece].double())
            out_err = max(out_err, ((out[p].double() - ref).norm() / ref.norm()).item())
            lse_err = max(lse_err, (lse[p].double() - scores.logsumexp(-1)).abs().max().item())
        errors[f"parts{parts}_out"] = out_err
        errors[f"parts{parts}_lse"] = lse_err
    return errors


RAGGED = RunsPlan(SPECIAL_TOKENS_PER_FRAME + 7, (RunsCall(0, 8, 1), RunsCall(8, 5, 3)), "a cut for the test")


def split_backend_modes(prefix_kernel: str, kv_splits: int, runs_plan: Optional[RunsPlan] = None) -> list[str]:
    """A random stream through a PagedKVCache whose split backend reads every visible key with one
    Triton call over the runs (or the calls of ``runs_plan``: 13 queries cut into 8 rows in one part and
    5 in three); ``drive_one_frame_backend`` compares every step with float64 attention."""
    page, heads, dim, scale, window, steps = 7, 2, 16, 2, 3, 14
    cache = PagedKVCache(2, heads, dim, page, scale, window, max_frame_num=64, dtype=torch.float32, device="cpu",
                         num_patch_pages=scale + window + 1, special_pages=-(-SPECIAL_TOKENS_PER_FRAME
                                                                              * (scale + steps + 1) // page),
                         allocation="lowest")
    split = SplitPrefixBackend(page_size=page, num_patch_pages=cache.table.num_patch_pages,
                               num_pages=cache.table.num_pages, num_heads=heads, head_dim=dim, dtype=torch.float32,
                               device="cpu", kernel="cpu", kv_splits=kv_splits, prefix_kernel=prefix_kernel,
                               runs_plan=runs_plan)
    seen = drive_one_frame_backend(cache, split, page_size=page, dtype=torch.float32, scale=scale, window=window,
                                   steps=steps, seed=3, keyframe_share=0.6, heads=heads, head_dim=dim)
    return [mode for _, mode in seen]


def counted_calls() -> list:
    """Every call of the kernel from here on, as ``[rows, parts, wrote into a given out]``."""
    calls = []
    plain = triton_prefix.runs_attention

    def counting(q, *args, parts=1, out=None, **kwargs):
        calls.append([q.shape[0], parts, out is not None])
        return plain(q, *args, parts=parts, out=out, **kwargs)

    triton_prefix.runs_attention = counting
    return calls


if __name__ == "__main__":
    modes = {f"{kernel}/{splits}": split_backend_modes(kernel, splits)
             for kernel, splits in (("triton", 1), ("triton", 5))}
    calls = counted_calls()
    modes["triton/ragged"] = split_backend_modes("triton", 5, RAGGED)
    print(json.dumps({"kernel": kernel_errors(), "modes": modes, "ragged_calls": sorted({tuple(c) for c in calls}),
                      "runs": contiguous_runs([4, 0, 1, 2, 7, 8], 3, 10)}))
