"""Where the time of one steady-state frame goes, host against device (GPU only).

For the node's default one-frame path (full preset, bf16, CUDA graphs): per ``SessionManager.push``
the host wall time, split into the host work before the graph replay (checks, page table, attention
plan, camera cache plan, input copy), the replay itself (device time between two CUDA events around
``graph.replay()``), and the host work after it (the wait for the outputs, their copy to the host,
the result, the long-run policy). In a back-to-back loop the device idles for ``wall - replay``:
the host gap that a pipelined step would hide. A second table splits the host work before the
replay into the KV cache's step (page table, write slots, the attention plan within it) and the
camera-head cache's step, and names two parts of the work after it: the KV cache's ``end_step`` and
the frame's result (the rest of that column is the wait for the device and the copies to the host).

    python3 scripts/host_gap.py [--frames 120] [--heads depth+camera|camera] [--width 518 --height 378]
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
from lingbot_map_ros.core.session_manager import SessionManager


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--frames", type=int, default=120, help="steady frames measured (after the window is full)")
    p.add_argument("--heads", default="depth+camera", choices=("depth+camera", "camera"))
    p.add_argument("--width", type=int, default=518)
    p.add_argument("--height", type=int, default=378)
    p.add_argument("--preset", default="full", help="model preset (tiny: a dry run)")
    p.add_argument("--device", default="cuda", help="cuda (cpu: a dry run of the script, no graphs to time)")
    args = p.parse_args()
    stream = StreamConfig(with_depth=args.heads == "depth+camera")
    runtime = RuntimeConfig(device=args.device, model_preset=args.preset)
    manager = SessionManager(runtime, stream, log=lambda m: None)
    gen = torch.Generator().manual_seed(0)
    pool = [torch.rand(3, args.height, args.width, generator=gen) for _ in range(8)]
    if torch.cuda.is_available():
        pool = [frame.pin_memory() for frame in pool]

    marks: dict[str, float] = {}
    events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
    original_call = cuda_graph.GraphedFrameStep.__call__

    def timed_call(self, image, rope_frame, with_depth):
        marks["replay_call"] = time.perf_counter()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = original_call(self, image, rope_frame, with_depth)
        end.record()
        events.append((start, end))
        marks["replay_return"] = time.perf_counter()
        return out

    cuda_graph.GraphedFrameStep.__call__ = timed_call
    parts: dict[str, float] = {}  # host ms of this frame per part, reset before each push

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
    per_part: dict[str, list[float]] = {}
    warm = stream.scale_frames + stream.sliding_window + 24
    rows = []
    for i in range(warm + args.frames):
        parts.clear()
        t0 = time.perf_counter()
        manager.push(pool[i % len(pool)], float(i))
        t1 = time.perf_counter()
        if i >= warm and marks:
            rows.append((t0, marks["replay_call"], marks["replay_return"], t1))
            for part, ms in parts.items():
                per_part.setdefault(part, []).append(ms)
    if not rows:
        print(f"no graph replays to time ({manager.info.attention} on {manager.info.device})")
        return
    torch.cuda.synchronize()
    replay_ms = [s.elapsed_time(e) for s, e in events[-args.frames:]]
    wall = [(t1 - t0) * 1e3 for t0, _, _, t1 in rows]
    pre = [(c - t0) * 1e3 for t0, c, _, _ in rows]
    launch = [(r - c) * 1e3 for _, c, r, _ in rows]
    post = [(t1 - r) * 1e3 for _, _, r, t1 in rows]
    med = statistics.median
    print(f"host gap, {args.heads}, {args.width}x{args.height}, {manager.info.attention}, "
          f"{torch.cuda.get_device_name()}, {args.frames} steady frames (medians, ms)")
    print("| push wall | replay (device) | host before replay | replay launch | after replay (wait + results) "
          "| device idle per frame |")
    print("|---|---|---|---|---|---|")
    print(f"| {med(wall):.2f} | {med(replay_ms):.2f} | {med(pre):.2f} | {med(launch):.2f} | {med(post):.2f} "
          f"| {med(wall) - med(replay_ms):.2f} |")
    print()
    print("| host part (inside the push) | median ms |")
    print("|---|---|")
    for part, values in per_part.items():
        print(f"| {part} | {med(values):.3f} |")


if __name__ == "__main__":
    main()
