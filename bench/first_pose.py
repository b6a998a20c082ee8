"""Time to first pose: from process start to the first poses of the core (GPU; a CPU dry run works).

What a robot waits for after boot, through the core alone (no ROS transport, no camera pacing: frames
are pushed back to back): the interpreter and imports, the model's load, the scale frames' joint call
(the first poses, eager), then the first one-frame step, which compiles the fused blocks and the depth
head (Inductor), JIT-compiles our Triton/Gluon kernels and captures the step's CUDA graphs, and the
frames until the window is full (each filling bucket of the split kernel is one more capture). With the
kernel cache empty (``cold``) every compiler runs; with it kept (``warm``: ``LINGBOT_MAP_CACHE_DIR``, or
``lingbot_map_bench --warm-cache`` at install time) they read their results back.

The model loads as a robot's does, from a checkpoint file (``--checkpoint``: ``RuntimeConfig(checkpoint=...)``,
the file read, cast to the compute dtype and moved to the GPU). A file of the official key names and
shapes, holding the preset's seeded random weights, is written beforehand and untimed by
``--write-checkpoint`` (float32, as the official files are: 4.6 GB for ``full``; speed does not depend on
the values). Without ``--checkpoint`` the weights are drawn in the timed process instead, which costs
far more than reading a file. The row's ``weights`` says which of the two its ``model_load_s`` holds.

    python3 bench/first_pose.py --write-checkpoint /tmp/fp/full.safetensors          # set-up, untimed
    LINGBOT_MAP_CACHE_DIR=/tmp/kc python3 bench/first_pose.py --checkpoint /tmp/fp/full.safetensors \
        --caches cold --json first_cold.json
    python3 bench/first_pose.py --device cpu --preset tiny --height 42 --width 56   # dry run
"""
from __future__ import annotations

import os
import time


def _seconds_since_process_start() -> float:
    """Seconds since the kernel started this process (``/proc/self/stat``), so the interpreter's own
    start-up counts; the wall clock since this module began where ``/proc`` cannot say."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: start time in clock ticks since boot
        with open("/proc/uptime") as f:
            return float(f.read().split()[0]) - started
    except (OSError, ValueError, IndexError):
        return time.perf_counter() - _MODULE_START


_MODULE_START = time.perf_counter()
_AT_MODULE_START = _seconds_since_process_start()

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

RANDOM_WEIGHTS = "random (drawn in process)"  # the row's ``weights`` without --checkpoint
CHECKPOINT_SEED = 0  # the seed of the weights --write-checkpoint draws


def write_checkpoint(path: Path, preset: str, dtype_name: str, device: str) -> None:
    """Write ``preset``'s seeded random weights to ``path`` as a safetensors checkpoint with the official
    key names (the model's ``state_dict()``), every tensor in ``dtype_name``. Set-up for the timed run,
    so it is not timed. Atomic: the file goes to a temporary name beside ``path`` and is renamed over it
    once complete and flushed, so a killed write never leaves a truncated checkpoint to be timed."""
    import torch
    from safetensors.torch import save_file

    from lingbot_map_ros.core.config import model_config
    from lingbot_map_ros.core.files import temporary_name
    from lingbot_map_ros.core.model.checkpoint import build_model

    dtype = getattr(torch, dtype_name)
    model, _ = build_model(model_config(preset), seed=CHECKPOINT_SEED, device=device, dtype=torch.float32)
    tensors = {name: (t.to(dtype) if t.is_floating_point() else t).detach().to("cpu").contiguous()
               for name, t in model.state_dict().items()}
    del model
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_name(path)
    try:
        save_file(tensors, str(tmp), metadata={"format": "pt", "preset": preset, "seed": str(CHECKPOINT_SEED)})
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    print(f"wrote {path}: {path.stat().st_size / 1e9:.2f} GB, {len(tensors)} tensors in {dtype_name}, "
          f"the '{preset}' preset's random weights (seed {CHECKPOINT_SEED})")


def weights_of(checkpoint: str, random_weights: bool) -> str:
    """What the row's ``model_load_s`` holds: weights drawn in the process, or a file read (its size and format)."""
    if random_weights:
        return RANDOM_WEIGHTS
    from lingbot_map_ros.core.model.checkpoint import sniff_format

    kind = sniff_format(Path(checkpoint))
    return f"checkpoint file ({os.path.getsize(checkpoint) / 1e9:.2f} GB, " \
           f"{'safetensors' if kind == 'safetensors' else 'torch.save'})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--caches", default="cold", choices=("cold", "warm"), help="what the row calls the kernel cache")
    p.add_argument("--device", default="cuda")
    p.add_argument("--preset", default="full")
    p.add_argument("--height", type=int, default=378)
    p.add_argument("--width", type=int, default=518)
    p.add_argument("--heads", default="depth+camera", choices=("depth+camera", "camera"))
    p.add_argument("--scale-frames", type=int, default=8)
    p.add_argument("--sliding-window", type=int, default=64)
    p.add_argument("--json", default="", metavar="FILE", help="write the first_pose row (run-of-record shape)")
    p.add_argument("--checkpoint", default="", metavar="FILE",
                   help="load the model from this checkpoint (.safetensors/.pt/.pth with the official key names, "
                        "--preset's shapes) as a robot does; default: random weights drawn in the timed process")
    p.add_argument("--write-checkpoint", default="", metavar="FILE",
                   help="set-up, untimed: write --preset's seeded random weights as a .safetensors checkpoint "
                        "to FILE (drawn on --device) and exit")
    p.add_argument("--dtype", default=None, choices=("float32", "bfloat16"),
                   help="--write-checkpoint's tensor dtype (default float32, the official checkpoint files' "
                        "dtype: 4.6 GB for full; bfloat16 halves it). The timed run computes in bf16 on a GPU, "
                        "fp32 on the CPU, whatever the file holds")
    args = p.parse_args()
    if args.write_checkpoint:
        if args.checkpoint:
            p.error("--write-checkpoint writes a checkpoint and exits; time the run with --checkpoint afterwards")
        write_checkpoint(Path(args.write_checkpoint), args.preset, args.dtype or "float32", args.device)
        return
    if args.dtype:
        p.error("--dtype is the dtype --write-checkpoint writes; the timed run computes in the device's dtype")

    def since_start() -> float:
        return _AT_MODULE_START + time.perf_counter() - _MODULE_START

    import torch

    from lingbot_map_ros.core.config import RuntimeConfig, StreamConfig
    from lingbot_map_ros.core.kernel_cache import use_kernel_cache
    from lingbot_map_ros.core.model.checkpoint import CheckpointError
    from lingbot_map_ros.core.model_host import ModelHost
    from lingbot_map_ros.core.session_manager import SessionManager

    folders = use_kernel_cache()
    imported = since_start()
    capture_s = [0.0]  # time inside CUDA-graph captures (the rest of the first step: compilers and warm-up)
    if args.device.startswith("cuda"):
        graph_cls = torch.cuda.CUDAGraph
        begin, end = graph_cls.capture_begin, graph_cls.capture_end
        started: list[float] = []

        def timed_begin(self, *a, **k):
            started.append(time.perf_counter())
            return begin(self, *a, **k)

        def timed_end(self, *a, **k):
            out = end(self, *a, **k)
            capture_s[0] += time.perf_counter() - started.pop()
            return out

        graph_cls.capture_begin, graph_cls.capture_end = timed_begin, timed_end
    on_cuda = args.device.startswith("cuda")
    settings = RuntimeConfig(device=args.device, model_preset=args.preset, dtype="bfloat16" if on_cuda else "float32",
                             checkpoint=args.checkpoint)
    try:
        base = ModelHost.load(settings, log=lambda m: print(m, file=sys.stderr))
    except CheckpointError as exc:
        sys.exit(f"first_pose.py: {exc}")
    if on_cuda:
        torch.cuda.synchronize()
    loaded = since_start()
    stream = StreamConfig(scale_frames=args.scale_frames, sliding_window=args.sliding_window,
                          with_depth=args.heads == "depth+camera")
    manager = SessionManager.around(base.model, base.cfg, stream, base.resolved, log=lambda m: None,
                                    settings=settings, random_weights=base.random_weights)
    gen = torch.Generator().manual_seed(0)
    frames = [torch.rand(3, args.height, args.width, generator=gen) for _ in range(4)]
    marks: dict[str, float] = {}
    longest_ms = 0.0
    steady_at = args.scale_frames + args.sliding_window + 2
    for i in range(steady_at + 20):
        t0 = time.perf_counter()
        results = manager.push(frames[i % len(frames)], float(i))
        ms = (time.perf_counter() - t0) * 1e3
        if results and "first_pose" not in marks:
            marks["first_pose"] = since_start()  # the scale frames' joint call
        elif results and "first_graph_pose" not in marks:
            marks["first_graph_pose"] = since_start()  # the first one-frame step: compile + capture
            first_step_ms = ms
            first_capture_s = capture_s[0]
        elif results and i > args.scale_frames:
            longest_ms = max(longest_ms, ms)
        if i == steady_at:
            marks["window_full"] = since_start()
    steady = since_start()
    row = {"table": "first_pose", "caches": args.caches, "geometry": f"{args.width}x{args.height}",
           "heads": args.heads, "path": "default", "attention": base.resolved.attention,
           "seconds": round(marks["first_pose"], 2), "first_graph_pose_s": round(marks["first_graph_pose"], 2),
           "window_full_s": round(marks["window_full"], 2), "import_s": round(imported, 2),
           "model_load_s": round(loaded - imported, 2), "weights": weights_of(args.checkpoint, base.random_weights),
           "first_step_compile_capture_s": round(first_step_ms / 1e3, 2),
           # the first one-frame step split: its graph captures, and the rest (Inductor, the Triton JIT, warm-up)
           "capture_s": round(first_capture_s, 2) if on_cuda else None,
           "compile_s": round(first_step_ms / 1e3 - first_capture_s, 2) if on_cuda else None,
           "longest_later_frame_ms": round(longest_ms, 1), "excludes": "ROS transport and camera pacing",
           "cache_folders": folders}
    print(f"time to first pose ({args.caches} caches, {row['geometry']}, {args.heads}, {base.resolved.attention}): "
          f"process start -> imports {row['import_s']} s -> model ({row['weights']}) {row['model_load_s']} s more "
          f"-> first poses "
          f"(scale frames) at {row['seconds']} s -> first one-frame pose at {row['first_graph_pose_s']} s "
          f"(its step {row['first_step_compile_capture_s']} s: compile + capture) -> window full at "
          f"{row['window_full_s']} s; longest later frame {row['longest_later_frame_ms']} ms; done at {steady:.1f} s")
    if args.json:  # with the set-up, so that a run of record made of first-pose parts alone has one
        from lingbot_map_ros.core.files import atomic_open
        from lingbot_map_ros.tools.bench import setup_facts

        with atomic_open(args.json, "w") as f:
            json.dump({"setup": setup_facts(torch.device(args.device)), "rows": [row]}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
