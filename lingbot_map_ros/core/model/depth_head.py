"""DPT depth head (docs/model.md §13): four aggregated token maps -> per-pixel depth and confidence.

Optional for the node (poses do not need it) but required for depth output and windowed alignment.
Runs in fp32 with autocast off on chunks of 8 frames (memory only; no numerical effect).
Its feature maps are channels-last from the start (the token maps ``[n, patches, C]`` reshape to an
NCHW-shaped view with NHWC strides), so cuDNN runs NHWC convolutions; ``use_channels_last`` gives the
weights that layout too (the runtime's choice on CUDA), or cuDNN converts every filter on every call.
Reproduces the in-place-ReLU residual quirk (§16 #7): the skip of a residual unit adds ``relu(x)``.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .fusion import active_fusion
from .rope import SIZES_KEPT
from .table_cache import TableCache

FRAME_CHUNK = 8
OUTPUT_HIDDEN = 32  # channels between the two output convolutions (fixed in the official head)


def _upsample(x: Tensor, size: tuple[int, int]) -> Tensor:
    return F.interpolate(x, size=size, mode="bilinear", align_corners=True)


def sincos_position_codes(
    channels: int, h: int, w: int, image_h: int, image_w: int, dtype: torch.dtype
) -> tuple[Tensor, Tensor]:
    """Separable position code of a feature map of an ``image_h×image_w`` image (§13, "PE").

    Returns ``code_u [C/2, w]`` (channels ``[0, C/2)``, vary along columns) and ``code_v [C/2, h]``
    (channels ``[C/2, C)``, vary along rows). Coordinates are aspect-aware and generated in ``dtype``;
    each is encoded with ``C/4`` float64 frequencies ``1/100^(m/n)`` as ``[sin..., cos...]`` and the
    result rounded once to ``dtype``.
    """
    if channels % 4 != 0:
        raise ValueError(f"position-map channels must be divisible by 4 (got {channels})")
    aspect = image_w / image_h
    diag = math.sqrt(aspect * aspect + 1.0)
    span_u = (aspect / diag) * (w - 1) / w
    span_v = (1.0 / diag) * (h - 1) / h
    u = torch.linspace(-span_u, span_u, w, dtype=dtype)  # [w]
    v = torch.linspace(-span_v, span_v, h, dtype=dtype)  # [h]
    n = channels // 4
    omega = 1.0 / (100.0 ** (torch.arange(n, dtype=torch.float64) / n))  # [n]

    def encode(z: Tensor) -> Tensor:
        ang = z.to(torch.float64)[:, None] * omega[None, :]  # [len, n]
        return torch.cat([ang.sin(), ang.cos()], dim=1).to(dtype).T.contiguous()  # [2n, len]

    return encode(u), encode(v)


def sincos_position_map(channels: int, h: int, w: int, image_h: int, image_w: int, dtype: torch.dtype) -> Tensor:
    """The full ``[C, h, w]`` position map (materialised; the head itself adds it by broadcasting)."""
    code_u, code_v = sincos_position_codes(channels, h, w, image_h, image_w, dtype)
    half = channels // 2
    return torch.cat([code_u[:, None, :].expand(half, h, w), code_v[:, :, None].expand(half, h, w)], dim=0)


class ResidualConvUnit(nn.Module):
    """``relu(x) + conv2(relu(conv1(relu(x))))`` — the skip adds relu(x) (official in-place ReLU)."""

    def __init__(self, features: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(features, features, 3, padding=1)
        self.conv2 = nn.Conv2d(features, features, 3, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        x = torch.relu(x)
        return x + self.conv2(torch.relu(self.conv1(x)))


class FeatureFusionBlock(nn.Module):
    """``out_conv(up(RCU₂(a + RCU₁(b)), size))``; refinenet4 has no RCU₁ (and no keys for it)."""

    def __init__(self, features: int, has_skip: bool = True) -> None:
        super().__init__()
        if has_skip:
            self.resConfUnit1 = ResidualConvUnit(features)
        self.resConfUnit2 = ResidualConvUnit(features)
        self.out_conv = nn.Conv2d(features, features, 1)

    def forward(self, a: Tensor, b: Tensor | None, size: tuple[int, int]) -> Tensor:
        x = a if b is None else a + self.resConfUnit1(b)
        x = _upsample(self.resConfUnit2(x), size)
        return self.out_conv(x)


class Scratch(nn.Module):
    """Container so the keys read ``scratch.layerN_rn`` / ``scratch.refinenetN`` / ``scratch.output_conv*``."""

    def __init__(self, in_channels: tuple[int, int, int, int], features: int) -> None:
        super().__init__()
        self.layer1_rn = nn.Conv2d(in_channels[0], features, 3, padding=1, bias=False)
        self.layer2_rn = nn.Conv2d(in_channels[1], features, 3, padding=1, bias=False)
        self.layer3_rn = nn.Conv2d(in_channels[2], features, 3, padding=1, bias=False)
        self.layer4_rn = nn.Conv2d(in_channels[3], features, 3, padding=1, bias=False)
        self.refinenet1 = FeatureFusionBlock(features)
        self.refinenet2 = FeatureFusionBlock(features)
        self.refinenet3 = FeatureFusionBlock(features)
        self.refinenet4 = FeatureFusionBlock(features, has_skip=False)
        self.output_conv1 = nn.Conv2d(features, features // 2, 3, padding=1)
        self.output_conv2 = nn.Sequential(
            nn.Conv2d(features // 2, OUTPUT_HIDDEN, 3, padding=1), nn.ReLU(), nn.Conv2d(OUTPUT_HIDDEN, 2, 1)
        )


class DPTDepthHead(nn.Module):
    def __init__(
        self,
        dim_in: int = 2048,
        patch_size: int = 14,
        features: int = 256,
        out_channels: tuple[int, int, int, int] = (256, 512, 1024, 1024),
        patch_start_idx: int = 6,
    ) -> None:
        super().__init__()
        self.patch_size = patch_size
        self.patch_start_idx = patch_start_idx
        self.norm = nn.LayerNorm(dim_in, eps=1e-5)
        self.projects = nn.ModuleList(nn.Conv2d(dim_in, oc, 1) for oc in out_channels)
        self.resize_layers = nn.ModuleList(
            [
                nn.ConvTranspose2d(out_channels[0], out_channels[0], 4, stride=4),
                nn.ConvTranspose2d(out_channels[1], out_channels[1], 2, stride=2),
                nn.Identity(),  # no keys at index 2
                nn.Conv2d(out_channels[3], out_channels[3], 3, stride=2, padding=1),
            ]
        )
        # frames per call (phase 1 has several): the memory budget lowers it (docs/memory.md)
        self.frame_chunk = FRAME_CHUNK
        self.channels_last = False  # the convolution weights' layout (use_channels_last)
        self.scratch = Scratch(out_channels, features)
        # 4 token maps per frame size; a few sizes' worth (least recently used dropped first)
        self._pe_cache: TableCache[tuple[Tensor, Tensor]] = TableCache(4 * SIZES_KEPT)

    def use_channels_last(self, on: bool) -> None:
        """Give the convolution weights channels-last layout (or back): values unchanged, new storage,
        so call it before a CUDA graph captures the head (the session does, at each model call)."""
        if on != self.channels_last:
            self.to(memory_format=torch.channels_last if on else torch.contiguous_format)
            self.channels_last = on

    def forward(self, token_list: list[Tensor], image_hw: tuple[int, int]) -> tuple[Tensor, Tensor]:
        """token_list: 4 × ``[S, P, dim_in]`` -> depth ``[S, H, W]``, confidence ``[S, H, W]`` (fp32)."""
        if len(token_list) != 4:
            raise ValueError(f"the DPT head needs 4 token maps (got {len(token_list)})")
        S = token_list[0].shape[0]
        step = max(1, int(self.frame_chunk))  # frames per call: each frame's maps are independent
        depths, confs = [], []
        with torch.autocast(device_type=token_list[0].device.type, enabled=False):
            for start in range(0, S, step):
                chunk = [t[start : start + step].float() for t in token_list]
                d, c = self._forward_chunk(chunk, image_hw)
                depths.append(d)
                confs.append(c)
        return torch.cat(depths, dim=0), torch.cat(confs, dim=0)

    def _pe_codes(self, image_hw: tuple[int, int], device: torch.device,
                  dtype: torch.dtype = torch.float32) -> list[tuple[Tensor, Tensor]]:
        """``0.1·PE`` as its two codes (``sincos_position_codes``) for every map the head adds it to: the
        four projected token maps, then the output features. Cached per shape, image, dtype and device,
        and looked up here on the host so that the head's arithmetic (``dpt_chunk``) is a pure function."""
        H, W = image_hw
        ph, pw = H // self.patch_size, W // self.patch_size
        shapes = [(p.out_channels, ph, pw) for p in self.projects] + [(self.scratch.output_conv1.out_channels, H, W)]

        def codes(C: int, h: int, w: int) -> tuple[Tensor, Tensor]:
            def build() -> tuple[Tensor, Tensor]:
                cu, cv = sincos_position_codes(C, h, w, H, W, dtype)
                return cu.to(device) * 0.1, cv.to(device) * 0.1  # scaled once, same products as x's dtype

            return self._pe_cache.get_or_build((C, h, w, image_hw, dtype, str(device)), build)

        return [codes(*shape) for shape in shapes]

    def _forward_chunk(self, tokens: list[Tensor], image_hw: tuple[int, int]) -> tuple[Tensor, Tensor]:
        codes = self._pe_codes(image_hw, tokens[0].device, tokens[0].dtype)
        fusion = active_fusion()
        if fusion is not None and tokens[0].is_cuda:  # the graph step: compiled (fused elementwise work)
            return fusion.depth_chunk(dpt_chunk, self, tokens, codes, image_hw)
        return dpt_chunk(self, tokens, codes, image_hw)


def _add_pe(x: Tensor, code: tuple[Tensor, Tensor]) -> Tensor:
    """``x + 0.1·PE`` without materialising PE (``code``: the two scaled codes of ``x``'s shape)."""
    cu, cv = code
    half = x.shape[1] // 2
    return torch.cat([x[:, :half] + cu[None, :, None, :], x[:, half:] + cv[None, :, :, None]], dim=1)


def dpt_chunk(head: DPTDepthHead, tokens: list[Tensor], codes: list[tuple[Tensor, Tensor]],
              image_hw: tuple[int, int]) -> tuple[Tensor, Tensor]:
    """The head's arithmetic on one chunk of frames: 4 × ``[n, P, dim_in]`` fp32 -> depth, confidence
    ``[n, H, W]``. A pure function of its tensors (``codes``: ``DPTDepthHead._pe_codes``), so the graph
    step can compile it (``fusion.BlockFusion.depth_chunk``) and the eager path runs it as it is."""
    H, W = image_hw
    ph, pw = H // head.patch_size, W // head.patch_size
    layers = []
    for level, t in enumerate(tokens):
        x = head.norm(t[:, head.patch_start_idx :])  # [n, Np, 2C]
        x = x.transpose(1, 2).reshape(x.shape[0], x.shape[2], ph, pw)  # [n, 2C, ph, pw]
        x = _add_pe(head.projects[level](x), codes[level])  # [n, oc_l, ph, pw]
        layers.append(head.resize_layers[level](x))
    s = head.scratch
    l1, l2, l3, l4 = s.layer1_rn(layers[0]), s.layer2_rn(layers[1]), s.layer3_rn(layers[2]), s.layer4_rn(layers[3])
    o = s.refinenet4(l4, None, tuple(l3.shape[2:]))
    o = s.refinenet3(o, l3, tuple(l2.shape[2:]))
    o = s.refinenet2(o, l2, tuple(l1.shape[2:]))
    o = s.refinenet1(o, l1, (2 * l1.shape[2], 2 * l1.shape[3]))
    o = _upsample(s.output_conv1(o), (H, W))  # [n, F/2, H, W]
    o = s.output_conv2(_add_pe(o, codes[-1]))  # [n, 2, H, W]
    return torch.exp(o[:, 0]), 1 + torch.exp(o[:, 1])
