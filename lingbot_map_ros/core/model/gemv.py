"""The camera head's one-token fp32 linears as Triton GEMVs, each with what surrounds it fused in.

Why: in the graph step the camera head's trunk (4 blocks x 4 refinement iterations, width 2048, one
token per frame, fp32 as the official recipe) reads 3.2 GB of weights a frame through cuBLAS GEMVs
at 2.3-3.5 TB/s, and around every GEMV sit small kernels of their own (LayerNorm, bias, GELU,
LayerScale, residual): ~10 launches a block, each a few µs of a latency-bound step. A GEMV is
bandwidth-bound, so what surrounds it is free when done in the same pass:

* ``norm_linear``: ``act(W · LN(x) + b)`` (LN₁ → qkv, LN₂ → fc1 → GELU): every program recomputes the
  LayerNorm statistics of ``x`` (8 KB, from L2, in one load) and normalises each chunk as it streams ``W``;
* ``linear_residual``: ``r + γ ⊙ (W · a + b)`` (proj, fc2 with their LayerScale and residual).

A block is then 4 GEMVs + the camera decode's 2 kernels. Each program owns ``BN`` output rows and
streams its ``[BN, K]`` slice of ``W`` in ``BK`` chunks (``_tile``: per shape, as measured). Numerics:
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


def _check(x: Tensor, weight: Tensor, bias: Tensor) -> tuple[int, int]:
    n, k = weight.shape
    if x.dtype != torch.float32 or weight.dtype != torch.float32 or bias.dtype != torch.float32:
        raise ValueError(f"the camera GEMVs run in fp32 (got {x.dtype}, {weight.dtype}, {bias.dtype})")
    if x.numel() != k or not x.is_contiguous() or not weight.is_contiguous() or bias.shape != (n,):
        raise ValueError(f"one token x [{k}] (got {list(x.shape)}), weight [{n}, {k}] contiguous, bias [{n}]")
    return n, k


def _tile(n: int, k: int) -> tuple[int, int]:
    """Rows per program and the chunk of ``K`` each loop step streams, per shape (measured on the H200
    inside a CUDA graph, ``bench/gemv_bench.py``): the wide linears (qkv, fc1: N >= 6144) keep 16 rows
    in 256-column chunks (>= 384 programs); the narrow ones (proj, fc2: N = 2048) take 2 rows in
    1024-column chunks (1024 programs, each with more bytes in flight): proj 8.5 -> 7.1 µs, fc2
    24.8 -> 18.5 µs, faster than cuBLAS's 8.0 and 20.9."""
    return (2, 1024) if n <= 2048 else (16, BLOCK_K)


def norm_linear(x: Tensor, norm: tuple[Tensor, Tensor], eps: float, weight: Tensor, bias: Tensor, *,
                gelu: bool = False, block_n: int = 0, block_k: int = 0, num_warps: int = 4) -> Tensor:
    """``act(weight · LayerNorm(x) + bias)`` for one token ``x [..., K]`` (fp32): ``[..., N]``; ``act``: exact
    GELU or none; ``norm``: the LayerNorm's (weight, bias). The tile arguments are for the benchmark."""
    n, k = _check(x, weight, bias)
    out = torch.empty(*x.shape[:-1], n, device=x.device, dtype=torch.float32)
    bn, bk = block_n or _tile(n, k)[0], block_k or _tile(n, k)[1]
    _gemv[(triton.cdiv(n, bn),)](x, weight, bias, out, norm[0], norm[1], bias, bias, n, k, float(eps), NORM=True,
                                 EPILOGUE=1 if gelu else 0, BN=bn, BK=bk, KP=triton.next_power_of_2(k),
                                 num_warps=num_warps)
    return out


def linear_residual(a: Tensor, weight: Tensor, bias: Tensor, gamma: Tensor, residual: Tensor, *, block_n: int = 0,
                    block_k: int = 0, num_warps: int = 4) -> Tensor:
    """``residual + gamma ⊙ (weight · a + bias)`` for one token ``a [..., K]`` (fp32): ``[..., N]``."""
    n, k = _check(a, weight, bias)
    if residual.shape[-1] != n or residual.numel() != n or not residual.is_contiguous() or gamma.shape != (n,):
        raise ValueError(f"residual [{n}] contiguous and gamma [{n}] (got {list(residual.shape)}, {list(gamma.shape)})")
    out = torch.empty_like(residual)
    bn, bk = block_n or _tile(n, k)[0], block_k or _tile(n, k)[1]
    _gemv[(triton.cdiv(n, bn),)](a, weight, bias, out, bias, bias, gamma, residual, n, k, 0.0, NORM=False,
                                 EPILOGUE=2, BN=bn, BK=bk, KP=1, num_warps=num_warps)
    return out


__all__ = ["norm_linear", "linear_residual"]
