"""The official LingBot-Map streaming benchmark, reported with this package's statistics (GPU only).

Runs the official repository's own profiling path (``gct_profile.py``: its model with random weights,
its ``torch.compile`` recipe, its per-frame CUDA events with a sync after each frame) from a checkout
given by ``--official``, and prints the steady median and p90 the way ``lingbot_map_bench`` does
(frames from ``scale + window`` on), so that one table can hold both. Nothing of the official code is
part of this package: the checkout is carried to the GPU machine beside it (scripts/device_run.sh says how).

    python3 bench/official_bench.py --official .official [--frames 208] [--backend flashinfer|sdpa]
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time

import numpy as np
import torch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--official", required=True, help="folder holding the official gct_profile.py and lingbot_map/")
    p.add_argument("--frames", type=int, default=208)
    p.add_argument("--height", type=int, default=378)
    p.add_argument("--width", type=int, default=518)
    p.add_argument("--scale-frames", type=int, default=8)
    p.add_argument("--sliding-window", type=int, default=64)
    p.add_argument("--camera-iterations", type=int, default=4)
    p.add_argument("--backend", default="flashinfer", choices=("flashinfer", "sdpa"))
    p.add_argument("--no-compile", action="store_true", help="the official eager path")
    p.add_argument("--label", default="", help="a word for the table's first column (e.g. 'host load')")
    p.add_argument("--json", default="", metavar="FILE", help="also write the latency row (run-of-record shape)")
    args = p.parse_args()
    sys.path.insert(0, args.official)
    import gct_profile as official  # the official script, imported from the carried checkout

    device, dtype = "cuda", torch.bfloat16
    autocast = torch.amp.autocast("cuda", dtype=dtype)
    torch.manual_seed(42)
    images = torch.randn(1, args.frames, 3, args.height, args.width, device=device)  # [1, S, 3, H, W]
    model = official.load_model(args.backend, img_size=args.width, sliding_window=args.sliding_window,
                                max_frame_num=args.frames + 100, camera_num_iterations=args.camera_iterations)
    scale = args.scale_frames
    warm_scale = images[:, :scale].to(dtype)  # [1, scale, 3, H, W]
    warm_stream = images[:, scale:scale + 10].to(dtype)  # [1, 10, 3, H, W]

    def rehearse(passes: int) -> None:
        """The official warm-up: clean cache, the scale frames at once, then ten single frames."""
        for _ in range(passes):
            model.clean_kv_cache()
            torch.compiler.cudagraph_mark_step_begin()
            with torch.no_grad(), autocast:
                model.forward(warm_scale, num_frame_for_scale=scale, num_frame_per_block=scale, causal_inference=True)
            for i in range(warm_stream.shape[1]):
                torch.compiler.cudagraph_mark_step_begin()
                with torch.no_grad(), autocast:
                    model.forward(warm_stream[:, i:i + 1], num_frame_for_scale=scale, num_frame_per_block=1,
                                  causal_inference=True)
        torch.cuda.synchronize()

    t0 = time.perf_counter()
    rehearse(1)
    if not args.no_compile:
        official.compile_model(model)
        rehearse(3)
    warm_s = time.perf_counter() - t0
    with contextlib.redirect_stdout(sys.stderr):
        per_frame, scale_frames, phase1_ms = official.profile_streaming(model, images, args.frames, dtype)
    steady = np.array(per_frame[max(0, args.sliding_window):])  # streaming frames from scale + window on
    variant = f"official {args.backend}{'' if args.no_compile else '+compile'}"
    if args.label:
        variant += f", {args.label}"
    print(f"official_bench: {args.height}x{args.width}, bf16 autocast, scale {scale}, window {args.sliding_window}, "
          f"camera iterations {args.camera_iterations}, {torch.cuda.get_device_name()}, warm-up {warm_s:.0f} s")
    print("| variant | frames | steady median ms | steady p90 ms | FPS (steady mean) | phase-1 ms | peak mem GB |")
    print("|---|---|---|---|---|---|---|")
    print(f"| {variant} | {args.frames} | {statistics.median(steady):.2f} | {np.percentile(steady, 90):.2f} | "
          f"{1000.0 / steady.mean():.1f} | {phase1_ms:.1f} | {torch.cuda.max_memory_allocated() / 1e9:.2f} |")
    if args.json:
        import json

        row = {"table": "latency", "geometry": f"{args.width}x{args.height}", "heads": "depth+camera",
               "path": "official", "attention": f"{args.backend}{'' if args.no_compile else '+compile'}",
               "window": args.sliding_window, "scale_frames": scale, "camera_iterations": args.camera_iterations,
               "streams": 1, "load": args.label or "idle", "median_ms": round(float(statistics.median(steady)), 2),
               "p90_ms": round(float(np.percentile(steady, 90)), 2),
               "peak_gb": round(torch.cuda.max_memory_allocated() / 1e9, 2), "frames": args.frames,
               "fps": round(1000.0 / float(steady.mean()), 1), "warm_up_s": round(warm_s, 1)}
        with open(args.json, "w") as f:
            json.dump({"rows": [row]}, f, indent=1)


if __name__ == "__main__":
    main()
