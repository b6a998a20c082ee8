"""``lingbot_map_offline``: stream frames through the session without ROS and save the trajectory.

Used for replaying recordings and for the parity check against the official implementation
(full preset, fp32, CPU, small sizes): ``--frames X.npy --out result.npz``.

Reconstruction exports: ``--with-depth`` also stores ``depth``/``depth_conf`` ``[S, H, W]``
in the ``.npz``; ``--ply map.ply`` writes the fused voxel map (the node's ``~/map_points`` rules);
``--colmap DIR`` writes COLMAP text (cameras, poses, the fused points) plus the model-input frames
the cameras refer to (``DIR/images``). Both run the depth head. Saved sessions (docs/sessions.md):
``--save-session DIR`` writes the session (the KV cache's map) after the run; ``--load-session DIR``
continues a saved one, so a second recording is processed in the world of the first (``--no-mapping``:
localization only, the loaded map is not changed). Frames are read one at a time
(an ``.npy`` is memory-mapped) and only frames still waiting for their result are kept.

Several cameras of one bag (``--topic /front/image --topic /rear/image``) run as the node's
several-camera mode does, one stream per camera over one model; with ``--base-frame`` every camera is
placed in one world with one body pose through the bag's TF: ``offline_cameras.py``. Offline, a camera
counts as stalled (``--camera-timeout``) after that many seconds of image stamps without a placed frame
(the node counts wall time), so a run is repeatable.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import signal
import sys
import time
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from ..core.files import atomic_open
from ..core.results import FrameResult
from ..core.trajectory import write_tum
from .cli import (
    INTERRUPTED_EXIT,
    OneLineParser,
    UsageError,
    distinct_outputs,
    fail,
    output_dir,
    output_path,
)
from .common import add_session_options, check_session_args, runtime_from_args, stream_from_args

PROG = "lingbot_map_offline"
OUT_SUFFIXES = (".npz", ".json")
TUM_SUFFIXES = (".tum", ".txt")


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog=PROG, description=__doc__)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--frames", help="float32 .npy [S,3,H,W] in [0,1], already model-sized (stamps: indices)")
    src.add_argument("--images", help="folder of *.jpg/*.jpeg/*.png, preprocessed as the node does; stamps from "
                     "numeric file names (TUM 1305031102.175304.png s, EuRoC 1403636579763555584.png ns), "
                     "else --stamps, else --fps, else the frame index")
    src.add_argument("--video", help="video file, preprocessed as the node does; stamps: the container's timestamps")
    src.add_argument("--bag", help="rosbag2 folder (mcap or sqlite3) or ROS 1 .bag file with Image/CompressedImage "
                     "messages; stamps: the message headers")
    p.add_argument("--topic", action="append", default=[], help="image topic inside --bag (default: the only image "
                   "topic); several --topic options: several cameras of one bag, one stream each through one model "
                   "(the node's several-camera mode), one output per camera named after it: --out run.npz -> "
                   "run.front.npz, run.rear.npz (--tum likewise)")
    p.add_argument("--camera-name", action="append", default=[], help="with several --topic: the cameras' names, "
                   "in the order of the topics (default: each topic's first name, /front/image -> front)")
    p.add_argument("--depth-topic", default="", help="--bag: the depth topic registered to the colour image "
                   "(scale_source depth), paired by stamp as the node pairs it")
    p.add_argument("--stamps", default="", help="--images: stamps file, one stamp (s) per image in name order, or "
                   "TUM rgb.txt 'stamp path' lines (they then choose the images)")
    p.add_argument("--fps", type=float, default=0.0, help="--video: keep about this many frames per second; "
                   "--images without stamps in the names: stamp = index / fps (default: 0 = all frames / indices)")
    p.add_argument("--max-frames", type=int, default=0, help="stop after this many frames (default: 0 = all)")
    p.add_argument("--out", required=True, help="result file, exactly this name: .npz (pose_enc, c2w, intrinsics, "
                   "is_keyframe, stamps, latency, ...) or .json (pose_enc only)")
    p.add_argument("--tum", default="", help="also write the trajectory in TUM format (stamp tx ty tz qx qy qz qw), "
                   ".tum or .txt")
    p.add_argument("--plot", default="", help="also write a figure (.png/.pdf/.svg): trajectory top view, latency "
                   "per frame, KV-cache pages over frames")
    p.add_argument("--quiet", action="store_true", help="print nothing but errors (no progress bar, no summary)")
    g = p.add_argument_group("reconstruction exports (names as the node parameters)")
    g.add_argument("--ply", default="", help="write the fused points (voxel map) as binary PLY")
    g.add_argument("--colmap", default="", help="write COLMAP text (cameras.txt, images.txt, points3D.txt, images/) "
                   "into this folder")
    g = p.add_argument_group("saved sessions (docs/sessions.md)")
    g.add_argument("--save-session", default="", metavar="DIR", help="after the run, save the session (the map) "
                   "to this folder, atomically")
    g.add_argument("--load-session", default="", metavar="DIR", help="continue the session saved in this folder: "
                   "poses in its world, frame numbering continued")
    g.add_argument("--no-mapping", action="store_true", help="with --load-session: localization only, no frame is "
                   "stored (the loaded map stays as it is)")
    add_session_options(p)
    # the node's unprojection and map settings: same names, defaults and ranges (the settings table)
    add_session_options(p, names=RECON_OPTIONS, with_depth=False)
    # a robot's recording (--bag with /tf, /tf_static, a depth topic): the node's robot settings
    add_session_options(p, names=ROBOT_OPTIONS, with_depth=False)
    # several cameras with --base-frame: the node's rig settings (offline_cameras.py)
    add_session_options(p, names=CAMERA_OPTIONS, with_depth=False)
    return p


CAMERA_OPTIONS = ("primary_camera", "camera_timeout")
RECON_OPTIONS = ("points_stride", "points_min_confidence", "map_voxel_size", "map_max_points")
ROBOT_OPTIONS = ("base_frame", "odom_frame", "world_frame", "camera_frame", "scale_source", "scale_factor",
                 "scale_min_samples", "scale_min_travel", "depth_sync_slop")


def robot_mode(args: argparse.Namespace) -> bool:
    """Whether the run places its poses in a robot's TF tree / a metric unit (the node's robot mode)."""
    return bool(args.base_frame or args.depth_topic or args.scale_source != "model")


def robot_values(args: argparse.Namespace) -> dict:
    from ..core.settings import defaults

    values = defaults()
    values.update({name: getattr(args, name) for name in ROBOT_OPTIONS})
    values["image_width"] = args.image_width
    values["camera_aspect"] = args.camera_aspect
    values["tf_timeout"] = 0.0  # the recording holds every transform and depth image already: nothing to wait for
    return values


def check_outputs(args: argparse.Namespace) -> None:
    """Every output checked before the model is built: exact names, existing folders, no clashes."""
    output_path(args.out, "--out", OUT_SUFFIXES)
    if args.tum:
        output_path(args.tum, "--tum", TUM_SUFFIXES)
    if args.plot:
        from .plotting import PLOT_SUFFIXES, available

        output_path(args.plot, "--plot", PLOT_SUFFIXES)
        missing = available()
        if missing:
            raise UsageError(f"--plot {args.plot}: {missing}")
    if args.ply:
        output_path(args.ply, "--ply", (".ply",))
    if args.colmap:
        output_dir(args.colmap, "--colmap")
    distinct_outputs([("--out", args.out), ("--tum", args.tum), ("--plot", args.plot), ("--ply", args.ply)])
    if args.max_frames < 0:
        raise UsageError(f"--max-frames must be >= 0 (got {args.max_frames})")
    if args.fps < 0:
        raise UsageError(f"--fps must be >= 0 (got {args.fps:g})")
    if args.no_mapping and not args.load_session:
        raise UsageError("--no-mapping needs --load-session (localization needs a map)")
    if args.save_session and not Path(args.save_session).expanduser().absolute().parent.is_dir():
        raise UsageError(f"--save-session {args.save_session}: its parent folder does not exist")
    if args.stamps and not args.images:
        raise UsageError("--stamps goes with --images (videos and bags carry their own stamps)")
    if robot_mode(args):
        from ..core.settings import robot_problems

        if not args.bag:
            raise UsageError("the robot settings (--base-frame, --depth-topic, --scale-source) need --bag: the "
                             "recording's /tf, /tf_static and depth")
        problems = robot_problems(robot_values(args))
        if args.scale_source == "depth" and not args.depth_topic:
            problems.append("--scale-source depth needs --depth-topic")
        if args.depth_topic and args.scale_source != "depth":
            problems.append("--depth-topic is read for --scale-source depth")
        if problems:
            raise UsageError("; ".join(problems))
    if args.ply or args.colmap:
        from ..core.settings import SETTINGS_BY_NAME

        for name in RECON_OPTIONS:
            lo, hi = SETTINGS_BY_NAME[name].range
            if not lo <= getattr(args, name) <= hi:
                raise UsageError(f"{SETTINGS_BY_NAME[name].option} must be in [{lo}, {hi}] (got {getattr(args, name)})")


def frame_source(args: argparse.Namespace):
    """The checked input (``frame_sources.FrameSource``); ``SourceError`` (one line) when unusable."""
    from ..core.preprocess import FramePreprocessor
    from . import frame_sources

    if args.frames:
        return frame_sources.open_npy(args.frames)
    from ..core.config import planned_height

    width = getattr(args, "image_width", 518)  # the node's preprocessing at --image-width (and --camera-aspect)
    prep = FramePreprocessor(width=width, max_height=planned_height(width, getattr(args, "camera_aspect", 0.0)))
    if args.images:
        return frame_sources.open_images(args.images, stamps_file=args.stamps, fps=args.fps, preprocessor=prep)
    if args.video:
        return frame_sources.open_video(args.video, fps=args.fps, preprocessor=prep)
    return frame_sources.open_bag(args.bag, topic=args.topic, preprocessor=prep)


def save_results(results: list[FrameResult], out: str, tum: str = "", with_depth: bool = False,
                 robot=None, extra_arrays: Optional[dict] = None) -> None:
    """Write the results under exactly the names given (temp file + rename: never a half file).

    ``robot`` (a ``bag_robot.BagRobot``): also what the node would publish, per frame: ``robot_pose``
    [S, 4, 4] (the body pose in ``world_frame``, metric when the scale is; NaN where the frame was
    withheld), ``robot_placed`` [S], ``robot_tf`` [S, 4, 4] (the /tf edge: world -> odom, -> base or ->
    camera), ``scale`` and ``scale_state``; the TUM file then holds the placed poses."""
    pose_enc = np.stack([r.pose_enc for r in results]).astype(np.float32)  # [S, 9]
    out_path = Path(out)
    if out_path.suffix.lower() == ".json":
        with atomic_open(out_path, "w") as f:
            json.dump({"pose_enc": pose_enc.tolist()}, f)
    else:
        extra = {}
        maps = [r for r in results if r.depth is not None] if with_depth else []
        if maps:  # every frame's, or with --depth-every N those of the frames the depth head ran on
            extra["depth"] = np.stack([r.depth for r in maps]).astype(np.float32)  # [K, H, W]
            extra["depth_conf"] = np.stack([r.depth_conf for r in maps]).astype(np.float32)  # [K, H, W]
            extra["has_depth"] = np.array([r.depth is not None for r in results])  # [S]: the frames of depth's rows
        if robot is not None:
            nan = np.full((4, 4), np.nan)
            placed = [robot.placed.get(r.stamp.ns) for r in results]
            extra["robot_pose"] = np.stack([p.pose if p is not None else nan for p in placed])  # [S, 4, 4]
            extra["robot_tf"] = np.stack([p.tf[2] if p is not None and p.tf is not None else nan for p in placed])
            extra["robot_placed"] = np.array([p is not None for p in placed])
            status = robot.scale()
            extra["scale"] = np.array(status.value if status.metric else np.nan)
            extra["scale_state"] = np.array(status.state)
        extra.update(extra_arrays or {})  # a caller's own per-frame arrays (several cameras: their world poses)
        arrays = dict(
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
        with atomic_open(out_path, "wb") as f:
            np.savez(f, **arrays)  # a file object: no ".npz" appended
    if tum and robot is not None:
        placed = [(float(r.stamp), robot.placed[r.stamp.ns].pose) for r in results if r.stamp.ns in robot.placed]
        write_tum(tum, [t for t, _ in placed], [m for _, m in placed])  # atomic
    elif tum:
        write_tum(tum, [float(r.stamp) for r in results], [r.c2w for r in results])  # atomic


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        check_session_args(parser, args)  # settings and the checkpoint file: one line, exit 2
    except SystemExit as exc:  # --help, or a usage error already printed: a return code for in-process callers
        return int(exc.code or 0)
    args.topics, args.topic = list(args.topic), (args.topic[0] if len(args.topic) == 1 else "")
    if len(args.topics) > 1:  # several cameras of one bag (offline_cameras.py)
        from .offline_cameras import check_camera_args, check_topics, run_cameras

        try:
            cameras = check_camera_args(args)
            description = check_topics(args, cameras)
        except UsageError as exc:
            return fail(PROG, str(exc))
        return run_cameras(args, cameras, description)
    try:
        if args.camera_name:
            raise UsageError("--camera-name names the cameras of several --topic options")
        if args.primary_camera:
            raise UsageError("--primary-camera chooses among the cameras of several --topic options")
        check_outputs(args)
        source = frame_source(args)
    except UsageError as exc:
        return fail(PROG, str(exc))
    return _run(args, source)


def _run(args: argparse.Namespace, source) -> int:
    from ..core.session_errors import SessionError
    from ..core.session_manager import InferenceFailed, SessionManager
    from .frame_sources import SourceError, stamp_problems
    from .progress import Progress

    quiet = args.quiet
    say: Callable[[str], None] = (lambda m: None) if quiet else (lambda m: print(f"[{PROG}] {m}", file=sys.stderr))
    try:
        stream = stream_from_args(args)
        if args.ply or args.colmap or (robot_mode(args) and args.scale_source == "depth"):
            stream = dataclasses.replace(stream, with_depth=True)  # the exports and the depth scale need the head
        manager = SessionManager.open(runtime_from_args(args), stream, log=say)
    except (ValueError, OSError, RuntimeError) as exc:  # a bad checkpoint (keys, shapes, unsafe pickle)
        msg = str(exc).replace("set allow_unsafe_checkpoint:=true", "pass --allow-unsafe-checkpoint")
        return fail(PROG, f"--checkpoint {args.checkpoint}: {msg}" if args.checkpoint else msg)
    from ..core.session_store import SessionFileError

    history: list = []  # the trajectory of a loaded session, saved again with --save-session
    if args.load_session:
        try:
            report = manager.load(args.load_session)
        except SessionFileError as exc:
            return fail(PROG, f"--load-session: {exc}")
        history = list(report.extra.get("trajectory", []))
        say(report.message())
    manager.session.mapping = not args.no_mapping
    say(f"{source.description}; stamps from {source.stamps_from}")
    robot = None
    if robot_mode(args):
        from .bag_io import BagError

        try:
            robot = _bag_robot(args, say)
        except BagError as exc:
            return fail(PROG, f"--bag {exc}")
    results: list[FrameResult] = []
    dropped = 0
    start = time.perf_counter()
    recon = _Reconstruction(args, manager.session.device) if (args.ply or args.colmap) else None
    total = source.total
    if args.max_frames and (total is None or args.max_frames < total):
        total = args.max_frames
    bar = Progress(total, PROG, enabled=None if not quiet else False)
    interrupted = False
    error: Optional[str] = None
    stamps: list[float] = []
    previous_sigterm = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    try:
        try:
            for count, (frame, stamp) in enumerate(source):
                if args.max_frames and count >= args.max_frames:
                    break
                stamps.append(float(stamp))
                tagged = _IndexedStamp(stamp, count, getattr(stamp, "ns", None))
                if recon is not None:
                    recon.waiting[count] = frame
                try:
                    new = manager.push(frame, tagged)
                except (SessionError, InferenceFailed) as exc:  # refused, or the model raised (new session)
                    dropped += 1
                    if not quiet:
                        bar.write(f"[{PROG}] frame {count} dropped: {exc}")
                    if recon is not None:
                        for lost in (tagged, *getattr(exc, "discarded", ())):  # buffered frames a new session dropped
                            recon.waiting.pop(lost.index, None)
                    continue
                _place(robot, new)
                results += _consume(new, recon, args.with_depth)
                bar.update(1, extra=f"{len(results)} poses")
        except KeyboardInterrupt:
            interrupted = True
        except SourceError as exc:  # an undecodable frame in the middle: keep what was done
            error = str(exc)
        try:
            flushed = manager.flush()  # frames still buffered for phase 1
            _place(robot, flushed)
            results += _consume(flushed, recon, args.with_depth)
        except KeyboardInterrupt:  # a second Ctrl-C: save what is there now
            interrupted = True
    finally:
        bar.close()
        signal.signal(signal.SIGTERM, previous_sigterm)
    if not results:
        if interrupted:
            return fail(PROG, "interrupted before any pose was computed; nothing written", INTERRUPTED_EXIT)
        return fail(PROG, error or "no frame was processed; nothing written", 1)
    problems = stamp_problems(stamps)
    if problems:
        say(f"warning: the input's stamps have {problems}; evaluation against a ground truth may mis-associate")
    save_results(results, args.out, args.tum, with_depth=args.with_depth, robot=robot)
    if robot is not None:
        scale = robot.scale()
        say(f"robot: {len(robot.placed)} of {len(results)} poses placed in {args.world_frame} (body: "
            f"{args.base_frame or 'the camera'}); scale {scale.state}"
            + (f" {scale.value:.6g} m per model unit" if scale.metric else ""))
    if args.plot:
        from .plotting import RunSeries, plot_run

        plot_run(args.plot, RunSeries.from_results(results), title=f"{PROG}: {source.description}")
        say(f"figure -> {args.plot}")
    if recon is not None:
        recon.finish(results, say)
    if args.save_session and not interrupted:
        trajectory = history + [[float(r.stamp), np.asarray(r.c2w, np.float64).reshape(-1).tolist()] for r in results]
        try:
            say(manager.save(args.save_session, extra={"trajectory": trajectory}).message())
        except (SessionError, SessionFileError) as exc:
            error = error or f"--save-session: {exc}"
    wall = time.perf_counter() - start
    written = ", ".join(x for x in (args.out, args.tum, args.plot) if x)
    if interrupted:
        print(f"[{PROG}] interrupted: wrote the {len(results)} poses computed so far -> {written}", file=sys.stderr)
        return INTERRUPTED_EXIT
    if error:
        print(f"{PROG}: error: {error}; wrote the {len(results)} poses before it -> {written}", file=sys.stderr)
        return 1
    rate = len(results) / wall if wall > 0 else 0.0
    say(f"{len(results)} frames ({dropped} dropped) in {wall:.1f} s ({rate:.2f} frames/s) -> {written}")
    return 0


def _sigterm_as_interrupt(signum, frame) -> None:
    """SIGTERM (a job scheduler, ``timeout``) ends the run like Ctrl-C: what was done is written."""
    raise KeyboardInterrupt


class _IndexedStamp(float):
    """The source's stamp (a float, as before) that also knows which pushed frame it belongs to, so a
    result finds its input frame (for colours and COLMAP images) whatever the session buffers, and
    a bag's exact header stamp (``ns``; None for other sources)."""

    index: int
    ns: Optional[int]

    def __new__(cls, value: float, index: int, ns: Optional[int] = None) -> "_IndexedStamp":
        obj = super().__new__(cls, value)
        obj.index = index
        obj.ns = ns
        return obj


def _bag_robot(args: argparse.Namespace, say):
    """The robot of a ``--bag`` run: the recording's TF and depth through the node's ``RobotFrames``."""
    from .bag_io import bag_recording_info
    from .bag_robot import BagRobot

    frame_id, colour_wh, duration = bag_recording_info(args.bag, args.topic)
    camera_frame = args.camera_frame or frame_id
    robot = BagRobot(args.bag, robot_values(args), camera_frame, args.depth_topic, lambda: colour_wh, say,
                     duration)
    say(f"robot: {args.world_frame} -> {args.odom_frame or args.base_frame or camera_frame} from the bag's TF; "
        f"camera frame {camera_frame}; scale {args.scale_source}")
    return robot


def _place(robot, results: list[FrameResult]) -> None:
    """Each finite result through the node's robot placement (before its depth is dropped)."""
    if robot is None:
        return
    for r in results:
        robot.place(r)


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

        from ..core.geometry import intrinsics_for_camera
        from ..core.reconstruction import is_finite_camera, unproject_depth

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
            with atomic_open(Path(self.args.colmap) / "images" / name, "wb") as f:
                Image.fromarray(rgb).save(f, format="PNG")
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
