"""``lingbot_map_bench --cameras N``: N camera streams on one model - batched steps against the
same N streams one after another, and (``--processes``) against N separate processes on one device.

Random weights, random frames; every stream gets a frame at every tick. The steady state starts once
every stream's window is full (``scale_frames + sliding_window * keyframe_interval`` frames). Rows:

* ``batched``: a ``StreamGroup`` (``core/stream_group.py``) with ``batch=True``; ms per tick = one
  batched step of N frames (the model call, every stream's plan and results). Under CUDA graphs the
  step is the captured one of its batch size (``core/batched_graph.py``), else one eager call; the
  row's note and the line after the table say which path ran and how often;
* ``one after another``: N ``SessionManager``s over the same model, each tick pushes every stream's
  frame in turn (each push the single-camera path, CUDA graphs included);
* ``N processes``: N copies of the one-stream run started together, as a user with N nodes on one GPU
  would run them (each loads its own weights); frames/s is the sum of the processes' steady rates
  over the time their steady phases overlap, and the ms per frame are the frames that ended then
  (``overlap_of``).

The batched and sequential runs feed identical frames, so their poses are compared too.
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import torch

from ..core.config import StreamConfig
from ..core.footprint import GB
from ..core.model_host import ModelHost
from ..core.runtime import resolve_device
from ..core.session_manager import SessionManager
from ..core.stream_group import StreamGroup, group_footprint
from .common import add_session_options, check_session_args, runtime_from_args, stream_from_args
from .gemm_profile import ProductTime, product_comparison, products_by_shape
from .gpu_clock import ClockSampler, ClockWindow
from .kernel_profile import by_category, device_kernel_ms, kernel_category


@dataclass
class StreamsRow:
    mode: str
    streams: int
    step_median_ms: float  # per tick: N frames
    step_p90_ms: float
    total_fps: float  # frames of every stream per second, steady state
    peak_gb: float
    note: str = ""
    predicted_gb: float = float("nan")  # the footprint of the group (batched rows)
    path: str = ""  # batched rows: the path the batched ticks ran ("graphed", "eager", "alone")
    clock: Optional[ClockWindow] = None  # the GPU's SM clock and power over the steady ticks (None: not sampled)


def _frames(height: int, width: int, streams: int, device: torch.device) -> list[list[torch.Tensor]]:
    """A small pool of random frames per stream (different per stream), pinned on CUDA."""
    pools = []
    for s in range(streams):
        gen = torch.Generator().manual_seed(100 + s)
        pool = [torch.rand(3, height, width, generator=gen) for _ in range(4)]
        pools.append([p.pin_memory() for p in pool] if device.type == "cuda" else pool)
    return pools


def _peak(device: torch.device) -> float:
    return torch.cuda.max_memory_allocated(device) / GB if device.type == "cuda" else float("nan")


def _reset_peak(device: torch.device) -> float:
    """Start a mode's peak from the weights alone: the previous mode's sessions, pools and graphs sit in
    reference cycles (a session and its callbacks), so they are collected here rather than whenever the
    collector's third generation next runs; without it a mode's peak held the previous mode's pools."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        return torch.cuda.memory_allocated(device) / GB
    return float("nan")


def _steady_start(stream: StreamConfig) -> int:
    return stream.scale_frames + stream.sliding_window * stream.keyframe_interval


@dataclass
class Ticks:
    """What ``_timed_ticks`` measured: each steady tick's ms, every stream's poses, and the steady span's
    start and end in seconds since the epoch (the clock sampler's time)."""

    times: np.ndarray
    poses: dict
    start: float = 0.0
    end: float = 0.0


def _timed_ticks(tick: Callable[[int], dict[str, list]], frames: int, steady: int) -> Ticks:
    """Run ``frames`` ticks; the wall time of each steady tick and every stream's poses."""
    times, poses = [], {}
    start = time.time()
    for i in range(frames):
        if i == steady:
            start = time.time()
        t0 = time.perf_counter()
        out = tick(i)
        dt = (time.perf_counter() - t0) * 1e3
        for name, results in out.items():
            poses.setdefault(name, []).extend(r.pose_enc for r in results)
        if i >= steady:
            times.append(dt)
    return Ticks(np.array(times), poses, start, time.time())


def _group_tick(group: StreamGroup, pools, n: int) -> Callable[[int], dict[str, list]]:
    """Tick ``i`` of a group: every stream's next frame in one ``step``; its results by stream (a failed
    frame stops the benchmark: its figures would not be of the step it names)."""

    def tick(i: int) -> dict[str, list]:
        outcomes = group.step({f"cam{s}": (pools[s][i % len(pools[s])], float(i)) for s in range(n)})
        for name, o in outcomes.items():
            if o.error is not None:
                raise RuntimeError(f"{name}: {o.error}")
        return {name: list(o.results) for name, o in outcomes.items()}

    return tick


def run_batched(base: ModelHost, stream: StreamConfig, n: int, frames: int, pools,
                clocks: ClockSampler) -> tuple[StreamsRow, dict]:
    device = base.resolved.device
    held = _reset_peak(device)
    group = StreamGroup(base, stream, [f"cam{i}" for i in range(n)], log=lambda m: None, batch=True)
    ticks = _timed_ticks(_group_tick(group, pools, n), frames, _steady_start(stream))
    times, poses = ticks.times, ticks.poses
    fp = group_footprint(base, stream, n, group.managers["cam0"].session.image_hw)
    row = _row("batched" if n > 1 else "batched (one stream: the single-camera path)", n, times, _peak(device),
               f"footprint {fp.total / GB:.2f} GB predicted, {held:.2f} GB held at start; {batched_paths(group)}")
    row.clock = clocks.between(ticks.start, ticks.end)
    row.predicted_gb = fp.total / GB
    row.path = group.path_counts.most_common(1)[0][0] if group.path_counts else "alone"
    print(f"batched path: {group.decision.path} ({group.decision.reason})")
    return row, poses


@dataclass
class GroupProfile:
    """What ``profile_group`` measured: GPU kernel ms per tick by kernel name, by category, and the matrix
    products by shape."""

    kernels: dict[str, float]
    products: list[ProductTime]

    @property
    def categories(self) -> dict[str, float]:
        return by_category(self.kernels)


def profile_group(base: ModelHost, stream: StreamConfig, n: int, pools, ticks: int = 10) -> GroupProfile:
    """GPU kernel ms per tick by category, and the products by shape, for ``n`` streams in the steady
    state: a fresh group fills its windows, then runs ``ticks`` ticks eagerly under the profiler (graph
    replays hide their kernels; the eager batched call runs the same kernels, with the compiled block
    bodies, only the gaps between them differ). ``n = 1`` is the single-camera step (a batch of one is
    the stream's own step)."""
    from torch.profiler import ProfilerActivity, profile

    from ..core.model.fusion import fused_blocks

    _reset_peak(base.resolved.device)
    group = StreamGroup(base, stream, [f"cam{i}" for i in range(n)], log=lambda m: None, batch=True)
    tick = _group_tick(group, pools, n)
    start = _steady_start(stream) + 2
    for i in range(start):
        tick(i)
    sessions = [group.manager(name).session for name in group.names]
    graphs = [s.use_cuda_graphs for s in sessions]
    # the operators (CPU activity) carry the products' shapes, the kernels (CUDA activity) their time; the
    # CLI refuses --profile without a GPU, and the CPU activity alone lets the tests drive this function
    activities = [ProfilerActivity.CPU]
    if base.resolved.device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    try:
        for s in sessions:
            s.use_cuda_graphs = False
        with profile(activities=activities, record_shapes=True) as prof, fused_blocks(sessions[0]._fusion):
            for i in range(start, start + ticks):
                tick(i)
            if base.resolved.device.type == "cuda":
                torch.cuda.synchronize()
    finally:
        for s, g in zip(sessions, graphs):
            s.use_cuda_graphs = g
    # the products' time: their kernels' on a GPU; on the CPU (the tests) the operators' own time
    product_time = "device_time_total" if base.resolved.device.type == "cuda" else "cpu_time_total"
    return GroupProfile(device_kernel_ms(prof.key_averages(), ticks),
                        products_by_shape(prof.key_averages(group_by_input_shape=True), ticks, product_time))


def profile_comparison(one: dict[str, float], many: dict[str, float], n: int) -> str:
    """Kernel time per category: one stream's step beside the batched step of ``n``, and their ratio
    (n.00x: the category does not gain from the batch; 1.00x: it is free)."""
    rows = [f"GPU kernel time per tick by category, eager (one stream beside {n} streams batched):", "",
            f"| category | one stream ms | {n} streams ms | ratio |", "|---|---|---|---|"]
    for category in sorted(set(one) | set(many), key=lambda c: -many.get(c, 0.0)):
        a, b = one.get(category, 0.0), many.get(category, 0.0)
        rows.append(f"| {category} | {a:.2f} | {b:.2f} | {b / a:.2f}x |" if a else f"| {category} | 0 | {b:.2f} | - |")
    total_one, total_many = sum(one.values()), sum(many.values())
    rows.append(f"| total | {total_one:.2f} | {total_many:.2f} | "
                f"{total_many / total_one if total_one else float('nan'):.2f}x |")
    return "\n".join(rows)


def kernel_comparison(one: dict[str, float], many: dict[str, float], n: int, top: int = 25) -> str:
    """The kernels whose time grows most from one stream's step to the batched step of ``n`` (ms per tick,
    eager): where the batch gains least. A kernel at n.00x does not gain; one seen only in the batched step
    (the loops over the streams, the concatenations) shows ``-``."""
    def growth(name: str) -> float:
        return many.get(name, 0.0) - one.get(name, 0.0)

    rows = [f"Kernels by growth, eager (one stream beside {n} streams batched; the {top} that grow most):", "",
            f"| kernel | category | one stream ms | {n} streams ms | ratio |", "|---|---|---|---|---|"]
    for name in sorted(set(one) | set(many), key=lambda k: -growth(k))[:top]:
        a, b = one.get(name, 0.0), many.get(name, 0.0)
        short = name if len(name) <= 70 else name[:67] + "..."
        ratio = f"{b / a:.2f}x" if a else "-"
        rows.append(f"| `{short.replace('|', '/')}` | {kernel_category(name)} | {a:.3f} | {b:.3f} | {ratio} |")
    return "\n".join(rows)


def batched_paths(group: StreamGroup) -> str:
    """Which path the batched ticks took, how often, and the captures per batch size."""
    if not group.path_counts:
        return "path: every step alone (no tick had two phase-2 frames)"
    text = "path: " + ", ".join(f"{path} x{count}" for path, count in group.path_counts.most_common())
    stats = group.graph_stats()
    if stats:
        text += "; " + ", ".join(f"B={b}: {s.captures} captures, {s.replays} replays" for b, s in sorted(stats.items()))
    return text


def run_sequential(base: ModelHost, stream: StreamConfig, n: int, frames: int, pools,
                   clocks: ClockSampler) -> tuple[StreamsRow, dict]:
    device = base.resolved.device
    held = _reset_peak(device)
    managers = [SessionManager(base, stream, log=lambda m: None) for _ in range(n)]

    def tick(i: int) -> dict[str, list]:
        return {f"cam{s}": m.push(pools[s][i % len(pools[s])], float(i)) for s, m in enumerate(managers)}

    ticks = _timed_ticks(tick, frames, _steady_start(stream))
    row = _row("one after another", n, ticks.times, _peak(device),
               f"{np.median(ticks.times) / n:.2f} ms a push, {held:.2f} GB held at start")
    row.clock = clocks.between(ticks.start, ticks.end)
    return row, ticks.poses


def _row(mode: str, n: int, times: np.ndarray, peak: float, note: str = "") -> StreamsRow:
    nan = float("nan")
    if not times.size:
        return StreamsRow(mode, n, nan, nan, nan, peak, "run too short for a steady state")
    return StreamsRow(mode, n, float(np.median(times)), float(np.percentile(times, 90)),
                      n * 1e3 / float(np.mean(times)), peak, note)


READY = "ready"  # a worker's line once its window is full, before its steady frames


@dataclass
class Overlap:
    """The processes' steady frames while all of them ran (``overlap_of``)."""

    fps: float  # frames/s of all processes together
    times: np.ndarray  # ms of each frame that ended inside the overlap, every process's
    fraction: float  # the overlap's share of the longest steady span
    start: float = 0.0  # the overlap, seconds since the epoch
    end: float = 0.0


def overlap_of(reports: list[dict]) -> Overlap:
    """The processes' rates over the time their steady phases overlap: a process that ran alone at the
    start or the end (it compiled faster, or finished first) ran at one stream's speed then, which is not
    what N nodes on one GPU get. Each process's rate is its frames between its first and last frame that
    ended inside the overlap, over the time between them (``reports``: the workers' ``times`` in ms and
    ``ends``, each frame's end in seconds; ``start``/``end``: the steady span)."""
    if any(not r["times"] for r in reports):  # a run too short for a steady phase
        return Overlap(float("nan"), np.zeros(0), 0.0)
    start, end = max(r["start"] for r in reports), min(r["end"] for r in reports)
    spans = [r["end"] - r["start"] for r in reports]
    fraction = max(0.0, end - start) / max(max(spans), 1e-9)
    fps, inside = 0.0, []
    for r in reports:
        ends, times = np.asarray(r["ends"], dtype=float), np.asarray(r["times"], dtype=float)
        keep = (ends > start) & (ends <= end)
        if keep.sum() < 2:
            return Overlap(float("nan"), np.asarray(inside, dtype=float), fraction, start, end)
        done = ends[keep]
        fps += (len(done) - 1) / max(float(done[-1] - done[0]), 1e-9)
        inside.extend(times[keep])
    return Overlap(fps, np.asarray(inside, dtype=float), fraction, start, end)


def run_processes(argv: list[str], n: int, clocks: ClockSampler) -> StreamsRow:
    """N one-stream runs of this tool (``--worker``) started together; each fills its window (model load,
    compilation, capture) and says ``ready``; once all have, they start their steady frames together, and
    each prints them."""
    cmd = [sys.executable, "-m", "lingbot_map_ros.tools.bench_streams", *argv, "--worker"]
    procs = [subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for _ in range(n)]
    before: list[list[str]] = [[] for _ in procs]  # what each printed before ``ready`` (all of it, if none)
    for proc, lines in zip(procs, before):
        while (line := proc.stdout.readline()) and line.strip() != READY:
            lines.append(line)
        if not line:  # it ended before its steady phase: its exit status and report are read below
            break
    for proc in procs:
        if proc.poll() is None:
            proc.stdin.write("go\n")
            proc.stdin.flush()
    reports = []
    for proc, lines in zip(procs, before):
        out, _ = proc.communicate()
        out = "".join(lines) + out
        if proc.returncode != 0:
            raise RuntimeError(f"a worker process failed (exit {proc.returncode})")
        reports.append(json.loads(out.strip().splitlines()[-1]))
    overlap = overlap_of(reports)
    nan = float("nan")
    times = overlap.times
    return StreamsRow(f"{n} processes", n, float(np.median(times)) if times.size else nan,
                      float(np.percentile(times, 90)) if times.size else nan, overlap.fps,
                      max(r["peak"] for r in reports),
                      f"ms per frame in each process while all ran; steady phases overlap {overlap.fraction:.0%}",
                      clock=clocks.between(overlap.start, overlap.end))


def worker(base: ModelHost, stream: StreamConfig, frames: int, pools) -> None:
    """One stream alone; prints its steady per-frame times and the span they cover (JSON)."""
    manager = SessionManager(base, stream, log=lambda m: None)
    steady = _steady_start(stream)
    times, ends, start = [], [], 0.0
    for i in range(frames):
        if i == steady:
            print(READY, flush=True)  # the parent starts every process's steady phase at once
            sys.stdin.readline()
            start = time.time()
        t0 = time.perf_counter()
        manager.push(pools[0][i % len(pools[0])], float(i))
        if i >= steady:
            times.append((time.perf_counter() - t0) * 1e3)
            ends.append(time.time())
    print(json.dumps({"times": times, "ends": ends, "start": start, "end": time.time(),
                      "peak": _peak(base.resolved.device)}))


def format_table(rows: list[StreamsRow], header: str) -> str:
    lines = [header, "", "| mode | streams | ms per tick (median) | p90 | frames/s, all streams | peak GB "
             "| SM clock, power (clock limits) | note |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.mode} | {r.streams} | {r.step_median_ms:.2f} | {r.step_p90_ms:.2f} | {r.total_fps:.1f} "
                     f"| {r.peak_gb:.2f} | {clock_cell(r.clock)} | {r.note} |")
    return "\n".join(lines)


def clock_cell(clock: Optional[ClockWindow]) -> str:
    """``1852 MHz, 691 W (power cap)``; ``-`` where nothing was sampled (no ``nvidia-smi``, a CPU run)."""
    if clock is None:
        return "-"
    return f"{clock.sm_mhz:.0f} MHz, {clock.power_w:.0f} W ({clock.reason_names()})"


def pose_difference(a: dict, b: dict) -> float:
    """Largest relative difference of any stream's poses between two runs of the same frames."""
    worst = 0.0
    for name in a:
        x, y = np.stack(a[name]), np.stack(b[name])
        worst = max(worst, float(np.linalg.norm(x - y) / max(np.linalg.norm(y), 1e-12)))
    return worst


def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="lingbot_map_bench --cameras N", description=__doc__.splitlines()[0])
    add_session_options(p)
    p.add_argument("--cameras", type=int, required=True, help="streams on the one model (1..8)")
    p.add_argument("--height", type=int, default=378, help="model input height (multiple of 14)")
    p.add_argument("--width", type=int, default=518, help="model input width (multiple of 14)")
    p.add_argument("--frames", type=int, default=160, help="frames per stream, phase 1 included")
    p.add_argument("--heads", default="depth+camera", choices=("depth+camera", "camera"))
    p.add_argument("--processes", action="store_true", help="also run the N streams as N processes")
    p.add_argument("--profile", action="store_true",
                   help="also print GPU kernel time by category, one stream beside the N batched (eager ticks)")
    p.add_argument("--json", default="", help="also write the rows as a run-of-record part (table 'streams')")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    check_session_args(p, args)
    if not 1 <= args.cameras <= 8:
        p.error(f"--cameras must be in 1..8 (got {args.cameras})")
    try:
        device = resolve_device(args.device)
    except ValueError as exc:
        p.error(str(exc))
    if args.profile and device.type != "cuda":
        p.error("--profile measures GPU kernel time: it needs --device cuda (refused before the run)")
    runtime_cfg = runtime_from_args(args)
    stream = dataclasses.replace(stream_from_args(args), with_depth=args.heads == "depth+camera")
    base = ModelHost.load(runtime_cfg, log=lambda m: None)
    n = args.cameras
    pools = _frames(args.height, args.width, n, device)
    if args.worker:
        worker(base, stream, args.frames, pools)
        return 0
    if args.frames <= _steady_start(stream) + 1:
        print(f"note: {args.frames} frames do not reach the steady state (the window is full after "
              f"{_steady_start(stream)} frames)", file=sys.stderr)
    rows = []
    with ClockSampler.of(device) as clocks:
        single, _ = run_sequential(base, stream, 1, args.frames, pools[:1], clocks)
        single.mode = "one stream (reference)"
        rows.append(single)
        batched, batched_poses = run_batched(base, stream, n, args.frames, pools, clocks)
        sequential, sequential_poses = run_sequential(base, stream, n, args.frames, pools, clocks)
        rows += [batched, sequential]
    profile_rows: list[dict] = []
    if args.profile:
        one, many = profile_group(base, stream, 1, pools), profile_group(base, stream, n, pools)
        print(profile_comparison(one.categories, many.categories, n), flush=True)
        print(product_comparison(one.products, many.products, n), flush=True)
        print(kernel_comparison(one.kernels, many.kernels, n), flush=True)
        profile_rows = step_profile_rows(one.categories, many.categories, n, args, stream)
    if args.processes:
        del base
        if device.type == "cuda":
            torch.cuda.empty_cache()
        child = _without(argv, "--processes", "--json")
        with ClockSampler.of(device) as clocks:
            rows.append(run_processes(child, n, clocks))
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU x{os.cpu_count()}"
    header = (f"lingbot_map_bench --cameras {n}: preset {runtime_cfg.resolved_preset()}, {args.width}x{args.height}, "
              f"{args.heads}, scale {stream.scale_frames}, window {stream.sliding_window}, "
              f"camera iterations {stream.camera_iterations}, {gpu}, torch {torch.__version__}")
    print(format_table(rows, header))
    ratio = batched.step_median_ms / single.step_median_ms if single.step_median_ms else float("nan")
    print(f"batched step of {n} / one stream's step: {ratio:.2f}x; frames/s batched / one after another: "
          f"{batched.total_fps / sequential.total_fps:.2f}x")
    if batched.clock is not None and single.clock is not None:
        print(f"SM clock over the batched ticks / the one-stream ticks: {batched.clock.sm_mhz:.0f} / "
              f"{single.clock.sm_mhz:.0f} MHz ({batched.clock.sm_mhz / single.clock.sm_mhz:.3f}); a card at its "
              f"power limit lowers its clock when it is kept busier")
        one_j = single.clock.power_w * single.step_median_ms / 1e3
        batched_j = batched.clock.power_w * batched.step_median_ms / n / 1e3
        print(f"energy a frame (board power x time a frame): {one_j:.1f} J one stream, {batched_j:.1f} J batched")
    print(f"pose_enc relative difference, batched vs one after another (same frames): "
          f"{pose_difference(batched_poses, sequential_poses):.2e}")
    if args.json:
        from .bench import write_results

        write_results(args.json, result_rows(rows, args, stream) + profile_rows, device)
    return 0


def _without(argv: list[str], flag: str, valued: str) -> list[str]:
    """``argv`` without ``flag`` and without ``valued`` and its value (the worker's own command line)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == valued:
            skip = True
        elif a != flag and not a.startswith(valued + "="):
            out.append(a)
    return out


def result_rows(rows: list[StreamsRow], args: argparse.Namespace, stream: StreamConfig) -> list[dict]:
    """The row of table ``streams`` of a run of record (``scripts/perf_tables.py``'s shape;
    ``bench/record.py`` merges the parts): the batched step of N streams beside one stream's step,
    the same streams one after another and (``--processes``) a process each."""

    def num(x: float, digits: int = 2):
        return None if x != x else round(float(x), digits)

    by_mode = {r.mode: r for r in rows}
    batched = next(r for r in rows if r.mode.startswith("batched"))
    single = by_mode["one stream (reference)"]
    sequential = by_mode.get("one after another")
    processes = by_mode.get(f"{batched.streams} processes")
    return [{"table": "streams", "geometry": f"{args.width}x{args.height}", "heads": args.heads,
             "window": stream.sliding_window, "scale_frames": stream.scale_frames,
             "camera_iterations": stream.camera_iterations, "streams": batched.streams,
             "ms_per_step": num(batched.step_median_ms), "p90_ms": num(batched.step_p90_ms),
             "one_stream_ms": num(single.step_median_ms), "fps_total": num(batched.total_fps, 1),
             "sequential_fps": num(sequential.total_fps, 1) if sequential else None,
             "processes_fps": num(processes.total_fps, 1) if processes else None,
             "peak_gb": num(batched.peak_gb), "predicted_gb": num(batched.predicted_gb), "frames": args.frames,
             "path": batched.path, **clock_fields(batched.clock, ""), **clock_fields(single.clock, "one_stream_"),
             **clock_fields(processes.clock if processes else None, "processes_")}]


def clock_fields(clock: Optional[ClockWindow], prefix: str) -> dict:
    """A phase's clock in a ``streams`` row: ``{prefix}sm_mhz``, ``{prefix}power_w``, ``{prefix}clock_limits``
    (none where it was not sampled)."""
    if clock is None:
        return {}
    return {f"{prefix}sm_mhz": round(clock.sm_mhz), f"{prefix}power_w": round(clock.power_w),
            f"{prefix}clock_limits": clock.reason_names()}


def step_profile_rows(one: dict[str, float], many: dict[str, float], n: int, args: argparse.Namespace,
                      stream: StreamConfig) -> list[dict]:
    """Rows of table ``step_profile`` (``scripts/perf_tables.py``): per kernel category, the GPU kernel ms of
    one stream's step beside the batched step of ``n`` (eager ticks, ``profile_group``)."""
    return [{"table": "step_profile", "geometry": f"{args.width}x{args.height}", "heads": args.heads,
             "window": stream.sliding_window, "streams": n, "category": category,
             "one_stream_ms": round(one.get(category, 0.0), 2), "batched_ms": round(many.get(category, 0.0), 2)}
            for category in sorted(set(one) | set(many), key=lambda c: (-many.get(c, 0.0), c))]


if __name__ == "__main__":
    sys.exit(main())
