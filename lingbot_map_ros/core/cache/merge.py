"""The exact merge of attention parts: outputs over disjoint key sets, each with its log-sum-exp, made into
the attention over their union (the split backend's key ranges and ragged tails, the carried tail of a
frame's own attention in ``model/frame_tiles.py``).

One module so that both callers share one compiled merge and neither imports the other."""
from __future__ import annotations

import functools
from typing import Callable

import torch
from torch import Tensor

# True: a ragged tail's parts are merged straight into the output rows by one Triton kernel
# (``triton_merge.py``) on the GPU, ~0.4 ms a frame less at 518x392 (72 calls); False: the merge as PyTorch
# ops (compiled where the caller compiles) and a copy into the rows. A kernel constant, not a setting (the
# bench's ``+mergekernel`` / ``+torchmerge`` measure either).
KERNEL = True


def merge_partials(outs: list[Tensor], lses: list[Tensor]) -> Tensor:
    """Attention over the union of disjoint key sets from the parts: outs ``[b_i, H, T, D]``, lses
    ``[b_i, H, T]`` (``b_i`` key ranges of part ``i``; k parts in all) -> ``[T, H, D]`` in at least fp32."""
    weights = torch.softmax(torch.cat(lses), dim=0).unsqueeze(-1)  # [k, H, T, 1]: exp(lse_i) / Σ exp(lse_j)
    merged = (torch.cat([o.to(weights.dtype) for o in outs]) * weights).sum(0)  # [H, T, D]
    return merged.transpose(0, 1)  # [T, H, D]


def merge_into(rows: Tensor, parts: Tensor, lse: Tensor, merge: Callable[[list[Tensor], list[Tensor]], Tensor]) -> None:
    """``rows [R, H, D]`` (a view of the frame's output, written in place) = the merge of one kernel call's
    parts ``[G, R, H, D]`` with their log-sum-exps ``[G, H, R]``: by ``triton_merge`` on the GPU where
    ``KERNEL`` is on, else by ``merge`` (``merge_partials`` or ``fused_merge()``) and a copy."""
    if KERNEL and rows.is_cuda and _triton_installed():
        from .triton_merge import merge_parts_into  # Triton: imported only on the GPU path

        merge_parts_into(rows, parts, lse)
        return
    rows.copy_(merge([parts.transpose(1, 2)], [lse]))  # [G, H, R, D] -> [R, H, D]


@functools.cache
def _triton_installed() -> bool:
    """A GPU without Triton (some Jetson images) keeps the PyTorch merge instead of failing the frame
    (asked once: the merge runs 72 times a frame)."""
    from ..runtime import triton_installed

    return triton_installed()


@functools.lru_cache(maxsize=1)
def fused_merge() -> Callable[[list[Tensor], list[Tensor]], Tensor]:
    """``merge_partials`` compiled (one or two kernels instead of a handful), shared by every caller."""
    from ..model.fusion import allow_recompiles

    allow_recompiles(64)  # one specialisation per (frame size, dtype, number of parts)
    return torch.compile(merge_partials, fullgraph=True, dynamic=False)


__all__ = ["KERNEL", "fused_merge", "merge_into", "merge_partials"]
