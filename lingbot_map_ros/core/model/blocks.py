"""Transformer building blocks shared by the DINO backbone, the aggregator and the camera head.

Every attention in the model has the same parameter layout (docs/model.md §5): ``qkv = Linear(C, 3C)``
whose output channel ``c = s·C + h·d + j`` (s ∈ q,k,v; head h; in-head j), heads merged back as
``h·d + j`` before ``proj``. What differs between the three uses is *how the attention itself is
computed* (each frame alone with 2D RoPE; across frames through a KV cache with 3D RoPE; causal over
camera tokens). Blocks therefore take an ``attend(q, k, v)`` callable and never know which one it is;
this keeps the K/V storage out of the model (docs/architecture.md, "Seams").
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .fusion import active_fusion
from .interfaces import GlobalAttention
from .rope import RopeApplier

# q, k, v [N, T, H, D] (after q/k-norm) -> attention output [N, T, H, D]
AttendFn = Callable[[Tensor, Tensor, Tensor], Tensor]


class LayerScale(nn.Module):
    """Per-channel residual-branch gain ``γ ⊙ x`` (key ``gamma``)."""

    def __init__(self, dim: int, init_value: float = 1e-5) -> None:
        super().__init__()
        self.init_value = init_value
        self.gamma = nn.Parameter(torch.full((dim,), float(init_value)))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.gamma


class Mlp(nn.Module):
    """``fc2(GELU(fc1(x)))`` with exact (erf) GELU, as every MLP of the model."""

    def __init__(self, in_features: int, hidden_features: int, out_features: int | None = None) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden_features, out_features if out_features is not None else in_features)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Attention(nn.Module):
    """Multi-head attention parameters; the attention itself is delegated to ``attend``."""

    def __init__(self, dim: int, num_heads: int, *, qk_norm: bool = False, qk_norm_eps: float = 1e-5) -> None:
        super().__init__()
        if dim % num_heads != 0:
            raise ValueError(f"width {dim} is not divisible by {num_heads} heads")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.qkv = nn.Linear(dim, 3 * dim)
        # One LN over each head vector, weights shared by all heads (aggregator blocks only).
        self.q_norm: nn.Module = nn.LayerNorm(self.head_dim, eps=qk_norm_eps) if qk_norm else nn.Identity()
        self.k_norm: nn.Module = nn.LayerNorm(self.head_dim, eps=qk_norm_eps) if qk_norm else nn.Identity()
        self.proj = nn.Linear(dim, dim)

    def qkv_heads(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``x [N, T, C]`` -> q, k, v ``[N, T, H, D]`` with q/k-norm applied (token-major layout)."""
        N, T, _ = x.shape
        qkv = self.qkv(x).reshape(N, T, 3, self.num_heads, self.head_dim)  # [N, T, 3, H, D]
        q, k, v = qkv.unbind(dim=2)  # each [N, T, H, D]
        return self.q_norm(q), self.k_norm(k), v

    def forward(self, x: Tensor, attend: AttendFn) -> Tensor:
        q, k, v = self.qkv_heads(x)
        out = attend(q, k, v)  # [N, T, H, D]
        return self.proj(out.flatten(-2))  # [N, T, C]


class Block(nn.Module):
    """Pre-norm block: ``y = x + γ₁·Proj(Attn(LN₁ x))``, ``z = y + γ₂·FC₂(GELU(FC₁(LN₂ y)))``."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        mlp_ratio: float = 4.0,
        norm_eps: float = 1e-5,
        qk_norm: bool = False,
        layerscale_init: float = 1e-5,
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps)
        self.attn = Attention(dim, num_heads, qk_norm=qk_norm, qk_norm_eps=1e-5)
        self.ls1 = LayerScale(dim, layerscale_init)
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))
        self.ls2 = LayerScale(dim, layerscale_init)

    def forward(self, x: Tensor, attend: AttendFn) -> Tensor:
        """x: ``[N, T, C]``.

        Inside ``fusion.fused_blocks(...)`` (the CUDA-graph frame step) a block whose attention is a
        ``SplitAttend`` runs as two compiled regions around the attention call (the camera head's trunk
        too, in fp32); everywhere else (CPU, phase 1) exactly the ops below run, so eager numbers
        never change.
        """
        fused = active_fusion()
        if fused is not None and isinstance(attend, SplitAttend):
            return fused.block(self, x, attend)
        x = x + self.ls1(self.attn(self.norm1(x), attend))
        return x + self.ls2(self.mlp(self.norm2(x)))


def sdpa_tokens(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Plain softmax attention on token-major ``[N, T, H, D]`` tensors (scale 1/√D, no mask); in a frame step
    whose fusion says so, by our kernel where cuDNN's query tiles would spill into a second wave
    (``frame_tiles.py``)."""
    fusion = active_fusion()
    if fusion is not None and fusion.frame_tiles:
        from .frame_tiles import our_rows, tiles_attention

        rows = our_rows(q)
        out = tiles_attention(q, k, v, rows) if rows else None
        if out is not None:
            return out  # [N, T, H, D]
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))  # [N, H, T, D]
    return out.transpose(1, 2)  # [N, T, H, D]


class SplitAttend:
    """An attention callable in two parts: a rotation of q and k (``rope``) and the attention proper.

    Calling it does exactly what the closures of earlier versions did (RoPE, cast q and k to v's
    dtype, attend). The split exists so that the fused block path can do the rotation and the cast
    inside its own compiled kernels and call only ``core`` (an opaque region for the compiler).
    """

    def __init__(self, rope: RopeApplier | None, core: AttendFn) -> None:
        self.rope = rope
        self.core = core  # q, k, v already rotated and in v's dtype -> output, same layout as q

    def __call__(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        if self.rope is not None:
            q, k = self.rope(q), self.rope(k)
        return self.core(q.to(v.dtype), k.to(v.dtype), v)


def dense_attend(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Attention of the DINO blocks: every token of a frame to every token of the frame."""
    return sdpa_tokens(q, k, v)


DENSE_ATTEND = SplitAttend(None, sdpa_tokens)  # the DINO blocks' attention, fusable (no RoPE, no cast)


def frame_attend(rope: RopeApplier | None) -> SplitAttend:
    """Frame-block attention: 2D RoPE on q and k, then each frame attends only to itself.

    q and k are cast to v's dtype after RoPE: under autocast LayerNorm returns fp32, v is the
    lower-precision linear output, and SDPA needs one dtype.
    """
    return SplitAttend(rope, sdpa_tokens)


def global_attend(block_idx: int, rope: RopeApplier | None, global_attention: GlobalAttention) -> SplitAttend:
    """Global-block attention: 3D RoPE, then the injected cache/backend sees ``[T, H, D]``.

    Input here is ``[1, S·P, H, D]`` (the whole call as one sequence). q and k are cast to v's dtype
    *before* the cache so it stores K in the model dtype (never silently fp32 under autocast).
    RoPE is elementwise, so rotating the ``[1, T, H, D]`` tensor equals rotating its ``[T, H, D]`` view.
    """

    def core(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return global_attention(block_idx, q[0], k[0], v[0])[None]  # [1, T, H, D]

    return SplitAttend(rope, core)
