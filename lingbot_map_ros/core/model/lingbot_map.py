"""LingBot-Map streaming model: aggregator + camera head (+ optional DPT depth head).

Submodule names make ``state_dict()`` keys identical to the official checkpoint (docs/model.md §3.2).
The model holds no streaming state: frame indices, token variants and the two attention seams come
from the caller (the streaming session, or a test reference).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor, nn

from ..config import ModelConfig
from .aggregator import Aggregator
from .blocks import LayerScale
from .camera_head import CameraCausalHead
from .depth_head import DPTDepthHead
from .interfaces import CameraAttention, GlobalAttention
from .rope import DEFAULT_MAX_POSITIONS

MAX_CAMERA_ITERATIONS = 4


@dataclass
class ModelOutput:
    pose_enc: Tensor  # [S, 9] fp32, last refinement iteration
    depth: Tensor | None = None  # [S, H, W] fp32; None when not requested or no depth head
    depth_conf: Tensor | None = None  # [S, H, W] fp32


class LingBotMap(nn.Module):
    def __init__(self, cfg: ModelConfig, *, enable_depth: bool = True) -> None:
        super().__init__()
        self.cfg = cfg
        self.aggregator = Aggregator(cfg)
        self.camera_head = CameraCausalHead(
            cfg.camera_dim, cfg.camera_num_heads, cfg.camera_trunk_depth, cfg.mlp_ratio, cfg.layerscale_init
        )
        self.depth_head: DPTDepthHead | None = (
            DPTDepthHead(
                cfg.camera_dim,
                cfg.patch_size,
                cfg.depth_features,
                tuple(cfg.depth_out_channels),
                cfg.num_special_tokens,
            )
            if enable_depth
            else None
        )

    @property
    def has_depth(self) -> bool:
        return self.depth_head is not None

    def forward(
        self,
        images: Tensor,
        *,
        rope_frames: Tensor,
        camera_variant: Tensor,
        scale_variant: Tensor,
        global_attention: GlobalAttention,
        camera_attention: CameraAttention,
        num_iterations: int = 4,
        with_depth: bool = False,
        max_positions: int = DEFAULT_MAX_POSITIONS,
        validate: bool = True,
        depth_stream: torch.cuda.Stream | None = None,
        depth_frames: Sequence[int] | None = None,
    ) -> ModelOutput:
        """images ``[S, 3, H, W]`` in [0, 1]; per-frame ``rope_frames``/``camera_variant``/``scale_variant`` ``[S]``.

        ``depth_frames`` (with ``with_depth``): the frames the depth head runs on, in this order (None:
        all); ``depth`` then has one row per listed frame. A batched step of several streams
        (``core/stream_group.py``) runs it on the frames whose stream asks for depth at this step.

        ``depth_stream`` (CUDA): the depth head runs there, beside the camera head on the current
        stream. The camera head is a chain of small kernels over one token per frame that leaves most
        of the GPU idle; the depth head fills it. Both read the aggregator's tokens only, and the
        current stream waits for the depth head before returning, so the caller sees one step."""
        _check_iterations(num_iterations)
        layers = self.aggregator(
            images,
            rope_frames=rope_frames,
            camera_variant=camera_variant,
            scale_variant=scale_variant,
            global_attention=global_attention,
            max_positions=max_positions,
            validate=validate,
        )  # list of [S, P, 2C]
        return self._heads(layers, (images.shape[2], images.shape[3]), camera_attention, num_iterations,
                           with_depth, depth_stream, depth_frames)

    def embed(self, images: Tensor, camera_variant: Tensor, scale_variant: Tensor) -> Tensor:
        """``forward`` up to the tokens that enter the first block: images ``[S, 3, H, W]`` -> ``[S, P, C]``.
        The image encoder (DINO) reads the frames only, never the caches, so the CUDA-graph step runs
        it as a graph of its own while the host still plans the step (``cuda_graph.py``)."""
        return self.aggregator.embed(images, camera_variant, scale_variant)

    def forward_embedded(
        self,
        tokens: Tensor,
        image_hw: tuple[int, int],
        *,
        rope_frames: Tensor,
        global_attention: GlobalAttention,
        camera_attention: CameraAttention,
        num_iterations: int = 4,
        with_depth: bool = False,
        max_positions: int = DEFAULT_MAX_POSITIONS,
        depth_stream: torch.cuda.Stream | None = None,
        depth_frames: Sequence[int] | None = None,
    ) -> ModelOutput:
        """The rest of ``forward`` from ``embed``'s tokens ``[S, P, C]`` of ``image_hw`` frames; no checks
        that read tensors back (the graph step's caller guarantees the ranges):
        ``forward(images, ...) == forward_embedded(embed(images, ...), ...)``, kernel for kernel."""
        _check_iterations(num_iterations)
        grid = (image_hw[0] // self.cfg.patch_size, image_hw[1] // self.cfg.patch_size)
        layers = self.aggregator.attend(tokens, grid, rope_frames=rope_frames, global_attention=global_attention,
                                        max_positions=max_positions, check_rope=False)  # list of [S, P, 2C]
        return self._heads(layers, image_hw, camera_attention, num_iterations, with_depth, depth_stream, depth_frames)

    def _heads(self, layers: list[Tensor], hw: tuple[int, int], camera_attention: CameraAttention,
               num_iterations: int, with_depth: bool, depth_stream: torch.cuda.Stream | None,
               depth_frames: Sequence[int] | None = None) -> ModelOutput:
        """The camera head (and the depth head when asked) over the aggregator's layers ``[S, P, 2C]``."""
        depth_here = with_depth and self.depth_head is not None and (depth_frames is None or len(depth_frames) > 0)
        if depth_here and depth_frames is not None and list(depth_frames) != list(range(layers[0].shape[0])):
            n = len(depth_frames)
            if list(depth_frames) == list(range(n)):  # the leading frames (a captured batch puts them first): views
                depth_layers = [layer[:n] for layer in layers]  # [n, P, 2C] each, no index upload inside a graph
            else:
                index = torch.tensor(list(depth_frames), dtype=torch.long, device=layers[0].device)  # [n]
                depth_layers = [layer.index_select(0, index) for layer in layers]  # [n, P, 2C] each
            poses = self.camera_head(layers[-1][:, 0], camera_attention, num_iterations)
            depth, depth_conf = self.depth_head(depth_layers, hw)
            return ModelOutput(pose_enc=poses[-1], depth=depth, depth_conf=depth_conf)
        if depth_here and depth_stream is not None:
            main = torch.cuda.current_stream(layers[-1].device)
            depth_stream.wait_stream(main)  # the tokens are written on the current stream
            with torch.cuda.stream(depth_stream):
                depth, depth_conf = self.depth_head(layers, hw)
            poses = self.camera_head(layers[-1][:, 0], camera_attention, num_iterations)
            main.wait_stream(depth_stream)  # join: the outputs (and the tokens' reuse) come after both heads
            return ModelOutput(pose_enc=poses[-1], depth=depth, depth_conf=depth_conf)
        poses = self.camera_head(layers[-1][:, 0], camera_attention, num_iterations)
        out = ModelOutput(pose_enc=poses[-1])
        if depth_here:
            out.depth, out.depth_conf = self.depth_head(layers, hw)
        return out

    @torch.no_grad()
    def init_weights(self, seed: int = 0) -> None:
        """Deterministic random initialisation (same values on every device for a given seed).

        Values are drawn on the CPU in fp32 from one generator, in ``named_parameters`` order, then
        copied in (and cast to each parameter's dtype): linear/conv weights, position and special
        tokens trunc-normal std 0.02, biases 0, LayerNorm 1/0, LayerScale ``cfg.layerscale_init``,
        unused ``mask_token`` 0. Tokens get std 0.02 (not DINO's 1e-6) so token variants matter
        with random weights.
        """
        gen = torch.Generator(device="cpu").manual_seed(seed)
        layerscale = {id(m.gamma) for m in self.modules() if isinstance(m, LayerScale)}
        norms = {id(p) for m in self.modules() if isinstance(m, nn.LayerNorm) for p in m.parameters(recurse=False)}
        for name, p in self.named_parameters():
            value = torch.empty(p.shape, dtype=torch.float32)
            if id(p) in layerscale:
                value.fill_(self.cfg.layerscale_init)
            elif id(p) in norms:
                value.fill_(1.0 if name.endswith("weight") else 0.0)
            elif name.endswith("bias") or name.endswith("mask_token"):
                value.zero_()
            else:
                _trunc_normal(value, std=0.02, gen=gen)
            p.copy_(value)
        self.aggregator.reset_buffers()


def _check_iterations(num_iterations: int) -> None:
    if not 1 <= num_iterations <= MAX_CAMERA_ITERATIONS:
        raise ValueError(f"num_iterations must be in 1..{MAX_CAMERA_ITERATIONS} (got {num_iterations})")


def _trunc_normal(t: Tensor, std: float, gen: torch.Generator, bound: float = 2.0) -> None:
    """Normal(0, std) truncated to ±bound·std by inverse CDF (one uniform draw per value).

    torch's ``trunc_normal_`` rejection-samples in a Python loop, which takes seconds even for the
    tiny preset; this is one vectorised pass.
    """
    lo = 0.5 * (1.0 + math.erf(-bound / math.sqrt(2.0)))  # Φ(-bound)
    t.uniform_(2 * lo - 1, 1 - 2 * lo, generator=gen)  # = 2Φ(x) - 1 on the allowed range
    t.erfinv_().mul_(std * math.sqrt(2.0)).clamp_(-bound * std, bound * std)
