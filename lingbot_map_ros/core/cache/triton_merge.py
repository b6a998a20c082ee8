"""The merge of a ragged tail's attention parts as one Triton kernel that writes the frame's output rows.

Why: at 518x392 (a 640x480 camera) every attention call of a frame - the 24 global blocks' and the 48 DINO
and frame blocks' own - carries an 18-row tail (17 in the DINO encoder) whose ``G`` parts (one per
whole-tile program of a head) are merged by log-sum-exp (``merge.merge_partials``). Compiled, that merge is
two small kernels (the softmax of the parts' log-sum-exps, then the weighted sum), and writing its fp32
result into the bf16 output rows is a third: ~6.8 µs of kernel time a call on an H100 for ~600 KB of data,
72 calls a frame. One kernel does all three, with two fewer launches (and graph nodes) a call.

Exact as ``merge_partials``: fp32 weights ``exp(lse_g - max)`` normalised by their sum, fp32 accumulation
over the parts in order, one rounding to the output's dtype; a part that saw no keys (log-sum-exp -inf,
output 0) weighs 0. The kernel also runs in Triton's interpreter (``TRITON_INTERPRET=1``), which is how
the CPU tests check it against float64.
"""
from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor


@triton.jit
def _merge_parts(parts, lse, out, num_parts,
                 part_g, part_r, part_h,  # parts [G, R, H, D] strides (D contiguous)
                 lse_g, lse_h, lse_r,  # lse [G, H, R] strides
                 out_r, out_h,  # out [R, H, D] strides (D contiguous)
                 HEAD_DIM: tl.constexpr, BLOCK_G: tl.constexpr):
    row = tl.program_id(0)
    head = tl.program_id(1)
    g = tl.arange(0, BLOCK_G)  # [BLOCK_G]
    d = tl.arange(0, HEAD_DIM)  # [D]
    valid = g < num_parts
    part_lse = tl.load(lse + g * lse_g + head * lse_h + row * lse_r, mask=valid, other=float("-inf"))  # [BLOCK_G]
    weight = tl.where(valid, tl.exp(part_lse - tl.max(part_lse, 0)), 0.0)  # [BLOCK_G]: a -inf part weighs 0
    values = tl.load(parts + g[:, None] * part_g + row * part_r + head * part_h + d[None, :],
                     mask=valid[:, None], other=0.0).to(tl.float32)  # [BLOCK_G, D]
    merged = tl.sum(values * weight[:, None], 0) / tl.sum(weight, 0)  # [D]
    tl.store(out + row * out_r + head * out_h + d, merged.to(out.dtype.element_ty))


def merge_parts_into(rows: Tensor, parts: Tensor, lse: Tensor) -> None:
    """``rows [R, H, D]`` (a view of the frame's output, written in place) = the attention over the union
    of the parts' key sets: ``parts [G, R, H, D]`` with their log-sum-exps ``lse [G, H, R]`` (fp32)."""
    g, r, h, d = parts.shape
    if rows.shape != (r, h, d) or lse.shape != (g, h, r):
        raise ValueError(f"merge shapes disagree: rows {tuple(rows.shape)}, parts {tuple(parts.shape)}, "
                         f"lse {tuple(lse.shape)}")
    if d & (d - 1) or parts.stride(3) != 1 or rows.stride(2) != 1:
        raise ValueError(f"the merge kernel takes a power-of-two head dim, contiguous per head (got D {d})")
    _merge_parts[(r, h)](parts, lse, rows, g, parts.stride(0), parts.stride(1), parts.stride(2),
                         lse.stride(0), lse.stride(1), lse.stride(2), rows.stride(0), rows.stride(1),
                         HEAD_DIM=d, BLOCK_G=triton.next_power_of_2(g), num_warps=2)


__all__ = ["merge_parts_into"]
