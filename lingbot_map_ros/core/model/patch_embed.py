"""Patch embedding: DINOv2 ViT-L/14 with 4 registers, as LingBot-Map builds it (docs/model.md §5).

It turns each normalised frame into one token per 14×14 patch. Registered under the aggregator as
``patch_embed`` so its keys are ``aggregator.patch_embed.*`` (the inner conv is itself called
``patch_embed``, hence ``aggregator.patch_embed.patch_embed.proj``).

The one LingBot-specific detail is the position-embedding resampling (§16 #9): the 37×37 grid is
resized to the input's patch grid by explicit output size with antialiased bicubic in fp32, and only
a 518×518 input uses the table unchanged.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .blocks import DENSE_ATTEND, Block
from .rope import SIZES_KEPT
from .table_cache import TableCache


class PatchConv(nn.Module):
    """``Conv2d(3, C, 14, stride 14)`` + row-major flatten (key ``proj``)."""

    def __init__(self, patch_size: int, embed_dim: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(3, embed_dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)  # [N, Np, C]


def resample_pos_embed(pos_embed: Tensor, ph: int, pw: int, height: int, width: int) -> Tensor:
    """Position embedding for a ``ph×pw`` patch grid from the ``[1, 1+g², C]`` table.

    Unchanged only when the grid is the table's own (Np == g²) and the image is square; otherwise the
    grid part is resampled in fp32 (bicubic, antialias, size-based, align_corners=False). The result
    stays fp32; the caller casts it to the token dtype.
    """
    n_grid = pos_embed.shape[1] - 1
    grid = int(round(n_grid**0.5))
    if grid * grid != n_grid:
        raise ValueError(f"pos_embed grid part has {n_grid} entries, not a square")
    if ph * pw == n_grid and height == width:
        return pos_embed
    cls_pe = pos_embed[:, :1]  # [1, 1, C]
    C = pos_embed.shape[2]
    patch_pe = pos_embed[:, 1:].reshape(1, grid, grid, C).permute(0, 3, 1, 2).float()  # [1, C, g, g]
    patch_pe = F.interpolate(patch_pe, size=(ph, pw), mode="bicubic", antialias=True, align_corners=False)
    patch_pe = patch_pe.permute(0, 2, 3, 1).reshape(1, ph * pw, C)  # [1, Np, C]
    return torch.cat([cls_pe.to(patch_pe.dtype), patch_pe], dim=1)  # [1, 1+Np, C]


class DinoV2Backbone(nn.Module):
    """ViT with registers; outputs only the patch rows after the final norm."""

    def __init__(
        self,
        *,
        img_size: int = 518,
        patch_size: int = 14,
        embed_dim: int = 1024,
        depth: int = 24,
        num_heads: int = 16,
        mlp_ratio: float = 4.0,
        num_register_tokens: int = 4,
        layerscale_init: float = 1.0,
    ) -> None:
        super().__init__()
        self.patch_size = patch_size
        self.num_register_tokens = num_register_tokens
        grid = img_size // patch_size
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, 1 + grid * grid, embed_dim))
        self.register_tokens = nn.Parameter(torch.zeros(1, num_register_tokens, embed_dim))
        self.mask_token = nn.Parameter(torch.zeros(1, embed_dim))  # never used at inference; kept for the keys
        self.patch_embed = PatchConv(patch_size, embed_dim)
        self.blocks = nn.ModuleList(
            Block(
                embed_dim, num_heads, mlp_ratio=mlp_ratio, norm_eps=1e-6, qk_norm=False, layerscale_init=layerscale_init
            )
            for _ in range(depth)
        )
        self.norm = nn.LayerNorm(embed_dim, eps=1e-6)
        # resampled position tables per (grid, image, dtype, device, weights): (the source it was built
        # from, the table); the source is held so that its address cannot be reused while the key names it
        self._pos_tables: TableCache[tuple[Tensor, Tensor]] = TableCache(SIZES_KEPT)

    def position_table(self, ph: int, pw: int, height: int, width: int, dtype: torch.dtype) -> Tensor:
        """``resample_pos_embed(...)`` cast to ``dtype``, ``[1, 1+Np, C]``, built once per frame size.

        Why: the resampling (antialiased bicubic over the 37×37 table) ran on every frame, ~65 µs of
        the H200's frame step for a table that only changes with the size or the weights (a load or a
        cast bumps the parameter's version or moves it: a new key)."""
        source = self.pos_embed.detach()  # shares the storage and the version counter
        key = (ph, pw, height, width, dtype, source.device, source.dtype, source.data_ptr(), source._version)

        def build() -> tuple[Tensor, Tensor]:
            with torch.no_grad():
                return source, resample_pos_embed(source, ph, pw, height, width).to(dtype)

        return self._pos_tables.get_or_build(key, build)[1]

    def forward(self, x: Tensor) -> Tensor:
        """x: normalised ``[N, 3, H, W]`` (H, W multiples of the patch size) -> ``[N, Np, C]``."""
        N, _, H, W = x.shape
        ph, pw = H // self.patch_size, W // self.patch_size
        tokens = self.patch_embed(x)  # [N, Np, C]
        tokens = torch.cat([self.cls_token.expand(N, -1, -1).to(tokens.dtype), tokens], dim=1)  # [N, 1+Np, C]
        tokens = tokens + self.position_table(ph, pw, H, W, tokens.dtype)
        regs = self.register_tokens.expand(N, -1, -1).to(tokens.dtype)  # [N, R, C]
        tokens = torch.cat([tokens[:, :1], regs, tokens[:, 1:]], dim=1)  # [N, 1+R+Np, C]
        for block in self.blocks:
            tokens = block(tokens, DENSE_ATTEND)
        tokens = self.norm(tokens)
        return tokens[:, 1 + self.num_register_tokens :]  # [N, Np, C]
