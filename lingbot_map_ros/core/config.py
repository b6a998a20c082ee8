"""Every setting of the package in one place: model shapes, cache/stream geometry, runtime choices.

ROS parameters and CLI options map onto these dataclasses one to one (see ``core/settings.py``, the
settings table, and README.md, "The ROS 2 node"); ``validate_*`` functions return human-readable
reasons so the node can reject a parameter change with an explanation instead of crashing later
inside the model.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

PATCH_SIZE = 14
MODEL_WIDTH_PX = 518
SPECIAL_TOKENS_PER_FRAME = 6  # camera, 4 registers, scale
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class ModelConfig:
    """Shapes of the LingBot-Map streaming model. ``full`` equals the official checkpoints."""

    preset: str = "full"
    img_size: int = MODEL_WIDTH_PX  # the model is built for 518 whatever the input height
    patch_size: int = PATCH_SIZE
    embed_dim: int = 1024  # aggregator width C (DINO width too)
    num_heads: int = 16  # aggregator heads; head_dim must stay 64 for the RoPE bands
    depth: int = 24  # frame/global block pairs
    mlp_ratio: float = 4.0
    num_register_tokens: int = 4
    dino_depth: int = 24
    dino_num_heads: int = 16
    out_layers: tuple[int, ...] = (4, 11, 17, 23)  # block pairs whose outputs form the token list
    camera_trunk_depth: int = 4
    camera_num_heads: int = 16
    depth_features: int = 256
    depth_out_channels: tuple[int, int, int, int] = (256, 512, 1024, 1024)
    rope_2d_base: float = 100.0
    rope_3d_base: float = 10000.0
    layerscale_init: float = 0.01

    @property
    def head_dim(self) -> int:
        return self.embed_dim // self.num_heads

    @property
    def camera_dim(self) -> int:
        return 2 * self.embed_dim

    @property
    def camera_head_dim(self) -> int:
        return self.camera_dim // self.camera_num_heads

    @property
    def num_special_tokens(self) -> int:
        return 2 + self.num_register_tokens

    @property
    def pos_embed_grid(self) -> int:
        return self.img_size // self.patch_size  # 37


MODEL_PRESETS: dict[str, ModelConfig] = {
    "full": ModelConfig(preset="full"),
    # Same module structure and key names, small widths/depths: CPU tests and the demo.
    # head_dim stays 64 (2 heads x 64) so the 2D/3D RoPE bands are exactly the official ones.
    "tiny": ModelConfig(
        preset="tiny",
        embed_dim=128,
        num_heads=2,
        depth=4,
        dino_depth=2,
        dino_num_heads=2,
        out_layers=(0, 1, 2, 3),
        camera_trunk_depth=2,
        camera_num_heads=2,
        depth_features=32,
        depth_out_channels=(16, 32, 64, 64),
    ),
}


def model_config(preset: str) -> ModelConfig:
    if preset not in MODEL_PRESETS:
        raise ValueError(f"unknown model preset {preset!r}; choose one of {sorted(MODEL_PRESETS)}")
    return MODEL_PRESETS[preset]


LONG_RUN_POLICIES = ("window", "reset", "stop")


@dataclass(frozen=True)
class StreamConfig:
    """Cache geometry and streaming policy (docs/model.md §1, §9, §12, §15)."""

    scale_frames: int = 8  # n_s == n_sc: processed together first, patch pages kept forever
    sliding_window: int = 64  # W: most recent stored frames kept with all tokens
    keyframe_interval: int = 1  # kf: every kf-th frame after the scale frames is stored
    camera_iterations: int = 4  # K: camera-head refinement iterations
    max_frame_num: int = 1024  # RoPE table rows; a stored-frame index never reaches it
    with_depth: bool = False  # run the DPT depth head
    # Long runs (issue 5): what happens before a limit is reached.
    long_run_policy: str = "window"
    max_stored_frames: int = 320  # stored frames per session before the policy acts (training range)
    overlap_frames: int = 16  # frames carried into the next window (policy "window")


# Choices of the runtime settings (validated here, resolved in runtime.py, declared in settings.py).
FLASHINFER_KERNELS = ("auto", "fa2", "fa3")
SDPA_KERNELS = ("auto", "split", "cudnn", "flash")
SWITCHES = ("auto", "on", "off")

@dataclass(frozen=True)
class RuntimeConfig:
    """Where and how the model runs."""

    device: str = "auto"  # auto | cpu | cuda | cuda:N
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    attention_backend: str = "auto"  # auto | flashinfer | sdpa
    checkpoint: str = ""
    model_preset: str = ""  # "" = full with a checkpoint, tiny without
    seed: int = 0  # random-weight initialisation
    allow_unsafe_checkpoint: bool = False  # allow torch.load(weights_only=False)
    cuda_graphs: bool = True  # replay phase-2 frame steps as CUDA graphs (CUDA only)
    # The attention kernel and the block fusion (resolved, with reasons, by runtime.resolve_runtime):
    flashinfer_kernel: str = "auto"  # auto | fa2 | fa3 (attention_backend flashinfer)
    sdpa_kernel: str = "auto"  # auto | split | cudnn | flash: one-frame steps of attention_backend sdpa on CUDA
    compile_blocks: str = "auto"  # auto | on | off: torch.compile-fused block bodies in the CUDA-graph step
    autocast: bool = True  # the official mixed-precision recipe; False = pure dtype (opt-in, moves poses)

    def resolved_preset(self) -> str:
        if self.model_preset:
            return self.model_preset
        return "full" if self.checkpoint else "tiny"


def validate_stream(cfg: StreamConfig) -> list[str]:
    """Reasons why ``cfg`` cannot run; empty when it can."""
    problems: list[str] = []
    if cfg.scale_frames < 1:
        problems.append(f"scale_frames must be >= 1 (got {cfg.scale_frames})")
    if cfg.sliding_window < 1:
        problems.append(f"sliding_window must be >= 1 (got {cfg.sliding_window})")
    if cfg.keyframe_interval < 1:
        problems.append(f"keyframe_interval must be >= 1 (got {cfg.keyframe_interval})")
    if not 1 <= cfg.camera_iterations <= 4:
        problems.append(f"camera_iterations must be in 1..4 (got {cfg.camera_iterations})")
    if cfg.max_frame_num < cfg.scale_frames + 2:
        problems.append(
            f"max_frame_num ({cfg.max_frame_num}) must exceed scale_frames + 1 ({cfg.scale_frames + 1})"
        )
    if cfg.long_run_policy not in LONG_RUN_POLICIES:
        problems.append(f"long_run_policy must be one of {LONG_RUN_POLICIES} (got {cfg.long_run_policy!r})")
    if cfg.max_stored_frames < cfg.scale_frames + 1:
        problems.append(
            f"max_stored_frames ({cfg.max_stored_frames}) must exceed scale_frames ({cfg.scale_frames})"
        )
    if cfg.max_stored_frames > cfg.max_frame_num:
        problems.append(
            f"max_stored_frames ({cfg.max_stored_frames}) must not exceed max_frame_num ({cfg.max_frame_num})"
        )
    if cfg.overlap_frames < 1:
        problems.append(f"overlap_frames must be >= 1 (got {cfg.overlap_frames})")
    return problems


def validate_runtime(cfg: RuntimeConfig) -> list[str]:
    problems: list[str] = []
    if not (cfg.device in ("auto", "cpu", "cuda") or (cfg.device.startswith("cuda:") and cfg.device[5:].isdigit())):
        problems.append(f"device must be auto, cpu, cuda or cuda:N (got {cfg.device!r})")
    if cfg.dtype not in ("auto", "float32", "bfloat16", "float16"):
        problems.append(f"dtype must be auto, float32, bfloat16 or float16 (got {cfg.dtype!r})")
    if cfg.attention_backend not in ("auto", "flashinfer", "sdpa"):
        problems.append(f"attention_backend must be auto, flashinfer or sdpa (got {cfg.attention_backend!r})")
    if cfg.model_preset and cfg.model_preset not in MODEL_PRESETS:
        problems.append(f"model_preset must be one of {sorted(MODEL_PRESETS)} (got {cfg.model_preset!r})")
    for name, allowed in (("flashinfer_kernel", FLASHINFER_KERNELS), ("sdpa_kernel", SDPA_KERNELS),
                          ("compile_blocks", SWITCHES)):
        if getattr(cfg, name) not in allowed:
            problems.append(f"{name} must be one of {list(allowed)} (got {getattr(cfg, name)!r})")
    return problems


def model_input_height(width0: int, height0: int) -> int:
    """Resized height before the centre crop (docs/model.md §2.1 step 3), evaluated as the official code does."""
    if width0 <= 0 or height0 <= 0:
        raise ValueError(f"image size must be positive (got {width0}x{height0})")
    return round(height0 * (MODEL_WIDTH_PX / width0) / PATCH_SIZE) * PATCH_SIZE


def stored_frame_limit(stream: StreamConfig) -> int:
    """Frames a session stores before its long-run policy acts: ``max_stored_frames``, and never so
    many that a RoPE frame index reaches ``max_frame_num`` (the official model fails there)."""
    return min(stream.max_stored_frames, stream.max_frame_num - 1)


def special_pages_capacity(max_frame_num: int, page_size: int) -> int:
    """Special-stream pages the official cache preallocates: ceil((max_frame_num+100)*6/page_size)+16."""
    return math.ceil((max_frame_num + 100) * SPECIAL_TOKENS_PER_FRAME / page_size) + 16


def replace(cfg, **changes):
    """``dataclasses.replace`` re-exported so callers need one import."""
    return dataclasses.replace(cfg, **changes)


__all__ = [
    "ModelConfig",
    "StreamConfig",
    "RuntimeConfig",
    "MODEL_PRESETS",
    "model_config",
    "validate_stream",
    "validate_runtime",
    "model_input_height",
    "special_pages_capacity",
    "stored_frame_limit",
    "replace",
    "field",
]
