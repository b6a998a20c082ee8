"""q/k-norm, RoPE and the cast to the attention dtype of an aggregator block, in one Triton kernel.

Why: in the fused graph step (``fusion.py``) Inductor compiles this part of a block into two kernels,
a LayerNorm over the 64 channels of every head vector (written out in fp32, as under autocast) and the
rotation (which pairs channels of another position of the same row, so it cannot join the reduction),
~17 µs together per block for 4 MB of q and k: ~0.8 ms a frame over 48 aggregator blocks. Here one
program per token reads its q and k rows from the fused qkv output (bf16), normalises each head in
fp32, rotates and writes q and k in the input dtype, reading each element twice (itself and its
rotation partner, an L1 hit) and writing it once.

Both rotations of the model (docs/model.md §7) are ``out[d] = y[d]·cos[d] + sign[d]·y[partner(d)]·sin[d]``
on the normalised head vector ``y``:

* ``halves`` (2D RoPE, frame blocks): quarters ``[a, b, c, d] -> [-b, a, -d, c]``; tables ``[T, D]``;
* ``pairs`` (3D RoPE, global blocks): pairs ``(2j, 2j+1) -> (-x[2j+1], x[2j])``; tables ``[T, D/2]``.

Numerics: the eager ops' (fp32 LayerNorm, fp32 products and sums, one rounding to the output dtype);
the LayerNorm's reduction order differs from PyTorch's, so results equal the eager path's to fp32
rounding before the cast, like the compiled path they replace. Runs in Triton's interpreter (the CPU
tests check it against float64).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

STYLES = ("halves", "pairs")


@triton.jit
def _norm_rotate(src, w_ptr, b_ptr, cos_row, sin_row, heads, dims, partner, sign, eps, HEAD_DIM: tl.constexpr,
                 PAIRS: tl.constexpr):
    """One token's ``[H, D]`` q or k at ``src`` (head stride ``HEAD_DIM``): LayerNorm per head, then the rotation."""
    x = tl.load(src + heads[:, None] * HEAD_DIM + dims[None, :]).to(tl.float32)  # [H, D]
    xp = tl.load(src + heads[:, None] * HEAD_DIM + partner[None, :]).to(tl.float32)  # [H, D]: rotation partners
    mean = tl.sum(x, axis=1) / HEAD_DIM  # [H]
    centred = x - mean[:, None]
    rstd = 1.0 / tl.sqrt(tl.sum(centred * centred, axis=1) / HEAD_DIM + eps)  # [H]
    w = tl.load(w_ptr + dims).to(tl.float32)
    b = tl.load(b_ptr + dims).to(tl.float32)
    wp = tl.load(w_ptr + partner).to(tl.float32)
    bp = tl.load(b_ptr + partner).to(tl.float32)
    y = centred * rstd[:, None] * w[None, :] + b[None, :]  # [H, D]
    yp = (xp - mean[:, None]) * rstd[:, None] * wp[None, :] + bp[None, :]  # [H, D]
    if PAIRS:
        table = dims // 2  # one angle per pair
    else:
        table = dims
    c = tl.load(cos_row + table).to(tl.float32)  # [D]
    s = tl.load(sin_row + table).to(tl.float32)
    return y * c[None, :] + (sign[None, :] * yp) * s[None, :]  # [H, D]


@triton.jit
def _qk_norm_rope(qkv_ptr, q_ptr, k_ptr, qw_ptr, qb_ptr, kw_ptr, kb_ptr, cos_ptr, sin_ptr, tokens, stride_token,
                  stride_table, eps, HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, PAIRS: tl.constexpr):
    """Program (row of the ``[N·T]`` tokens): its q and k, normalised and rotated, into ``q_ptr``, ``k_ptr``."""
    row = tl.program_id(0)
    token = row % tokens  # the tables hold one row per token of a frame's (or call's) sequence
    heads = tl.arange(0, HEADS)  # [H]
    dims = tl.arange(0, HEAD_DIM)  # [D]
    if PAIRS:
        partner = dims ^ 1
        sign = tl.where(dims % 2 == 0, -1.0, 1.0)
    else:
        quarter: tl.constexpr = HEAD_DIM // 4
        first = (dims // quarter) % 2 == 0  # quarters a and c take -b and -d
        partner = tl.where(first, dims + quarter, dims - quarter)
        sign = tl.where(first, -1.0, 1.0)
    cos_row = cos_ptr + token * stride_table
    sin_row = sin_ptr + token * stride_table
    src = qkv_ptr + row * stride_token  # [3, H, D] of this token
    out = row * HEADS * HEAD_DIM + heads[:, None] * HEAD_DIM + dims[None, :]  # [H, D]
    q = _norm_rotate(src, qw_ptr, qb_ptr, cos_row, sin_row, heads, dims, partner, sign, eps, HEAD_DIM, PAIRS)
    tl.store(q_ptr + out, q.to(q_ptr.dtype.element_ty))
    k = _norm_rotate(src + HEADS * HEAD_DIM, kw_ptr, kb_ptr, cos_row, sin_row, heads, dims, partner, sign, eps,
                     HEAD_DIM, PAIRS)
    tl.store(k_ptr + out, k.to(k_ptr.dtype.element_ty))


def qk_norm_rope(qkv: Tensor, q_norm: tuple[Tensor, Tensor], k_norm: tuple[Tensor, Tensor], eps: float,
                 cos: Tensor, sin: Tensor, style: str) -> tuple[Tensor, Tensor]:
    """``qkv [N, T, 3, H, D]`` (the fused linear's output, contiguous) -> q, k ``[N, T, H, D]`` in its dtype:
    ``rope(LayerNorm(x))`` per head with the (weight, bias) pairs ``q_norm``, ``k_norm``; ``cos``/``sin``:
    the rotation's tables, one row per token of ``T`` (``[T, 1, D]`` for ``halves``, ``[T, 1, D/2]`` for
    ``pairs``), any float dtype (computed in fp32)."""
    if style not in STYLES:
        raise ValueError(f"style must be one of {STYLES} (got {style!r})")
    n, t, three, h, d = qkv.shape
    width = d // 2 if style == "pairs" else d
    if three != 3 or not qkv.is_contiguous() or d % 4 or d & (d - 1) or h & (h - 1):
        raise ValueError(f"qkv must be a contiguous [N, T, 3, H, D] with H and D powers of two (got {list(qkv.shape)})")
    if cos.shape != (t, 1, width) or sin.shape != cos.shape or cos.stride(0) != sin.stride(0) or cos.stride(2) != 1:
        raise ValueError(f"{style} tables must be [{t}, 1, {width}] alike (got {list(cos.shape)}, {list(sin.shape)})")
    for weight in (*q_norm, *k_norm):
        if weight.shape != (d,) or not weight.is_contiguous():
            raise ValueError(f"q/k-norm weights must be contiguous [{d}] (got {list(weight.shape)})")
    q = torch.empty(n, t, h, d, device=qkv.device, dtype=qkv.dtype)  # [N, T, H, D]
    k = torch.empty_like(q)
    _qk_norm_rope[(n * t,)](qkv, q, k, *q_norm, *k_norm, cos, sin, t, qkv.stride(1), cos.stride(0), float(eps),
                            HEADS=h, HEAD_DIM=d, PAIRS=style == "pairs", num_warps=4)
    return q, k


__all__ = ["qk_norm_rope", "STYLES"]
