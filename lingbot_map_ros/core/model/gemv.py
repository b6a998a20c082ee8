"""The camera head's fp32 linears (one token per stream) as Triton GEMVs, each with what surrounds it fused in.

Why: in the graph step the camera head's trunk (4 blocks x 4 refinement iterations, width 2048, one
token per frame, fp32 as the official recipe) reads 3.2 GB of weights a frame through cuBLAS GEMVs
at 2.3-3.5 TB/s, and around every GEMV sit small kernels of their own (LayerNorm, bias, GELU,
LayerScale, residual): ~10 launches a block, each a few µs of a latency-bound step. A GEMV is
bandwidth-bound, so what surrounds it is free when done in the same pass:

* ``norm_linear``: ``act(W · LN(x) + b)`` (LN₁ → qkv, LN₂ → fc1 → GELU): every program recomputes the
  LayerNorm statistics of ``x`` (8 KB, from L2, in one load) and normalises each chunk as it streams ``W``;
* ``linear_residual``: ``r + γ ⊙ (W · a + b)`` (proj, fc2 with their LayerScale and residual).

A block is then 4 GEMVs + the camera decode's 2 kernels. Each program owns ``BN`` output rows and
streams its ``[BN, K]`` slice of ``W`` in ``BK`` chunks (``_tile``: per shape, as measured). A batched
step of several streams has one camera token per stream: ``_gemv_tokens`` applies each streamed chunk
of ``W`` to all of them, so the weights, what bounds the kernel, are read once a step, not once a
stream. Numerics:
fp32 FMAs throughout (no TF32), exact-erf GELU; sums in another order than cuBLAS, so results equal the
unfused head's to fp32 rounding (test_gpu.py). Runs in Triton's interpreter too (the CPU tests, against
float64).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

BLOCK_K = 256


@triton.jit
def _row_stats(x_ptr, K, eps, KP: tl.constexpr):
    """Mean and 1/std of the fp32 vector ``x [K]`` from one load of all of it (``KP``: K rounded up to a
    power of two; a loop of chunks would put a chain of dependent loads before the weights stream)."""
    cols = tl.arange(0, KP)
    ok = cols < K
    x = tl.load(x_ptr + cols, mask=ok, other=0.0)  # [KP]
    mean = tl.sum(x, axis=0) / K
    centred = tl.where(ok, x - mean, 0.0)
    return mean, 1.0 / tl.sqrt(tl.sum(centred * centred, axis=0) / K + eps)


@triton.jit
def _gemv(x_ptr, w_ptr, b_ptr, out_ptr, ln_w_ptr, ln_b_ptr, gamma_ptr, res_ptr, N, K, eps,
          NORM: tl.constexpr, EPILOGUE: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, KP: tl.constexpr):
    """Program (row block): ``out[n] = epilogue(Σ_k W[n, k] · x'[k] + b[n])`` for its ``BN`` rows, where
    ``x' = LN(x)`` if ``NORM`` else ``x``; ``EPILOGUE`` 0: none, 1: exact GELU, 2: ``res + γ ⊙ ·``."""
    rows = tl.program_id(0) * BN + tl.arange(0, BN)  # [BN]
    row_ok = rows < N
    if NORM:
        mean, rstd = _row_stats(x_ptr, K, eps, KP)
    acc = tl.zeros([BN, BK], tl.float32)
    for k0 in range(0, K, BK):
        cols = k0 + tl.arange(0, BK)  # [BK]
        col_ok = cols < K
        x = tl.load(x_ptr + cols, mask=col_ok, other=0.0)  # [BK]
        if NORM:
            x = (x - mean) * rstd * tl.load(ln_w_ptr + cols, mask=col_ok, other=0.0) + tl.load(
                ln_b_ptr + cols, mask=col_ok, other=0.0)
            x = tl.where(col_ok, x, 0.0)
        w = tl.load(w_ptr + rows[:, None] * K + cols[None, :], mask=row_ok[:, None] & col_ok[None, :], other=0.0)
        acc += w * x[None, :]  # [BN, BK]
    y = tl.sum(acc, axis=1) + tl.load(b_ptr + rows, mask=row_ok, other=0.0)  # [BN]
    if EPILOGUE == 1:
        y = 0.5 * y * (1.0 + tl.math.erf(y * 0.7071067811865476))
    elif EPILOGUE == 2:
        y = tl.load(res_ptr + rows, mask=row_ok, other=0.0) + tl.load(gamma_ptr + rows, mask=row_ok, other=0.0) * y
    tl.store(out_ptr + rows, y, mask=row_ok)


@triton.jit
def _gemv_tokens(x_ptr, w_ptr, b_ptr, out_ptr, ln_w_ptr, ln_b_ptr, gamma_ptr, res_ptr, M, N, K, eps,
                 MP: tl.constexpr, NORM: tl.constexpr, EPILOGUE: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                 KP: tl.constexpr):
    """``_gemv`` for ``M`` tokens (``x [M, K]``, one per stream of a batched step; ``MP``: M rounded up to a
    power of two): each program streams its ``[BN, K]`` slice of ``W`` once and applies every chunk to all
    the tokens, so a step of M streams reads the weights once instead of M times."""
    toks = tl.arange(0, MP)  # [MP]
    tok_ok = toks < M
    rows = tl.program_id(0) * BN + tl.arange(0, BN)  # [BN]
    row_ok = rows < N
    if NORM:
        stat_cols = tl.arange(0, KP)
        stat_ok = tok_ok[:, None] & (stat_cols < K)[None, :]
        xs = tl.load(x_ptr + toks[:, None] * K + stat_cols[None, :], mask=stat_ok, other=0.0)  # [MP, KP]
        mean = tl.sum(xs, axis=1) / K  # [MP]
        centred = tl.where(stat_ok, xs - mean[:, None], 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(centred * centred, axis=1) / K + eps)  # [MP]
    acc = tl.zeros([MP, BN, BK], tl.float32)
    for k0 in range(0, K, BK):
        cols = k0 + tl.arange(0, BK)  # [BK]
        col_ok = cols < K
        x_ok = tok_ok[:, None] & col_ok[None, :]
        x = tl.load(x_ptr + toks[:, None] * K + cols[None, :], mask=x_ok, other=0.0)  # [MP, BK]
        if NORM:
            x = (x - mean[:, None]) * rstd[:, None] * tl.load(ln_w_ptr + cols, mask=col_ok, other=0.0)[None, :] \
                + tl.load(ln_b_ptr + cols, mask=col_ok, other=0.0)[None, :]
            x = tl.where(x_ok, x, 0.0)
        w = tl.load(w_ptr + rows[:, None] * K + cols[None, :], mask=row_ok[:, None] & col_ok[None, :], other=0.0)
        acc += w[None, :, :] * x[:, None, :]  # [MP, BN, BK]
    y = tl.sum(acc, axis=2) + tl.load(b_ptr + rows, mask=row_ok, other=0.0)[None, :]  # [MP, BN]
    out_ok = tok_ok[:, None] & row_ok[None, :]
    if EPILOGUE == 1:
        y = 0.5 * y * (1.0 + tl.math.erf(y * 0.7071067811865476))
    elif EPILOGUE == 2:
        y = tl.load(res_ptr + toks[:, None] * N + rows[None, :], mask=out_ok, other=0.0) \
            + tl.load(gamma_ptr + rows, mask=row_ok, other=0.0)[None, :] * y
    tl.store(out_ptr + toks[:, None] * N + rows[None, :], y, mask=out_ok)


MAX_TOKENS = 4  # tokens (streams of a batched step) one call takes; more go through the compiled block


def _check(x: Tensor, weight: Tensor, bias: Tensor) -> tuple[int, int, int]:
    n, k = weight.shape
    if x.dtype != torch.float32 or weight.dtype != torch.float32 or bias.dtype != torch.float32:
        raise ValueError(f"the camera GEMVs run in fp32 (got {x.dtype}, {weight.dtype}, {bias.dtype})")
    m = x.numel() // k  # tokens: the leading dimensions flattened
    if (x.shape[-1] != k or not 1 <= m <= MAX_TOKENS or not x.is_contiguous() or not weight.is_contiguous()
            or bias.shape != (n,)):
        raise ValueError(f"1..{MAX_TOKENS} tokens x [..., {k}] (got {list(x.shape)}), weight [{n}, {k}] contiguous, "
                         f"bias [{n}]")
    return m, n, k


def _tile(n: int, k: int, m: int = 1) -> tuple[int, int]:
    """Rows per program and the chunk of ``K`` each loop step streams, per shape (measured on the H200
    inside a CUDA graph, ``bench/gemv_bench.py``): the wide linears (qkv, fc1: N >= 6144) keep 16 rows
    in 256-column chunks (>= 384 programs); the narrow ones (proj, fc2: N = 2048) take 2 rows in
    1024-column chunks (1024 programs, each with more bytes in flight): proj 8.5 -> 7.1 µs, fc2
    24.8 -> 18.5 µs, faster than cuBLAS's 8.0 and 20.9. Three or four tokens halve the narrow chunk: the
    accumulator holds a ``[BN, BK]`` tile per token, and twice the registers would spill. Two to four
    tokens (a batched step's) stream the wide linears 8 rows in 512-column chunks (H100, 2 tokens: qkv
    26.7 -> 23.1 µs, fc1 38.5 -> 28.0; 4 tokens: 36.9 -> 27.7, 37.9 -> 35.7)."""
    if n <= 2048:
        return (2, 512) if m > 2 else (2, 1024)
    return (16, BLOCK_K) if m == 1 else (8, 512)


def _launch(x: Tensor, weight: Tensor, bias: Tensor, out: Tensor, ln: tuple[Tensor, Tensor], gamma: Tensor,
            residual: Tensor, eps: float, *, m: int, norm: bool, epilogue: int, block_n: int, block_k: int,
            num_warps: int) -> None:
    n, k = weight.shape
    bn, bk = block_n or _tile(n, k, m)[0], block_k or _tile(n, k, m)[1]
    kp = triton.next_power_of_2(k) if norm else 1
    if m == 1:
        _gemv[(triton.cdiv(n, bn),)](x, weight, bias, out, ln[0], ln[1], gamma, residual, n, k, float(eps), NORM=norm,
                                     EPILOGUE=epilogue, BN=bn, BK=bk, KP=kp, num_warps=num_warps)
    else:
        _gemv_tokens[(triton.cdiv(n, bn),)](x, weight, bias, out, ln[0], ln[1], gamma, residual, m, n, k, float(eps),
                                            MP=triton.next_power_of_2(m), NORM=norm, EPILOGUE=epilogue, BN=bn,
                                            BK=bk, KP=kp, num_warps=num_warps)


def norm_linear(x: Tensor, norm: tuple[Tensor, Tensor], eps: float, weight: Tensor, bias: Tensor, *,
                gelu: bool = False, block_n: int = 0, block_k: int = 0, num_warps: int = 4) -> Tensor:
    """``act(weight · LayerNorm(x) + bias)`` for 1..``MAX_TOKENS`` tokens ``x [..., K]`` (fp32): ``[..., N]``;
    ``act``: exact GELU or none; ``norm``: the LayerNorm's (weight, bias). The tile arguments are for the
    benchmark."""
    m, n, _ = _check(x, weight, bias)
    out = torch.empty(*x.shape[:-1], n, device=x.device, dtype=torch.float32)
    _launch(x, weight, bias, out, norm, bias, bias, eps, m=m, norm=True, epilogue=1 if gelu else 0, block_n=block_n,
            block_k=block_k, num_warps=num_warps)
    return out


def linear_residual(a: Tensor, weight: Tensor, bias: Tensor, gamma: Tensor, residual: Tensor, *, block_n: int = 0,
                    block_k: int = 0, num_warps: int = 4) -> Tensor:
    """``residual + gamma ⊙ (weight · a + bias)`` for 1..``MAX_TOKENS`` tokens ``a [..., K]`` (fp32): ``[..., N]``."""
    m, n, _ = _check(a, weight, bias)
    if residual.shape[-1] != n or residual.numel() != m * n or not residual.is_contiguous() or gamma.shape != (n,):
        raise ValueError(f"residual [..., {n}] of {m} tokens, contiguous, and gamma [{n}] (got {list(residual.shape)}, "
                         f"{list(gamma.shape)})")
    out = torch.empty_like(residual)
    _launch(a, weight, bias, out, (bias, bias), gamma, residual, 0.0, m=m, norm=False, epilogue=2, block_n=block_n,
            block_k=block_k, num_warps=num_warps)
    return out


__all__ = ["MAX_TOKENS", "linear_residual", "norm_linear"]
