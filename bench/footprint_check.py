#!/usr/bin/env python3
"""The footprint model (core/footprint.py) against the measured peak on a GPU, and small cards.

Part a: predicted peak next to ``torch.cuda.max_memory_allocated`` for each width x window x heads
(random weights of the preset; frames from a 640x480 camera at that width), their ratio (the model
should be within 10 %), and ms/frame of the steady state.

Part b: small cards. The process is capped with ``torch.cuda.set_per_process_memory_fraction`` at
each GB cap, the node's default geometry runs with ``gpu_memory_budget`` = the cap and
``fit_window`` on, the depth head and the long-run window policy, for ``--long-frames`` frames: the
window the budget picked, the peak (must stay <= the budget), no out-of-memory, ms/frame. When even
a window of 1 does not fit at a width, the next smaller width is tried.

Dry run on the CPU: ``--device cpu --preset tiny --frames 40 --long-frames 60`` (no allocator
statistics there: the measured column shows the tensors' bytes, weights and pools only).
"""
from __future__ import annotations

import argparse
import gc
import sys
import time

import numpy as np
import torch

from lingbot_map_ros.core.config import RuntimeConfig, StreamConfig, model_input_height
from lingbot_map_ros.core.footprint import GB, footprint
from lingbot_map_ros.core.memory_budget import MemoryBudgetExceeded
from lingbot_map_ros.core.model_host import ModelHost
from lingbot_map_ros.core.session_manager import SessionManager


def frame_pool(height: int, width: int, device: torch.device, n: int = 8) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    pool = [torch.rand(3, height, width, generator=gen) for _ in range(n)]
    return [p.pin_memory() for p in pool] if device.type == "cuda" else pool


def measured_bytes(device: torch.device, manager: SessionManager) -> int:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return manager.memory_report().allocated  # CPU: the tensors' bytes (weights, pools)


def fresh(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def stream_through(manager: SessionManager, pool: list[torch.Tensor], frames: int, steady_from: int) -> list[float]:
    """Push ``frames`` frames; ms of each one-frame step from ``steady_from`` on."""
    times = []
    for i in range(frames):
        t0 = time.perf_counter()
        manager.push(pool[i % len(pool)], float(i))
        dt = (time.perf_counter() - t0) * 1e3
        if i >= steady_from:
            times.append(dt)
    return times


def part_a(base, runtime_cfg: RuntimeConfig, args) -> None:
    device = base.resolved.device
    print(f"\n### a) predicted vs measured peak: preset {base.cfg.preset}, {str(base.resolved.dtype)[6:]}, "
          f"{base.resolved.attention}, {args.frames} frames after the window is full\n")
    # the node's speed per geometry comes from lingbot_map_bench (docs/performance.md): this loop's times
    # were well above it on the H200 (35-61 ms at 518 against 29-33 ms), with the fused blocks off too
    print("| width x height | window | heads | predicted GB | measured GB | measured / predicted "
          "| ms/frame (indicative only) |")
    print("|---|---|---|---|---|---|---|")
    for width in args.widths:
        height = model_input_height(640, 480, width)
        pool = frame_pool(height, width, device)
        for window in args.windows:
            for heads in args.heads:
                stream = StreamConfig(sliding_window=window, with_depth=heads == "depth+camera", image_width=width)
                fresh(device)
                manager = SessionManager.around(base.model, base.cfg, stream, base.resolved, log=lambda m: None,
                                                settings=runtime_cfg)
                steady_from = stream.scale_frames + window + 1
                times = stream_through(manager, pool, steady_from + args.frames, steady_from)
                predicted = footprint(base.cfg, base.resolved, manager.stream_cfg, height, width).total
                measured = measured_bytes(device, manager)
                print(f"| {width}x{height} | {window} | {heads} | {predicted / GB:.3f} | {measured / GB:.3f} | "
                      f"{measured / predicted:.3f} | {np.median(times):.2f} |", flush=True)
                del manager


def part_b(base, runtime_cfg: RuntimeConfig, args) -> None:
    device = base.resolved.device
    total = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else 0
    cuda_index = 0  # set_per_process_memory_fraction wants an index, not torch.device("cuda")
    if device.type == "cuda":
        cuda_index = device.index if device.index is not None else torch.cuda.current_device()
    print(f"\n### b) small cards: fit_window, depth+camera, long_run_policy window, {args.long_frames} frames\n")
    print("| cap GB | width x height | window picked | depth chunk | peak GB | peak <= budget | window switches "
          "| ms/frame | result |")
    print("|---|---|---|---|---|---|---|---|---|")
    for cap in args.caps:
        if device.type == "cuda":
            torch.cuda.set_per_process_memory_fraction(min(1.0, cap * GB / total), cuda_index)
        for width in args.b_widths:
            height = model_input_height(640, 480, width)
            stream = StreamConfig(with_depth=True, image_width=width, gpu_memory_budget=cap, fit_window=True)
            fresh(device)
            try:
                manager = SessionManager.around(base.model, base.cfg, stream, base.resolved, log=lambda m: None,
                                                settings=runtime_cfg)
            except MemoryBudgetExceeded as exc:
                print(f"| {cap} | {width}x{height} | - | - | - | - | - | - | refused: {exc} |", flush=True)
                continue
            picked = manager.stream_cfg
            result = "ok"
            times: list[float] = []
            try:
                times = stream_through(manager, frame_pool(height, width, device), args.long_frames,
                                       picked.scale_frames + picked.sliding_window + 1)
            except Exception as exc:  # noqa: BLE001 - an out-of-memory is the finding, reported in the table
                result = f"FAILED {type(exc).__name__}: {str(exc)[:200]}"
            peak = measured_bytes(device, manager)
            print(f"| {cap} | {width}x{height} | {picked.sliding_window} | {picked.depth_chunk} | {peak / GB:.3f} | "
                  f"{'yes' if peak <= cap * GB else 'NO'} | {manager.policy.window_switches} | "
                  f"{np.median(times) if times else float('nan'):.2f} | {result} |", flush=True)
            del manager
            break  # the largest width that fits is the answer for this cap
    if device.type == "cuda":
        torch.cuda.set_per_process_memory_fraction(1.0, cuda_index)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--preset", default="full")
    p.add_argument("--dtype", default="auto", help="auto: bfloat16 on CUDA, float32 on the CPU")
    p.add_argument("--part", default="ab", help="a, b or ab")
    p.add_argument("--widths", default="518,392,280")
    p.add_argument("--windows", default="16,32,64")
    p.add_argument("--heads", default="camera,depth+camera")
    p.add_argument("--frames", type=int, default=60, help="part a: steady frames per row")
    p.add_argument("--caps", default="8,4", help="part b: GB caps")
    p.add_argument("--b-widths", default="518,392,280,224", help="part b: widths tried in turn until one fits")
    p.add_argument("--long-frames", type=int, default=2000, help="part b: frames per cap")
    p.add_argument("--compile-blocks", default="off", choices=("auto", "on", "off"),
                   help="off by default: compiling per width would take most of the time limit")
    args = p.parse_args(argv)
    args.widths = [int(v) for v in args.widths.split(",")]
    args.windows = [int(v) for v in args.windows.split(",")]
    args.heads = [h for h in args.heads.split(",") if h]
    args.caps = [float(v) for v in args.caps.split(",")]
    args.b_widths = [int(v) for v in args.b_widths.split(",")]
    runtime_cfg = RuntimeConfig(model_preset=args.preset, device=args.device, dtype=args.dtype,
                                compile_blocks=args.compile_blocks)
    base = ModelHost.load(runtime_cfg, log=lambda m: None)
    gpu = torch.cuda.get_device_name(base.resolved.device) if base.resolved.device.type == "cuda" else "CPU"
    print(f"footprint_check: {gpu}, torch {torch.__version__}, weights {base.weights}")
    if "a" in args.part:
        part_a(base, runtime_cfg, args)
    if "b" in args.part:
        part_b(base, runtime_cfg, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
