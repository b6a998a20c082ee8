"""Probe: can a Triton attention kernel of our own beat cuDNN on the split backend's hot call?

The hot call of a steady frame is one frame's queries (1005 x 16 heads, d 64) against the unmasked,
contiguous patch prefix (72 pages x 999 = 71,928 keys), with the log-sum-exp that the split
backend's merge needs. cuDNN runs it at ~404 TFLOP/s (docs/benchmarks.md); issue 21 needs ~550 for
its goal. This script is a measurement, not a backend: a plain online-softmax kernel (exp2 with the
scale folded in, fp32 accumulators, full key blocks without masks and one masked tail block),
autotuned over tile sizes, timed against cuDNN on the same tensors, each checked against an fp32
reference; beside it the package's TMA kernel (``core/cache/triton_prefix.py``, the split backend's
prefix kernel since it won here) per tile, and FlashInfer fa3 over contiguous key ranges.

    python3 scripts/triton_attention_probe.py [--queries 1005] [--keys 71928] [--heads 16]  (device_run.sh probe)
    TRITON_INTERPRET=1 python3 scripts/triton_attention_probe.py --device cpu --queries 40 --keys 300 --heads 2
"""
from __future__ import annotations

import argparse
import math

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from lingbot_map_ros.core.cache.triton_prefix import runs_attention

LOG2_E = 1.4426950408889634

_CONFIGS = [
    triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
    for bm, bn, w, s in [
        (128, 128, 8, 2), (128, 128, 8, 3), (128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 4, 3),
        (64, 128, 4, 3), (64, 64, 4, 4), (64, 128, 4, 4), (128, 256, 8, 2), (64, 256, 4, 3),
    ]
]


@triton.jit
def _prefix_attention(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr,
                      stride_qt, stride_qh, stride_kn, stride_kh, stride_vn, stride_vh, stride_ot, stride_oh,
                      num_queries, scale_log2, NUM_KEYS: tl.constexpr, FULL_END: tl.constexpr,
                      HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One (query block, head) per program: softmax(q k^T * scale) v over all keys, and its LSE.
    ``FULL_END``: the keys before it come in whole blocks of any ``BLOCK_N`` up to 256 (a multiple of
    256, computed on the host); the rest go through masked blocks. The key count is a compile-time
    constant: one frame size has one count at the steady state, and fixed loop bounds unroll well."""
    block = tl.program_id(0)
    head = tl.program_id(1)
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)  # [BM]
    dims = tl.arange(0, HEAD_DIM)  # [D]
    cols = tl.arange(0, BLOCK_N)  # [BN]
    row_ok = rows < num_queries
    q = tl.load(q_ptr + rows[:, None] * stride_qt + head * stride_qh + dims[None, :],
                mask=row_ok[:, None], other=0.0)  # [BM, D]
    k_head = k_ptr + head * stride_kh
    v_head = v_ptr + head * stride_vh
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max, log2 units
    l_i = tl.zeros([BLOCK_M], tl.float32)  # running sum of exp2
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)  # [BM, D]
    for start in range(0, FULL_END, BLOCK_N):  # full key blocks: no masks
        keys = start + cols
        k = tl.load(k_head + keys[None, :] * stride_kn + dims[:, None])  # [D, BN]
        s = tl.dot(q, k) * scale_log2  # [BM, BN]
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_head + keys[:, None] * stride_vn + dims[None, :])  # [BN, D]
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    for start in range(FULL_END, NUM_KEYS, BLOCK_N):  # the last keys, masked
        keys = start + cols
        key_ok = keys < NUM_KEYS
        k = tl.load(k_head + keys[None, :] * stride_kn + dims[:, None], mask=key_ok[None, :], other=0.0)
        s = tl.where(key_ok[None, :], tl.dot(q, k) * scale_log2, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_head + keys[:, None] * stride_vn + dims[None, :], mask=key_ok[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(o_ptr + rows[:, None] * stride_ot + head * stride_oh + dims[None, :], out.to(o_ptr.dtype.element_ty),
             mask=row_ok[:, None])
    lse = (m_i + tl.math.log2(l_i)) / 1.4426950408889634  # natural log
    tl.store(lse_ptr + head * num_queries + rows, lse, mask=row_ok)


_tuned = triton.autotune(configs=_CONFIGS, key=["num_queries", "NUM_KEYS"])(_prefix_attention)


def prefix_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, tuned: bool = True,
                     block_m: int = 64, block_n: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """q [T, H, D], k and v [N, H, D] (token-major pages) -> out [T, H, D], lse [H, T] (fp32)."""
    t, h, d = q.shape
    n = k.shape[0]
    out = torch.empty_like(q)  # [T, H, D]
    lse = torch.empty(h, t, device=q.device, dtype=torch.float32)  # [H, T]
    args = (q, k, v, out, lse, q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            out.stride(0), out.stride(1), t, LOG2_E / math.sqrt(d))
    shape = dict(NUM_KEYS=n, FULL_END=n // 256 * 256, HEAD_DIM=d)
    if tuned:
        _tuned[lambda meta: (triton.cdiv(t, meta["BLOCK_M"]), h)](*args, **shape)
    else:
        _prefix_attention[(triton.cdiv(t, block_m), h)](*args, **shape, BLOCK_M=block_m, BLOCK_N=block_n)
    return out, lse



# (block_m, block_n, warps, stages): the package's TMA kernel (lingbot_map_ros/core/cache/triton_prefix.py)
# over one run of all keys, per tile; its default is the first row
TMA_VARIANTS = [(64, 128, 4, 3), (64, 128, 4, 2), (64, 64, 4, 6), (128, 128, 8, 3)]
# the package's Gluon kernel per tile: block_m x block_n, stages, parts; pairs: the warp-specialised
# kernel (two consumer warpgroups of block_m queries sharing each K/V block, a producer warp)
_G = dict(block_m=64, block_n=128, num_warps=4, parts=1, pairs=False)
GLUON_VARIANTS = [
    {**_G, "stages": 3}, {**_G, "stages": 3, "pairs": True}, {**_G, "stages": 4, "pairs": True},
    {**_G, "stages": 2, "pairs": True}, {**_G, "stages": 3, "pairs": True, "parts": 2},
]


def merged(out: torch.Tensor, lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Parts ``out [P, T, H, D]``, ``lse [P, H, T]`` -> the attention ``[T, H, D]`` and its LSE ``[H, T]``."""
    if out.shape[0] == 1:
        return out[0], lse[0]
    total = torch.logsumexp(lse, dim=0)  # [H, T]
    weights = torch.exp(lse - total).transpose(1, 2)[..., None]  # [P, T, H, 1]
    return (out.float() * weights).sum(0).to(out.dtype), total


def prefix_attention_tma(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **tiles) -> tuple:
    """The package kernel over the keys as one run: out [T, H, D], lse [H, T]."""
    runs = torch.tensor([[0, k.shape[0]]], dtype=torch.int32, device=q.device)
    out, lse = runs_attention(q, k, v, runs, **tiles)
    return out[0], lse[0]


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 (float64 on the CPU) softmax attention and its LSE, head by head."""
    ref_dtype = torch.float64 if q.device.type == "cpu" else torch.float32
    outs, lses = [], []
    for head in range(q.shape[1]):
        qh, kh, vh = (x[:, head].to(ref_dtype) for x in (q, k, v))  # [T, D], [N, D], [N, D]
        scores = qh @ kh.T / math.sqrt(q.shape[2])  # [T, N]
        lses.append(torch.logsumexp(scores, dim=1))  # [T]
        outs.append(torch.softmax(scores, dim=1) @ vh)  # [T, D]
    return torch.stack(outs, dim=1), torch.stack(lses)  # [T, H, D], [H, T]


def fa3_ragged_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, check, reps: int) -> None:
    """FlashInfer's fa3 (TMA loads: contiguous keys) with the keys cut into S ranges, one request per
    range with the same queries, merged by their LSE. Its 192-query tiles give 6 x 16 = 96 CTAs on 132
    SMs for one range; S = 11 makes 1056 = 8 x 132."""
    import flashinfer

    t, h, d = q.shape
    n = k.shape[0]
    workspace = torch.empty(256 << 20, dtype=torch.uint8, device=q.device)
    for splits in (1, 2, 4, 11):
        bounds = [round(i * n / splits) for i in range(splits + 1)]
        wrapper = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD", backend="fa3")
        qo_indptr = torch.arange(0, (splits + 1) * t, t, dtype=torch.int32, device=q.device)  # [S + 1]
        kv_indptr = torch.tensor(bounds, dtype=torch.int32, device=q.device)  # [S + 1]
        try:
            wrapper.plan(qo_indptr, kv_indptr, h, h, d, causal=False, q_data_type=q.dtype, kv_data_type=k.dtype)
            queries = q.repeat(splits, 1, 1)  # [S*T, H, D]

            def run(wrapper=wrapper, queries=queries, splits=splits):
                out, lse = wrapper.run(queries, k, v, return_lse=True)  # [S*T, H, D], [S*T, H]
                if splits == 1:
                    return out, lse
                parts = out.view(splits, t, h, d).transpose(0, 1)  # [T, S, H, D]
                return flashinfer.merge_states(parts.contiguous(), lse.view(splits, t, h).transpose(0, 1).contiguous())

            out, _ = run()
            check(f"flashinfer fa3 ragged, {splits} key range(s){' + merge_states' if splits > 1 else ''}", out, None,
                  time_us(run, reps))
        except Exception as exc:
            print(f"fa3 ragged x{splits}: FAILED {type(exc).__name__}: {str(exc)[:300]}")


def time_us(fn, reps: int) -> float:
    """Median of CUDA-event times over ``reps`` calls after a warm-up."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return sorted(times)[len(times) // 2]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--queries", type=int, default=1005)
    p.add_argument("--keys", type=int, default=71928)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--device", default="cuda", help="cpu: a correctness dry run under TRITON_INTERPRET=1")
    p.add_argument("--flashinfer", action="store_true", help="also FlashInfer's fa3 over contiguous keys, split")
    p.add_argument("--tma-only", action="store_true", help="only cuDNN and the package's kernels (no autotuning)")
    args = p.parse_args()
    dev = torch.device(args.device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    gen = torch.Generator(device=dev).manual_seed(0)
    t, n, h, d = args.queries, args.keys, args.heads, args.head_dim
    q = torch.randn(t, h, d, device=dev, dtype=dtype, generator=gen)  # [T, H, D]
    k = torch.randn(n, h, d, device=dev, dtype=dtype, generator=gen)  # [N, H, D]
    v = torch.randn(n, h, d, device=dev, dtype=dtype, generator=gen)  # [N, H, D]
    ref_out, ref_lse = reference(q, k, v)
    flop = 4 * t * n * h * d
    print(f"T={t} N={n} H={h} D={d}: {flop / 1e9:.1f} GFLOP")
    rows = []

    def check(name: str, out: torch.Tensor, lse: torch.Tensor | None, us: float) -> None:
        err = ((out.to(ref_out.dtype) - ref_out).norm() / ref_out.norm()).item()
        lse_err = float("nan") if lse is None else (lse.to(ref_lse.dtype) - ref_lse).abs().max().item()
        rows.append((name, us, flop / us / 1e6 if us == us else float("nan"), err, lse_err))

    if dev.type == "cpu":
        out, lse = prefix_attention(q, k, v, tuned=False, block_m=16, block_n=64)
        check("triton, 16 x 64 (interpreter)", out, lse, float("nan"))
        out, lse = prefix_attention_tma(q, k, v, block_m=16, block_n=32, num_warps=4, num_stages=2)
        check("triton TMA (package), 16 x 32 (interpreter)", out, lse, float("nan"))
    else:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        qh, kh, vh = (x.transpose(0, 1)[None] for x in (q, k, v))  # [1, H, T|N, D] views of the token-major data

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(qh, kh, vh)

        check("cuDNN fused attention (SDPA, strided token-major views)", cudnn()[0].transpose(0, 1), None,
              time_us(cudnn, args.reps))
        if not args.tma_only:
            out, lse = prefix_attention(q, k, v)  # autotunes on its first call
            best = _tuned.best_config
            check(f"triton, autotuned ({best})", out, lse, time_us(lambda: prefix_attention(q, k, v), args.reps))
        for bm, bn, warps, stages in TMA_VARIANTS:
            opts = dict(block_m=bm, block_n=bn, num_warps=warps, num_stages=stages)
            name = f"triton TMA (package), {bm} x {bn}, {warps} warps, {stages} stages"
            try:
                out, lse = prefix_attention_tma(q, k, v, **opts)
                check(name, out, lse, time_us(lambda: prefix_attention_tma(q, k, v, **opts), args.reps))
            except Exception as exc:  # a tile that does not compile or launch is reported, not fatal
                print(f"{name}: FAILED {type(exc).__name__}: {str(exc)[:300]}")
        from lingbot_map_ros.core.cache import gluon_runs

        runs = torch.tensor([[0, n]], dtype=torch.int32, device=dev)
        # GLUON_VARIANTS; a row with parts > 1 times the kernel alone and the kernel with the LSE merge
        for variant in GLUON_VARIANTS:
            tiles = dict(variant)
            parts = tiles.pop("parts")
            name = (f"gluon (package), {'2 x ' if tiles['pairs'] else ''}{tiles['block_m']} x {tiles['block_n']}, "
                    f"{tiles['stages']} stages, {parts} part(s){', warp-specialised' if tiles['pairs'] else ''}")
            try:
                out, lse = merged(*gluon_runs.runs_attention(q, k, v, runs, parts=parts, **tiles))
                check(name, out, lse, time_us(lambda t=tiles, p=parts: gluon_runs.runs_attention(
                    q, k, v, runs, parts=p, **t), args.reps))
                if parts > 1:
                    check(name + " + merge", out, lse, time_us(lambda t=tiles, p=parts: merged(
                        *gluon_runs.runs_attention(q, k, v, runs, parts=p, **t)), args.reps))
            except Exception as exc:  # reported, not fatal
                print(f"{name}: FAILED {type(exc).__name__}: {str(exc)[:300]}")
        if args.flashinfer:
            fa3_ragged_rows(q, k, v, check, args.reps)
    print("| kernel | us | TFLOP/s | rel. error vs reference | max abs LSE error |")
    print("|---|---|---|---|---|")
    for name, us, tf, err, lse_err in rows:
        print(f"| {name} | {us:.0f} | {tf:.0f} | {err:.2e} | {lse_err:.2e} |")


if __name__ == "__main__":
    main()
