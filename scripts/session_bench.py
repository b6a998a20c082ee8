"""Saved sessions at the full model's steady state (device machine): size, save / load time, exactness.

One model (random weights: the cache's size and the timings do not depend on them), a session with
``--scale`` scale frames and a full ``--window`` of keyframes, saved to ``--dir``, loaded into a
second manager over the same model (the load writes into that manager's preallocated pools), then
both get the same next ``--next`` frames: the table gives the folder's size, the save and load
times, one long-run window switch of the uninterrupted run for comparison (the other way to start
over: re-feed the overlap), and the largest |Δ| of pose_enc between the resumed and the
uninterrupted run (0 when the resume is exact; CUDA graphs and autocast run the same kernels).

    python3 scripts/session_bench.py --device cuda --dtype bfloat16 --preset full
    python3 scripts/session_bench.py --device cpu --dtype float32 --preset tiny   # dry run, seconds
"""
from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from lingbot_map_ros.core.config import RuntimeConfig, StreamConfig
from lingbot_map_ros.core.session_manager import SessionManager, load_model


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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

    loaded = load_model(runtime, log)
    a = SessionManager(runtime, stream, log, load=lambda _r, _l: loaded)
    b = SessionManager(runtime, stream, log, load=lambda _r, _l: loaded)
    device = a.session.device
    g = torch.Generator().manual_seed(0)
    frames = [torch.rand(3, h, w, generator=g) for _ in range(args.scale + args.window + args.next + 2)]
    filled = args.scale + args.window
    for f in frames[:filled]:
        a.push(f)
    folder = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="lingbot_session_bench_")) / "session"
    try:
        sync(device)
        t0 = time.perf_counter()
        saved = a.save(str(folder))
        sync(device)
        save_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        b.load(str(folder))  # the first load allocates the pools for this frame size
        sync(device)
        first_load_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        loaded_report = b.load(str(folder))  # as on a running node: into the pools it has
        sync(device)
        load_s = time.perf_counter() - t0
        delta = 0.0
        for f in frames[filled:filled + args.next]:
            ra, rb = a.push(f), b.push(f)
            delta = max(delta, float(np.abs(np.stack([r.pose_enc for r in ra]) -
                                            np.stack([r.pose_enc for r in rb])).max()))
        switches = a.window_switches
        for f in frames[filled + args.next:]:  # the next keyframe passes max_stored_frames: a window switch
            a.push(f)
        switch_ms = a.last_alignment.switch_ms if a.window_switches > switches and a.last_alignment else float("nan")
    finally:
        if not args.dir:
            shutil.rmtree(folder.parent, ignore_errors=True)
    rows = [
        ("model / dtype / device", f"{args.preset} / {args.dtype} / {device}"),
        ("frames (scale + window), size", f"{args.scale} + {args.window}, {w}x{h}"),
        ("frames saved / stored", f"{saved.frames} / {saved.stored} (loaded {loaded_report.frames})"),
        ("size on disk", f"{saved.bytes / 2**20:.1f} MiB"),
        ("save", f"{save_s * 1e3:.0f} ms"),
        ("  of which the copy between two frames", f"{saved.capture_seconds * 1e3:.0f} ms (the stream's pause; "
                                                   "the node writes the copy while frames go on)"),
        ("load (into existing pools)", f"{load_s * 1e3:.0f} ms"),
        ("load (pools allocated first)", f"{first_load_s * 1e3:.0f} ms"),
        ("one window switch (re-feed overlap)", f"{switch_ms:.0f} ms ({args.overlap} overlap frames)"),
        (f"max |d pose_enc|, next {args.next} frames", f"{delta:.3g}"),
    ]
    width = max(len(k) for k, _ in rows)
    print(f"| {'quantity'.ljust(width)} | value |")
    print(f"|{'-' * (width + 2)}|-------|")
    for k, v in rows:
        print(f"| {k.ljust(width)} | {v} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
