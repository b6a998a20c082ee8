"""CLI options shared by the offline tool and the benchmark; names equal the node parameters."""
from __future__ import annotations

import argparse

from ..core.config import RuntimeConfig, StreamConfig


def add_session_options(parser: argparse.ArgumentParser, *, scale_frames: int = 8, sliding_window: int = 64) -> None:
    g = parser.add_argument_group("model and session (same names as the node parameters)")
    g.add_argument("--checkpoint", default="", help="official .pt/.safetensors; empty = random weights")
    g.add_argument("--model-preset", default="", choices=["", "full", "tiny"],
                   help="full = official shapes; default: full with a checkpoint, tiny without")
    g.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    g.add_argument("--dtype", default="auto", help="auto (bf16 on GPU, fp32 on CPU), float32, bfloat16, float16")
    g.add_argument("--attention-backend", default="auto", choices=["auto", "flashinfer", "sdpa"])
    g.add_argument("--scale-frames", type=int, default=scale_frames)
    g.add_argument("--sliding-window", type=int, default=sliding_window)
    g.add_argument("--keyframe-interval", type=int, default=1)
    g.add_argument("--camera-iterations", type=int, default=4)
    g.add_argument("--max-frame-num", type=int, default=1024)
    g.add_argument("--max-stored-frames", type=int, default=320,
                   help="stored frames per session before the long-run policy acts")
    g.add_argument("--long-run-policy", default="window", choices=["window", "reset", "stop"])
    g.add_argument("--overlap-frames", type=int, default=16)
    g.add_argument("--with-depth", action="store_true", help="run the DPT depth head")
    g.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    g.add_argument("--allow-unsafe-checkpoint", action="store_true",
                   help="allow a checkpoint that needs arbitrary code to unpickle (trusted files only)")


def runtime_from_args(args: argparse.Namespace) -> RuntimeConfig:
    return RuntimeConfig(
        device=args.device,
        dtype=args.dtype,
        attention_backend=args.attention_backend,
        checkpoint=args.checkpoint,
        model_preset=args.model_preset,
        seed=args.seed,
        allow_unsafe_checkpoint=args.allow_unsafe_checkpoint,
    )


def stream_from_args(args: argparse.Namespace) -> StreamConfig:
    return StreamConfig(
        scale_frames=args.scale_frames,
        sliding_window=args.sliding_window,
        keyframe_interval=args.keyframe_interval,
        camera_iterations=args.camera_iterations,
        max_frame_num=args.max_frame_num,
        with_depth=args.with_depth,
        long_run_policy=args.long_run_policy,
        max_stored_frames=min(args.max_stored_frames, args.max_frame_num - 1),
        overlap_frames=args.overlap_frames,
    )
