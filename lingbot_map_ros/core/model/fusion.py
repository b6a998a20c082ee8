"""Fused transformer blocks for the CUDA-graph frame step: ``torch.compile`` of the block bodies.

Eager, one block is ~20 small kernels besides its GEMMs and its attention (LayerNorms, the casts
of the mixed-precision recipe, RoPE's slices/products/stack, LayerScale, residual adds), and the
model has 24 DINO + 48 aggregator blocks. Compiling the two regions of a block around its attention
call fuses them into a handful of Triton kernels:

* ``pre``: ``LN₁ → qkv → q/k-norm → RoPE(q, k) → cast to v's dtype``, returns q, k, v;
* ``post``: ``proj → γ₁ → residual → LN₂ → fc1 → GELU → fc2 → γ₂ → residual``.

The attention itself (``SplitAttend.core``: SDPA, or the paged KV cache with its Python bookkeeping)
stays outside, so the compiler never sees the cache. The regions are pure functions of tensors
(parameters passed in), so one compiled graph serves every block of the same shape: 24 DINO blocks
share one, 24 frame blocks another, 24 global blocks a third, the camera head's 4 trunk blocks x 4
iterations (fp32, autocast off) a fourth. Compilation happens in the warm-up run
before the CUDA graph is captured; the graph then replays the compiled kernels like any other.

Numerics: the regions run the same ops under the same autocast state as the eager blocks, with
Inductor's ``emulate_precision_casts`` so that every bf16 rounding of the eager path is kept
(Inductor would otherwise keep fused intermediates in fp32). Reduction order inside LayerNorm and
GEMM epilogues may differ from the eager kernels, so results match to bf16 rounding, not bit for
bit; the fused path is used only where the eager path also runs in half precision (CUDA).
"""
from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterator, Optional, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .rope import apply_rope_2d, apply_rope_3d


class AttendCall(Protocol):
    """What the fused regions need of a block's attention call (``blocks.SplitAttend``), named here as a
    protocol so that this module never imports ``blocks`` (which imports it)."""

    rope: Optional[Any]  # the block's RoPE applier (``tables``, ``apply_fn``), or None

    def core(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:  # [N, T, H, D] each -> [N, T, H, D]
        ...

_STATE = threading.local()


def active_fusion() -> Optional["BlockFusion"]:
    """The fusion in effect on this thread (None: eager blocks)."""
    return getattr(_STATE, "fusion", None)


@contextlib.contextmanager
def fused_blocks(fusion: Optional["BlockFusion"]) -> Iterator[None]:
    """Run the enclosed model call with ``fusion`` (None leaves the blocks eager)."""
    previous = active_fusion()
    _STATE.fusion = fusion
    try:
        yield
    finally:
        _STATE.fusion = previous


def _pre_qkv(x: Tensor, n1_w: Tensor, n1_b: Tensor, n1_eps: float, qkv_w: Tensor, qkv_b: Tensor) -> Tensor:
    """``x [N, T, C]`` -> ``qkv(norm1(x)) [N, T, 3C]``: the start of ``_pre``, compiled alone for blocks whose
    q/k-norm and RoPE run as one Triton kernel (``qk_rope.py``)."""
    C = x.shape[-1]
    return F.linear(F.layer_norm(x, (C,), n1_w, n1_b, n1_eps), qkv_w, qkv_b)  # [N, T, 3C]


def _pre(
    x: Tensor,
    n1_w: Tensor, n1_b: Tensor, n1_eps: float,
    qkv_w: Tensor, qkv_b: Tensor,
    qn_w: Optional[Tensor], qn_b: Optional[Tensor], kn_w: Optional[Tensor], kn_b: Optional[Tensor], qk_eps: float,
    num_heads: int,
    cos: Optional[Tensor], sin: Optional[Tensor], rotate: Optional[Callable[[Tensor, Tensor, Tensor], Tensor]],
) -> tuple[Tensor, Tensor, Tensor]:
    """``x [N, T, C]`` -> q, k, v ``[N, T, H, D]`` exactly as ``Attention.qkv_heads(norm1(x))`` + RoPE + cast."""
    N, T, C = x.shape
    head_dim = C // num_heads
    qkv = _pre_qkv(x, n1_w, n1_b, n1_eps, qkv_w, qkv_b).reshape(N, T, 3, num_heads, head_dim)  # [N, T, 3, H, D]
    q, k, v = qkv.unbind(dim=2)  # each [N, T, H, D]
    if qn_w is not None:
        q = F.layer_norm(q, (head_dim,), qn_w, qn_b, qk_eps)
        k = F.layer_norm(k, (head_dim,), kn_w, kn_b, qk_eps)
    if rotate is not None:
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
    return q.to(v.dtype), k.to(v.dtype), v


def _post(
    x: Tensor, attn_out: Tensor,
    proj_w: Tensor, proj_b: Tensor, g1: Tensor,
    n2_w: Tensor, n2_b: Tensor, n2_eps: float,
    fc1_w: Tensor, fc1_b: Tensor, fc2_w: Tensor, fc2_b: Tensor, g2: Tensor,
) -> Tensor:
    """``x + γ₁·proj(attn_out)``, then the MLP half of ``Block.forward``; ``attn_out [N, T, H, D]``."""
    C = x.shape[-1]
    x = x + F.linear(attn_out.flatten(-2), proj_w, proj_b) * g1  # [N, T, C]
    h = F.layer_norm(x, (C,), n2_w, n2_b, n2_eps)
    h = F.linear(F.gelu(F.linear(h, fc1_w, fc1_b)), fc2_w, fc2_b)  # [N, T, C]
    return x + h * g2


def allow_recompiles(count: int) -> None:
    """Let each compiled function hold ``count`` shape specialisations (one per frame size, dtype, part count).

    Dynamo's default (8) is below what a node sees over its life (sizes, heads, batch of phase 1), and
    with ``fullgraph=True`` hitting it is an error, not a slow path."""
    import torch._dynamo

    config = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):  # the setting's current and former name
        if hasattr(config, name):
            setattr(config, name, max(getattr(config, name), count))


class BlockFusion:
    """Compiled ``pre``/``post`` regions shared by every block; ``block`` runs one block through them."""

    def __init__(self, *, triton_kernels: bool = False, depth_head: bool = False, frame_tiles: bool = False) -> None:
        """``triton_kernels`` (CUDA with Triton only): our kernels where they apply, the aggregator blocks'
        q/k-norm + RoPE + cast (``qk_rope.py``, after a compiled LN₁ → qkv) instead of Inductor's two
        kernels, and the camera head's fp32 blocks (one token per stream) as four fused GEMVs (``gemv.py``).
        ``depth_head``: the DPT head's arithmetic compiled too (``depth_chunk``); else it runs eager.
        ``frame_tiles`` (Hopper with our Gluon runs kernel): a frame's own attention by that kernel where
        cuDNN's query tiles would spill into a second wave (``frame_tiles.py``)."""
        from ..kernel_cache import use_kernel_cache

        use_kernel_cache()  # compiled kernels kept across processes and reboots (kernel_cache.py)
        # 3 block kinds x a few shapes, plus head room: never fall back to eager silently.
        allow_recompiles(64)
        options = {"emulate_precision_casts": True}
        self.triton_kernels = triton_kernels
        self.frame_tiles = frame_tiles
        self._gemv_max_tokens = 0  # the most camera tokens (streams) the fused GEMVs take; 0: no Triton
        if triton_kernels:
            from .gemv import MAX_TOKENS

            self._gemv_max_tokens = MAX_TOKENS
        self._pre = torch.compile(_pre, fullgraph=True, dynamic=False, options=options)
        self._pre_qkv = torch.compile(_pre_qkv, fullgraph=True, dynamic=False, options=options)
        self._post = torch.compile(_post, fullgraph=True, dynamic=False, options=options)
        self.fuses_depth_head = depth_head
        self._options = options
        self._depth: Optional[Callable[..., tuple[Tensor, Tensor]]] = None  # compiled on first use
        self.calls = 0
        self.depth_calls = 0

    def depth_chunk(self, chunk: Callable[..., tuple[Tensor, Tensor]], head: nn.Module, tokens: list[Tensor],
                    codes: list[tuple[Tensor, Tensor]], image_hw: tuple[int, int]) -> tuple[Tensor, Tensor]:
        """``chunk(head, tokens, codes, image_hw)``, the DPT head's arithmetic (``depth_head.dpt_chunk``,
        handed in: this module never imports the head), compiled when this fusion fuses the depth head.

        Why: eager, the head is its convolutions (cuDNN) plus ~25 elementwise kernels over fp32 maps of
        up to 518x378x128 (ReLUs and residual adds of each fusion block, five bilinear upsamplings whose
        NHWC kernel reads far below the memory's speed, the position codes); Inductor fuses them into
        the upsamplings' neighbours. The head runs beside the camera head and outlasts it, so its time
        is the depth + camera frame's tail. fp32 throughout: the results differ from eager only by the
        order of fp32 additions (LayerNorm, the bilinear weights)."""
        if not self.fuses_depth_head:
            return chunk(head, tokens, codes, image_hw)
        if self._depth is None:
            self._depth = torch.compile(chunk, fullgraph=True, dynamic=False, options=self._options)
        self.depth_calls += 1
        return self._depth(head, tokens, codes, image_hw)

    def block(self, blk: nn.Module, x: Tensor, attend: AttendCall) -> Tensor:
        attn = blk.attn
        qk = not isinstance(attn.q_norm, torch.nn.Identity)
        if (self.triton_kernels and x.is_cuda and x.dtype == torch.float32
                and x.shape[0] * x.shape[1] <= self._gemv_max_tokens
                and not qk and attend.rope is None):
            self.calls += 1
            return _few_token_block(blk, x, attend)
        cos = sin = rotate = None
        if attend.rope is not None:
            # the dtype the eager path rotates in: q/k-norm output (fp32 under autocast), else qkv's
            probe_dtype = _qk_dtype(x, blk, qk)
            cos, sin = attend.rope.tables(probe_dtype)
            rotate = attend.rope.apply_fn
        style = _ROPE_STYLES.get(rotate) if qk and self.triton_kernels and x.is_cuda else None
        if style is not None:
            from .qk_rope import qk_norm_rope

            N, T, C = x.shape
            qkv = self._pre_qkv(x, blk.norm1.weight, blk.norm1.bias, blk.norm1.eps, attn.qkv.weight, attn.qkv.bias)
            qkv = qkv.view(N, T, 3, attn.num_heads, C // attn.num_heads)  # [N, T, 3, H, D]
            q, k = qk_norm_rope(qkv, (attn.q_norm.weight, attn.q_norm.bias), (attn.k_norm.weight, attn.k_norm.bias),
                                attn.q_norm.eps, cos, sin, style)  # each [N, T, H, D]
            v = qkv[:, :, 2]  # [N, T, H, D] view
        else:
            q, k, v = self._pre(
                x, blk.norm1.weight, blk.norm1.bias, blk.norm1.eps, attn.qkv.weight, attn.qkv.bias,
                attn.q_norm.weight if qk else None, attn.q_norm.bias if qk else None,
                attn.k_norm.weight if qk else None, attn.k_norm.bias if qk else None,
                attn.q_norm.eps if qk else 0.0, attn.num_heads, cos, sin, rotate,
            )
        out = attend.core(q, k, v)  # [N, T, H, D], opaque to the compiler
        self.calls += 1
        return self._post(
            x, out, attn.proj.weight, attn.proj.bias, blk.ls1.gamma, blk.norm2.weight, blk.norm2.bias, blk.norm2.eps,
            blk.mlp.fc1.weight, blk.mlp.fc1.bias, blk.mlp.fc2.weight, blk.mlp.fc2.bias, blk.ls2.gamma,
        )


def _few_token_block(blk: nn.Module, x: Tensor, attend: AttendCall) -> Tensor:
    """A camera-trunk block for 1..``MAX_TOKENS`` fp32 tokens ``x [1, S, C]`` (one per stream of the step) in
    four fused GEMVs around the attention: the weights are read once for all the streams."""
    from .gemv import linear_residual, norm_linear

    attn, mlp = blk.attn, blk.mlp
    N, T, C = x.shape
    qkv = norm_linear(x, (blk.norm1.weight, blk.norm1.bias), blk.norm1.eps, attn.qkv.weight, attn.qkv.bias)
    q, k, v = qkv.view(N, T, 3, attn.num_heads, C // attn.num_heads).unbind(2)  # each [1, S, H, D]
    out = attend.core(q, k, v).reshape(N, T, C).contiguous()  # [1, S, C]
    x = linear_residual(out, attn.proj.weight, attn.proj.bias, blk.ls1.gamma, x)
    h = norm_linear(x, (blk.norm2.weight, blk.norm2.bias), blk.norm2.eps, mlp.fc1.weight, mlp.fc1.bias, gelu=True)
    return linear_residual(h, mlp.fc2.weight, mlp.fc2.bias, blk.ls2.gamma, x)  # [1, S, C]


_ROPE_STYLES = {apply_rope_2d: "halves", apply_rope_3d: "pairs"}  # the rotations qk_rope.py implements


def _qk_dtype(x: Tensor, blk: nn.Module, qk_norm: bool) -> torch.dtype:
    """dtype of q after ``qkv`` (+ q-norm) in the eager path, without running it."""
    device_type = x.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.float32 if qk_norm else torch.get_autocast_dtype(device_type)
    return torch.promote_types(x.dtype, blk.attn.qkv.weight.dtype) if not qk_norm else torch.promote_types(
        torch.promote_types(x.dtype, blk.attn.qkv.weight.dtype), blk.attn.q_norm.weight.dtype)


__all__ = ["BlockFusion", "active_fusion", "allow_recompiles", "fused_blocks"]
