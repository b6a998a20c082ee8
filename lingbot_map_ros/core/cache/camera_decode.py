"""The camera head's one-frame attention as a split-key decode in Triton: one query per head over the
camera cache's visible tokens, this frame's key and value written into the cache by the same call.

Why: in the CUDA-graph step every trunk block of every refinement iteration (16 calls a frame for the
full model) attends one fp32 query per head over the whole preallocated capacity with an additive
mask. SDPA runs that as its memory-efficient kernel with one thread block per head and query tile:
16 thread blocks on 132 SMs walk ~320 keys x 128 dims each, latency-bound (~40 µs a call, ~0.65 ms a
frame in the profile), while the data (2.6 MB of K and V) would take ~1 µs at the device's bandwidth.
Here the keys are cut into ``BLOCK_KEYS``-long parts, one program per (head, part), each a
single-pass softmax over its keys; a second small kernel merges the parts by their max and sum. The
visible length is read on the device (the cache's write slot), so one graph serves every length.

The two scatters of the eager path (``index_copy_`` of k and v into the slot) are folded in: the part
holding the slot uses this frame's k and v from the inputs (it never reads that row of the cache) and
writes them there. Everything is fp32 with plain FMAs (no tensor cores, no TF32), as the head's
official recipe. The kernels also run in Triton's interpreter, which is how the CPU tests check them
against float64.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

BLOCK_KEYS = 32  # keys per program: 11 parts x 16 heads = 176 programs at the default capacity (321)
MERGE_CHUNK = 64  # parts the merge kernel reads at once (any capacity: it loops)
EMPTY_MAX = -1.0e30  # the max of a part without visible keys (finite: its weight in the merge is exactly 0)
LOG2_E = 1.4426950408889634


@triton.jit
def _decode_parts(q_ptr, k_new_ptr, v_new_ptr, k_ptr, v_ptr, slot_ptr, acc_ptr, max_ptr, sum_ptr,
                  stride_qh, stride_nh, stride_slot, scale_log2, HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr):
    """Program (head, part): keys ``part·BLOCK ..`` that are visible (``<= slot``) against the head's query.

    Writes the part's unnormalised output ``Σ 2^(s - m) v`` [D], its max ``m`` and its sum ``Σ 2^(s - m)``
    (scores ``s`` in log2 units); the part holding the slot also stores this frame's k and v there."""
    head = tl.program_id(0)
    part = tl.program_id(1)
    parts = tl.num_programs(1)
    slot = tl.load(slot_ptr)  # this frame's slot; keys 0 .. slot are visible
    keys = part * BLOCK + tl.arange(0, BLOCK)  # [BK]
    dims = tl.arange(0, HEAD_DIM)  # [D]
    q = tl.load(q_ptr + head * stride_qh + dims)  # [D]
    k_new = tl.load(k_new_ptr + head * stride_nh + dims)  # [D]
    v_new = tl.load(v_new_ptr + head * stride_nh + dims)  # [D]
    offsets = keys[:, None] * stride_slot + head * HEAD_DIM + dims[None, :]  # [BK, D]
    stored = (keys < slot)[:, None]  # [BK, 1]: rows read from the cache
    mine = (keys == slot)[:, None]  # [BK, 1]: this frame's row, taken from the inputs
    k = tl.where(mine, k_new[None, :], tl.load(k_ptr + offsets, mask=stored, other=0.0))  # [BK, D]
    v = tl.where(mine, v_new[None, :], tl.load(v_ptr + offsets, mask=stored, other=0.0))  # [BK, D]
    owner = (slot >= part * BLOCK) & (slot < part * BLOCK + BLOCK)
    write = (dims >= 0) & owner  # [D]
    tl.store(k_ptr + slot * stride_slot + head * HEAD_DIM + dims, k_new, mask=write)
    tl.store(v_ptr + slot * stride_slot + head * HEAD_DIM + dims, v_new, mask=write)
    visible = keys <= slot  # [BK]
    s = tl.where(visible, tl.sum(k * q[None, :], axis=1) * scale_log2, -1.0e30)  # [BK], log2 units
    m = tl.max(s, axis=0)
    p = tl.where(visible, tl.exp2(s - m), 0.0)  # [BK]
    acc = tl.sum(p[:, None] * v, axis=0)  # [D]
    row = head * parts + part
    tl.store(acc_ptr + row * HEAD_DIM + dims, acc)
    tl.store(max_ptr + row, m)
    tl.store(sum_ptr + row, tl.sum(p, axis=0))


@triton.jit
def _decode_merge(acc_ptr, max_ptr, sum_ptr, out_ptr, parts, stride_oh, HEAD_DIM: tl.constexpr,
                  CHUNK: tl.constexpr):
    """Program (head): ``Σ_i 2^(m_i - M) acc_i / Σ_i 2^(m_i - M) l_i`` over the parts (``M``: their max)."""
    head = tl.program_id(0)
    dims = tl.arange(0, HEAD_DIM)  # [D]
    top = tl.full([CHUNK], -1.0e30, tl.float32)
    for start in range(0, parts, CHUNK):
        idx = start + tl.arange(0, CHUNK)  # [C]
        top = tl.maximum(top, tl.load(max_ptr + head * parts + idx, mask=idx < parts, other=-1.0e30))
    big = tl.max(top, axis=0)  # part 0 always sees key 0: finite and real
    total = tl.zeros([HEAD_DIM], tl.float32)
    norm = tl.zeros([CHUNK], tl.float32)
    for start in range(0, parts, CHUNK):
        idx = start + tl.arange(0, CHUNK)  # [C]
        ok = idx < parts
        w = tl.exp2(tl.load(max_ptr + head * parts + idx, mask=ok, other=-1.0e30) - big)  # [C]; 0 for empty parts
        norm += w * tl.load(sum_ptr + head * parts + idx, mask=ok, other=0.0)
        acc = tl.load(acc_ptr + (head * parts + idx)[:, None] * HEAD_DIM + dims[None, :], mask=ok[:, None],
                      other=0.0)  # [C, D]
        total += tl.sum(w[:, None] * acc, axis=0)
    tl.store(out_ptr + head * stride_oh + dims, total / tl.sum(norm, axis=0))


def decode_attention(q: Tensor, k_new: Tensor, v_new: Tensor, k_cache: Tensor, v_cache: Tensor,
                     slot: Tensor, *, block_keys: int = BLOCK_KEYS) -> Tensor:
    """Write ``k_new, v_new [1, H, D]`` at ``slot`` (a one-element device tensor) of ``k_cache, v_cache
    [capacity, H, D]`` and attend ``q [1, H, D]`` over cache rows ``0 .. slot``: returns ``[1, H, D]``.

    fp32 throughout (the camera head's dtype); the cache rows must be contiguous (``[H, D]`` each)."""
    tensors = (q, k_new, v_new, k_cache, v_cache)
    if any(t.dtype != torch.float32 for t in tensors):
        raise ValueError(f"the camera decode runs in fp32 (got {[str(t.dtype) for t in tensors]})")
    _, h, d = q.shape
    capacity = k_cache.shape[0]
    if (q.shape[0] != 1 or k_new.shape != q.shape or v_new.shape != q.shape or k_cache.shape != (capacity, h, d)
            or v_cache.shape != k_cache.shape):
        raise ValueError(f"q {list(q.shape)}, k/v {list(k_new.shape)}/{list(v_new.shape)}, cache "
                         f"{list(k_cache.shape)}/{list(v_cache.shape)}: one query [1, H, D] over [capacity, H, D]")
    if d & (d - 1) or any(t.stride(-1) != 1 for t in tensors) or any(
            t.stride(1) != d for t in (k_cache, v_cache)) or k_cache.stride(0) != v_cache.stride(0) or (
            k_new.stride(1) != v_new.stride(1)):
        raise ValueError("head_dim must be a power of two with contiguous heads and matching cache rows")
    parts = -(-capacity // block_keys)
    acc = torch.empty(h, parts, d, device=q.device, dtype=torch.float32)  # [H, P, D]
    top = torch.empty(h, parts, device=q.device, dtype=torch.float32)  # [H, P]
    norm = torch.empty(h, parts, device=q.device, dtype=torch.float32)  # [H, P]
    out = torch.empty(1, h, d, device=q.device, dtype=torch.float32)  # [1, H, D]
    _decode_parts[(h, parts)](q, k_new, v_new, k_cache, v_cache, slot, acc, top, norm, q.stride(1),
                              k_new.stride(1), k_cache.stride(0), LOG2_E / math.sqrt(d), HEAD_DIM=d,
                              BLOCK=block_keys)
    _decode_merge[(h,)](acc, top, norm, out, parts, out.stride(1), HEAD_DIM=d, CHUNK=MERGE_CHUNK)
    return out


__all__ = ["decode_attention", "BLOCK_KEYS"]
