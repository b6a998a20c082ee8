"""Camera head (CameraCausalHead, docs/model.md §10): camera tokens -> 9-D pose encodings.

The head refines a pose encoding over ``K`` iterations; each iteration modulates the (normalised)
camera token with the current estimate (adaLN), runs a small trunk whose attention is causal over
the frames of the session, and adds a correction. Which earlier frames the trunk can see is the
injected :class:`CameraAttention`'s business (one cache per iteration, no eviction, §10.3).

The head always runs in fp32 with autocast off (the official recipe): inputs are upcast, the head's
weights are expected to be fp32.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from .blocks import Block, Mlp, SplitAttend
from .interfaces import CameraAttention

POSE_DIM = 9  # t(3), quaternion xyzw(4), fov_h, fov_w
FOV_START = 7  # channels 7..8 get a ReLU


def activate_pose(p: Tensor) -> Tensor:
    """Identity on translation and quaternion, ReLU on the two FoV channels."""
    return torch.cat([p[..., :FOV_START], torch.relu(p[..., FOV_START:])], dim=-1)


class CameraCausalHead(nn.Module):
    def __init__(
        self,
        dim: int = 2048,
        num_heads: int = 16,
        trunk_depth: int = 4,
        mlp_ratio: float = 4.0,
        layerscale_init: float = 0.01,
    ) -> None:
        super().__init__()
        self.dim = dim
        self.trunk = nn.ModuleList(
            Block(dim, num_heads, mlp_ratio=mlp_ratio, norm_eps=1e-5, qk_norm=False, layerscale_init=layerscale_init)
            for _ in range(trunk_depth)
        )
        self.token_norm = nn.LayerNorm(dim, eps=1e-5)
        self.trunk_norm = nn.LayerNorm(dim, eps=1e-5)
        self.adaln_norm = nn.LayerNorm(dim, eps=1e-6, elementwise_affine=False)
        self.empty_pose_tokens = nn.Parameter(torch.zeros(1, 1, POSE_DIM))
        self.embed_pose = nn.Linear(POSE_DIM, dim)
        self.poseLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(dim, 3 * dim))  # key index .1
        self.pose_branch = Mlp(dim, dim // 2, POSE_DIM)

    def forward(
        self, camera_tokens: Tensor, camera_attention: CameraAttention, num_iterations: int = 4
    ) -> list[Tensor]:
        """camera_tokens ``[S, 2C]`` (camera row of the last aggregated output) -> activated pose per
        iteration ``[S, 9]``."""
        if num_iterations < 1:
            raise ValueError(f"num_iterations must be >= 1 (got {num_iterations})")
        with torch.autocast(device_type=camera_tokens.device.type, enabled=False):
            c = self.token_norm(camera_tokens.float())  # [S, 2C]
            S = c.shape[0]
            c_norm = self.adaln_norm(c)  # [S, 2C] same every iteration
            raw: Tensor | None = None  # running pre-activation encoding [S, 9]
            outputs: list[Tensor] = []
            for it in range(num_iterations):
                if raw is None:
                    e = self.embed_pose(self.empty_pose_tokens[0].expand(S, POSE_DIM))  # [S, 2C]
                else:
                    e = self.embed_pose(raw)  # [S, 2C] fed with the raw (not activated) estimate
                shift, scale, gate = self.poseLN_modulation(e).chunk(3, dim=-1)  # each [S, 2C]
                x = gate * (c_norm * (1 + scale) + shift) + c  # [S, 2C]; every iteration restarts from ĉ
                x = x[None]  # [1, S, 2C]
                for b, block in enumerate(self.trunk):
                    x = block(x, _camera_attend(it, b, camera_attention))
                delta = self.pose_branch(self.trunk_norm(x[0]))  # [S, 9]
                raw = delta if raw is None else raw + delta
                outputs.append(activate_pose(raw))
        return outputs


def _camera_attend(iteration: int, block: int, camera_attention: CameraAttention) -> SplitAttend:
    """Adapt the ``[1, S, H, D]`` block layout to the ``[S, H, D]`` camera-attention seam.

    A ``SplitAttend`` without RoPE (its cast to v's dtype is a no-op in fp32): inside the graph step's
    fused blocks the trunk's LayerNorms, LayerScales, residuals and GELU then run as a few compiled
    kernels around the camera attention instead of ~10 small ones a block (``fusion.py``)."""

    def attend(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return camera_attention(iteration, block, q[0], k[0], v[0])[None]  # [1, S, H, D]

    return SplitAttend(None, attend)
