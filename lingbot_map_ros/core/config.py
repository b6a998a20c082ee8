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


# The allowed values of every choice setting, written once: the dataclasses below carry them, the
# settings table (settings.py) reads them from there, runtime.py resolves them.
LONG_RUN_POLICIES = ("window", "reset", "stop")
DTYPES = ("auto", "float32", "bfloat16", "float16")
ATTENTION_BACKENDS = ("auto", "flashinfer", "sdpa")
FLASHINFER_KERNELS = ("auto", "fa2", "fa3")
SDPA_KERNELS = ("auto", "split", "cudnn", "flash")
SWITCHES = ("auto", "on", "off")


def limited(default, *, range: tuple | None = None, choices: tuple | None = None):
    """A dataclass field with its allowed values (an inclusive ``range`` or ``choices``): the one place
    they are written. ``limit_problems`` checks them; the settings table declares them to ROS and argparse."""
    return field(default=default, metadata={"range": range, "choices": choices})


def field_limits(cls, name: str) -> dict:
    """``{"range": ..., "choices": ...}`` of the field ``name`` of the config dataclass ``cls``."""
    meta = {f.name: f.metadata for f in dataclasses.fields(cls)}[name]
    return {"range": meta.get("range"), "choices": meta.get("choices")}


def limit_problems(cfg) -> list[str]:
    """One reason per field whose value lies outside its declared range or choices."""
    problems: list[str] = []
    for f in dataclasses.fields(cfg):
        value, lo_hi, choices = getattr(cfg, f.name), f.metadata.get("range"), f.metadata.get("choices")
        if choices is not None and value not in choices:
            problems.append(f"{f.name} must be one of {list(choices)} (got {value!r})")
        elif lo_hi is not None and not lo_hi[0] <= value <= lo_hi[1]:
            problems.append(f"{f.name} must be in [{lo_hi[0]}, {lo_hi[1]}] (got {value})")
    return problems


@dataclass(frozen=True)
class StreamConfig:
    """Cache geometry and streaming policy (docs/model.md §1, §9, §12, §15)."""

    scale_frames: int = limited(8, range=(1, 256))  # n_s == n_sc: processed together first, kept forever
    sliding_window: int = limited(64, range=(1, 4096))  # W: most recent stored frames kept with all tokens
    keyframe_interval: int = limited(1, range=(1, 100_000))  # kf: every kf-th frame after the scale frames is stored
    camera_iterations: int = limited(4, range=(1, 4))  # K: camera-head refinement iterations
    max_frame_num: int = limited(1024, range=(3, 1_000_000))  # RoPE rows; a stored-frame index never reaches it
    with_depth: bool = False  # run the DPT depth head
    depth_every: int = limited(1, range=(1, 10_000))  # with depth: frames 0, N, 2N, ... (and every scale frame)
    # Long runs: what happens before a limit is reached.
    long_run_policy: str = limited("window", choices=LONG_RUN_POLICIES)
    max_stored_frames: int = limited(320, range=(2, 1_000_000))  # stored frames per session before the policy acts
    overlap_frames: int = limited(16, range=(1, 4096))  # frames carried into the next window (policy "window")
    # Memory (docs/memory.md): the model input width, the budget the footprint must fit, and whether
    # the sliding window shrinks to fit it.
    image_width: int = limited(MODEL_WIDTH_PX, range=(16 * PATCH_SIZE, MODEL_WIDTH_PX))  # a multiple of 14
    gpu_memory_budget: float = limited(0.0, range=(0.0, 10_000.0))  # GB; 0: free memory at configure - margin
    fit_window: bool = False  # True: the largest sliding_window <= the configured one that fits the budget
    # the camera's height / width (0.75 for 640x480): the budget plans for that frame, and a taller one is
    # centre-cropped to it; 0: unknown, plan for the tallest input of the width (a square)
    camera_aspect: float = limited(0.0, range=(0.0, 1.0))
    depth_chunk: int = 8  # frames per depth-head call in phase 1 (not a setting: the budget lowers it)


@dataclass(frozen=True)
class RuntimeConfig:
    """Where and how the model runs."""

    device: str = "auto"  # auto | cpu | cuda | cuda:N
    dtype: str = limited("auto", choices=DTYPES)
    attention_backend: str = limited("auto", choices=ATTENTION_BACKENDS)
    checkpoint: str = ""
    model_preset: str = limited("", choices=("", *sorted(MODEL_PRESETS)))  # "": full with a checkpoint, else tiny
    seed: int = limited(0, range=(0, 2**31 - 1))  # random-weight initialisation
    allow_unsafe_checkpoint: bool = False  # allow torch.load(weights_only=False)
    cuda_graphs: bool = True  # replay phase-2 frame steps as CUDA graphs (CUDA only)
    # The attention kernel and the block fusion (resolved, with reasons, by runtime.resolve_runtime):
    flashinfer_kernel: str = limited("auto", choices=FLASHINFER_KERNELS)  # attention_backend flashinfer
    sdpa_kernel: str = limited("auto", choices=SDPA_KERNELS)  # one-frame steps of attention_backend sdpa on CUDA
    compile_blocks: str = limited("auto", choices=SWITCHES)  # torch.compile-fused block bodies in the graph step
    autocast: bool = True  # the official mixed-precision recipe; False = pure dtype (opt-in, moves poses)

    def resolved_preset(self) -> str:
        if self.model_preset:
            return self.model_preset
        return "full" if self.checkpoint else "tiny"


def validate_stream(cfg: StreamConfig) -> list[str]:
    """Reasons why ``cfg`` cannot run; empty when it can: each field's limits, then the rules
    between fields."""
    problems = limit_problems(cfg)
    if cfg.image_width % PATCH_SIZE:
        problems.append(f"image_width {cfg.image_width} is not a multiple of the {PATCH_SIZE}-px patch")
    if cfg.max_frame_num < cfg.scale_frames + 2:
        problems.append(
            f"max_frame_num ({cfg.max_frame_num}) must exceed scale_frames + 1 ({cfg.scale_frames + 1})"
        )
    if cfg.max_stored_frames < cfg.scale_frames + 1:
        problems.append(
            f"max_stored_frames ({cfg.max_stored_frames}) must exceed scale_frames ({cfg.scale_frames})"
        )
    if cfg.max_stored_frames > cfg.max_frame_num:
        problems.append(
            f"max_stored_frames ({cfg.max_stored_frames}) must not exceed max_frame_num ({cfg.max_frame_num})"
        )
    return problems


def validate_runtime(cfg: RuntimeConfig) -> list[str]:
    """Reasons why ``cfg`` cannot be resolved; empty when it can (whether this machine can run it is
    ``runtime.resolve_runtime``'s question)."""
    problems = limit_problems(cfg)
    if not (cfg.device in ("auto", "cpu", "cuda") or (cfg.device.startswith("cuda:") and cfg.device[5:].isdigit())):
        problems.insert(0, f"device must be auto, cpu, cuda or cuda:N (got {cfg.device!r})")
    return problems


def model_input_height(width0: int, height0: int, width: int = MODEL_WIDTH_PX) -> int:
    """Resized height before the centre crop (docs/model.md §2.1 step 3) at model width ``width``,
    evaluated as the official code does (its ``target_size`` is the width)."""
    if width0 <= 0 or height0 <= 0:
        raise ValueError(f"image size must be positive (got {width0}x{height0})")
    return round(height0 * (width / width0) / PATCH_SIZE) * PATCH_SIZE


def planned_height(image_width: int, camera_aspect: float) -> int:
    """The tallest model input a session may get, the height the memory budget is checked at: the
    camera's (``camera_aspect`` = height / width, rounded to patches as ``model_input_height`` does) when
    known, else the width's tallest (a square: taller images are centre-cropped to it)."""
    if camera_aspect <= 0:
        return image_width
    rows = round(camera_aspect * image_width / PATCH_SIZE)
    return min(image_width, max(1, rows) * PATCH_SIZE)


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
    "limited",
    "field_limits",
    "limit_problems",
    "replace",
    "field",
]
