"""Where the time of one steady-state frame goes, host against device (GPU only).

For the node's default one-frame path (full preset, bf16, CUDA graphs) and any bench variant: per
``SessionManager.push`` the host wall time and the device's span of the step, from the moment the
frame's first graph is queued (``GraphedFrameStep.begin``: the image encoder's graph) to the end of
the step graph (``finish``). In a back-to-back loop the
device idles for ``wall - span``: host work that no graph hides. Inside the span, ``begin → finish``
on the device is the encoder's graph or, when the host's plan takes longer, the wait for it.

Columns (medians, ms): push wall; device span; on the device, ``begin → finish`` and the step graph;
on the host, the work before ``begin`` (checks, the frame's copy), between ``begin`` and ``finish``
(the KV cache's and the camera cache's step: page table, write slots, the attention plan and their
uploads) and after ``finish`` (the wait for the outputs, their copy, the result, the long-run policy).
A second table splits the host parts by function.

With ``--cameras N`` (N >= 1) the same question for a ``StreamGroup`` of N streams at one window: every
CUDA graph replay is bracketed by device events, so per tick the device time of each graph (the encoder,
the step) and the device's idle time between them and between ticks are measured, beside the host time
of the group's parts (the streams' ``open_step``, the batched step's ``finish`` before its replay, the
read-back, each stream's ``finish_step``). N = 1 is the one-camera path (a batch of one is the stream's
own step), so the two rows show what the batched step adds.

    python3 bench/host_gap.py [--frames 120] [--heads depth+camera|camera] [--variants auto,portable]
    python3 bench/host_gap.py --cameras 2 --window 64 [--frames 60] [--kernels]

``--kernels`` traces the replayed graphs' kernels over the steady ticks (the CUDA profiler sees the kernels of a
graph's replay) and prints, one stream beside N, their time per tick by category and by kernel, the time the
device had a kernel running (their union: the depth head's kernels run beside the camera head's), and for the
longest kernel (the global attention) its median time by the stream's place in a round of a block's calls.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from lingbot_map_ros.core import cuda_graph
from lingbot_map_ros.core import stream as stream_module
from lingbot_map_ros.core.cache import camera_cache, paged, split_backend
from lingbot_map_ros.core.config import RuntimeConfig, StreamConfig
from lingbot_map_ros.core.model_host import ModelHost
from lingbot_map_ros.core.session_manager import SessionManager
from lingbot_map_ros.tools.bench import variant_runtime


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--frames", type=int, default=120, help="steady frames measured (after the window is full)")
    p.add_argument("--heads", default="depth+camera", choices=("depth+camera", "camera"))
    p.add_argument("--variants", default="auto", help="bench variants (lingbot_map_bench --help), comma list")
    p.add_argument("--width", type=int, default=518)
    p.add_argument("--height", type=int, default=378)
    p.add_argument("--preset", default="full", help="model preset (tiny: a dry run)")
    p.add_argument("--device", default="cuda", help="cuda (cpu: a dry run of the script, no graphs to time)")
    p.add_argument("--cameras", type=int, default=0, help="N >= 1: a stream group of N (beside one stream)")
    p.add_argument("--window", type=int, default=64, help="sliding window of the --cameras runs")
    p.add_argument("--kernels", action="store_true",
                   help="with --cameras: the replayed graphs' kernels of the steady ticks by name, one stream beside N")
    args = p.parse_args()
    if args.cameras:
        group_main(args)
        return
    settings = RuntimeConfig(device=args.device, model_preset=args.preset,
                             dtype="bfloat16" if args.device.startswith("cuda") else "float32")
    base = ModelHost.load(settings, log=lambda m: None)
    marks: dict[str, float] = {}
    events: list[torch.cuda.Event] = []
    parts: dict[str, float] = {}  # host ms of this frame per part, reset before each push
    _instrument(marks, events, parts)
    on_cuda = base.resolved.device.type == "cuda"
    print(f"host gap, {args.heads}, {args.width}x{args.height}, "
          f"{torch.cuda.get_device_name() if on_cuda else 'cpu'}, {args.frames} steady frames (medians, ms)")
    print("| variant | push wall | device span | device: begin → finish | device: step graph | host before begin "
          "| host begin → finish (plan) | host after finish | device idle per frame |")
    print("|---|---|---|---|---|---|---|---|---|")
    split_tables = []
    for variant in args.variants.split(","):
        runtime = variant_runtime(variant, base.resolved.device, base.resolved.dtype)
        stream = StreamConfig(with_depth=args.heads == "depth+camera")
        manager = SessionManager.around(base.model, base.cfg, stream, runtime, log=lambda m: None, settings=settings)
        gen = torch.Generator().manual_seed(0)
        pool = [torch.rand(3, args.height, args.width, generator=gen) for _ in range(8)]
        if on_cuda:
            pool = [frame.pin_memory() for frame in pool]
        warm = stream.scale_frames + stream.sliding_window + 24
        rows, per_part = [], {}
        events.clear()
        for i in range(warm + args.frames):
            parts.clear()
            marks.clear()
            t0 = time.perf_counter()
            manager.push(pool[i % len(pool)], float(i))
            t1 = time.perf_counter()
            if i >= warm and "finish_return" in marks:
                rows.append((t0, marks["begin_call"], marks["begin_return"], marks["finish_call"],
                             marks["finish_return"], t1))
                for part, ms in parts.items():
                    per_part.setdefault(part, []).append(ms)
        if not rows or not on_cuda:
            print(f"| {variant} | no graph replays to time ({manager.host.info.attention} on "
                  f"{manager.host.info.device}) |")
            continue
        torch.cuda.synchronize()
        triples = [events[j:j + 3] for j in range(0, len(events), 3)][-len(rows):]
        med = statistics.median
        wall = med([(r[5] - r[0]) * 1e3 for r in rows])
        span = med([a.elapsed_time(c) for a, _, c in triples])
        device = [med([a.elapsed_time(b) for a, b, _ in triples]), med([b.elapsed_time(c) for _, b, c in triples])]
        host = [med([(r[1] - r[0]) * 1e3 for r in rows]), med([(r[3] - r[2]) * 1e3 for r in rows]),
                med([(r[5] - r[4]) * 1e3 for r in rows])]
        cells = [wall, span, *device, *host, wall - span]
        print(f"| {variant} | " + " | ".join(f"{ms:.2f}" for ms in cells) + " |")
        split_tables.append((variant, {part: med(values) for part, values in per_part.items()}))
    for variant, by_part in split_tables:
        print(f"\n| host part, {variant} | median ms |\n|---|---|")
        for part, ms in by_part.items():
            print(f"| {part} | {ms:.3f} |")


def _instrument(marks: dict[str, float], events: list, parts: dict[str, float]) -> None:
    """Wrap the step's halves (host marks, device events) and the host parts (their host time)."""
    step = cuda_graph.GraphedFrameStep
    original_begin, original_finish = step.begin, step.finish

    def begin(self, image):
        marks["begin_call"] = time.perf_counter()
        events.append(_event())
        original_begin(self, image)
        marks["begin_return"] = time.perf_counter()

    def finish(self, rope_frame, with_depth):
        marks["finish_call"] = time.perf_counter()
        events.append(_event())
        out = original_finish(self, rope_frame, with_depth)
        events.append(_event())
        marks["finish_return"] = time.perf_counter()
        return out

    step.begin, step.finish = begin, finish

    for owner, name, part in ((paged.PagedKVCache, "begin_step", "kv begin_step"),
                              (split_backend.SplitPrefixBackend, "plan", "  of which the split plan"),
                              (camera_cache.CameraKVCache, "begin_step", "camera begin_step"),
                              (paged.PagedKVCache, "end_step", "kv end_step"),
                              (stream_module.StreamingSession, "_make_result", "result")):
        _time_method(parts, owner, name, part)


def group_main(args: argparse.Namespace) -> None:
    """``--cameras N``: one stream's ticks, then N streams' batched ticks, the graphs' device times."""
    from lingbot_map_ros.core import stream_group
    from lingbot_map_ros.core.config import StreamConfig as Stream

    settings = RuntimeConfig(device=args.device, model_preset=args.preset,
                             dtype="bfloat16" if args.device.startswith("cuda") else "float32")
    base = ModelHost.load(settings, log=lambda m: None)
    on_cuda = base.resolved.device.type == "cuda"
    replays: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []
    parts: dict[str, float] = {}
    if on_cuda:
        original_replay = torch.cuda.CUDAGraph.replay

        def replay(graph):
            before = _event()
            original_replay(graph)
            replays.append((_GRAPH_NAMES.get(id(graph), "graph"), before, _event()))

        torch.cuda.CUDAGraph.replay = replay
    _time_group_parts(parts)
    stream = Stream(with_depth=args.heads == "depth+camera", sliding_window=args.window)
    print(f"host gap of a stream group, {args.heads}, {args.width}x{args.height}, window {args.window}, "
          f"{torch.cuda.get_device_name() if on_cuda else 'cpu'}, {args.frames} steady ticks (medians, ms)")
    print("| streams | tick wall | device busy | device idle | graphs per tick (device ms each) |")
    print("|---|---|---|---|---|")
    tables = []
    kernel_tables: dict[int, tuple[dict[str, tuple[float, float]], float, float]] = {}
    for n in sorted({1, args.cameras}):
        group = stream_group.StreamGroup(base, stream, [f"cam{i}" for i in range(n)], log=lambda m: None, batch=True)
        gen = torch.Generator().manual_seed(0)
        pools = [[torch.rand(3, args.height, args.width, generator=gen) for _ in range(4)] for _ in range(n)]
        if on_cuda:
            pools = [[f.pin_memory() for f in pool] for pool in pools]
        warm = stream.scale_frames + stream.sliding_window + 8
        walls, per_part, ticks = [], {}, []
        profiler = None
        for i in range(warm + args.frames):
            if i == warm and args.kernels and on_cuda:  # the replays' kernels (CUPTI traces them in graphs)
                torch.cuda.synchronize()
                profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
                profiler.start()
                print(f"steady ticks of {n} stream(s) from unix time {time.time():.1f}")
            parts.clear()
            first = len(replays)
            t0 = time.perf_counter()
            outcomes = group.step({f"cam{s}": (pools[s][i % 4], float(i)) for s in range(n)})
            wall = (time.perf_counter() - t0) * 1e3
            if any(o.error is not None for o in outcomes.values()):
                raise RuntimeError(f"tick {i} failed: {outcomes}")
            if i >= warm:
                walls.append(wall)
                ticks.append((first, len(replays)))
                for part, ms in parts.items():
                    per_part.setdefault(part, []).append(ms)
        if profiler is not None:
            torch.cuda.synchronize()
            print(f"steady ticks of {n} stream(s) to unix time {time.time():.1f}")
            profiler.stop()
            kernel_tables[n] = _graph_kernels(profiler, args.frames, n)
        med = statistics.median
        if not on_cuda or not ticks or ticks[0][0] == ticks[0][1]:
            print(f"| {n} | {med(walls):.2f} | no graph replays to time "
                  f"({base.info.attention} on {base.info.device}) |")
        else:
            torch.cuda.synchronize()
            busy, idle, graphs = [], [], {}
            for (a, b), (a_next, _) in zip(ticks, ticks[1:]):
                spans = replays[a:b]
                busy.append(sum(s.elapsed_time(e) for _, s, e in spans))
                idle.append(sum(spans[j][2].elapsed_time(spans[j + 1][1]) for j in range(len(spans) - 1))
                            + spans[-1][2].elapsed_time(replays[a_next][1]))
                for j, (name, s, e) in enumerate(spans):
                    graphs.setdefault(f"{j}:{name}", []).append(s.elapsed_time(e))
            cells = ", ".join(f"{k.split(':', 1)[1]} {med(v):.2f}" for k, v in graphs.items())
            print(f"| {n} | {med(walls):.2f} | {med(busy):.2f} | {med(idle):.2f} | {cells} |")
        tables.append((n, {part: med(values) for part, values in per_part.items()}))
        del group
    for n, by_part in tables:
        print(f"\n| host part, {n} stream(s) | median ms per tick |\n|---|---|")
        for part, ms in by_part.items():
            print(f"| {part} | {ms:.3f} |")
    if len(kernel_tables) == 2:
        _print_kernel_tables(kernel_tables)
    elif args.kernels:
        print("\nno kernels to trace (CUDA only)")


def _graph_kernels(profiler, ticks: int, streams: int) -> tuple[dict[str, tuple[float, float]], float, float]:
    """Per tick: ``{kernel name: (launches, ms)}``, the ms of kernel time and the ms the device had at
    least one kernel running (their union: with side streams, kernels overlap)."""
    import json
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        profiler.export_chrome_trace(f.name)
        with open(f.name, encoding="utf-8") as text:
            trace = json.load(text)
    kernels = [e for e in trace.get("traceEvents", []) if e.get("cat") == "kernel" and "dur" in e]
    by_name: dict[str, list[float]] = {}
    for e in kernels:
        entry = by_name.setdefault(e["name"], [0.0, 0.0])
        entry[0] += 1
        entry[1] += e["dur"] / 1e3
    busy, end = 0.0, float("-inf")
    for start, stop in sorted((e["ts"], e["ts"] + e["dur"]) for e in kernels):
        if start > end:
            busy += stop - start
            end = stop
        elif stop > end:
            busy += stop - end
            end = stop
    total = sum(ms for _, ms in by_name.values())
    # the longest kernel's launches in time order, each launch's position within a tick's round of streams
    # (a batched step calls it once per stream and block): does the k-th stream's call take longer?
    longest = max(by_name, key=lambda k: by_name[k][1])
    launches = sorted((e["ts"], e["dur"]) for e in kernels if e["name"] == longest)
    per_tick = len(launches) // ticks
    slots = [statistics.median(d for j, (_, d) in enumerate(launches) if j % streams == i) / 1e3
             for i in range(streams)]
    print(f"{longest[:60]}: {per_tick} launches a tick, median ms by the stream's place in a round: "
          + ", ".join(f"{x:.4f}" for x in slots))
    return ({k: (c / ticks, ms / ticks) for k, (c, ms) in by_name.items()}, total / ticks, busy / 1e3 / ticks)


def _print_kernel_tables(tables: dict[int, tuple[dict[str, tuple[float, float]], float, float]]) -> None:
    """Kernel time of the replayed graphs, one stream beside N: by category, then the kernels that grew most."""
    from lingbot_map_ros.tools.kernel_profile import kernel_category

    (one, (k1, total1, busy1)), (n, (kn, totaln, busyn)) = sorted(tables.items())
    print(f"\n| graphs' kernels per tick | 1 stream | {n} streams | ratio |\n|---|---|---|---|")
    print(f"| kernel time, ms | {total1:.2f} | {totaln:.2f} | {totaln / total1:.2f} |")
    print(f"| device busy with a kernel (union), ms | {busy1:.2f} | {busyn:.2f} | {busyn / busy1:.2f} |")
    print(f"| launches | {sum(c for c, _ in k1.values()):.0f} | {sum(c for c, _ in kn.values()):.0f} | |")
    categories: dict[str, list[float]] = {}
    for i, table in enumerate((k1, kn)):
        for name, (count, ms) in table.items():
            row = categories.setdefault(kernel_category(name), [0.0, 0.0, 0.0, 0.0])
            row[i] += ms
            row[2 + i] += count
    print(f"\n| category | launches, 1 | launches, {n} | ms, 1 | ms, {n} | ratio |\n|---|---|---|---|---|---|")
    for category, (a, b, c1, cn) in sorted(categories.items(), key=lambda kv: -kv[1][1]):
        print(f"| {category} | {c1:.0f} | {cn:.0f} | {a:.3f} | {b:.3f} | {b / a if a else float('nan'):.2f} |")
    names = set(k1) | set(kn)
    growth = sorted(names, key=lambda k: k1.get(k, (0, 0))[1] - kn.get(k, (0, 0))[1])  # most added ms first
    print(f"\n| kernel (most ms added first) | launches, 1 | launches, {n} | ms, 1 | ms, {n} |\n|---|---|---|---|---|")
    for name in growth:
        c1, a = k1.get(name, (0, 0))
        cn, b = kn.get(name, (0, 0))
        print(f"| {name[:90]} | {c1:.0f} | {cn:.0f} | {a:.3f} | {b:.3f} |")


_GRAPH_NAMES: dict[int, str] = {}  # id(CUDAGraph) -> "encoder" / "step", set where the graphs are captured


def _time_group_parts(parts: dict[str, float]) -> None:
    """Wrap the group's host parts (their host time adds to ``parts``) and name the graphs as captured."""
    from lingbot_map_ros.core import batched_graph, readback
    from lingbot_map_ros.core import stream as stream_mod

    for owner, name, part in ((stream_mod.StreamingSession, "prepare_step", "prepare_step (every stream)"),
                              (stream_mod.StreamingSession, "open_step", "open_step (every stream)"),
                              (batched_graph.GraphedBatchStep, "begin", "batched begin (frames in, encoder queued)"),
                              (batched_graph.GraphedBatchStep, "finish", "batched finish (RoPE in, step queued)"),
                              (cuda_graph.GraphedFrameStep, "begin", "one-stream begin"),
                              (cuda_graph.GraphedFrameStep, "finish", "one-stream finish"),
                              (readback.StagedReadback, "fetch", "read-back (waits for the step)"),
                              (stream_mod.StreamingSession, "finish_step", "finish_step (every stream)")):
        _time_method(parts, owner, name, part)
    original_capture = cuda_graph.capture_into

    def capture_into(pool, run):
        graph, output = original_capture(pool, run)
        _GRAPH_NAMES[id(graph)] = "encoder" if isinstance(output, torch.Tensor) else "step"
        return graph, output

    cuda_graph.capture_into = capture_into
    batched_graph.capture_into = capture_into


def _time_method(parts: dict[str, float], owner: type, name: str, part: str) -> None:
    """Wrap ``owner.name`` so that its host time adds to ``parts[part]``."""
    original = getattr(owner, name)

    def timed(*a, **kw):
        t = time.perf_counter()
        try:
            return original(*a, **kw)
        finally:
            parts[part] = parts.get(part, 0.0) + (time.perf_counter() - t) * 1e3

    setattr(owner, name, timed)


def _event() -> torch.cuda.Event:
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


if __name__ == "__main__":
    main()
