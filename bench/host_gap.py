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

    python3 bench/host_gap.py [--frames 120] [--heads depth+camera|camera] [--variants auto,portable]
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
    args = p.parse_args()
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

    def time_method(owner: type, name: str, part: str) -> None:
        """Wrap ``owner.name`` so that its host time adds to ``parts[part]``."""
        original = getattr(owner, name)

        def timed(*a, **kw):
            t = time.perf_counter()
            try:
                return original(*a, **kw)
            finally:
                parts[part] = parts.get(part, 0.0) + (time.perf_counter() - t) * 1e3

        setattr(owner, name, timed)

    time_method(paged.PagedKVCache, "begin_step", "kv begin_step")
    time_method(split_backend.SplitPrefixBackend, "plan", "  of which the split plan")
    time_method(camera_cache.CameraKVCache, "begin_step", "camera begin_step")
    time_method(paged.PagedKVCache, "end_step", "kv end_step")
    time_method(stream_module.StreamingSession, "_make_result", "result")


def _event() -> torch.cuda.Event:
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


if __name__ == "__main__":
    main()
