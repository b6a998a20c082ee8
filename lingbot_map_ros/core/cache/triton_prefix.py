"""The split backend's unmasked prefix call as a Triton kernel of our own (TMA loads, Hopper).

Why: at 518x378 one steady frame spends ~19 of its ~31 ms in 24 calls of one shape: 1005 queries x
16 heads x d 64 against the 71,928 contiguous, unmasked keys of the patch prefix, with the
log-sum-exp that the split merge needs. cuDNN runs it at ~390 TFLOP/s. This kernel, measured on the
H200 against cuDNN on the same tensors (docs/benchmarks.md), is faster there because of two choices:

* **TMA loads** (host tensor descriptors over ``[keys, H*D]`` rows): Triton pipelines them through
  shared memory with ``NUM_STAGES`` buffers, where plain pointer loads were not pipelined at all;
* **64 queries per program, 3 stages**: 106 KB of shared memory, so exactly two programs share an SM
  and the 16 x 16 = 256 programs of a frame fill the 264 slots of 132 SMs in one balanced wave (with
  2 stages three fit, the wave is uneven, and the call is 35 % slower).

Everything else is a plain online softmax: fp32 scores and accumulators, the running max kept in raw
score units so that scaling and shifting are one FMA, ``exp2`` with the scale folded in, whole key
blocks unmasked and one masked block at the end of each key range. ``key_ranges > 1`` cuts the keys
into equal ranges (a third grid axis), each returning its own partial and LSE for the split
backend's exact merge, for frame sizes whose programs would spill into a second wave.

``exp2_on_fma`` computes every second exponential with a polynomial on the FMA pipe instead of the
MUFU unit (at d = 64 the MUFU is as busy as the tensor cores); it is an option the benchmark
measures, exact to 7.7e-5 relative per exponential (bf16 rounds p to 3.9e-3).

Only the split backend imports this module, and only for ``prefix_kernel`` ``triton``: the package
runs without Triton (``runtime.triton_prefix_unusable_reason`` says when this cannot run). The kernel
also runs in Triton's interpreter (``TRITON_INTERPRET=1``), which is how the CPU tests check it
against float64.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.tools.tensor_descriptor import TensorDescriptor

BLOCK_M = 64  # queries per program
BLOCK_N = 128  # keys per block
NUM_WARPS = 4
NUM_STAGES = 3  # 106 KB of shared memory: two programs per SM
PROGRAMS_PER_SM = 2  # what the split backend's key-range choice counts with (factory.py)
LOG2_E = 1.4426950408889634


# 2**f for f in [-0.5, 0.5] as a degree-3 fit of the relative error (max 7.7e-5)
_P0, _P1, _P2, _P3 = (tl.constexpr(c) for c in (0.99992894, 0.693276242, 0.242604051, 0.0550886838))
_ROUND = tl.constexpr(12582912.0)  # 1.5 * 2**23: x + _ROUND holds round(x) in the low mantissa bits


@triton.jit
def _exp2_fma(x):
    """2**x for x <= 0 on the FMA pipe: round, a polynomial of the fraction, the integer into the exponent."""
    x = tl.maximum(x, -125.0)
    shifted = x + _ROUND
    frac = x - (shifted - _ROUND)  # in [-0.5, 0.5]
    poly = tl.fma(tl.fma(tl.fma(frac, _P3, _P2), frac, _P1), frac, _P0)
    bits = (shifted.to(tl.int32, bitcast=True) << 23) + poly.to(tl.int32, bitcast=True)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _exp2_mixed(x, EMULATE: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """2**x; with ``EMULATE`` every second column on the FMA pipe (a register-only split and join)."""
    if EMULATE:
        even, odd = tl.split(tl.reshape(x, [BM, BN // 2, 2]))  # [BM, BN/2] each
        return tl.reshape(tl.join(tl.math.exp2(even), _exp2_fma(odd)), [BM, BN])
    return tl.math.exp2(x)


@triton.jit
def _softmax_step(s, m_i, l_i, acc, v, scale_log2, EMULATE: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """Fold one key block (raw scores ``s`` [BM, BN], values ``v`` [BN, D]) into the running state."""
    m_new = tl.maximum(m_i, tl.max(s, 1))  # [BM]
    shift = m_new * scale_log2  # [BM]
    p = _exp2_mixed(s * scale_log2 - shift[:, None], EMULATE, BM, BN)  # [BM, BN]
    alpha = tl.math.exp2(m_i * scale_log2 - shift)  # [BM]
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])  # [BM, D]
    return m_new, l_i, acc


@triton.jit
def _prefix_attention(q_desc, k_desc, v_desc, o_ptr, lse_ptr, num_queries, keys_per_range, full_end, scale_log2,
                      stride_or, stride_ot, stride_oh, HEAD_DIM: tl.constexpr, BM: tl.constexpr,
                      BN: tl.constexpr, EMULATE: tl.constexpr):
    """Program (query block, head, key range): softmax(q kᵀ · scale) v over the range, and its LSE.
    ``full_end``: the range's keys in whole blocks of ``BN`` (the rest go through one masked block)."""
    block = tl.program_id(0)
    head = tl.program_id(1)
    key_range = tl.program_id(2)
    col = head * HEAD_DIM
    first_key = key_range * keys_per_range
    q = q_desc.load([block * BM, col])  # [BM, D]; rows past the queries read as zeros
    m_i = tl.full([BM], float("-inf"), tl.float32)  # running max of raw scores
    l_i = tl.zeros([BM], tl.float32)  # running sum of exp2
    acc = tl.zeros([BM, HEAD_DIM], tl.float32)  # [BM, D]
    for start in tl.range(0, full_end, BN):  # whole blocks: no masks
        s = tl.dot(q, k_desc.load([first_key + start, col]).T)  # [BM, BN]
        v = v_desc.load([first_key + start, col])  # [BN, D]
        m_i, l_i, acc = _softmax_step(s, m_i, l_i, acc, v, scale_log2, EMULATE, BM, BN)
    if full_end < keys_per_range:  # the range's last keys; the columns after them masked
        keys = full_end + tl.arange(0, BN)  # [BN]
        s = tl.dot(q, k_desc.load([first_key + full_end, col]).T)
        s = tl.where((keys < keys_per_range)[None, :], s, float("-inf"))
        v = v_desc.load([first_key + full_end, col])  # finite rows (the next range's keys, or zeros)
        m_i, l_i, acc = _softmax_step(s, m_i, l_i, acc, v, scale_log2, False, BM, BN)
    rows = block * BM + tl.arange(0, BM)  # [BM]
    dims = tl.arange(0, HEAD_DIM)  # [D]
    row_ok = rows < num_queries
    out = acc / l_i[:, None]
    tl.store(o_ptr + key_range * stride_or + rows[:, None] * stride_ot + head * stride_oh + dims[None, :],
             out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None])
    lse = (m_i * scale_log2 + tl.math.log2(l_i)) * 0.6931471805599453  # natural log
    tl.store(lse_ptr + (key_range * tl.num_programs(1) + head) * num_queries + rows, lse, mask=row_ok)


def _tma_ready(x: Tensor) -> Tensor:
    """``x [N, H, D]`` with rows of H*D contiguous elements on a 16-byte boundary (a copy if not)."""
    n, h, d = x.shape
    aligned = x.data_ptr() % 16 == 0 and (x.stride(0) * x.element_size()) % 16 == 0
    if x.stride(2) != 1 or x.stride(1) != d or not aligned:
        x = x.contiguous()
    return x


def prefix_attention(q: Tensor, k: Tensor, v: Tensor, *, key_ranges: int = 1, exp2_on_fma: bool = False,
                     block_m: int = BLOCK_M, block_n: int = BLOCK_N, num_warps: int = NUM_WARPS,
                     num_stages: int = NUM_STAGES) -> tuple[Tensor, Tensor]:
    """Unmasked attention of ``q [T, H, D]`` over ``k, v [N, H, D]`` (token-major: each key's heads in
    one row, e.g. a slice of the cache's pages) cut into ``key_ranges`` equal ranges.

    Returns out ``[S, T, H, D]`` in q's dtype and lse ``[S, H, T]`` float32 (natural log, scores
    scaled by 1/√D), one per key range. The tile arguments are for the probe (scripts/)."""
    t, h, d = q.shape
    n = k.shape[0]
    if n % key_ranges:
        raise ValueError(f"{n} keys do not cut into {key_ranges} equal ranges")
    if k.dtype != q.dtype or v.dtype != q.dtype or k.shape != v.shape or k.shape[1:] != q.shape[1:]:
        raise ValueError(f"q {list(q.shape)} {q.dtype}, k {list(k.shape)} {k.dtype}, v {list(v.shape)} {v.dtype}")
    q, k, v = _tma_ready(q), _tma_ready(k), _tma_ready(v)
    out = torch.empty(key_ranges, t, h, d, device=q.device, dtype=q.dtype)  # [S, T, H, D]
    lse = torch.empty(key_ranges, h, t, device=q.device, dtype=torch.float32)  # [S, H, T]
    q_desc = TensorDescriptor(q, [t, h * d], [q.stride(0), 1], [block_m, d])
    k_desc = TensorDescriptor(k, [n, h * d], [k.stride(0), 1], [block_n, d])
    v_desc = TensorDescriptor(v, [n, h * d], [v.stride(0), 1], [block_n, d])
    grid = (-(-t // block_m), h, key_ranges)
    per_range = n // key_ranges
    _prefix_attention[grid](q_desc, k_desc, v_desc, out, lse, t, per_range, per_range // block_n * block_n,
                             LOG2_E / math.sqrt(d),
                             out.stride(0), out.stride(1), out.stride(2), HEAD_DIM=d, BM=block_m, BN=block_n,
                             EMULATE=exp2_on_fma, num_warps=num_warps, num_stages=num_stages)
    return out, lse


__all__ = ["prefix_attention", "BLOCK_M", "PROGRAMS_PER_SM"]
