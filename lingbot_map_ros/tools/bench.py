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
from typing import Optional

import numpy as np
import torch

from ..core.config import RuntimeConfig, StreamConfig
from ..core.model.fusion import fused_blocks
from ..core.model_host import ModelHost
from ..core.runtime import resolve_device, resolve_for
from ..core.session_manager import SessionManager
from .common import add_session_options, check_session_args, runtime_from_args, stream_from_args
from .kernel_profile import kernel_ms_by_category


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
    attention: str = ""  # the resolved one-frame path, e.g. sdpa:split+graph+compiled
    predicted_gb: float = float("nan")  # the footprint's prediction (footprint.py) for this runtime and size
    window_switches: int = 0  # long-run policy: fresh windows started over the run (long_run rows)


VARIANT_HELP = (
    "comma list of auto | portable | BACKEND[:KERNEL][+graph|+eager][+compile][+bf16], each optionally with "
    "[+cudnnprefix|+tritonprefix|+gluonprefix][+torchstep][+pairs|+singles][+partsN][+wholerows]"
    "[+fusedtail|+tailcall][+sidetail|+tailafter][+framecudnn][+mergekernel|+torchmerge][@smXY]: "
    "auto = the node's default parameters on this device; portable = auto@sm89 (what a GPU without Hopper's "
    "instructions resolves to: Ampere, Ada, Orin); BACKEND sdpa|flashinfer, KERNEL split|cudnn|flash (sdpa) or "
    "fa2|fa3 (flashinfer); +compile = torch.compile-fused blocks in the graph step; +bf16 = no autocast "
    "(opt-in numerics); +cudnnprefix / +tritonprefix / +gluonprefix = the split kernel's prefix by cuDNN / our "
    "runs kernel in Triton / in Gluon; +torchstep = the graph step's small pieces as PyTorch ops; +pairs / "
    "+singles = the Gluon runs kernel with two consumer warpgroups a program / one (auto: pairs where their "
    "programs fit one wave); +partsN = the split kernel's prefix read as N key ranges (auto: the fewest waves "
    "of programs on the SMs; N names one call over every query row); +wholerows = our runs kernel in one call "
    "over every query row (auto: whole query tiles in one wave and the ragged tail in key ranges where "
    "runs_plan.plan_runs models that faster); +fusedtail / +tailcall = that tail carried by the Gluon "
    "kernel's whole-tile programs / as a call of its own (auto: runs_plan.FUSED_TAIL); +sidetail / +tailafter = "
    "that call on a side stream beside the whole tiles / after them (auto: runs_plan.TAIL_BESIDE); "
    "+framecudnn = the DINO and frame blocks' own attention in one cuDNN call (auto: our Gluon kernel where "
    "cuDNN's query tiles would spill into a second wave, model/frame_tiles.py); +mergekernel / +torchmerge = "
    "a ragged tail's parts merged into the output rows by our Triton kernel / by PyTorch ops and a copy "
    "(auto: merge.KERNEL); "
    "@smXY = resolved for compute capability X.Y (a stand-in for this GPU's). "
    "e.g. auto,portable,sdpa:split+graph+compile,flashinfer:fa3+graph"
)

PREFIX_FLAGS = {"cudnnprefix": "sdpa", "tritonprefix": "triton", "gluonprefix": "gluon"}
# what the bench's run-of-record rows call a variant: the paths of the latency table
PATH_NAMES = {"auto": "default", "portable": "portable"}


@dataclass(frozen=True)
class BenchOverrides:
    """What a bench variant asks for beyond the user settings: kernel choices the capability would make
    otherwise, a stand-in capability, a Gluon kernel constant. Only the benchmark builds one; the node
    never sees it (it resolves from its settings and the GPU alone)."""

    capability: Optional[tuple[int, int]] = None  # resolve as this compute capability (``@smXY``)
    prefix_kernel: str = "auto"  # the split kernel's prefix (``+cudnnprefix`` ...)
    step_kernels: str = "auto"  # ``+torchstep``: the PyTorch ops
    gluon_pairs: Optional[bool] = None  # ``+pairs`` / ``+singles``: the Gluon kernel's layout, else by shape
    kv_parts: int = 0  # ``+partsN``: the split kernel's key ranges, else ``split_backend.auto_kv_splits``'s
    whole_rows: bool = False  # ``+wholerows``: our runs kernel in one call over every row, else ``runs_plan``'s cut
    fused_tail: Optional[bool] = None  # ``+fusedtail`` / ``+tailcall``: the cut's tail carried by whole tiles or not
    tail_beside: Optional[bool] = None  # ``+sidetail`` / ``+tailafter``: the tail's call beside the whole tiles
    frame_cudnn: bool = False  # ``+framecudnn``: a frame's own attention in one cuDNN call, never our kernel
    merge_kernel: Optional[bool] = None  # ``+mergekernel`` / ``+torchmerge``: a tail's merge by our kernel or not


def parse_variant(variant: str) -> tuple[str, list[str], BenchOverrides]:
    """``variant`` -> (backend[:kernel] or auto, the runtime flags, the bench-only overrides)."""
    name, _, cap = variant.replace("-bf16", "+bf16").partition("@")
    head, *flags = name.split("+")
    capability = None
    if head == "portable":
        head, capability = "auto", PORTABLE_CAPABILITY
    if cap:
        digits = cap.removeprefix("sm")
        if not digits.isdigit() or len(digits) < 2:
            raise ValueError(f"bad capability {cap!r} in {variant!r} (e.g. @sm89, @sm110)")
        capability = (int(digits[:-1]), int(digits[-1]))
    prefix = [PREFIX_FLAGS[f] for f in flags if f in PREFIX_FLAGS]
    pairs = [f == "pairs" for f in flags if f in ("pairs", "singles")]
    parts = [f for f in flags if f.startswith("parts") and f[5:].isdigit() and int(f[5:]) >= 1]
    tail = [f == "fusedtail" for f in flags if f in ("fusedtail", "tailcall")]
    beside = [f == "sidetail" for f in flags if f in ("sidetail", "tailafter")]
    merge = [f == "mergekernel" for f in flags if f in ("mergekernel", "torchmerge")]
    overrides = BenchOverrides(capability=capability, prefix_kernel=prefix[-1] if prefix else "auto",
                               step_kernels="torch" if "torchstep" in flags else "auto",
                               gluon_pairs=pairs[-1] if pairs else None, kv_parts=int(parts[-1][5:]) if parts else 0,
                               whole_rows="wholerows" in flags, fused_tail=tail[-1] if tail else None,
                               tail_beside=beside[-1] if beside else None, frame_cudnn="framecudnn" in flags,
                               merge_kernel=merge[-1] if merge else None)
    switches = ("torchstep", "pairs", "singles", "wholerows", "fusedtail", "tailcall", "sidetail", "tailafter",
                "framecudnn", "mergekernel", "torchmerge")
    rest = [f for f in flags if f not in PREFIX_FLAGS and f not in switches and f not in parts]
    unknown = set(rest) - {"graph", "eager", "compile", "bf16"}
    if unknown or (head == "auto" and rest):
        raise ValueError(f"unknown variant flags {sorted(unknown or rest)} in {variant!r}; {VARIANT_HELP}")
    return head, rest, overrides


# the stand-in for "a GPU without Hopper's instructions" (Ada; Ampere and Orin resolve the same: the test
# of runtime.resolve_for pins it)
PORTABLE_CAPABILITY = (8, 9)


@contextlib.contextmanager
def kernel_constants(overrides: BenchOverrides):
    """``+pairs`` / ``+singles``: the Gluon prefix kernel with two consumer warpgroups a program or one,
    instead of its choice by shape (``gluon_runs.use_pairs``); ``+partsN``: the split kernel's key ranges
    instead of ``split_backend.auto_kv_splits``'s choice, in one call over every query row, as with
    ``+wholerows`` (``runs_plan.RAGGED_TAIL``); ``+fusedtail`` / ``+tailcall``: the cut's tail carried by
    the whole tiles' programs or as a call of its own (``runs_plan.FUSED_TAIL``); ``+sidetail`` /
    ``+tailafter``: that call on a side stream beside the whole tiles or after them
    (``runs_plan.TAIL_BESIDE``); ``+framecudnn``: a frame's own attention never by our kernel
    (``frame_tiles.ENABLED``); ``+mergekernel`` / ``+torchmerge``: a ragged tail's merge by our Triton kernel
    or by PyTorch ops (``merge.KERNEL``). Kernel constants, not runtime decisions (the bench measures the
    alternatives of one build), set for this variant's run and restored after it."""
    from ..core.cache import gluon_runs, merge, runs_plan, split_backend
    from ..core.model import frame_tiles

    saved = (gluon_runs.PAIRS, split_backend.auto_kv_splits, runs_plan.RAGGED_TAIL, runs_plan.FUSED_TAIL,
             runs_plan.TAIL_BESIDE, frame_tiles.ENABLED, merge.KERNEL)
    if overrides.merge_kernel is not None:
        merge.KERNEL = overrides.merge_kernel
    if overrides.frame_cudnn:
        frame_tiles.ENABLED = False
    if overrides.gluon_pairs is not None:
        gluon_runs.PAIRS = overrides.gluon_pairs
    if overrides.kv_parts:
        split_backend.auto_kv_splits = lambda *args, **kwargs: overrides.kv_parts
    if overrides.kv_parts or overrides.whole_rows:
        runs_plan.RAGGED_TAIL = False
    if overrides.fused_tail is not None:
        runs_plan.FUSED_TAIL = overrides.fused_tail
    if overrides.tail_beside is not None:
        runs_plan.TAIL_BESIDE = overrides.tail_beside
    try:
        yield
    finally:
        (gluon_runs.PAIRS, split_backend.auto_kv_splits, runs_plan.RAGGED_TAIL, runs_plan.FUSED_TAIL,
         runs_plan.TAIL_BESIDE, frame_tiles.ENABLED, merge.KERNEL) = saved


def variant_runtime(variant: str, device: torch.device, dtype: torch.dtype):
    """Parse a variant name into the ``ResolvedRuntime`` it stands for (same resolver as the node).

    ``auto`` is what the node runs with its default parameters on this device."""
    head, flags, over = parse_variant(variant)
    requests = dict(prefix_kernel=over.prefix_kernel, step_kernels=over.step_kernels, capability=over.capability)
    if head == "auto":
        return resolve_for(device, dtype, **requests)
    backend, _, kernel = head.partition(":")
    fi_kernel = kernel if backend == "flashinfer" and kernel else "auto"
    sdpa_kernel = kernel if backend == "sdpa" and kernel else "auto"
    return resolve_for(device, dtype, backend=backend, flashinfer_kernel=fi_kernel, sdpa_kernel=sdpa_kernel,
                       cuda_graphs="eager" not in flags and device.type == "cuda",
                       compile_blocks="on" if "compile" in flags else "off", autocast="bf16" not in flags,
                       **requests)


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
    from ..core.footprint import footprint

    predicted = footprint(base.cfg, runtime, stream_cfg, height, width).total / 1e9
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
    window_switches = manager.policy.window_switches
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
        attention=runtime.attention,
        predicted_gb=predicted,
        window_switches=window_switches,
    ), np.stack(poses)


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
    totals = kernel_ms_by_category(prof.key_averages(), frames)
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
        if stream.gpu_memory_budget > 0:  # the window configure picks for the budget (fit_window), then its table
            from ..core.sizing import configure_fit, fit_line

            fit = configure_fit(cfg, rt, runtime_cfg, stream, args.cameras)
            tables.append(fit_line(fit, stream))
            stream = fit.stream or stream
        tables.append(footprint(cfg, rt, stream, args.height, args.width, args.cameras).table())
    return "\n\n".join(tables)


def setup_facts(device: torch.device, notes: str = "") -> dict:
    """The set-up of a run of record (docs/perf/runs/*.json ``setup``): GPU, host, torch, CUDA, driver."""
    import subprocess

    driver = ""
    if device.type == "cuda":
        try:
            driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                    capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[0]
        except (OSError, IndexError, subprocess.SubprocessError):
            driver = "unknown"
    return {"gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU",
            "host_cpus": os.cpu_count() or 0, "torch": torch.__version__, "cuda": torch.version.cuda or "",
            "driver": driver, "official_commit": os.environ.get("OFFICIAL_COMMIT") or None, "notes": notes}


def result_rows(rows: list[BenchRow], args: argparse.Namespace) -> list[dict]:
    """The run-of-record rows of ``rows`` (docs/perf/runs/*.json): a latency row per variant and heads, a
    long_run row for runs of 1,000 frames or more, a memory row (predicted beside measured) per heads."""
    geometry = f"{args.width}x{args.height}"
    out: list[dict] = []

    def num(x: float, digits: int = 2):
        return None if x != x else round(float(x), digits)

    for r in rows:
        name = r.variant.split(" = ")[0]
        path = PATH_NAMES.get(name, name)
        common = {"geometry": geometry, "heads": r.heads, "path": path, "attention": r.attention}
        if r.frames >= 1000:
            out.append({"table": "long_run", **common, "frames": r.frames, "median_ms": num(r.steady_median_ms),
                        "p90_ms": num(r.steady_p90_ms), "growth_mb": num(r.growth_gb * 1e3, 1),
                        "peak_gb": num(r.peak_mem_gb), "window_switches": r.window_switches})
            continue
        out.append({"table": "latency", **common, "window": args.sliding_window,
                    "scale_frames": args.scale_frames, "camera_iterations": args.camera_iterations, "streams": 1,
                    "load": args.load, "median_ms": num(r.steady_median_ms), "p90_ms": num(r.steady_p90_ms),
                    "peak_gb": num(r.peak_mem_gb), "frames": r.frames, "fps": num(r.fps, 1),
                    "phase1_ms": num(r.phase1_ms, 1), "first_frame_ms": num(r.first_frame_ms, 0),
                    "growth_mb": num(r.growth_gb * 1e3, 1)})
        if path == "default" and args.load == "idle":
            out.append({"table": "memory", "geometry": geometry, "window": args.sliding_window, "heads": r.heads,
                        "streams": 1, "predicted_gb": num(r.predicted_gb), "measured_gb": num(r.peak_mem_gb)})
    return out


def write_results(path: str, rows: list[dict], device: torch.device, run: str = "") -> None:
    """``--json FILE``: the rows in the shape of a run-of-record file (bench/record.py merges several)."""
    import datetime
    import json

    from ..core.files import atomic_write_text

    doc = {"run": run or os.path.splitext(os.path.basename(path))[0],
           "date": datetime.date.today().isoformat(), "commit": os.environ.get("LINGBOT_COMMIT", "unknown"),
           "setup": setup_facts(device), "rows": rows}
    atomic_write_text(path, json.dumps(doc, indent=1) + "\n")


def warm_cache(args: argparse.Namespace, base: ModelHost, runtime_cfg: RuntimeConfig,
               stream_cfg: StreamConfig) -> int:
    """``--warm-cache``: compile every kernel the node's default path needs at this frame size (one
    filled window per heads setting) into the kernel cache, so the first boot of a robot does not."""
    from ..core.kernel_cache import use_kernel_cache

    folders = use_kernel_cache()
    steady_start = stream_cfg.scale_frames + stream_cfg.sliding_window * stream_cfg.keyframe_interval
    t0 = time.perf_counter()
    for heads in [h for h in args.heads.split(",") if h]:
        run_one(base, runtime_cfg, stream_cfg, "auto", steady_start + 2, args.height, args.width, heads)
    print(f"kernel caches warmed for {args.width}x{args.height} ({args.heads}) in {time.perf_counter() - t0:.1f} s: "
          + ", ".join(f"{k}={v}" for k, v in folders.items()))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    several = any(a == "--cameras" or a.startswith("--cameras=") for a in argv)
    if several and "--footprint" not in argv:  # N streams' speed: tools/bench_streams.py
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
    p.add_argument("--cameras", type=int, default=1,
                   help="with --footprint: the cameras of one node (the weights once, a share of the page pool "
                        "and a camera cache each); without it: the several-stream benchmark")
    p.add_argument("--json", default="", metavar="FILE",
                   help="also write the rows as a run-of-record file (docs/perf/runs/*.json shape)")
    p.add_argument("--load", default="idle", help="the host's load during the run, as the rows name it")
    p.add_argument("--warm-cache", action="store_true",
                   help="compile the default path's kernels at this frame size into the kernel cache "
                        "(LINGBOT_MAP_CACHE_DIR, else ~/.cache/lingbot_map) and exit")
    args = p.parse_args(argv)
    check_session_args(p, args)
    if args.cameras < 1:
        p.error(f"--cameras must be at least 1 (got {args.cameras})")
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
    from ..core.kernel_cache import use_kernel_cache

    use_kernel_cache()
    base = ModelHost.load(runtime_cfg, log=lambda m: None)
    print(f"weights: {base.weights}", file=sys.stderr)
    if args.warm_cache:
        return warm_cache(args, base, runtime_cfg, stream_cfg)
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
                with kernel_constants(parse_variant(variant)[2]):
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
    if args.json:
        write_results(args.json, result_rows(rows, args), device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
