"""One frame's attention over runs of contiguous visible keys, as a Triton kernel of our own (TMA, Hopper).

Why: at 518x378 a steady frame spends most of its time in 24 calls of one shape: 1005 queries x 16
heads x d 64 against ~73k visible keys. With the split backend's ``lowest`` page allocation those
keys are a few contiguous **runs** of a block's storage: the patch prefix (pages ``0 .. m-1``, plus a
non-keyframe's own page right after it) and the specials (6 per stored frame, from the first special
page on). This kernel reads them in one call, with the run starts and lengths in a small device
tensor that the plan writes before each replay:

* one call instead of cuDNN's unmasked prefix + masked tail + LSE merge, and no visibility masks to
  rebuild on the host each frame;
* the lengths live on the device, so one CUDA graph serves the filling window and the full one;
* **TMA loads** (host tensor descriptors over ``[slots, H*D]`` rows), pipelined by Triton through
  ``NUM_STAGES`` shared-memory buffers (plain pointer loads were not pipelined at all);
* **64 queries per program, 3 stages**: 106 KB of shared memory, so exactly two programs share an SM
  and the 16 x 16 = 256 programs of a 518x378 frame fill the 264 slots of 132 SMs in one balanced
  wave (2 stages: 35 % slower; 128-query programs or 64-key blocks: slower too, as measured on an H200).

Inside, a plain online softmax: fp32 scores and accumulators, the running max kept in raw score
units so that scaling and shifting are one FMA, ``exp2`` with the scale folded in, whole key blocks
unmasked and one masked block at the end of each run piece. ``parts > 1`` cuts the visible keys (in
run order) into that many equal pieces on a third grid axis, each returning its own partial and
log-sum-exp for an exact merge: for frame sizes whose programs would spill into a second wave.

Only the split backend imports this module, and only for ``prefix_kernel`` ``triton``: the package
runs without Triton (``runtime.triton_prefix_unusable_reason`` says when this cannot run). The
kernel also runs in Triton's interpreter (``TRITON_INTERPRET=1``), which is how the CPU tests check
it against float64.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.tools.tensor_descriptor import TensorDescriptor

BLOCK_M = 64  # queries per program
BLOCK_N = 128  # keys per block
NUM_WARPS = 4
NUM_STAGES = 3  # 106 KB of shared memory: two programs per SM
PROGRAMS_PER_SM = 2  # what the split backend's choice of parts counts with (factory.py)
MAX_RUNS = 4  # runs per call: a keyframe's prefix + specials, or one run for a non-keyframe; holes fall back
LOG2_E = 1.4426950408889634


@triton.jit
def _softmax_step(s, m_i, l_i, acc, v, scale_log2):
    """Fold one key block (raw scores ``s`` [BM, BN], values ``v`` [BN, D]) into the running state."""
    m_new = tl.maximum(m_i, tl.max(s, 1))  # [BM]
    shift = m_new * scale_log2  # [BM]
    p = tl.math.exp2(s * scale_log2 - shift[:, None])  # [BM, BN]
    alpha = tl.math.exp2(m_i * scale_log2 - shift)  # [BM]
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])  # [BM, D]
    return m_new, l_i, acc


@triton.jit
def _runs_attention(q_desc, k_desc, v_desc, o_ptr, lse_ptr, runs_ptr, num_queries, scale_log2,
                    stride_op, stride_ot, stride_oh, HEAD_DIM: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                    NUM_RUNS: tl.constexpr):
    """Program (query block, head, part): softmax(q kᵀ · scale) v over its piece of the runs, and its LSE.

    ``runs_ptr``: int32 [NUM_RUNS, 2] (first slot, length; length 0 = unused). Part ``p`` of ``P``
    takes visible keys ``[p·L/P, (p+1)·L/P)`` of the runs laid end to end (``L``: their total)."""
    block = tl.program_id(0)
    head = tl.program_id(1)
    part = tl.program_id(2)
    parts = tl.num_programs(2)
    col = head * HEAD_DIM
    q = q_desc.load([block * BM, col])  # [BM, D]; rows past the queries read as zeros
    m_i = tl.full([BM], float("-inf"), tl.float32)  # running max of raw scores
    l_i = tl.zeros([BM], tl.float32)  # running sum of exp2
    acc = tl.zeros([BM, HEAD_DIM], tl.float32)  # [BM, D]
    total = 0
    for r in tl.static_range(NUM_RUNS):
        total += tl.load(runs_ptr + 2 * r + 1)
    lo = part * total // parts  # this part's keys, as offsets into the runs laid end to end
    hi = (part + 1) * total // parts
    offset = 0  # where run r starts in that order
    for r in tl.static_range(NUM_RUNS):
        first_slot = tl.load(runs_ptr + 2 * r)
        length = tl.load(runs_ptr + 2 * r + 1)
        begin = tl.maximum(lo - offset, 0)  # the piece [begin, end) of this run that is ours
        end = tl.minimum(hi - offset, length)
        count = tl.maximum(end - begin, 0)
        whole = count // BN * BN
        row0 = first_slot + begin
        for start in tl.range(0, whole, BN):  # whole blocks: no masks
            s = tl.dot(q, k_desc.load([row0 + start, col]).T)  # [BM, BN]
            v = v_desc.load([row0 + start, col])  # [BN, D]
            m_i, l_i, acc = _softmax_step(s, m_i, l_i, acc, v, scale_log2)
        if whole < count:  # the piece's last keys; the columns after them masked
            keys = whole + tl.arange(0, BN)  # [BN]
            s = tl.dot(q, k_desc.load([row0 + whole, col]).T)
            s = tl.where((keys < count)[None, :], s, float("-inf"))
            v = v_desc.load([row0 + whole, col])  # finite rows: other slots of the storage, or zeros past it
            m_i, l_i, acc = _softmax_step(s, m_i, l_i, acc, v, scale_log2)
        offset += length
    rows = block * BM + tl.arange(0, BM)  # [BM]
    dims = tl.arange(0, HEAD_DIM)  # [D]
    row_ok = rows < num_queries
    seen = l_i > 0  # a part with no keys (more parts than keys) contributes nothing to a merge
    out = tl.where(seen[:, None], acc / tl.where(seen, l_i, 1.0)[:, None], 0.0)
    tl.store(o_ptr + part * stride_op + rows[:, None] * stride_ot + head * stride_oh + dims[None, :],
             out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None])
    lse = tl.where(seen, (m_i * scale_log2 + tl.math.log2(tl.where(seen, l_i, 1.0))) * 0.6931471805599453,
                   float("-inf"))  # natural log
    tl.store(lse_ptr + (part * tl.num_programs(1) + head) * num_queries + rows, lse, mask=row_ok)


def tma_ready(x: Tensor) -> Tensor:
    """``x [N, H, D]`` with rows of H*D contiguous elements on a 16-byte boundary (a copy if not)."""
    n, h, d = x.shape
    aligned = x.data_ptr() % 16 == 0 and (x.stride(0) * x.element_size()) % 16 == 0
    if x.stride(2) != 1 or x.stride(1) != d or not aligned:
        x = x.contiguous()
    return x


def prepare_runs_call(q: Tensor, k: Tensor, v: Tensor, runs: Tensor, parts: int,
                      out: Optional[Tensor] = None) -> tuple[Tensor, ...]:
    """The checks and outputs of a runs kernel call (this one and ``gluon_runs.py``): q, k, v ready for
    TMA, out ``[P, T, H, D]`` (``out``, a view the kernel writes through its strides, or a new tensor)
    and lse ``[P, H, T]`` to fill; a clear error for anything else."""
    t, h, d = q.shape
    if k.dtype != q.dtype or v.dtype != q.dtype or k.shape != v.shape or k.shape[1:] != q.shape[1:]:
        raise ValueError(f"q {list(q.shape)} {q.dtype}, k {list(k.shape)} {k.dtype}, v {list(v.shape)} {v.dtype}")
    if runs.dtype != torch.int32 or runs.dim() != 2 or runs.shape[1] != 2 or runs.device != q.device:
        raise ValueError(f"runs must be int32 [R, 2] on {q.device} (got {runs.dtype} {list(runs.shape)})")
    if out is None:
        out = torch.empty(parts, t, h, d, device=q.device, dtype=q.dtype)  # [P, T, H, D]
    elif out.shape != (parts, t, h, d) or out.dtype != q.dtype or out.stride(3) != 1:
        raise ValueError(f"out must be [{parts}, {t}, {h}, {d}] {q.dtype} with unit stride in D "
                         f"(got {list(out.shape)} {out.dtype})")
    lse = torch.empty(parts, h, t, device=q.device, dtype=torch.float32)  # [P, H, T]
    return tma_ready(q), tma_ready(k), tma_ready(v), out, lse


def runs_attention(q: Tensor, k: Tensor, v: Tensor, runs: Tensor, *, parts: int = 1, block_m: int = BLOCK_M,
                   block_n: int = BLOCK_N, num_warps: int = NUM_WARPS, num_stages: int = NUM_STAGES,
                   out: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """Attention of ``q [T, H, D]`` over the keys of ``k, v [slots, H, D]`` (token-major storage: each
    key's heads in one row) named by ``runs`` (int32 ``[R, 2]`` on q's device: first slot, length).

    Returns out ``[P, T, H, D]`` in q's dtype and lse ``[P, H, T]`` float32 (natural log, scores
    scaled by 1/√D), one per part; with ``parts`` 1, ``out[0]`` is the attention itself. ``out``: a
    ``[P, T, H, D]`` view to write instead (rows of a larger output: ``runs_plan``'s cut). The tile
    arguments are for the probe (bench/)."""
    q, k, v, out, lse = prepare_runs_call(q, k, v, runs, parts, out)
    t, h, d = q.shape
    n = k.shape[0]
    q_desc = TensorDescriptor(q, [t, h * d], [q.stride(0), 1], [block_m, d])
    k_desc = TensorDescriptor(k, [n, h * d], [k.stride(0), 1], [block_n, d])
    v_desc = TensorDescriptor(v, [n, h * d], [v.stride(0), 1], [block_n, d])
    grid = (-(-t // block_m), h, parts)
    _runs_attention[grid](q_desc, k_desc, v_desc, out, lse, runs.contiguous(), t, LOG2_E / math.sqrt(d),
                          out.stride(0), out.stride(1), out.stride(2), HEAD_DIM=d, BM=block_m, BN=block_n,
                          NUM_RUNS=runs.shape[0], num_warps=num_warps, num_stages=num_stages)
    return out, lse


def contiguous_runs(visible_pages: list[int], last_page_len: int, page_size: int) -> list[tuple[int, int]]:
    """The visible slots as runs ``(first slot, length)`` in slot order: consecutive whole pages join,
    the last visible page holds ``last_page_len`` slots and ends its run."""
    partial = visible_pages[-1]
    runs: list[list[int]] = []
    for page in sorted(visible_pages):
        length = last_page_len if page == partial else page_size
        start = page * page_size
        if runs and runs[-1][0] + runs[-1][1] == start and runs[-1][1] % page_size == 0:
            runs[-1][1] += length
        else:
            runs.append([start, length])
    return [(start, length) for start, length in runs]


__all__ = ["runs_attention", "contiguous_runs", "BLOCK_M", "PROGRAMS_PER_SM", "MAX_RUNS"]
