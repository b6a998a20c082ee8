"""The memory a configuration needs, computed before anything is allocated (docs/memory.md).

``footprint`` adds up, from shapes alone, what a session of a model on a device holds at its peak:

* **resident** parts, allocated once and held: the weights at their dtypes, the patch-page pool and
  the special-page pool of every global block (sized by the same ``cache.factory.pool_layout`` the
  cache is built with), the camera-head cache, the attention backends' fixed buffers and the
  library workspaces (cuBLAS) on CUDA;
* **transient** parts, the activations of one model step: phase 1 (the scale frames through the
  model together, depth head included when it runs) and the one-frame step of phase 2; with CUDA
  graphs the one-frame step's activations live in the graph's private memory pool for good, so
  they become resident and phase 1 of every later session comes on top of them.

The peak is ``resident + graph pool + max(phase 1, one-frame step)`` (the one-frame step counts in
the max only without graphs). Transient estimates are the live tensors at the busiest point of each
stage, from the token count ``frames x (patches + 6)``; the constants below say what they stand for.
The weights and the pools are exact (``test_footprint.py`` checks them against the tensors built);
the activations are estimates whose ratio to ``torch.cuda.max_memory_allocated`` the device script
(``bench/footprint_check.py``) reports.

No torch allocation happens here: the weights are counted on a model built on the meta device.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional

import torch

from .config import PATCH_SIZE, SPECIAL_TOKENS_PER_FRAME, ModelConfig, StreamConfig, model_config, replace
from .runtime import ResolvedRuntime

GB = 1e9  # budgets and tables are in GB (10^9 bytes), as lingbot_map_bench reports memory
DINO_REGISTERS = 4  # DINOv2 ViT-L/14 with 4 registers (+1 class token) per frame
DEPTH_FRAME_CHUNK = 8  # frames per depth-head call (model/depth_head.py FRAME_CHUNK)
DEPTH_OUTPUT_HIDDEN = 32  # channels between the depth head's two output convolutions
CUBLAS_WORKSPACE_BYTES = 2 * 32 * 2**20  # Hopper cuBLAS workspace per stream, main + capture warm-up stream
FLASHINFER_WORKSPACE_BYTES = 256 * 2**20  # per FlashInfer wrapper (cache/flashinfer_backend.py)
# Live bytes per token inside one transformer block, in units of (channels x bytes): the residual
# stream, the normed input cast to the compute dtype, and the MLP hidden layer twice (fc1 output and
# its activation, mlp_ratio x C each) - the busiest point of a block.
BLOCK_LIVE_HIDDEN_COPIES = 2
# The depth head's busiest point at full resolution: the upsampled output_conv1 map (F/2 channels)
# and the refinenet1 map at 8x the patch grid (F channels), in units of those maps. Calibrated on the
# H200 (full/bf16, widths 518/392/280 x windows 16/32/64; docs/performance.md, memory): counting
# the tensors alive in the code gave 3 and 2 and over-predicted every depth row by 8-18 % (the head
# frees its intermediates as it goes); 1.5 and 1.25 put all 18 rows within -1 %..+1 %.
DEPTH_FULLRES_COPIES = 1.5
DEPTH_REFINE_COPIES = 1.25


@dataclass(frozen=True)
class FootprintPart:
    name: str
    bytes: int
    resident: bool  # allocated once and held (False: the activations of a step)
    note: str = ""


@dataclass(frozen=True)
class Footprint:
    """Named parts and the peak of a configuration (bytes)."""

    parts: tuple[FootprintPart, ...]
    total: int  # the predicted peak of torch.cuda.memory_allocated
    description: str = ""

    def part(self, name: str) -> int:
        return next(p.bytes for p in self.parts if p.name == name)

    @property
    def resident(self) -> int:
        return sum(p.bytes for p in self.parts if p.resident)

    def table(self) -> str:
        """The parts as a Markdown table, GB and share of the total."""
        lines = [f"footprint: {self.description}" if self.description else "footprint", "",
                 "| part | GB | share | held | what |", "|---|---|---|---|---|"]
        for p in self.parts:
            share = p.bytes / self.total if self.total else 0.0
            lines.append(f"| {p.name} | {p.bytes / GB:.3f} | {share:.1%} | {'resident' if p.resident else 'step'} "
                         f"| {p.note} |")
        lines.append(f"| **peak** | **{self.total / GB:.3f}** | | | resident + graph pool + largest step |")
        return "\n".join(lines)


def element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype, device="meta").element_size()


@functools.lru_cache(maxsize=16)
def weight_bytes(preset: str, dtype: torch.dtype, with_depth_head: bool = True) -> int:
    """Bytes of every parameter and buffer as ``ModelHost.load`` places them (aggregator in ``dtype``,
    heads fp32), counted on a model built on the meta device (nothing is allocated)."""
    from .model import LingBotMap  # late: the model package imports the whole network

    with torch.device("meta"):
        model = LingBotMap(model_config(preset), enable_depth=with_depth_head)
    model.aggregator.to(dtype)
    tensors = list(model.parameters()) + list(model.buffers())
    return sum(t.numel() * t.element_size() for t in tensors)


def page_size_of(height: int, width: int) -> int:
    """Patch tokens per frame = tokens per page of the patch pool."""
    return (height // PATCH_SIZE) * (width // PATCH_SIZE)


def aggregator_step_bytes(cfg: ModelConfig, rt: ResolvedRuntime, frames: int, page_size: int,
                          visible_keys: int, gathers_keys: bool) -> int:
    """Live activations of one aggregator step of ``frames`` frames at its busiest point (the last
    global block, when every token map the heads read is held).

    ``visible_keys``: keys its global attention sees; ``gathers_keys``: the backend copies them out of
    the pages (eager SDPA) instead of reading the pages in place."""
    a = element_size(rt.dtype)
    r = 4 if rt.autocast else a  # the residual stream and LayerNorm outputs stay fp32 under autocast
    c = cfg.embed_dim
    tokens = frames * (page_size + SPECIAL_TOKENS_PER_FRAME)
    hidden = int(cfg.mlp_ratio * c)
    block = tokens * (c * (r + a) + BLOCK_LIVE_HIDDEN_COPIES * hidden * a)  # residual, normed input, MLP hidden x2
    held = tokens * c * r  # the frame block's output, concatenated at an output layer
    token_maps = len(cfg.out_layers) * tokens * 2 * c * r  # [S, P, 2C] per output layer, read by the heads
    kv_write = 2 * tokens * c * a  # stack((k, v)) of the step before it is copied into the pages
    gathered = 2 * visible_keys * c * a if gathers_keys else 0
    scores = 0
    if rt.device.type != "cuda":  # math SDPA materialises the scores (CUDA kernels stream them)
        scores = cfg.num_heads * tokens * visible_keys * 4
    dino_tokens = frames * (page_size + 1 + DINO_REGISTERS)
    dino = dino_tokens * (c * (r + a) + BLOCK_LIVE_HIDDEN_COPIES * hidden * a)
    images = 2 * frames * 3 * page_size * PATCH_SIZE * PATCH_SIZE * 4  # the fp32 frames and their normalised copy
    return images + max(dino, block + held + token_maps + kv_write + gathered + scores)


def depth_head_bytes(cfg: ModelConfig, frames: int, height: int, width: int, chunk: int = DEPTH_FRAME_CHUNK) -> int:
    """Live activations of the depth head (fp32) over ``frames`` frames in calls of ``chunk`` frames:
    the full-resolution output stage dominates."""
    n = min(frames, max(1, chunk))
    f = cfg.depth_features
    page_size = page_size_of(height, width)
    fullres = int(n * height * width * 4 * (DEPTH_FULLRES_COPIES * f / 2 + DEPTH_OUTPUT_HIDDEN))
    refine = int(n * 64 * page_size * f * 4 * DEPTH_REFINE_COPIES)  # 8x the patch grid in each direction
    token_maps = 4 * n * page_size * cfg.camera_dim * 4  # the four token maps cast to fp32
    outputs = 2 * frames * height * width * 4  # depth and confidence of every frame
    return fullres + refine + token_maps + outputs


def camera_cache_bytes(cfg: ModelConfig, stream: StreamConfig) -> int:
    from .cache.factory import camera_cache_capacity

    return (stream.camera_iterations * cfg.camera_trunk_depth * 2 * camera_cache_capacity(stream)
            * cfg.camera_num_heads * cfg.camera_head_dim * 4)  # fp32, the head's dtype


def backend_buffer_bytes(cfg: ModelConfig, rt: ResolvedRuntime, stream: StreamConfig, page_size: int) -> int:
    """Fixed buffers of the attention backends and the libraries (CUDA)."""
    if rt.device.type != "cuda":
        return 0
    total = CUBLAS_WORKSPACE_BYTES
    if rt.backend == "flashinfer":
        total += FLASHINFER_WORKSPACE_BYTES * (2 if rt.cuda_graphs else 1)
    elif rt.cuda_graphs and rt.sdpa_kernel not in ("split", "cudnn"):
        from .cache.factory import max_stored_frames
        from .cache.pages import visible_patch_pages

        max_keys = visible_patch_pages(stream.scale_frames, stream.sliding_window) * page_size + (
            SPECIAL_TOKENS_PER_FRAME * max_stored_frames(stream))
        total += max_keys * (2 * cfg.embed_dim * element_size(rt.dtype) + 8)  # StaticSdpaBackend K, V, slots
    return total


def footprint(cfg: ModelConfig, rt: ResolvedRuntime, stream: StreamConfig, height: int, width: int,
              streams: int = 1) -> Footprint:
    """The predicted peak memory of a session of ``cfg`` on ``rt`` with ``stream`` at ``height x width``.

    ``streams`` > 1: a ``StreamGroup`` of that many streams (``core/stream_group.py``): the weights
    and the library workspaces once; each stream's share of the page pool, camera-head cache, backend
    buffers and CUDA-graph pool (its lone steps) once per stream; and the batched step of every
    stream's frame at once (eager, so transient) as one more candidate for the largest step."""
    from .cache.factory import pool_layout  # late: the cache package imports the backends
    from .cache.pages import visible_patch_pages

    if streams < 1:
        raise ValueError(f"streams must be >= 1 (got {streams})")
    n = streams

    a = element_size(rt.dtype)
    page_size = page_size_of(height, width)
    layout = pool_layout(rt, stream, page_size)
    per_page = cfg.depth * 2 * page_size * cfg.num_heads * cfg.head_dim * a  # every block, K and V
    weights = weight_bytes(cfg.preset, rt.dtype)
    patch_pool = n * layout.num_patch_pages * per_page
    special_pool = n * layout.special_pages * per_page
    camera = n * camera_cache_bytes(cfg, stream)
    buffers = backend_buffer_bytes(cfg, rt, stream, page_size)
    if n > 1 and rt.device.type == "cuda":  # the workspaces once, each stream's own buffers, the batched wrapper
        buffers = CUBLAS_WORKSPACE_BYTES + n * (buffers - CUBLAS_WORKSPACE_BYTES) + (
            FLASHINFER_WORKSPACE_BYTES if rt.backend == "flashinfer" else 0)

    s = stream.scale_frames
    eager_sdpa = rt.backend == "sdpa"  # phase 1 (and eager one-frame steps) gather the visible keys
    phase1 = aggregator_step_bytes(cfg, rt, s, page_size, s * (page_size + SPECIAL_TOKENS_PER_FRAME), eager_sdpa)
    visible = (visible_patch_pages(s, stream.sliding_window) * page_size
               + SPECIAL_TOKENS_PER_FRAME * stream.max_stored_frames)
    frame = aggregator_step_bytes(cfg, rt, 1, page_size, visible, eager_sdpa and not rt.cuda_graphs)
    depth1 = depth_head_bytes(cfg, s, height, width, stream.depth_chunk) if stream.with_depth else 0
    depth_frame = depth_head_bytes(cfg, 1, height, width) if stream.with_depth else 0
    graphs = rt.cuda_graphs and rt.device.type == "cuda"
    # the image encoder's graph keeps its tokens [1, P, C] for the step graphs to read (its scratch is reused)
    encoder_tokens = (page_size + SPECIAL_TOKENS_PER_FRAME) * cfg.embed_dim * rt.dtype.itemsize
    graph_pool = n * (frame + depth_frame + encoder_tokens) if graphs else 0
    step_peak = max(phase1 + depth1, 0 if graphs else frame + depth_frame)
    batched = batched_depth = 0
    if n > 1:  # every stream's frame in one eager call; attention gathers one stream's keys at a time
        batched = aggregator_step_bytes(cfg, rt, n, page_size, visible, eager_sdpa and not rt.cuda_graphs)
        batched_depth = depth_head_bytes(cfg, n, height, width, stream.depth_chunk) if stream.with_depth else 0
        step_peak = max(step_peak, batched + batched_depth)
    parts = (
        FootprintPart("weights", weights, True, f"{cfg.preset}: aggregator {str(rt.dtype)[6:]}, heads float32"),
        FootprintPart("patch_pool", patch_pool, True,
                      f"{layout.num_patch_pages} pages x {cfg.depth} blocks x {page_size} tokens x "
                      f"{cfg.num_heads}x{cfg.head_dim} x K,V"),
        FootprintPart("special_pool", special_pool, True, f"{layout.special_pages} pages"),
        FootprintPart("camera_cache", camera, True, "camera-head trunk K/V, float32"),
        FootprintPart("backend_buffers", buffers, True, "attention backends' fixed buffers, cuBLAS workspaces"),
        FootprintPart("cuda_graph_pool", graph_pool, True,
                      "one-frame step's activations (+ the encoder's tokens), held by the graphs"),
        FootprintPart("phase1_step", phase1, False, f"{s} scale frames together ({s * (page_size + 6)} tokens)"),
        FootprintPart("phase1_depth_head", depth1, False,
                      f"depth head over {min(s, stream.depth_chunk)} frames at a time" if depth1 else "depth off"),
        FootprintPart("frame_step", frame, False, f"one frame, {visible} visible keys"),
        FootprintPart("frame_depth_head", depth_frame, False, "one frame" if depth_frame else "depth off"),
    )
    if n > 1:
        parts += (FootprintPart("batched_step", batched, False, f"{n} streams' frames in one call"),
                  FootprintPart("batched_depth_head", batched_depth, False,
                                f"{n} frames" if batched_depth else "depth off"))
    resident = weights + patch_pool + special_pool + camera + buffers + graph_pool
    total = resident + step_peak
    description = (f"preset {cfg.preset}, {width}x{height}, {str(rt.dtype)[6:]}, {rt.device.type}, "
                   f"{rt.attention}, scale {s}, window {stream.sliding_window}, "
                   f"heads {'depth+camera' if stream.with_depth else 'camera'}"
                   + (f", {n} streams" if n > 1 else ""))
    return Footprint(parts, total, description)


def worst_case_height(width: int) -> int:
    """The tallest model input at ``width``: portrait images are centre-cropped to a square."""
    return width


def fits(fp: Footprint, budget_bytes: float) -> bool:
    return budget_bytes <= 0 or fp.total <= budget_bytes


def largest_fitting_window(cfg: ModelConfig, rt: ResolvedRuntime, stream: StreamConfig, height: int, width: int,
                           budget_bytes: float, streams: int = 1) -> Optional[int]:
    """The largest ``sliding_window`` up to the configured one whose footprint fits the budget; None
    when not even a window of 1 fits."""
    lo, hi, best = 1, stream.sliding_window, None
    while lo <= hi:  # the footprint grows with the window
        mid = (lo + hi) // 2
        candidate = replace(stream, sliding_window=mid)
        if fits(footprint(cfg, rt, candidate, height, width, streams), budget_bytes):
            best = mid
            lo = mid + 1
        else:
            hi = mid - 1
    return best


def assumed_runtime(device: str, dtype: torch.dtype, *, backend: str = "sdpa", sdpa_kernel: str = "split",
                    cuda_graphs: bool = True, autocast: bool = True) -> ResolvedRuntime:
    """A runtime for a device that need not be present (``lingbot_map_bench --footprint``): the
    node's choice on an H200 by default (SDPA's split kernel with CUDA graphs)."""
    dev = torch.device(device)
    on_cuda = dev.type == "cuda"
    return ResolvedRuntime(device=dev, dtype=dtype, backend=backend, backend_reason="assumed for the footprint",
                           sdpa_kernel=sdpa_kernel if on_cuda else "flash", cuda_graphs=cuda_graphs and on_cuda,
                           autocast=autocast)


def budget_problem(fp: Footprint, budget_bytes: float, what: str = "the configuration") -> str:
    """The reason a footprint does not fit, with the numbers ('' when it fits)."""
    if fits(fp, budget_bytes):
        return ""
    biggest = sorted(fp.parts, key=lambda p: -p.bytes)[:3]
    return (f"{what} needs {fp.total / GB:.2f} GB, the memory budget is {budget_bytes / GB:.2f} GB "
            f"({(fp.total - budget_bytes) / GB:.2f} GB too much; largest parts: "
            + ", ".join(f"{p.name} {p.bytes / GB:.2f}" for p in biggest)
            + f"; {fp.description})")


__all__ = [
    "GB", "Footprint", "FootprintPart", "assumed_runtime", "budget_problem", "depth_head_bytes", "fits",
    "footprint", "largest_fitting_window", "page_size_of", "weight_bytes", "worst_case_height",
]
