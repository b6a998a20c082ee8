"""The seams between the model and whatever holds its keys and values.

The model never knows how K/V are stored. Its global blocks and its camera-head trunk call one of
these callables with the current call's q, k, v (after q/k-norm and RoPE) and get the attention
output back. The streaming KV cache implements them over pages; the whole-sequence reference in the
tests implements them with an explicit mask. Both see exactly the same tensors.
"""
from __future__ import annotations

from typing import Protocol

import torch


class GlobalAttention(Protocol):
    def __call__(self, block: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Attention of global block ``block``.

        q, k, v: ``[T, H, D]`` with ``T = S * P`` tokens of the current call, frame-major, each frame
        laid out as ``[camera, register0..3, scale, patch(0,0), ..., patch(ph-1, pw-1)]``. k already
        carries q/k-norm and 3D RoPE; v is raw. Returns ``[T, H, D]`` in q's dtype
        (softmax scale 1/sqrt(D), no mask beyond the visible set).
        """
        ...


class CameraAttention(Protocol):
    def __call__(
        self, iteration: int, block: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        """Attention of camera-head trunk block ``block`` in refinement iteration ``iteration``.

        q, k, v: ``[S, H, D]``, one camera token per frame of the current call. Returns ``[S, H, D]``.
        """
        ...


class DenseGlobalAttention:
    """All tokens of the call attend to all tokens of the call: one-shot (non-streaming) inference."""

    def __call__(self, block: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return _sdpa_tokens(q, k, v)


class DenseCameraAttention:
    def __call__(self, iteration: int, block: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return _sdpa_tokens(q, k, v)


def _sdpa_tokens(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """``[T, H, D]`` token-major SDPA (PyTorch wants ``[B, H, T, D]``: 4-D input keeps CUDA's fast kernels)."""
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], attn_mask=mask
    )  # [1, H, T, D]
    return out[0].transpose(0, 1)
