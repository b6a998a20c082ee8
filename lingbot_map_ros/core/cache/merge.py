"""The exact merge of attention parts: outputs over disjoint key sets, each with its log-sum-exp, made into
the attention over their union (the split backend's key ranges and ragged tails, the carried tail of a
frame's own attention in ``model/frame_tiles.py``).

One module so that both callers share one compiled merge and neither imports the other."""
from __future__ import annotations

import functools
from typing import Callable

import torch
from torch import Tensor


def merge_partials(outs: list[Tensor], lses: list[Tensor]) -> Tensor:
    """Attention over the union of disjoint key sets from the parts: outs ``[b_i, H, T, D]``, lses
    ``[b_i, H, T]`` (``b_i`` key ranges of part ``i``; k parts in all) -> ``[T, H, D]`` in at least fp32."""
    weights = torch.softmax(torch.cat(lses), dim=0).unsqueeze(-1)  # [k, H, T, 1]: exp(lse_i) / Σ exp(lse_j)
    merged = (torch.cat([o.to(weights.dtype) for o in outs]) * weights).sum(0)  # [H, T, D]
    return merged.transpose(0, 1)  # [T, H, D]



@functools.lru_cache(maxsize=1)
def fused_merge() -> Callable[[list[Tensor], list[Tensor]], Tensor]:
    """``merge_partials`` compiled (one or two kernels instead of a handful), shared by every caller."""
    from ..model.fusion import allow_recompiles

    allow_recompiles(64)  # one specialisation per (frame size, dtype, number of parts)
    return torch.compile(merge_partials, fullgraph=True, dynamic=False)


__all__ = ["fused_merge", "merge_partials"]
