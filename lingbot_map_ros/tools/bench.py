"""``lingbot_map_bench``: per-frame latency, FPS and memory of the streaming session, as a table.

Random weights, random frames. The steady state starts once the sliding window is full
(``scale_frames + sliding_window * keyframe_interval`` frames); phase 1 is reported separately.
Speed goals are judged from this table (medians and ratios of one run), never from unit tests.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch

from ..core.config import RuntimeConfig, StreamConfig
from ..core.model.fusion import fused_blocks
from ..core.model_host import ModelHost
from ..core.runtime import resolve_device, resolve_for
from ..core.session_manager import SessionManager
from .common import add_session_options, check_session_args, runtime_from_args, stream_from_args


@dataclass
class BenchRow:
    variant: str  # backend + graph mode, e.g. flashinfer+graph
    backend: str
    heads: str
    frames: int
    phase1_ms: float
    steady_median_ms: float
    steady_p90_ms: float
    fps: float  # steady frames over their total time (their mean), not 1000 / median
    peak_mem_gb: float
    growth_gb: float  # memory at the last frame minus memory at frame 100 (or the steady start)
    growth_span: str
    first_frame_ms: float = 0.0  # first phase-2 frame: graph capture + block compilation
    finite: bool = True  # every pose finite


VARIANT_HELP = (
    "comma list of BACKEND[:KERNEL][+graph|+eager][+compile][+autotune][+bf16][+kvN][+serialheads]"
    "[+cudnnprefix|+tritonprefix|+gluonprefix][+nchwdepth][+torchstep][+onegraph][+eagerdepth][+pairs|+singles]: "
    "BACKEND sdpa|flashinfer, KERNEL split|cudnn|flash (sdpa) or fa2|fa3 (flashinfer); "
    "+compile = torch.compile-fused blocks in the graph step; "
    "+autotune = their GEMMs autotuned by Inductor (max-autotune, minutes to compile); "
    "+bf16 = no autocast (opt-in numerics); +kvN = the split kernel's prefix read as N key ranges "
    "(auto+kvN: the default with N); +serialheads = the depth head after the camera head, not beside "
    "it on a second stream of the graph step (auto+serialheads: the default so; +parallelheads: the default); "
    "+cudnnprefix / +tritonprefix = the split kernel as cuDNN's unmasked prefix + masked tail / as our Triton "
    "kernel over the visible runs in one call (auto: Triton where it runs) / as its Gluon version; "
    "+nchwdepth = the depth head's conv weights in NCHW layout (auto on CUDA: channels-last); "
    "+torchstep = the graph step's small pieces as PyTorch ops (the camera head's attention as masked SDPA; "
    "auto: our Triton kernels); +onegraph = the graph step as one graph launched after the host's plan (auto: "
    "the image encoder a graph of its own, queued first); +eagerdepth = the depth head eager in the graph step "
    "(auto: compiled with the fused blocks); +pairs / +singles = the Gluon prefix kernel with two "
    "consumer warpgroups sharing each K/V block (warp-specialised) / with one (auto: pairs where their programs "
    "fit one wave). "
    "e.g. sdpa:split+graph+compile,flashinfer:fa3+graph; "
    "auto = the node's default parameters on this device"
)


def _gluon_flag(flag: str) -> bool:
    return flag in ("pairs", "singles")


@contextlib.contextmanager
def gluon_kernel_constants(variant: str):
    """``+pairs`` / ``+singles``: the Gluon prefix kernel with two consumer warpgroups a program or one,
    for this variant's run, instead of its choice by shape (``gluon_runs.use_pairs``); a kernel
    constant, not a runtime decision (the bench measures the alternatives of one build), restored after
    the run."""
    flags = [f for f in variant.split("+") if _gluon_flag(f)]
    if not flags:
        yield
        return
    from ..core.cache import gluon_runs

    saved = gluon_runs.PAIRS
    gluon_runs.PAIRS = flags[-1] == "pairs"
    try:
        yield
    finally:
        gluon_runs.PAIRS = saved


def variant_runtime(variant: str, device: torch.device, dtype: torch.dtype):
    """Parse a variant name into the ``ResolvedRuntime`` it stands for (same resolver as the node).

    ``auto`` is what the node runs with its default parameters on this device."""
    head, *flags = variant.replace("-bf16", "+bf16").split("+")
    kv = [f for f in flags if f.startswith("kv") and f[2:].isdigit()]
    kv_splits = int(kv[-1][2:]) if kv else 0
    parallel_heads = "serialheads" not in flags
    prefix_flags = {"cudnnprefix": "sdpa", "tritonprefix": "triton", "gluonprefix": "gluon"}
    prefix = [prefix_flags[f] for f in flags if f in prefix_flags]
    prefix_kernel = prefix[-1] if prefix else "auto"
    nhwc = "nchwdepth" not in flags
    step_kernels = "torch" if "torchstep" in flags else "auto"
    encoder_graph = "onegraph" not in flags
    compile_depth = "eagerdepth" not in flags
    flags = [f for f in flags if f not in kv and f not in ("parallelheads", "serialheads", "nchwdepth", "torchstep",
                                                           "onegraph", "eagerdepth")
             and f not in prefix_flags and not _gluon_flag(f)]
    if head == "auto" and not flags:
        return resolve_for(device, dtype, kv_splits=kv_splits, parallel_heads=parallel_heads,
                           prefix_kernel=prefix_kernel, depth_channels_last=nhwc, step_kernels=step_kernels,
                           encoder_graph=encoder_graph, compile_depth=compile_depth)
    backend, _, kernel = head.partition(":")
    unknown = set(flags) - {"graph", "eager", "compile", "autotune", "bf16"}
    if unknown:
        raise ValueError(f"unknown variant flags {sorted(unknown)} in {variant!r}; {VARIANT_HELP}")
    fi_kernel = kernel if backend == "flashinfer" and kernel else "auto"
    sdpa_kernel = kernel if backend == "sdpa" and kernel else "auto"
    return resolve_for(device, dtype, backend=backend, flashinfer_kernel=fi_kernel, sdpa_kernel=sdpa_kernel,
                       cuda_graphs="eager" not in flags and device.type == "cuda",
                       compile_blocks="on" if {"compile", "autotune"} & set(flags) else "off",
                       autotune="autotune" in flags, autocast="bf16" not in flags, kv_splits=kv_splits,
                       parallel_heads=parallel_heads, prefix_kernel=prefix_kernel, depth_channels_last=nhwc,
                       step_kernels=step_kernels, encoder_graph=encoder_graph, compile_depth=compile_depth)


def _memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device)
    import resource

    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def _peak_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def run_one(base: ModelHost, runtime_cfg: RuntimeConfig, stream_cfg: StreamConfig, variant: str, frames: int,
            height: int, width: int, heads: str, report_every: int = 0,
            profile: bool = False) -> tuple[BenchRow, np.ndarray]:
    """One variant over ``frames`` frames through a session manager around the already built model
    (``base``: one model for every variant; the variant only changes the resolved runtime)."""
    device, dtype = base.resolved.device, base.resolved.dtype
    runtime = variant_runtime(variant, device, dtype)
    backend = runtime.backend
    stream_cfg = dataclasses.replace(stream_cfg, with_depth=(heads == "depth+camera"))
    manager = SessionManager.around(base.model, base.cfg, stream_cfg, runtime, log=lambda m: None,
                                    settings=runtime_cfg, random_weights=base.info.random_weights)
    gen = torch.Generator().manual_seed(0)
    pool = [torch.rand(3, height, width, generator=gen) for _ in range(8)]  # frames cycle through a pool
    if device.type == "cuda":
        pool = [p.pin_memory() for p in pool]
        torch.cuda.reset_peak_memory_stats(device)
    steady_start = stream_cfg.scale_frames + stream_cfg.sliding_window * stream_cfg.keyframe_interval
    mark = 100 if frames > 100 else steady_start
    per_frame: list[float] = []
    poses: list[np.ndarray] = []
    phase1_ms = 0.0
    mem_mark = mem_last = 0
    first_frame_ms = 0.0
    for i in range(frames):
        t0 = time.perf_counter()
        results = manager.push(pool[i % len(pool)], float(i))
        dt = (time.perf_counter() - t0) * 1e3
        poses += [r.pose_enc for r in results]
        if results and results[0].is_scale_frame:
            phase1_ms = dt
        elif results and not first_frame_ms:
            first_frame_ms = dt  # the first one-frame step: graph capture (and block compilation)
        elif results:
            per_frame.append(dt)
        if i == mark:
            mem_mark = _memory_bytes(device)
        if report_every and (i + 1) % report_every == 0:
            recent = per_frame[-report_every:]
            windows = manager.policy.window_switches
            print(f"  frames {i + 1}: median {np.median(recent):.2f} ms/frame over the last {len(recent)}, "
                  f"memory {_memory_bytes(device) / 1e9:.3f} GB, windows {windows}", file=sys.stderr, flush=True)
    mem_last = _memory_bytes(device)
    if profile:
        print(profile_table(manager, pool, variant), flush=True)
    pose_check = bool(np.isfinite(np.stack(poses)).all()) if poses else False
    del manager
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    # Steady state = the window is full: a shorter run has none (its frames still grow the cache),
    # so it reports no steady figures rather than numbers from the filling phase.
    steady = np.array(per_frame[max(0, steady_start - stream_cfg.scale_frames):])
    nan = float("nan")
    median = float(np.median(steady)) if steady.size else nan
    growth_ok = frames - 1 > mark and mark >= steady_start
    return BenchRow(
        variant=variant if not variant.startswith("auto") else f"{variant} = {runtime.attention}",
        backend=backend,
        heads=heads if not stream_cfg.with_depth or stream_cfg.depth_every == 1
        else f"{heads}, depth every {stream_cfg.depth_every}",
        frames=frames,
        phase1_ms=phase1_ms,
        steady_median_ms=median,
        steady_p90_ms=float(np.percentile(steady, 90)) if steady.size else nan,
        fps=1e3 / float(np.mean(steady)) if steady.size else nan,  # throughput: depth_every mixes two frame times
        peak_mem_gb=_peak_bytes(device) / 1e9,
        growth_gb=(mem_last - mem_mark) / 1e9 if growth_ok else nan,
        growth_span=f"{mark}->{frames - 1}" if growth_ok else "run too short",
        first_frame_ms=first_frame_ms,
        finite=pose_check,
    ), np.stack(poses)


KERNEL_CATEGORIES = (
    ("attention", ("prefill", "flash", "fmha", "attention", "attn")),
    ("gemm", ("gemm", "matmul", "cutlass", "xmma", "nvjet", "cublas", "sm90_")),
    ("layernorm", ("layer_norm", "layernorm")),
    ("conv (depth head)", ("conv", "implicit", "winograd", "cudnn")),
    ("copy/index/cat", ("copy", "index", "cat", "gather", "scatter", "fill")),
)


def profile_table(manager: SessionManager, pool, variant: str, frames: int = 10) -> str:
    """GPU kernel time per frame by category, measured eagerly on steady-state frames.

    Graph replays hide their kernels from the profiler, so the same steps are run eagerly: kernel
    times are the same, only the launch gaps differ.
    """
    from torch.profiler import ProfilerActivity, profile

    session = manager.session
    graphs = session.use_cuda_graphs
    session.use_cuda_graphs = False
    # the same kernels as the graph: the compiled block bodies run eagerly
    with profile(activities=[ProfilerActivity.CUDA]) as prof, fused_blocks(session._fusion):
        for i in range(frames):
            manager.push(pool[i % len(pool)], float(i))
        torch.cuda.synchronize()
    session.use_cuda_graphs = graphs
    totals: dict[str, float] = {}
    for event in prof.key_averages():
        us = getattr(event, "device_time_total", 0.0) or getattr(event, "cuda_time_total", 0.0)
        host_side = event.key.startswith(("aten::", "cuda", "Memcpy", "Memset")) and "kernel" not in event.key.lower()
        if us <= 0 or host_side:
            continue
        name = event.key.lower()
        category = next((c for c, keys in KERNEL_CATEGORIES if any(k in name for k in keys)), "elementwise/other")
        totals[category] = totals.get(category, 0.0) + us / 1e3 / frames
    rows = [f"GPU kernel time per frame ({variant}, eager, {frames} steady frames):", "",
            "| category | ms/frame |", "|---|---|"]
    for category, ms in sorted(totals.items(), key=lambda kv: -kv[1]):
        rows.append(f"| {category} | {ms:.2f} |")
    rows.append(f"| total | {sum(totals.values()):.2f} |")
    kernels = [e for e in prof.key_averages() if (getattr(e, "device_time_total", 0.0) or 0.0) > 0
               and not e.key.startswith(("aten::", "cuda"))]
    top = sorted(kernels, key=lambda e: -e.device_time_total)[:40]
    rows += ["", "| kernel | ms/frame | calls/frame | µs/call |", "|---|---|---|---|"]
    rows += [f"| {e.key[:90]} | {e.device_time_total / 1e3 / frames:.3f} | {e.count / frames:.0f} | "
             f"{e.device_time_total / max(e.count, 1):.1f} |" for e in top]
    return "\n".join(rows)


def format_table(rows: list[BenchRow], header: str) -> str:
    lines = [header, "",
             "| variant | heads | frames | steady median ms | steady p90 ms | FPS | phase-1 ms | first one-frame ms "
             "| peak mem GB | mem growth GB (frames) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r.variant} | {r.heads} | {r.frames} | {_num(r.steady_median_ms, '.2f')} | "
            f"{_num(r.steady_p90_ms, '.2f')} | "
            f"{_num(r.fps, '.1f')} | {r.phase1_ms:.1f} | {r.first_frame_ms:.0f} | {r.peak_mem_gb:.2f} | "
            f"{_num(r.growth_gb, '+.3f')} ({r.growth_span}){'' if r.finite else ' NON-FINITE POSES'} |"
        )
    return "\n".join(lines)


def _num(value: float, spec: str) -> str:
    """A table cell: ``-`` where the run was too short for the figure."""
    return "-" if value != value else format(value, spec)


def footprint_tables(runtime_cfg: RuntimeConfig, stream_cfg: StreamConfig, args: argparse.Namespace) -> str:
    """``--footprint``: the footprint table per head setting, for a device that need not be here."""
    from ..core.config import model_config
    from ..core.footprint import assumed_runtime, footprint

    device = "cuda" if args.device == "auto" else args.device
    on_cuda = device.startswith("cuda")
    dtype_name = runtime_cfg.dtype if runtime_cfg.dtype != "auto" else ("bfloat16" if on_cuda else "float32")
    backend = "flashinfer" if runtime_cfg.attention_backend == "flashinfer" else "sdpa"
    kernel = runtime_cfg.sdpa_kernel if runtime_cfg.sdpa_kernel != "auto" else "split"
    rt = assumed_runtime(device, getattr(torch, dtype_name), backend=backend, sdpa_kernel=kernel,
                         cuda_graphs=runtime_cfg.cuda_graphs, autocast=runtime_cfg.autocast)
    cfg = model_config(runtime_cfg.resolved_preset() if runtime_cfg.model_preset else "full")
    tables = []
    for heads in [h for h in args.heads.split(",") if h]:
        stream = dataclasses.replace(stream_cfg, with_depth=heads == "depth+camera")
        tables.append(footprint(cfg, rt, stream, args.height, args.width).table())
    return "\n\n".join(tables)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if any(a == "--cameras" or a.startswith("--cameras=") for a in argv):  # N streams: tools/bench_streams.py
        from .bench_streams import main as streams_main

        return streams_main(argv)
    p = argparse.ArgumentParser(prog="lingbot_map_bench", description=__doc__.splitlines()[0])
    add_session_options(p)
    p.add_argument("--height", type=int, default=378, help="model input height (multiple of 14)")
    p.add_argument("--width", type=int, default=518, help="model input width (multiple of 14)")
    p.add_argument("--frames", type=int, default=208, help="frames per run, phase 1 included")
    p.add_argument("--variants", default="",
                   help=VARIANT_HELP + "; default: the resolved backend with CUDA graphs on CUDA")
    p.add_argument("--heads", default="depth+camera,camera", help="comma list of depth+camera and/or camera")
    p.add_argument("--report-every", type=int, default=0, help="print the recent median and memory every N frames")
    p.add_argument("--profile", action="store_true", help="print GPU kernel time by category (first head setting)")
    p.add_argument("--profile-variant", default="", help="the variant to profile (default: the first)")
    p.add_argument("--footprint", action="store_true",
                   help="print the predicted memory of each head setting at --width x --height and exit: no GPU "
                        "needed (--device auto = cuda; docs/memory.md)")
    args = p.parse_args(argv)
    check_session_args(p, args)
    runtime_cfg = runtime_from_args(args)
    if args.footprint:
        print(footprint_tables(runtime_cfg, stream_from_args(args), args))
        return 0
    if runtime_cfg.checkpoint and not os.path.isfile(os.path.expanduser(runtime_cfg.checkpoint)):
        p.error(f"--checkpoint {runtime_cfg.checkpoint}: no such file")
    try:
        device = resolve_device(args.device)
    except ValueError as exc:
        p.error(str(exc))
    if args.profile and device.type != "cuda":
        p.error("--profile measures GPU kernel time: it needs --device cuda (refused before the run)")
    preset = runtime_cfg.resolved_preset()
    stream_cfg = stream_from_args(args)
    steady_start = stream_cfg.scale_frames + stream_cfg.sliding_window * stream_cfg.keyframe_interval
    if args.frames <= steady_start + 1:
        print(f"note: {args.frames} frames do not reach the steady state (the window is full after "
              f"{steady_start} frames): steady-state and memory-growth figures are not reported", file=sys.stderr)
    # random weights unless --checkpoint (weights change no timing, but a user may want to check theirs);
    # built once, the variants only change the resolved runtime
    base = ModelHost.load(runtime_cfg, log=lambda m: None)
    print(f"weights: {base.weights}", file=sys.stderr)
    dtype = base.resolved.dtype
    variants = [v for v in args.variants.split(",") if v] or ["auto"]
    rows = []
    pose_diffs: list[str] = []
    failures: list[str] = []
    profile_variant = args.profile_variant or variants[0]
    head_list = [h for h in args.heads.split(",") if h]
    for heads in head_list:
        reference: np.ndarray | None = None
        for variant in variants:
            try:
                profiled = args.profile and variant == profile_variant and heads == head_list[0]
                with gluon_kernel_constants(variant):
                    row, poses = run_one(base, runtime_cfg, stream_cfg, variant, args.frames, args.height,
                                         args.width, heads, args.report_every, profile=profiled)
            except Exception as exc:  # one broken variant must not lose the others' numbers
                print(f"FAILED: {variant} {heads}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
                failures.append(f"{variant} {heads}: {type(exc).__name__}: {str(exc)[:300]}")
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                continue
            rows.append(row)
            print(f"done: {variant} {heads}: {row.steady_median_ms:.2f} ms", file=sys.stderr, flush=True)
            if reference is None:
                reference = poses
            else:
                rel = float(np.linalg.norm(poses - reference) / max(np.linalg.norm(reference), 1e-12))
                pose_diffs.append(f"pose_enc relative difference {variant} vs {variants[0]} ({heads}, "
                                  f"{len(poses)} frames): {rel:.2e}")
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU x{os.cpu_count()}"
    header = (f"lingbot_map_bench: preset {preset}, {args.width}x{args.height}, {str(dtype).replace('torch.', '')}, "
              f"scale {args.scale_frames}, window {args.sliding_window}, kf {args.keyframe_interval}, "
              f"camera iterations {args.camera_iterations}, {gpu}, torch {torch.__version__}")
    print(format_table(rows, header))
    for line in pose_diffs:
        print(line)
    for line in failures:
        print("FAILED:", line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
