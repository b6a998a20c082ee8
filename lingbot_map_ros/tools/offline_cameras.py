"""``lingbot_map_offline --bag B --topic /front/image --topic /rear/image``: several cameras of one bag.

One stream per topic through one model and one page pool, the node's several-camera mode
(``core.stream_group.StreamGroup``, what ``ros/cameras.py`` runs): each camera keeps its own session,
and the phase-2 frames of a tick run as one batched step. Frames are read in the bag's order; a tick
collects the next frame of each camera and closes when a camera that already has a frame in it comes
again, so no frame is dropped (a node drops what its latest-frame queue replaces) and every stream sees
its frames in order: each camera's results are those of its topic run alone.

Names: a camera is named by ``--camera-name`` (in the order of the ``--topic`` options), else by its
topic's first name (``/front/image`` -> ``front``, the node's ``front/image``). Outputs: one file per
camera, the camera's name before the suffix: ``--out run.npz`` -> ``run.front.npz`` and
``run.rear.npz``, ``--tum run.tum`` -> ``run.front.tum``, ... (the camera's poses in its own world:
the offline tool has no TF, so the node's rig anchoring is not applied).
"""
from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path
from typing import Callable, Optional

from ..core.results import FrameResult
from .cli import INTERRUPTED_EXIT, UsageError, distinct_outputs, fail, output_path

PROG = "lingbot_map_offline"

# options that belong to one camera's run (a robot's TF and depth, exports, sessions): refused with several
SINGLE_CAMERA_OPTIONS = (("frames", "--frames"), ("images", "--images"), ("video", "--video"),
                         ("depth_topic", "--depth-topic"), ("base_frame", "--base-frame"),
                         ("odom_frame", "--odom-frame"), ("plot", "--plot"), ("ply", "--ply"),
                         ("colmap", "--colmap"), ("save_session", "--save-session"),
                         ("load_session", "--load-session"), ("no_mapping", "--no-mapping"))


def default_camera_name(topic: str) -> str:
    """The topic's first name: ``/front/image`` -> ``front`` (the node's ``<name>/image``)."""
    parts = [p for p in topic.split("/") if p]
    return parts[0] if parts else topic


def camera_output(path: str, name: str) -> str:
    """``run.npz`` for camera ``front`` -> ``run.front.npz`` (same folder, the suffix kept)."""
    p = Path(path)
    return str(p.with_name(f"{p.stem}.{name}{p.suffix}"))


def cameras_of(args: argparse.Namespace) -> dict[str, str]:
    """``{camera name: topic}`` in the order of ``--topic``; ``UsageError`` with the reason when unusable."""
    from ..core.settings import camera_problems

    topics = list(args.topics)
    if len(set(topics)) != len(topics):
        raise UsageError(f"--topic: {sorted({t for t in topics if topics.count(t) > 1})} given more than once")
    if args.camera_name and len(args.camera_name) != len(topics):
        raise UsageError(f"--camera-name: {len(args.camera_name)} names for {len(topics)} --topic options "
                         "(one per topic, in the same order)")
    names = list(args.camera_name) or [default_camera_name(t) for t in topics]
    problems = camera_problems({"cameras": names, "base_frame": "offline"})  # the node's naming rules
    if problems:
        how = "--camera-name" if args.camera_name else "the topics' first names (name them with --camera-name)"
        raise UsageError(f"camera names from {how}: {'; '.join(problems)}")
    return dict(zip(names, topics))


def check_camera_args(args: argparse.Namespace) -> dict[str, str]:
    """Several ``--topic``: the cameras and their outputs checked before the model is built."""
    from .offline import OUT_SUFFIXES, TUM_SUFFIXES, robot_mode

    if not args.bag:
        raise UsageError("several --topic options need --bag (the cameras of one recording)")
    for dest, option in SINGLE_CAMERA_OPTIONS:
        if getattr(args, dest, None):
            raise UsageError(f"{option} goes with one --topic (run that camera alone for it)")
    if robot_mode(args):
        raise UsageError("the robot settings go with one --topic (run that camera alone for them)")
    if args.max_frames < 0:
        raise UsageError(f"--max-frames must be >= 0 (got {args.max_frames})")
    cameras = cameras_of(args)
    pairs = []
    for name in cameras:
        output_path(camera_output(args.out, name), "--out", OUT_SUFFIXES)
        pairs.append((f"--out ({name})", camera_output(args.out, name)))
        if args.tum:
            output_path(camera_output(args.tum, name), "--tum", TUM_SUFFIXES)
            pairs.append((f"--tum ({name})", camera_output(args.tum, name)))
    distinct_outputs(pairs)
    return cameras


def check_topics(args: argparse.Namespace, cameras: dict[str, str]) -> str:
    """Each topic's first image decoded before any work (``SourceError`` names the topic); a description."""
    from .bag_io import BagError, check_first_image
    from .frame_sources import SourceError

    described = []
    for name, topic in cameras.items():
        try:
            _, msgtype, count = check_first_image(args.bag, topic)
        except BagError as exc:
            raise SourceError(f"--bag {exc}") from None
        described.append(f"{name} = {topic} ({msgtype.rsplit('/', 1)[-1]}, {count} messages)")
    return f"{args.bag}: {len(cameras)} cameras: " + ", ".join(described)


def run_cameras(args: argparse.Namespace, cameras: dict[str, str], description: str) -> int:
    """The cameras' streams through one ``StreamGroup``; one output file per camera."""
    from ..core.config import planned_height
    from ..core.model_host import ModelHost
    from ..core.preprocess import FramePreprocessor
    from ..core.session_errors import SessionError
    from ..core.session_events import InferenceFailed
    from ..core.session_manager import settings_problems
    from ..core.stream_group import StreamGroup
    from ..ros.image_io import UnsupportedImage
    from .bag_io import iter_bag_images_of
    from .common import runtime_from_args, stream_from_args
    from .offline import _consume, _IndexedStamp, _sigterm_as_interrupt, save_results

    quiet = args.quiet
    say: Callable[[str], None] = (lambda m: None) if quiet else (lambda m: print(f"[{PROG}] {m}", file=sys.stderr))
    names = list(cameras)
    try:
        runtime, stream = runtime_from_args(args), stream_from_args(args)
        problems = settings_problems(runtime, stream)
        if problems:
            raise ValueError("; ".join(problems))
        group = StreamGroup(ModelHost.load(runtime, log=say), stream, names, log=say)
    except (ValueError, OSError, RuntimeError) as exc:  # a bad checkpoint, or the streams do not fit the memory
        msg = str(exc).replace("set allow_unsafe_checkpoint:=true", "pass --allow-unsafe-checkpoint")
        return fail(PROG, f"--checkpoint {args.checkpoint}: {msg}" if args.checkpoint else msg)
    say(f"{description}; stamps from the message headers")
    width = getattr(args, "image_width", 518)  # the node's preprocessing at --image-width (and --camera-aspect)
    aspect = getattr(args, "camera_aspect", 0.0)
    preprocess = {n: FramePreprocessor(width=width, max_height=planned_height(width, aspect))
                  for n in names}  # one per camera, as the node's channels
    by_topic = {topic: name for name, topic in cameras.items()}
    results: dict[str, list[FrameResult]] = {n: [] for n in names}
    dropped = {n: 0 for n in names}
    fed = {n: 0 for n in names}

    def run(tick: dict) -> None:
        for name, outcome in group.step(tick).items():
            if outcome.error is not None:  # refused, or the model raised (a new session of this camera)
                assert isinstance(outcome.error, (SessionError, InferenceFailed))
                dropped[name] += 1
                say(f"camera {name}: frame {tick[name][1].index} dropped: {outcome.error}")
            results[name].extend(_consume(list(outcome.results), None, args.with_depth))

    start = time.perf_counter()
    interrupted = False
    error: Optional[str] = None
    previous_sigterm = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    try:
        tick: dict = {}
        try:
            images = iter_bag_images_of(args.bag, list(cameras.values()))
            while True:
                try:
                    topic, rgb, stamp = next(images)
                except StopIteration:
                    break
                except UnsupportedImage as exc:
                    error = f"--bag {args.bag}: {exc}"
                    break
                name = by_topic[topic]
                if args.max_frames and fed[name] >= args.max_frames:
                    continue
                if name in tick:  # this camera's next frame: the tick so far runs first
                    run(tick)
                    tick = {}
                tick[name] = (preprocess[name](rgb), _IndexedStamp(stamp, fed[name], stamp.ns))
                fed[name] += 1
            if tick:
                run(tick)
                tick = {}
            for name in names:  # scale frames still buffered (a camera with fewer frames than scale_frames)
                outcome = group.flush(name)
                if outcome.error is not None:
                    dropped[name] += 1
                    say(f"camera {name}: buffered frames dropped: {outcome.error}")
                results[name].extend(_consume(list(outcome.results), None, args.with_depth))
        except KeyboardInterrupt:
            interrupted = True
    finally:
        signal.signal(signal.SIGTERM, previous_sigterm)
    written = []
    for name in names:
        if not results[name]:
            say(f"camera {name}: no pose computed; nothing written for it")
            continue
        out = camera_output(args.out, name)
        tum = camera_output(args.tum, name) if args.tum else ""
        save_results(results[name], out, tum, with_depth=args.with_depth)
        written += [x for x in (out, tum) if x]
    if not written:
        if interrupted:
            return fail(PROG, "interrupted before any pose was computed; nothing written", INTERRUPTED_EXIT)
        return fail(PROG, error or "no frame was processed; nothing written", 1)
    if interrupted:
        print(f"[{PROG}] interrupted: wrote the poses computed so far -> {', '.join(written)}", file=sys.stderr)
        return INTERRUPTED_EXIT
    if error:
        print(f"{PROG}: error: {error}; wrote the poses before it -> {', '.join(written)}", file=sys.stderr)
        return 1
    wall = time.perf_counter() - start
    total = sum(len(r) for r in results.values())
    per_camera = ", ".join(f"{n} {len(results[n])} ({dropped[n]} dropped)" for n in names)
    say(f"{total} frames in {wall:.1f} s ({total / wall if wall > 0 else 0.0:.2f} frames/s; {per_camera}) -> "
        + ", ".join(written))
    return 0


__all__ = ["camera_output", "cameras_of", "check_camera_args", "default_camera_name", "run_cameras"]
