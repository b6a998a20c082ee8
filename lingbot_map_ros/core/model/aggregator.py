"""The aggregator: patch tokens + special tokens through alternating frame / global blocks (docs/model.md §4, §6, §8).

Everything stream-related (which variant a frame's special tokens take, which RoPE frame index it
gets, what the global blocks can see) is decided by the caller and passed in per frame: the
aggregator itself is stateless, so the same weights serve one-shot inference, streaming through a
paged cache and the test references.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from ..config import IMAGENET_MEAN, IMAGENET_STD, ModelConfig
from .blocks import Block, frame_attend, global_attend
from .interfaces import GlobalAttention
from .patch_embed import DinoV2Backbone
from .rope import DEFAULT_MAX_POSITIONS, Rope2D, Rope3D

ROPE_3D_BANDS = (20, 22, 22)  # time, height, width sub-dimensions for head dim 64 (§7.2)


class Aggregator(nn.Module):
    """Frames ``[S, 3, H, W]`` in [0, 1] -> list of ``[S, P, 2C]``
    (``[frame_out ‖ global_out]`` of ``cfg.out_layers``)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        C, R = cfg.embed_dim, cfg.num_register_tokens
        if cfg.head_dim != sum(ROPE_3D_BANDS):
            raise ValueError(
                f"aggregator head dim must be {sum(ROPE_3D_BANDS)} for the RoPE bands (got {cfg.head_dim})"
            )
        if any(not 0 <= i < cfg.depth for i in cfg.out_layers):
            raise ValueError(f"out_layers {cfg.out_layers} must lie in 0..{cfg.depth - 1}")
        self.patch_start_idx = cfg.num_special_tokens
        self.patch_embed = DinoV2Backbone(
            img_size=cfg.img_size,
            patch_size=cfg.patch_size,
            embed_dim=C,
            depth=cfg.dino_depth,
            num_heads=cfg.dino_num_heads,
            mlp_ratio=cfg.mlp_ratio,
            num_register_tokens=R,
            layerscale_init=cfg.layerscale_init,
        )
        # Axis 1 is the variant: 0 = reference frame (camera/registers) or scale frame (scale token).
        self.camera_token = nn.Parameter(torch.zeros(1, 2, 1, C))
        self.register_token = nn.Parameter(torch.zeros(1, 2, R, C))
        self.scale_token = nn.Parameter(torch.zeros(1, 2, 1, C))

        def make_block() -> Block:
            return Block(
                C,
                cfg.num_heads,
                mlp_ratio=cfg.mlp_ratio,
                norm_eps=1e-5,
                qk_norm=True,
                layerscale_init=cfg.layerscale_init,
            )

        self.frame_blocks = nn.ModuleList(make_block() for _ in range(cfg.depth))
        self.global_blocks = nn.ModuleList(make_block() for _ in range(cfg.depth))
        self.rope2d = Rope2D(cfg.head_dim, cfg.rope_2d_base, self.patch_start_idx)
        self.rope3d = Rope3D(cfg.head_dim, cfg.rope_3d_base, ROPE_3D_BANDS, self.patch_start_idx)
        self.reset_buffers()

    def reset_buffers(self, device: torch.device | str | None = None) -> None:
        """(Re)create the normalisation constants; needed after building on the meta device.

        Non-persistent (they are not in the checkpoint) and kept fp32 so the exact constants are used
        even when the weights are cast to bf16 (docs/model.md §2.2, §16 #6).
        """
        if device is None:
            device = self.camera_token.device
        mean = torch.tensor(IMAGENET_MEAN, dtype=torch.float32, device=device).view(1, 3, 1, 1)
        std = torch.tensor(IMAGENET_STD, dtype=torch.float32, device=device).view(1, 3, 1, 1)
        self.register_buffer("_resnet_mean", mean, persistent=False)
        self.register_buffer("_resnet_std", std, persistent=False)

    def special_tokens(self, camera_variant: Tensor, scale_variant: Tensor) -> Tensor:
        """``[S, 6, C]`` = [camera, register0..R-1, scale] with per-frame variants (§6)."""
        cam = self.camera_token[0, camera_variant]  # [S, 1, C]
        reg = self.register_token[0, camera_variant]  # [S, R, C]
        scale = self.scale_token[0, scale_variant]  # [S, 1, C]
        return torch.cat([cam, reg, scale], dim=1)  # [S, 6, C]

    def forward(
        self,
        images: Tensor,
        *,
        rope_frames: Tensor,
        camera_variant: Tensor,
        scale_variant: Tensor,
        global_attention: GlobalAttention,
        max_positions: int = DEFAULT_MAX_POSITIONS,
        validate: bool = True,
    ) -> list[Tensor]:
        """``validate=False`` skips the value checks that read tensors back to the host (a GPU sync,
        forbidden inside CUDA-graph capture); the streaming session guarantees those ranges itself."""
        S, ph, pw = self._check_inputs(images, rope_frames, camera_variant, scale_variant, check_values=validate)
        # Build/validate RoPE first: an out-of-range frame index must fail before any compute.
        self.rope3d.applier(rope_frames, ph, pw, images.device, max_positions, check=validate)
        tokens = self.embed(images, camera_variant, scale_variant)  # [S, P, C]
        return self.attend(tokens, (ph, pw), rope_frames=rope_frames, global_attention=global_attention,
                           max_positions=max_positions, check_rope=False)  # checked above

    def embed(self, images: Tensor, camera_variant: Tensor, scale_variant: Tensor) -> Tensor:
        """The first half of ``forward``: frames ``[S, 3, H, W]`` in [0, 1] -> ``[S, P, C]`` (special
        tokens, then the DINO patch tokens). It depends on the frames alone, never on the cache: the
        CUDA-graph step runs it as a graph of its own while the host plans the cache's step."""
        x = (images.float() - self._resnet_mean) / self._resnet_std  # [S, 3, H, W]
        x = x.to(self.patch_embed.patch_embed.proj.weight.dtype)
        patches = self.patch_embed(x)  # [S, Np, C]
        specials = self.special_tokens(camera_variant.to(images.device), scale_variant.to(images.device))  # [S, 6, C]
        return torch.cat([specials, patches], dim=1)  # [S, P, C] (dtype promotion as in the official model)

    def attend(
        self,
        tokens: Tensor,
        patch_grid: tuple[int, int],
        *,
        rope_frames: Tensor,
        global_attention: GlobalAttention,
        max_positions: int = DEFAULT_MAX_POSITIONS,
        check_rope: bool = True,
    ) -> list[Tensor]:
        """The second half of ``forward``: ``embed``'s tokens ``[S, P, C]`` (``patch_grid``: patch rows
        and columns of a frame) through the alternating frame / global blocks -> list of ``[S, P, 2C]``.
        ``check_rope=False``: the caller guarantees the RoPE range (no read-back: CUDA-graph capture)."""
        S, P, C = tokens.shape
        ph, pw = patch_grid
        rope_g = self.rope3d.applier(rope_frames, ph, pw, tokens.device, max_positions, check=check_rope)
        rope_f = self.rope2d.applier(ph, pw, tokens.device)
        attend_f = frame_attend(rope_f)
        outputs: list[Tensor] = []
        for i in range(self.cfg.depth):
            tokens = self.frame_blocks[i](tokens, attend_f)  # [S, P, C], each frame alone
            frame_out = tokens
            tokens = self.global_blocks[i](tokens.reshape(1, S * P, C), global_attend(i, rope_g, global_attention))
            tokens = tokens.reshape(S, P, C)
            if i in self.cfg.out_layers:
                outputs.append(torch.cat([frame_out, tokens], dim=-1))  # [S, P, 2C]
        return outputs

    def _check_inputs(
        self,
        images: Tensor,
        rope_frames: Tensor,
        camera_variant: Tensor,
        scale_variant: Tensor,
        check_values: bool = True,
    ) -> tuple[int, int, int]:
        if images.dim() != 4 or images.shape[1] != 3:
            raise ValueError(f"images must be [S, 3, H, W] (got {tuple(images.shape)})")
        S, _, H, W = images.shape
        p = self.cfg.patch_size
        if H % p or W % p or H == 0 or W == 0:
            raise ValueError(f"image size {H}x{W} must be positive multiples of the patch size {p}")
        named = (("rope_frames", rope_frames), ("camera_variant", camera_variant), ("scale_variant", scale_variant))
        for name, t in named:
            if t.shape != (S,):
                raise ValueError(f"{name} must have shape [{S}] (got {tuple(t.shape)})")
            if t.dtype not in (torch.int64, torch.int32):
                raise ValueError(f"{name} must be an integer tensor (got {t.dtype})")
        for name, t in (("camera_variant", camera_variant), ("scale_variant", scale_variant)):
            if check_values and S and (int(t.min()) < 0 or int(t.max()) > 1):
                raise ValueError(f"{name} values must be 0 or 1")
        return S, H // p, W // p
