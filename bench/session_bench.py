"""Saved sessions at the full model's steady state (device machine): size, save / load time, exactness.

One model (random weights: the cache's size and the timings do not depend on them), a session with
``--scale`` scale frames and a full ``--window`` of keyframes, saved to ``--dir``, loaded into a
second manager over the same model (the load writes into that manager's preallocated pools), then
both get the same next ``--next`` frames. The table gives the folder's size; per staging (the copy
in device memory, as the node makes it where it fits, and in host memory) the save's pause (the
capture between two frames), its write, the load's reading and checking and its commit (the pause);
one long-run window switch of the uninterrupted run for comparison (the other way to start over:
re-feed the overlap); the largest |Δ| of pose_enc between the resumed and the uninterrupted run (0
when the resume is exact; CUDA graphs and autocast run the same kernels); and the frame time while
another thread writes a save, as the node's session services do.

    python3 bench/session_bench.py --device cuda --dtype bfloat16 --preset full
    python3 bench/session_bench.py --device cpu --dtype float32 --preset tiny   # dry run, seconds
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch

from lingbot_map_ros.core.config import RuntimeConfig, StreamConfig
from lingbot_map_ros.core.model_host import ModelHost
from lingbot_map_ros.core.session_manager import SessionManager


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def save_timed(manager: SessionManager, folder: Path, on_device: bool, device: torch.device):
    """(report, pause s, write s): the capture between two frames, then the write."""
    sync(device)
    t0 = time.perf_counter()
    capture = manager.capture(on_device=on_device)
    sync(device)
    pause_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    report = capture.write(str(folder))
    return report, pause_s, time.perf_counter() - t0


def frames_during_a_write(manager: SessionManager, frames, folder: Path, device: torch.device,
                          alone: int = 30) -> tuple[float, float, float, int]:
    """Median ms of a frame (mapping off: nothing stored, no window switch) alone, then while the
    session is written by another thread as the node does (device copy where it fits); the max
    during, and the frames pushed during the write."""
    manager.session.mapping = False

    def timed(frame) -> float:
        t0 = time.perf_counter()
        manager.push(frame)
        sync(device)
        return (time.perf_counter() - t0) * 1e3

    base = [timed(frames[i % len(frames)]) for i in range(alone)]
    capture = manager.capture()
    writer = threading.Thread(target=capture.write, args=(str(folder),))
    writer.start()
    during = []
    while writer.is_alive() and len(during) < 5000:
        during.append(timed(frames[len(during) % len(frames)]))
    writer.join()
    manager.session.mapping = True
    if not during:
        return statistics.median(base), float("nan"), float("nan"), 0
    return statistics.median(base), statistics.median(during), max(during), len(during)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--preset", default="full")
    p.add_argument("--height", type=int, default=0, help="frame height (default: 378 full, 28 tiny)")
    p.add_argument("--width", type=int, default=0, help="frame width (default: 518 full, 42 tiny)")
    p.add_argument("--scale", type=int, default=8)
    p.add_argument("--window", type=int, default=64)
    p.add_argument("--overlap", type=int, default=16)
    p.add_argument("--next", type=int, default=4, help="frames compared after the resume")
    p.add_argument("--dir", default="", help="where the session is written (default: a temporary folder)")
    args = p.parse_args()
    full = args.preset == "full"
    h, w = args.height or (378 if full else 28), args.width or (518 if full else 42)
    runtime = RuntimeConfig(device=args.device, dtype=args.dtype, model_preset=args.preset, seed=0)
    stream = StreamConfig(scale_frames=args.scale, sliding_window=args.window, keyframe_interval=1,
                          overlap_frames=args.overlap, long_run_policy="window",
                          max_stored_frames=args.scale + args.window + args.next + 1)
    def log(message: str) -> None:  # quiet
        pass

    host = ModelHost.load(runtime, log)  # one model, two streams over it
    a = SessionManager(host, stream, log)
    b = SessionManager(host, stream, log)
    device = a.session.device
    g = torch.Generator().manual_seed(0)
    frames = [torch.rand(3, h, w, generator=g) for _ in range(args.scale + args.window + args.next + 2)]
    filled = args.scale + args.window
    for f in frames[:filled]:
        a.push(f)
    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="lingbot_session_bench_"))
    modes = ("host", "device") if device.type == "cuda" else ("host",)
    timings: dict[str, dict[str, float]] = {}
    try:
        for f in frames[:args.scale + 1]:  # b's pools for this frame size (and its graphs), as on a running node
            b.push(f)
        for mode in modes:  # the last one loaded is what b continues from
            report, pause_s, write_s = save_timed(a, root / mode, mode == "device", device)
            t0 = time.perf_counter()
            prepared = b.prepare_load(str(root / mode), on_device=mode == "device")
            sync(device)
            prepare_s = time.perf_counter() - t0
            loaded_report = b.commit_load(prepared)
            timings[mode] = dict(pause=pause_s, write=write_s, prepare=prepare_s, commit=loaded_report.pause_seconds,
                                 staged=loaded_report.staged_on != "host")
        saved = report
        delta = 0.0
        for f in frames[filled:filled + args.next]:
            ra, rb = a.push(f), b.push(f)
            delta = max(delta, float(np.abs(np.stack([r.pose_enc for r in ra]) -
                                            np.stack([r.pose_enc for r in rb])).max()))
        switches = a.policy.window_switches
        for f in frames[filled + args.next:]:  # the next keyframe passes max_stored_frames: a window switch
            a.push(f)
        alignment = a.policy.last_alignment
        switch_ms = alignment.switch_ms if a.policy.window_switches > switches and alignment else float("nan")
        during = frames_during_a_write(a, frames[:8], root / "during", device)
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)
    rows = [
        ("model / dtype / device", f"{args.preset} / {args.dtype} / {device}"),
        ("frames (scale + window), size", f"{args.scale} + {args.window}, {w}x{h}"),
        ("frames saved / stored", f"{saved.frames} / {saved.stored} (loaded {loaded_report.frames})"),
        ("size on disk", f"{saved.bytes / 2**20:.1f} MiB"),
    ]
    for mode, t in timings.items():
        where = "device memory" if mode == "device" else "host memory"
        rows += [
            (f"save, copy in {where}: the stream's pause", f"{t['pause'] * 1e3:.1f} ms"),
            ("  then the write (off the stream)", f"{t['write'] * 1e3:.0f} ms"),
            (f"load, staged in {where}: read + check (off the stream)", f"{t['prepare'] * 1e3:.0f} ms"
             + ("" if t["staged"] == (mode == "device") else " (NOT staged as asked)")),
            ("  then the commit: the stream's pause", f"{t['commit'] * 1e3:.1f} ms"),
            ("  save pause + load pause", f"{(t['pause'] + t['commit']) * 1e3:.1f} ms"),
        ]
    rows += [
        ("one window switch (re-feed overlap)", f"{switch_ms:.0f} ms ({args.overlap} overlap frames)"),
        (f"max |d pose_enc|, next {args.next} frames", f"{delta:.3g}"),
        ("frame, mapping off: alone / during a write", f"{during[0]:.2f} / {during[1]:.2f} ms median, "
                                                       f"{during[2]:.2f} ms max during ({during[3]} frames)"),
    ]
    width = max(len(k) for k, _ in rows)
    print(f"| {'quantity'.ljust(width)} | value |")
    print(f"|{'-' * (width + 2)}|-------|")
    for k, v in rows:
        print(f"| {k.ljust(width)} | {v} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
