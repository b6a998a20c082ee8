"""``lingbot_map_offline``: stream frames through the session without ROS and save the trajectory.

Used for replaying recordings and for the parity check against the official implementation
(full preset, fp32, CPU, small sizes): ``--frames X.npy --out result.npz``.

Reconstruction exports (issue 9): ``--with-depth`` also stores ``depth``/``depth_conf`` ``[S, H, W]``
in the ``.npz``; ``--ply map.ply`` writes the fused voxel map (the node's ``~/map_points`` rules);
``--colmap DIR`` writes COLMAP text (cameras, poses, the fused points) plus the model-input frames
the cameras refer to (``DIR/images``). Both run the depth head. Frames are read one at a time
(an ``.npy`` is memory-mapped) and only frames still waiting for their result are kept.
"""
from __future__ import annotations

import argparse
import dataclasses
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
    g = p.add_argument_group("reconstruction exports (run the depth head)")
    g.add_argument("--ply", default="", help="write the fused points (voxel map) as binary PLY")
    g.add_argument("--colmap", default="", help="write COLMAP text (cameras.txt, images.txt, points3D.txt, images/)")
    add_session_options(p)
    # the node's unprojection and map settings, same names, defaults and ranges (settings table)
    add_session_options(p, names=RECON_OPTIONS, with_depth=False)
    return p


RECON_OPTIONS = ("points_stride", "points_min_confidence", "map_voxel_size", "map_max_points")


def recon_problems(args: argparse.Namespace) -> list[str]:
    """Range problems of the reconstruction options (the node's rules for the same parameters)."""
    from ..core.settings import SETTINGS_BY_NAME

    out = []
    for name in RECON_OPTIONS:
        lo, hi = SETTINGS_BY_NAME[name].range
        v = getattr(args, name)
        if not lo <= v <= hi:
            out.append(f"{name} must be in [{lo}, {hi}] (got {v})")
    return out


def frame_source(args: argparse.Namespace):
    from . import frame_sources

    if args.frames:
        return frame_sources.npy_frames(args.frames)
    if args.images:
        return frame_sources.image_folder_frames(args.images)
    if args.video:
        return frame_sources.video_frames(args.video, fps=args.fps)
    return frame_sources.bag_frames(args.bag, topic=args.topic)


def save_results(results: list[FrameResult], out: str, tum: str = "", with_depth: bool = False) -> None:
    pose_enc = np.stack([r.pose_enc for r in results]).astype(np.float32)  # [S, 9]
    if out.endswith(".json"):
        Path(out).write_text(json.dumps({"pose_enc": pose_enc.tolist()}))
    else:
        extra = {}
        if with_depth and all(r.depth is not None for r in results):
            extra["depth"] = np.stack([r.depth for r in results]).astype(np.float32)  # [S, H, W]
            extra["depth_conf"] = np.stack([r.depth_conf for r in results]).astype(np.float32)  # [S, H, W]
        np.savez(
            out,
            **extra,
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

    if (args.ply or args.colmap) and recon_problems(args):
        print("lingbot_map_offline: " + "; ".join(recon_problems(args)), file=sys.stderr)
        return 2
    say = (lambda m: None) if args.quiet else (lambda m: print(f"[lingbot_map_offline] {m}", file=sys.stderr))
    try:
        stream = stream_from_args(args)
        if args.ply or args.colmap:  # the exports need the depth head
            stream = dataclasses.replace(stream, with_depth=True)
        session = make_session(runtime_from_args(args), stream, log=say)
    except (ValueError, OSError) as exc:
        print(f"lingbot_map_offline: {exc}", file=sys.stderr)
        return 2
    results: list[FrameResult] = []
    dropped = 0
    start = time.perf_counter()
    recon = _Reconstruction(args, session.device) if (args.ply or args.colmap) else None
    for count, (frame, stamp) in enumerate(frame_source(args)):
        if args.max_frames and count >= args.max_frames:
            break
        tagged = _IndexedStamp(stamp, count)
        if recon is not None:
            recon.waiting[count] = frame
        try:
            new = session.push(frame, tagged)
        except SessionError as exc:
            dropped += 1
            say(f"frame {count} dropped: {exc}")
            if recon is not None:
                recon.waiting.pop(count, None)
            continue
        results += _consume(new, recon, args.with_depth)
    results += _consume(session.flush(), recon, args.with_depth)
    if not results:
        print("lingbot_map_offline: no frame was processed", file=sys.stderr)
        return 1
    save_results(results, args.out, args.tum, with_depth=args.with_depth)
    if recon is not None:
        recon.finish(results, say)
    wall = time.perf_counter() - start
    say(f"{len(results)} frames ({dropped} dropped) in {wall:.1f} s -> {args.out}")
    return 0


class _IndexedStamp(float):
    """The source's stamp (a float, as before) that also knows which pushed frame it belongs to, so a
    result finds its input frame (for colours and COLMAP images) whatever the session buffers."""

    index: int

    def __new__(cls, value: float, index: int) -> "_IndexedStamp":
        obj = super().__new__(cls, value)
        obj.index = index
        return obj


class _Reconstruction:
    """``--ply`` / ``--colmap``: a voxel map fed frame by frame; COLMAP frames written as they come."""

    def __init__(self, args: argparse.Namespace, device) -> None:
        from ..core.reconstruction import VoxelMap

        self.args = args
        self.device = device
        self.map = VoxelMap(args.map_voxel_size, args.map_max_points)
        self.waiting: dict[int, object] = {}  # pushed frames whose result is not out yet
        self.names: dict[int, str] = {}  # frame index -> COLMAP image name
        self.intrinsics: dict[int, np.ndarray] = {}  # frame index -> the K its points used [3, 3]
        self.image_hw: tuple[int, int] | None = None
        if args.colmap:
            (Path(args.colmap) / "images").mkdir(parents=True, exist_ok=True)

    def add(self, r: FrameResult) -> None:
        import torch

        from ..core.reconstruction import is_finite_camera, unproject_depth

        from ..core.geometry import intrinsics_for_camera

        index = getattr(r.stamp, "index", None)
        frame = self.waiting.pop(index, None) if index is not None else None
        if r.depth is None or frame is None:
            return
        h, w = (int(v) for v in r.depth.shape)
        # the node's published intrinsics: raw K with the focal lengths clamped to a sane FoV (the
        # head's ReLU'd FoV can be 0, an infinite focal length); points and cameras.txt both use it
        k = intrinsics_for_camera(r.intrinsics, (w, h), (h, w), 0)
        if not is_finite_camera(k, r.c2w):
            return
        pts = unproject_depth(r.depth, k, r.c2w, confidence=r.depth_conf, image=frame,
                              stride=self.args.points_stride, min_confidence=self.args.points_min_confidence,
                              device=self.device)
        self.map.add(pts)
        self.image_hw = tuple(int(v) for v in r.depth.shape)  # type: ignore[assignment]
        if self.args.colmap:
            from PIL import Image

            name = f"frame_{index:06d}.png"
            rgb = (frame.clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).cpu().numpy()  # [H, W, 3]
            Image.fromarray(rgb).save(Path(self.args.colmap) / "images" / name)
            self.names[index] = name
            self.intrinsics[index] = k

    def finish(self, results: list[FrameResult], say) -> None:
        from ..core.reconstruction import write_colmap_text, write_ply

        xyz, rgb, conf = self.map.points().numpy()
        if self.args.ply:
            n = write_ply(self.args.ply, xyz, rgb, conf, comment="lingbot_map_offline fused points")
            say(f"{n} fused points -> {self.args.ply}")
        if self.args.colmap:
            keep = [r for r in results if getattr(r.stamp, "index", None) in self.names]
            write_colmap_text(self.args.colmap, np.stack([r.c2w for r in keep]).reshape(-1, 4, 4),
                              np.stack([self.intrinsics[r.stamp.index] for r in keep]).reshape(-1, 3, 3),
                              self.image_hw or (0, 0),
                              [self.names[r.stamp.index] for r in keep], xyz, rgb)
            say(f"COLMAP text model ({len(keep)} images, {len(xyz)} points) -> {self.args.colmap}")


def _consume(new: list[FrameResult], recon: "_Reconstruction | None", keep_depth: bool) -> list[FrameResult]:
    """Feed results to the exports, then drop their depth unless the .npz wants it (memory stays flat)."""
    out = []
    for r in new:
        if recon is not None:
            recon.add(r)
        if not keep_depth and r.depth is not None:
            r = dataclasses.replace(r, depth=None, depth_conf=None)
        out.append(r)
    return out


if __name__ == "__main__":
    sys.exit(main())
