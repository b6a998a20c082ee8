"""``lingbot_map_offline``: stream frames through the session without ROS and save the trajectory.

Used for replaying recordings and for the parity check against the official implementation
(full preset, fp32, CPU, small sizes): ``--frames X.npy --out result.npz``.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from ..core.geometry import write_tum
from ..core.results import FrameResult
from .common import add_session_options, runtime_from_args, stream_from_args


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lingbot_map_offline", description=__doc__.splitlines()[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--frames", help="float32 .npy [S,3,H,W] in [0,1], already model-sized")
    src.add_argument("--images", help="folder of *.jpg/*.png (sorted by name), preprocessed as the node does")
    src.add_argument("--video", help="video file, preprocessed as the node does")
    src.add_argument("--bag", help="rosbag2 folder (mcap or sqlite3) with Image/CompressedImage messages")
    p.add_argument("--topic", default="", help="image topic inside --bag (default: the only image topic)")
    p.add_argument("--fps", type=float, default=0.0, help="--video: keep about this many frames per second")
    p.add_argument("--max-frames", type=int, default=0, help="stop after this many frames (0 = all)")
    p.add_argument("--out", required=True, help="result .npz (pose_enc, c2w, intrinsics, is_keyframe, ...) or .json")
    p.add_argument("--tum", default="", help="also write the trajectory in TUM format")
    p.add_argument("--quiet", action="store_true")
    add_session_options(p)
    return p


def frame_source(args: argparse.Namespace):
    from . import frame_sources

    if args.frames:
        return frame_sources.npy_frames(args.frames)
    if args.images:
        return frame_sources.image_folder_frames(args.images)
    if args.video:
        return frame_sources.video_frames(args.video, fps=args.fps)
    return frame_sources.bag_frames(args.bag, topic=args.topic)


def save_results(results: list[FrameResult], out: str, tum: str = "") -> None:
    pose_enc = np.stack([r.pose_enc for r in results]).astype(np.float32)  # [S, 9]
    if out.endswith(".json"):
        Path(out).write_text(json.dumps({"pose_enc": pose_enc.tolist()}))
    else:
        np.savez(
            out,
            pose_enc=pose_enc,
            c2w=np.stack([r.c2w for r in results]),  # [S, 4, 4]
            intrinsics=np.stack([r.intrinsics for r in results]),  # [S, 3, 3]
            is_keyframe=np.array([r.is_keyframe for r in results]),  # [S]
            frame_index=np.array([r.frame_index for r in results]),
            session_id=np.array([r.session_id for r in results]),
            window_index=np.array([r.window_index for r in results]),
            stamp=np.array([float(r.stamp) for r in results]),
            latency_ms=np.array([r.latency_ms for r in results]),
        )
    if tum:
        write_tum(tum, [float(r.stamp) for r in results], [r.c2w for r in results])


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from ..core.stream import SessionError
    from ..core.long_run import make_session

    say = (lambda m: None) if args.quiet else (lambda m: print(f"[lingbot_map_offline] {m}", file=sys.stderr))
    try:
        session = make_session(runtime_from_args(args), stream_from_args(args), log=say)
    except (ValueError, OSError) as exc:
        print(f"lingbot_map_offline: {exc}", file=sys.stderr)
        return 2
    results: list[FrameResult] = []
    dropped = 0
    start = time.perf_counter()
    for count, (frame, stamp) in enumerate(frame_source(args)):
        if args.max_frames and count >= args.max_frames:
            break
        try:
            results += session.push(frame, stamp)
        except SessionError as exc:
            dropped += 1
            say(f"frame {count} dropped: {exc}")
    results += session.flush()
    if not results:
        print("lingbot_map_offline: no frame was processed", file=sys.stderr)
        return 1
    save_results(results, args.out, args.tum)
    wall = time.perf_counter() - start
    say(f"{len(results)} frames ({dropped} dropped) in {wall:.1f} s -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
