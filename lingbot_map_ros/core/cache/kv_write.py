"""One step's keys and values into a block's paged storage, in one Triton kernel (the graph step).

Why: the PyTorch path stacks ``k`` and ``v`` into a new ``[2, T, H, D]`` tensor and scatters it with
``index_copy_``: two kernels of ~8.5 µs each per global block (24 a frame, ~0.4 ms), for 4 MB that
the device moves in ~2 µs. Here one program per token reads its key and value rows where they are
(``v`` is a strided view of the fused qkv output) and writes them at the token's slot. Same bytes,
same slots: the storage afterwards is bit for bit the PyTorch path's. Runs in Triton's interpreter
too (the CPU tests).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

MAX_BLOCK = 1024  # elements a program moves per load (one row of the full model: 16 heads x 64)


@triton.jit
def _write_rows(k_ptr, v_ptr, slots_ptr, kv_ptr, stride_k, stride_v, plane, ROW: tl.constexpr, BLOCK: tl.constexpr):
    """Program (token): its ``ROW`` key and value elements to storage rows ``slot`` of planes 0 and 1."""
    token = tl.program_id(0)
    slot = tl.load(slots_ptr + token)
    cols = tl.arange(0, BLOCK)  # [B]
    for start in tl.static_range(0, ROW, BLOCK):
        c = start + cols
        ok = c < ROW
        tl.store(kv_ptr + slot * ROW + c, tl.load(k_ptr + token * stride_k + c, mask=ok), mask=ok)
        tl.store(kv_ptr + plane + slot * ROW + c, tl.load(v_ptr + token * stride_v + c, mask=ok), mask=ok)


def write_rows(k: Tensor, v: Tensor, slots: Tensor, flat: Tensor) -> None:
    """``flat[0, slots[t]] = k[t]`` and ``flat[1, slots[t]] = v[t]`` for every token ``t``.

    k, v ``[T, H, D]`` with each token's heads contiguous (any token stride); slots int64 ``[T]`` on the
    same device; flat ``[2, slots, H, D]`` in the same dtype with each plane's rows contiguous (a stream's share
    of a pool shared by several streams is a view whose planes lie a whole pool's plane apart)."""
    t, h, d = k.shape
    if v.shape != k.shape or flat.shape[0] != 2 or flat.shape[2:] != k.shape[1:] or slots.shape != (t,):
        raise ValueError(f"k {list(k.shape)}, v {list(v.shape)}, slots {list(slots.shape)}, storage {list(flat.shape)}")
    rows_contiguous = flat.stride()[1:] == (h * d, d, 1)
    if k.dtype != flat.dtype or v.dtype != flat.dtype or not rows_contiguous or slots.dtype != torch.long:
        raise ValueError(f"k {k.dtype}, v {v.dtype}, storage {flat.dtype} (strides {flat.stride()}), "
                         f"slots {slots.dtype}: one dtype, contiguous rows in each plane, int64 slots")
    for x in (k, v):
        if x.stride(2) != 1 or x.stride(1) != d:
            raise ValueError(f"each token's heads must be contiguous (strides {x.stride()})")
    row = h * d
    block = min(triton.next_power_of_2(row), MAX_BLOCK)
    _write_rows[(t,)](k, v, slots, flat, k.stride(0), v.stride(0), flat.stride(0), ROW=row, BLOCK=block)


__all__ = ["write_rows"]
