"""The runs kernel of ``triton_prefix.py`` in Gluon: the softmax of one key block overlaps the tensor
cores' work on its neighbours (FA3's intra-warpgroup pipelining), on Hopper.

Why: Triton 3.6 waits for every ``tl.dot`` right after issuing it, so inside a warpgroup the tensor
cores and the softmax take turns (the TTGIR shows ``warp_group_dot_wait {pendings = 0}`` after each
QKᵀ). Gluon issues the wgmma asynchronously and waits where we say. Per key block ``j`` of a program:

    S_j = Q K_jᵀ            (async, group A)
    O  += P_{j-1} V_{j-1}    (async, group B)
    wait until only B is in flight; softmax of S_j on the CUDA cores while B runs
    wait for B; the stage of block j-1 is free: TMA-load block j-1+STAGES into it; O *= alpha_j

Same contract as ``triton_prefix.runs_attention`` (runs table, parts, out and log-sum-exp per part),
same tiles (64 queries x 128 keys, one warpgroup, 3 stages, two programs per SM). Each run of a part
is its own pipeline (drained at the run's end: 2-4 runs against hundreds of blocks). The running
max starts at a finite -1e30 so that a part without keys gives l = 0 (no NaN) and is dropped.

A second, warp-specialised kernel (below ``_store_part``) runs the same per-warpgroup loop in two
consumer warpgroups that share each K/V block, fed by a producer warp: half the L2 traffic, where its
programs fit one wave (``use_pairs``). Its programs can also carry a ragged tail of rows after their
whole tiles (518x392's 18) by a third warpgroup against the K/V blocks they hold anyway
(``runs_attention_fused_tail``, where ``runs_plan`` cuts a frame and ``FUSED_TAIL`` is on).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from .triton_prefix import prepare_runs_call
from .waves import fits_one_wave

BLOCK_M = 64  # queries per program (one warpgroup)
BLOCK_N = 128  # keys per block
STAGES = 3  # K/V buffers: 8 + 96 KB of shared memory, two programs per SM
NUM_WARPS = 4
LOG2_E = 1.4426950408889634
@gluon.jit
def _issue_load(k_desc, v_desc, k_smem, v_smem, ready, stage, row, col, pred):
    """TMA-load the key and value block at storage row ``row`` into ``stage`` (skipped if not ``pred``)."""
    bar = ready.index(stage)
    mbarrier.expect(bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(k_desc, [row, col], bar, k_smem.index(stage), pred=pred)
    tma.async_copy_global_to_shared(v_desc, [row, col], bar, v_smem.index(stage), pred=pred)


@gluon.jit
def _softmax(s, m_i, l_i, valid, scale_log2, BN: gl.constexpr, S_LAYOUT: gl.constexpr):
    """One block's scores ``s`` [BM, BN] (its first ``valid`` columns real) against the running max
    and sum: the probabilities (fp32), the rescale factor of the older state, the new max and sum."""
    if valid < BN:
        cols = gl.arange(0, BN, layout=gl.SliceLayout(0, S_LAYOUT))  # [BN]
        s = gl.where((cols < valid)[None, :], s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, axis=1))  # [BM]
    shift = m_new * scale_log2  # [BM]
    p = gl.exp2(s * scale_log2 - shift[:, None])  # [BM, BN]
    alpha = gl.exp2(m_i * scale_log2 - shift)  # [BM]
    l_i = l_i * alpha + gl.sum(p, axis=1)
    return p, alpha, m_new, l_i


@gluon.jit
def _first_block(q_smem, k_smem, ready, counter, count, zeros, m_i, l_i, acc, scale_log2, BN: gl.constexpr,
                 STAGES: gl.constexpr, S_LAYOUT: gl.constexpr, O_LAYOUT: gl.constexpr, P_LAYOUT: gl.constexpr):
    """A run's first block, which has no P V before it to overlap: S = Q Kᵀ, its softmax, the rescaled
    accumulator and P as the A operand of the next wgmma."""
    stage = counter % STAGES
    mbarrier.wait(ready.index(stage), (counter // STAGES) & 1)
    s = warpgroup_mma(q_smem, k_smem.index(stage).permute((1, 0)), zeros, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(num_outstanding=0, deps=[s])  # [BM, BN]
    p, alpha, m_i, l_i = _softmax(s, m_i, l_i, count, scale_log2, BN, S_LAYOUT)
    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, O_LAYOUT))[:, None]
    p_op = gl.convert_layout(p.to(k_smem.dtype), P_LAYOUT)  # [BM, BN] as the A operand
    return p_op, m_i, l_i, acc


@gluon.jit
def _next_block(q_smem, k_smem, v_smem, ready, block, prev, valid, zeros, p_op, m_i, l_i, acc, scale_log2,
                BN: gl.constexpr, STAGES: gl.constexpr, S_LAYOUT: gl.constexpr):
    """Block ``block`` (counted over the program) once its stage is loaded: S = Q Kᵀ and the previous
    block's O += P V issued together, the softmax of S while P V runs, then both retired. The caller
    frees or refills stage ``prev`` and rescales the accumulator by ``alpha``."""
    stage = block % STAGES
    mbarrier.wait(ready.index(stage), (block // STAGES) & 1)
    s = warpgroup_mma(q_smem, k_smem.index(stage).permute((1, 0)), zeros, use_acc=False, is_async=True)
    acc = warpgroup_mma(p_op, v_smem.index(prev), acc, is_async=True)  # the previous block's values
    s = warpgroup_mma_wait(num_outstanding=1, deps=[s])  # S ready; O += P V may still run
    p, alpha, m_i, l_i = _softmax(s, m_i, l_i, valid, scale_log2, BN, S_LAYOUT)
    acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=[acc, p_op])
    return p, alpha, m_i, l_i, acc, p_op


@gluon.jit
def _attend_run(q_smem, k_desc, v_desc, k_smem, v_smem, ready, counter, row0, count, col, m_i, l_i, acc,
                scale_log2, BM: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr, S_LAYOUT: gl.constexpr,
                O_LAYOUT: gl.constexpr, P_LAYOUT: gl.constexpr):
    """Fold keys ``row0 .. row0+count-1`` into the running state; ``counter`` counts the blocks loaded
    before (it names the stage and mbarrier phase of each block)."""
    blocks = gl.cdiv(count, BN)
    if blocks > 0:
        for i in gl.static_range(STAGES):  # every earlier wgmma has retired: all stages are free
            _issue_load(k_desc, v_desc, k_smem, v_smem, ready, (counter + i) % STAGES, row0 + i * BN, col,
                        i < blocks)
        zeros = gl.zeros([BM, BN], gl.float32, S_LAYOUT)
        p_op, m_i, l_i, acc = _first_block(q_smem, k_smem, ready, counter, count, zeros, m_i, l_i, acc, scale_log2,
                                           BN, STAGES, S_LAYOUT, O_LAYOUT, P_LAYOUT)
        for i in range(1, blocks):
            prev = (counter + i - 1) % STAGES
            p, alpha, m_i, l_i, acc, p_op = _next_block(q_smem, k_smem, v_smem, ready, counter + i, prev,
                                                        count - i * BN, zeros, p_op, m_i, l_i, acc, scale_log2, BN,
                                                        STAGES, S_LAYOUT)
            _issue_load(k_desc, v_desc, k_smem, v_smem, ready, prev, row0 + (i - 1 + STAGES) * BN, col,
                        i - 1 + STAGES < blocks)
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, O_LAYOUT))[:, None]
            p_op = gl.convert_layout(p.to(k_desc.dtype), P_LAYOUT)
        last = (counter + blocks - 1) % STAGES
        acc = warpgroup_mma(p_op, v_smem.index(last), acc, is_async=True)
        acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=[acc, p_op])
    return m_i, l_i, acc, counter + blocks


@gluon.jit
def _runs_attention(q_desc, k_desc, v_desc, o_ptr, lse_ptr, runs_ptr, num_queries, scale_log2,
                    stride_op, stride_ot, stride_oh, HEAD_DIM: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
                    NUM_RUNS: gl.constexpr, STAGES: gl.constexpr, WARPS: gl.constexpr):
    """Program (query block, head, part): as ``triton_prefix._runs_attention``. ``WARPS`` 8 with ``BM``
    128: two warpgroups of 64 queries each sharing every K/V block."""
    S_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                       instr_shape=[16, BN, 16])
    O_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    P_LAYOUT: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_LAYOUT, k_width=2)
    block = gl.program_id(0)
    head = gl.program_id(1)
    part = gl.program_id(2)
    parts = gl.num_programs(2)
    col = head * HEAD_DIM

    q_smem = gl.allocate_shared_memory(q_desc.dtype, [BM, HEAD_DIM], q_desc.layout)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BN, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES, BN, HEAD_DIM], v_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    q_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
    mbarrier.init(q_ready, count=1)
    fence_async_shared()
    mbarrier.expect(q_ready, q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [block * BM, col], q_ready, q_smem)  # rows past the queries: zeros
    mbarrier.wait(q_ready, 0)

    m_i = gl.full([BM], -1.0e30, gl.float32, gl.SliceLayout(1, S_LAYOUT))  # running max of raw scores
    l_i = gl.zeros([BM], gl.float32, gl.SliceLayout(1, S_LAYOUT))  # running sum of exp2
    acc = gl.zeros([BM, HEAD_DIM], gl.float32, O_LAYOUT)  # [BM, D]
    lo, hi = _part_bounds(runs_ptr, part, parts, NUM_RUNS)
    offset = 0
    counter = 0
    for r in gl.static_range(NUM_RUNS):
        first_slot, count, offset = _run_piece(runs_ptr, r, lo, hi, offset)
        m_i, l_i, acc, counter = _attend_run(q_smem, k_desc, v_desc, k_smem, v_smem, ready, counter,
                                             first_slot, count, col, m_i, l_i, acc, scale_log2, BM, BN,
                                             STAGES, S_LAYOUT, O_LAYOUT, P_LAYOUT)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(i))
    mbarrier.invalidate(q_ready)
    _store_part(acc, m_i, l_i, o_ptr, lse_ptr, block * BM, head, part, num_queries, scale_log2, stride_op,
                stride_ot, stride_oh, HEAD_DIM, BM, S_LAYOUT, O_LAYOUT)


@gluon.jit
def _part_bounds(runs_ptr, part, parts, NUM_RUNS: gl.constexpr):
    """This part's keys ``[lo, hi)``, as offsets into the runs laid end to end."""
    total = 0
    for r in gl.static_range(NUM_RUNS):
        total += gl.load(runs_ptr + 2 * r + 1)
    return part * total // parts, (part + 1) * total // parts


@gluon.jit
def _run_piece(runs_ptr, r, lo, hi, offset):
    """Run ``r``'s share of the part ``[lo, hi)``: its first storage row, its key count, and the offset
    of the next run (every partition walks the same pieces in the same order)."""
    first_slot = gl.load(runs_ptr + 2 * r)
    length = gl.load(runs_ptr + 2 * r + 1)
    begin = gl.maximum(lo - offset, 0)
    end = gl.minimum(hi - offset, length)
    return first_slot + begin, gl.maximum(end - begin, 0), offset + length


@gluon.jit
def _store_part(acc, m_i, l_i, o_ptr, lse_ptr, row0, head, part, num_queries, scale_log2, stride_op, stride_ot,
                stride_oh, HEAD_DIM: gl.constexpr, BM: gl.constexpr, S_LAYOUT: gl.constexpr,
                O_LAYOUT: gl.constexpr):
    """Queries ``row0 .. row0+BM-1`` of one (head, part): out = acc / l and the natural-log LSE; a part
    that saw no keys (l = 0) writes zeros and -inf, which its merge drops."""
    rows = row0 + gl.arange(0, BM, layout=gl.SliceLayout(1, O_LAYOUT))  # [BM]
    dims = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, O_LAYOUT))  # [D]
    l_o = gl.convert_layout(l_i, gl.SliceLayout(1, O_LAYOUT))
    seen = l_o > 0
    out = gl.where(seen[:, None], acc / gl.where(seen, l_o, 1.0)[:, None], 0.0)
    offsets = part * stride_op + rows[:, None] * stride_ot + head * stride_oh + dims[None, :]
    gl.store(o_ptr + offsets, out.to(o_ptr.dtype.element_ty), mask=(rows < num_queries)[:, None])
    lse_rows = row0 + gl.arange(0, BM, layout=gl.SliceLayout(1, S_LAYOUT))  # [BM]
    seen_s = l_i > 0
    lse = gl.where(seen_s, (m_i * scale_log2 + gl.log2(gl.where(seen_s, l_i, 1.0))) * 0.6931471805599453,
                   float("-inf"))  # natural log
    gl.store(lse_ptr + (part * gl.num_programs(1) + head) * num_queries + lse_rows, lse, mask=lse_rows < num_queries)


# --- two consumer warpgroups sharing each K/V block, a producer warp loading them (FA3's layout) -------
#
# Why: the kernel above streams each head's keys once per 64 queries. At the steady state that is
# 256 programs x 18.4 MB = 4.7 GB from L2 a call, ~6 TB/s at its speed: about the L2's bandwidth, so
# the tensor cores wait. The exponentials are not what binds it (exp2 replaced by a copy: -9 %; a
# quarter of them as an FMA polynomial, FA4's trick: slower; both on an H200). Here
# a program holds 128 queries as two warpgroups of 64 that read the same K/V stages (half the L2
# traffic) and run independently (warp specialisation: no lockstep; each overlaps its softmax with its
# own wgmma as above); one warp issues the TMA loads. Stage ``s`` is refilled once both warpgroups have
# retired their P V on it (``empty[s]``, count 2). Their wgmma in strict alternation (FA3's ping-pong)
# measured no faster, so they run free.

PAIR_STAGES = 3  # 16 KB of queries + 3 x 32 KB of K/V: one program per SM
CONSUMER_REGS = 240  # registers per thread of each consumer warpgroup (setmaxnreg)
PRODUCER_REGS = 24  # the producer warp's (padded) warpgroup
PAIRS: bool | None = None  # None: pairs where their programs fit one wave (``use_pairs``); the bench forces either
# With the tail's warpgroup (``runs_attention_fused_tail``) four warpgroups share the register file (128 a thread
# on average): 184 + 184 for the pair, TAIL_WG_REGS for the tail's (a block's scores in halves), 24 for the producer.
TAIL_WG_CONSUMER_REGS = 184
TAIL_WG_REGS = 120


@gluon.jit
def _tail_block(qt_smem, k_tile, v_tile, valid, m_t, l_t, acc_t, scale_log2, BM: gl.constexpr, BN: gl.constexpr,
                O_LAYOUT: gl.constexpr, P_LAYOUT: gl.constexpr):
    """The ragged tail's queries ``qt_smem`` against one K/V block the program already holds, folded into
    the tail's own running state; synchronous. In halves of the block's keys: scores of ``BM x BN/2`` keep
    the tail's warpgroup within its share of the register file."""
    HALF: gl.constexpr = BN // 2
    for half in gl.static_range(2):
        if valid > half * HALF:  # a half past the run's end adds nothing
            k_half = k_tile.slice(half * HALF, HALF)  # [HALF, D]
            v_half = v_tile.slice(half * HALF, HALF)  # [HALF, D]
            s = warpgroup_mma(qt_smem, k_half.permute((1, 0)), gl.zeros([BM, HALF], gl.float32, O_LAYOUT),
                              use_acc=False, is_async=True)
            s = warpgroup_mma_wait(num_outstanding=0, deps=[s])  # [BM, HALF]
            p, alpha, m_t, l_t = _softmax(s, m_t, l_t, valid - half * HALF, scale_log2, HALF, O_LAYOUT)
            acc_t = acc_t * alpha[:, None]
            p_op = gl.convert_layout(p.to(k_tile.dtype), P_LAYOUT)  # [BM, HALF] as the A operand
            acc_t = warpgroup_mma(p_op, v_half, acc_t, is_async=True)
            acc_t, p_op = warpgroup_mma_wait(num_outstanding=0, deps=[acc_t, p_op])
    return m_t, l_t, acc_t


@gluon.jit
def _pair_consume_run(q_smem, k_smem, v_smem, ready, empty, counter, count, m_i, l_i, acc, scale_log2,
                      BM: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr, S_LAYOUT: gl.constexpr,
                      O_LAYOUT: gl.constexpr, P_LAYOUT: gl.constexpr):
    """``_attend_run`` without the loads: wait for each block's stage, release it after its P V."""
    blocks = gl.cdiv(count, BN)
    if blocks > 0:
        zeros = gl.zeros([BM, BN], gl.float32, S_LAYOUT)
        p_op, m_i, l_i, acc = _first_block(q_smem, k_smem, ready, counter, count, zeros, m_i, l_i, acc, scale_log2,
                                           BN, STAGES, S_LAYOUT, O_LAYOUT, P_LAYOUT)
        for i in range(1, blocks):
            prev = (counter + i - 1) % STAGES
            p, alpha, m_i, l_i, acc, p_op = _next_block(q_smem, k_smem, v_smem, ready, counter + i, prev,
                                                        count - i * BN, zeros, p_op, m_i, l_i, acc, scale_log2, BN,
                                                        STAGES, S_LAYOUT)
            mbarrier.arrive(empty.index(prev), count=1)  # this warpgroup is done with block i-1's stage
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, O_LAYOUT))[:, None]
            p_op = gl.convert_layout(p.to(k_smem.dtype), P_LAYOUT)
        last = (counter + blocks - 1) % STAGES
        acc = warpgroup_mma(p_op, v_smem.index(last), acc, is_async=True)
        acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=[acc, p_op])
        mbarrier.arrive(empty.index(last), count=1)
    return m_i, l_i, acc, counter + blocks


@gluon.jit
def _pair_consumer(q_smem, k_smem, v_smem, q_ready, ready, empty, o_ptr, lse_ptr, runs_ptr, num_queries,
                   scale_log2, stride_op, stride_ot, stride_oh, WG: gl.constexpr, HEAD_DIM: gl.constexpr,
                   BM: gl.constexpr, BN: gl.constexpr, NUM_RUNS: gl.constexpr, STAGES: gl.constexpr):
    """Warpgroup ``WG`` (0 or 1): queries ``WG*BM ..`` of the program's ``2*BM``, over every block."""
    S_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BN, 16])
    O_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    P_LAYOUT: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_LAYOUT, k_width=2)
    block = gl.program_id(0)
    head = gl.program_id(1)
    part = gl.program_id(2)
    q_tile = q_smem.index(WG)  # [BM, D]
    mbarrier.wait(q_ready, 0)
    m_i = gl.full([BM], -1.0e30, gl.float32, gl.SliceLayout(1, S_LAYOUT))
    l_i = gl.zeros([BM], gl.float32, gl.SliceLayout(1, S_LAYOUT))
    acc = gl.zeros([BM, HEAD_DIM], gl.float32, O_LAYOUT)  # [BM, D]
    lo, hi = _part_bounds(runs_ptr, part, gl.num_programs(2), NUM_RUNS)
    offset = 0
    counter = 0
    for r in gl.static_range(NUM_RUNS):
        _, count, offset = _run_piece(runs_ptr, r, lo, hi, offset)
        m_i, l_i, acc, counter = _pair_consume_run(q_tile, k_smem, v_smem, ready, empty, counter, count, m_i, l_i,
                                                   acc, scale_log2, BM, BN, STAGES, S_LAYOUT, O_LAYOUT, P_LAYOUT)
    _store_part(acc, m_i, l_i, o_ptr, lse_ptr, block * 2 * BM + WG * BM, head, part, num_queries, scale_log2,
                stride_op, stride_ot, stride_oh, HEAD_DIM, BM, S_LAYOUT, O_LAYOUT)


@gluon.jit
def _tail_consumer(q_smem, k_smem, v_smem, q_ready, ready, empty, runs_ptr, tail_o_ptr, tail_lse_ptr, tail_rows,
                   scale_log2, tail_stride_op, tail_stride_ot, tail_stride_oh, HEAD_DIM: gl.constexpr,
                   BM: gl.constexpr, BN: gl.constexpr, NUM_RUNS: gl.constexpr, STAGES: gl.constexpr):
    """The third consumer warpgroup of a program that carries a tail: the rows after the grid's whole tiles
    (``q_smem[2]``) against this program's ``1 / G`` share of the key blocks its partners stream anyway
    (part ``block`` of ``G`` programs a head: every ``G``-th block, from the ``block``-th). It waits for
    every block and releases every stage; only its share meets the tail's queries, synchronously and in
    halves of a block (``_tail_block``), beside the pair's pipelines (folded into them, it held the
    stages they wait for). Every ``G``-th block, not a range of them: a block of its share takes it
    longer than the pair takes one, and the ``G - 1`` blocks between two of its own let it catch up
    without holding a stage the producer must refill (a range of them measured no faster than the
    tail's own call)."""
    O_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    P_LAYOUT: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_LAYOUT, k_width=2)
    block = gl.program_id(0)
    head = gl.program_id(1)
    qt_tile = q_smem.index(2)  # [BM, D]
    mbarrier.wait(q_ready, 0)
    m_t = gl.full([BM], -1.0e30, gl.float32, gl.SliceLayout(1, O_LAYOUT))
    l_t = gl.zeros([BM], gl.float32, gl.SliceLayout(1, O_LAYOUT))
    acc_t = gl.zeros([BM, HEAD_DIM], gl.float32, O_LAYOUT)  # [BM, D]
    lo, hi = _part_bounds(runs_ptr, 0, 1, NUM_RUNS)
    programs = gl.num_programs(0)
    offset = 0
    counter = 0
    for r in gl.static_range(NUM_RUNS):
        _, count, offset = _run_piece(runs_ptr, r, lo, hi, offset)
        blocks = gl.cdiv(count, BN)
        for i in range(blocks):
            stage = (counter + i) % STAGES
            mbarrier.wait(ready.index(stage), ((counter + i) // STAGES) & 1)
            if (counter + i) % programs == block:
                m_t, l_t, acc_t = _tail_block(qt_tile, k_smem.index(stage), v_smem.index(stage), count - i * BN,
                                              m_t, l_t, acc_t, scale_log2, BM, BN, O_LAYOUT, P_LAYOUT)
            mbarrier.arrive(empty.index(stage), count=1)
        counter += blocks
    _store_part(acc_t, m_t, l_t, tail_o_ptr, tail_lse_ptr, 0, head, block, tail_rows, scale_log2, tail_stride_op,
                tail_stride_ot, tail_stride_oh, HEAD_DIM, BM, O_LAYOUT, O_LAYOUT)


@gluon.jit
def _pair_producer(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, ready, empty, runs_ptr,
                   HEAD_DIM: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, NUM_RUNS: gl.constexpr,
                   STAGES: gl.constexpr, TAIL: gl.constexpr):
    """One warp: the program's queries (and with ``TAIL`` the rows after the grid's whole tiles), then
    each block of its part into the next free stage."""
    block = gl.program_id(0)
    head = gl.program_id(1)
    part = gl.program_id(2)
    col = head * HEAD_DIM
    mbarrier.expect(q_ready, (3 if TAIL else 2) * q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [block * 2 * BM, col], q_ready, q_smem.index(0))
    tma.async_copy_global_to_shared(q_desc, [block * 2 * BM + BM, col], q_ready, q_smem.index(1))
    if TAIL:  # rows past the queries: zeros
        tma.async_copy_global_to_shared(q_desc, [gl.num_programs(0) * 2 * BM, col], q_ready, q_smem.index(2))
    lo, hi = _part_bounds(runs_ptr, part, gl.num_programs(2), NUM_RUNS)
    offset = 0
    counter = 0
    for r in gl.static_range(NUM_RUNS):
        first_slot, count, offset = _run_piece(runs_ptr, r, lo, hi, offset)
        blocks = gl.cdiv(count, BN)
        for i in range(blocks):
            stage = (counter + i) % STAGES
            mbarrier.wait(empty.index(stage), (((counter + i) // STAGES) & 1) ^ 1)  # fresh: passes at once
            _issue_load(k_desc, v_desc, k_smem, v_smem, ready, stage, first_slot + i * BN, col, True)
        counter += blocks


@gluon.jit
def _pair_attention(q_desc, k_desc, v_desc, o_ptr, lse_ptr, runs_ptr, num_queries, scale_log2,
                    stride_op, stride_ot, stride_oh, tail_o_ptr, tail_lse_ptr, tail_rows, tail_stride_op,
                    tail_stride_ot, tail_stride_oh, HEAD_DIM: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
                    NUM_RUNS: gl.constexpr, STAGES: gl.constexpr, TAIL: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                    PRODUCER_REGS: gl.constexpr, TAIL_REGS: gl.constexpr = 0):
    """Program (block of ``2*BM`` queries, head, part): the same contract as ``_runs_attention``; with
    ``TAIL`` (one part) the rows after the grid's whole tiles too, by a third warpgroup of ``TAIL_REGS``
    registers, as ``programs`` parts of their own (``tail_o_ptr`` ``[G, tail_rows, H, D]``,
    ``tail_lse_ptr`` ``[G, H, tail_rows]``)."""
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [3 if TAIL else 2, BM, HEAD_DIM], q_desc.layout)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BN, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES, BN, HEAD_DIM], v_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    q_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=3 if TAIL else 2)  # every consumer warpgroup
    mbarrier.init(q_ready, count=1)
    fence_async_shared()
    if TAIL:
        gl.warp_specialize([
            (_pair_consumer, (q_smem, k_smem, v_smem, q_ready, ready, empty, o_ptr, lse_ptr, runs_ptr, num_queries,
                              scale_log2, stride_op, stride_ot, stride_oh, 0, HEAD_DIM, BM, BN, NUM_RUNS, STAGES)),
            (_pair_consumer, (q_smem, k_smem, v_smem, q_ready, ready, empty, o_ptr, lse_ptr, runs_ptr, num_queries,
                              scale_log2, stride_op, stride_ot, stride_oh, 1, HEAD_DIM, BM, BN, NUM_RUNS, STAGES)),
            (_pair_producer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, ready, empty, runs_ptr,
                              HEAD_DIM, BM, BN, NUM_RUNS, STAGES, TAIL)),
            (_tail_consumer, (q_smem, k_smem, v_smem, q_ready, ready, empty, runs_ptr, tail_o_ptr, tail_lse_ptr,
                              tail_rows, scale_log2, tail_stride_op, tail_stride_ot, tail_stride_oh, HEAD_DIM, BM, BN,
                              NUM_RUNS, STAGES)),
        ], [4, 1, 4], [CONSUMER_REGS, PRODUCER_REGS, TAIL_REGS])
    else:
        gl.warp_specialize([
            (_pair_consumer, (q_smem, k_smem, v_smem, q_ready, ready, empty, o_ptr, lse_ptr, runs_ptr, num_queries,
                              scale_log2, stride_op, stride_ot, stride_oh, 0, HEAD_DIM, BM, BN, NUM_RUNS, STAGES)),
            (_pair_consumer, (q_smem, k_smem, v_smem, q_ready, ready, empty, o_ptr, lse_ptr, runs_ptr, num_queries,
                              scale_log2, stride_op, stride_ot, stride_oh, 1, HEAD_DIM, BM, BN, NUM_RUNS, STAGES)),
            (_pair_producer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, ready, empty, runs_ptr,
                              HEAD_DIM, BM, BN, NUM_RUNS, STAGES, TAIL)),
        ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])


def use_pairs(num_queries: int, heads: int, parts: int, sms: int, block_m: int = BLOCK_M) -> bool:
    """Whether the warp-specialised kernel (one program of ``2 * block_m`` queries per SM) runs a call:
    when its programs fit one wave. At 518 x 378 (1005 queries, 16 heads, one part) that is 128 programs
    on the H200's 132 SMs; at 518 x 392 (1042 queries) it would be 144, two waves, where the probe
    measured the one-warpgroup kernel faster (docs/performance.md, attention per layer, the 518x392 rows)."""
    return fits_one_wave(num_queries, 2 * block_m, heads, parts, sms)


_GL_DTYPES = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}


def runs_attention(q: Tensor, k: Tensor, v: Tensor, runs: Tensor, *, parts: int = 1, stages: int | None = None,
                   block_m: int = BLOCK_M, block_n: int = BLOCK_N, num_warps: int = NUM_WARPS,
                   pairs: bool | None = None, out: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """As ``triton_prefix.runs_attention`` (bf16 or fp16 on Hopper): out ``[P, T, H, D]``, lse ``[P, H, T]``.
    ``pairs``: the warp-specialised kernel (two consumer warpgroups of ``block_m`` queries and a
    producer warp a program) or the one-warpgroup kernel; None: ``PAIRS``, and where that is None too,
    ``use_pairs``. ``out``: a ``[P, T, H, D]`` view to write instead. The tile arguments are for the probe
    (bench/)."""
    if q.dtype not in _GL_DTYPES:
        raise ValueError(f"the Gluon kernel takes bf16 or fp16 (got {q.dtype})")
    q, k, v, out, lse = prepare_runs_call(q, k, v, runs, parts, out)
    t, h, d = q.shape
    if pairs is None:
        pairs = PAIRS if PAIRS is not None else use_pairs(
            t, h, parts, torch.cuda.get_device_properties(q.device).multi_processor_count, block_m)
    stages = (PAIR_STAGES if pairs else STAGES) if stages is None else stages
    q_desc, k_desc, v_desc = _descriptors(q, k, v, block_m, block_n)
    args = (q_desc, k_desc, v_desc, out, lse, runs.contiguous(), t, LOG2_E / math.sqrt(d), out.stride(0),
            out.stride(1), out.stride(2))
    if pairs:
        grid = (-(-t // (2 * block_m)), h, parts)
        _pair_attention[grid](*args, out, lse, 0, 0, 0, 0, HEAD_DIM=d, BM=block_m, BN=block_n,
                              NUM_RUNS=runs.shape[0], STAGES=stages, TAIL=False, **_pair_launch())
        return out, lse
    grid = (-(-t // block_m), h, parts)
    _runs_attention[grid](*args, HEAD_DIM=d, BM=block_m, BN=block_n, NUM_RUNS=runs.shape[0], STAGES=stages,
                          WARPS=num_warps, num_warps=num_warps)
    return out, lse


def carries_tail(head_dim: int, block_n: int = BLOCK_N) -> bool:
    """Whether ``runs_attention_fused_tail`` takes this head dim: the tail's half-block scores share the
    accumulator's wgmma layout (N = D), so D must be half a key block (64 at 128 keys: the model's)."""
    return head_dim == block_n // 2


def runs_attention_fused_tail(q: Tensor, k: Tensor, v: Tensor, runs: Tensor, head_rows: int, out: Tensor,
                              *, block_m: int = BLOCK_M, block_n: int = BLOCK_N) -> tuple[Tensor, Tensor]:
    """The warp-specialised kernel over rows ``[0, head_rows)`` (whole tiles of ``2 * block_m``, written
    into ``out`` ``[1, T, H, D]``, a view of the frame's output) with the ragged tail's rows
    ``[head_rows, T)`` (at most ``block_m``) riding in the same programs: each of a head's ``G`` tile
    programs has a third warpgroup that meets the tail's queries against every ``G``-th key block the pair
    streams anyway. Returns the tail's parts ``[G, T - head_rows, H, D]`` and their log-sum-exp
    ``[G, H, T - head_rows]``, for the caller's exact merge.

    Why: the tail as a call of its own reads the layer's whole K/V from memory again for a handful of
    rows (18 of 1042 at 518x392: ~17 % of the whole tiles' time for ~2 % of the work); here it costs
    only its tensor-core work beside the pair's, a ``1 / G`` share of the blocks at 64 rows."""
    if q.dtype not in _GL_DTYPES:
        raise ValueError(f"the Gluon kernel takes bf16 or fp16 (got {q.dtype})")
    t, h, d = q.shape
    tail = t - head_rows
    if head_rows <= 0 or head_rows % (2 * block_m) or not 0 < tail <= block_m:
        raise ValueError(f"a fused tail needs whole tiles of {2 * block_m} rows and 1..{block_m} rows after them "
                         f"(got {head_rows} of {t})")
    if not carries_tail(d, block_n):
        raise ValueError(f"a fused tail reads key blocks in halves of the head dim (got D {d}, blocks of {block_n})")
    q, k, v, out, lse = prepare_runs_call(q, k, v, runs, 1, out)
    tiles = head_rows // (2 * block_m)
    tail_out = torch.empty(tiles, tail, h, d, device=q.device, dtype=q.dtype)  # [G, tail, H, D]
    tail_lse = torch.empty(tiles, h, tail, device=q.device, dtype=torch.float32)  # [G, H, tail]
    q_desc, k_desc, v_desc = _descriptors(q, k, v, block_m, block_n)
    _pair_attention[(tiles, h, 1)](
        q_desc, k_desc, v_desc, out, lse, runs.contiguous(), head_rows, LOG2_E / math.sqrt(d), out.stride(0),
        out.stride(1), out.stride(2), tail_out, tail_lse, tail, tail_out.stride(0), tail_out.stride(1),
        tail_out.stride(2), HEAD_DIM=d, BM=block_m, BN=block_n, NUM_RUNS=runs.shape[0], STAGES=PAIR_STAGES,
        TAIL=True, **_pair_launch(tail_warpgroup=True))
    return tail_out, tail_lse


def _descriptors(q: Tensor, k: Tensor, v: Tensor, block_m: int,
                 block_n: int) -> tuple[TensorDescriptor, TensorDescriptor, TensorDescriptor]:
    """TMA descriptors of q ``[T, H*D]`` (tiles of ``block_m`` rows) and k, v ``[N, H*D]`` (``block_n``)."""
    t, h, d = q.shape
    n = k.shape[0]
    dtype = _GL_DTYPES[q.dtype]
    q_layout = gl.NVMMASharedLayout.get_default_for([block_m, d], dtype)
    kv_layout = gl.NVMMASharedLayout.get_default_for([block_n, d], dtype)
    return (TensorDescriptor(q, [t, h * d], [q.stride(0), 1], [block_m, d], q_layout),
            TensorDescriptor(k, [n, h * d], [k.stride(0), 1], [block_n, d], kv_layout),
            TensorDescriptor(v, [n, h * d], [v.stride(0), 1], [block_n, d], kv_layout))


def _pair_launch(tail_warpgroup: bool = False) -> dict:
    """The warp-specialised kernel's launch options: 4 warps in the default partition, and the register
    file split as ``setmaxnreg`` shares it out over the default partition, the second consumer and the
    producer's (padded) warpgroup (and the tail's warpgroup, with ``tail_warpgroup``)."""
    if tail_warpgroup:
        return dict(CONSUMER_REGS=TAIL_WG_CONSUMER_REGS, PRODUCER_REGS=PRODUCER_REGS, TAIL_REGS=TAIL_WG_REGS,
                    num_warps=4, maxnreg=65536 // (32 * 16))
    warps = 4 + 4 + 4
    return dict(CONSUMER_REGS=CONSUMER_REGS, PRODUCER_REGS=PRODUCER_REGS, num_warps=4,
                maxnreg=(65536 // (32 * warps)) // 8 * 8)


__all__ = ["carries_tail", "runs_attention", "runs_attention_fused_tail", "use_pairs", "BLOCK_M"]
