"""``lingbot_map_offline --bag B --topic /front/image --topic /rear/image``: several cameras of one bag.

One stream per topic through one model and one page pool, the node's several-camera mode
(``core.stream_group.StreamGroup``, what ``ros/cameras.py`` runs): each camera keeps its own session,
and the phase-2 frames of a tick run as one batched step. Frames are read in the bag's order; a tick
collects the next frame of each camera and closes when a camera that already has a frame in it comes
again, so no frame is dropped (a node drops what its latest-frame queue replaces) and every stream sees
its frames in order: each camera's results are those of its topic run alone.

Names: a camera is named by ``--camera-name`` (in the order of the ``--topic`` options), else by its
topic's first name (``/front/image`` -> ``front``, the node's ``front/image``): the node's ``cameras``.
Outputs: one file per camera, the camera's name before the suffix: ``--out run.npz`` -> ``run.front.npz``
and ``run.rear.npz``, ``--tum run.tum`` -> ``run.front.tum``, ...

Without ``--base-frame`` each camera's poses are in its own world. With ``--base-frame`` (and the bag's
``/tf``, ``/tf_static``) every camera is placed as the node places it (``bag_robot.BagRig``): its result
through its own ``RobotFrames`` (``base_frame -> its header's frame_id``), then the node's ``core.rig.Rig``:
one world (the body pose at the first placed frame), a camera that starts later anchored by the body
pose held at its first frame, the body pose driven by ``--primary-camera`` (the node's
``primary_camera``; default the first camera). Results are placed in the order a node that keeps up
with every frame places them (the bag's order of the frames that release them). A camera is stalled,
and the next tracking camera drives, when ``--camera-timeout`` seconds of image stamps pass without a
placed frame of it (the node counts wall time; stamps make the offline run repeatable). Then ``--out``
itself holds the body trajectory (``~/pose``: ``stamp``, ``pose`` [N, 4, 4], ``camera`` that drove each),
each camera's file adds ``world_pose`` [S, 4, 4] (``~/<name>/pose``; NaN where the node publishes none),
``placed`` [S], ``drives`` [S] and ``stamp_ns`` [S], and ``--tum`` writes the body (``run.tum``) and
each camera's placed poses in the one world (``run.front.tum``).
"""
from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path
from typing import Callable, Optional

from ..core.results import FrameResult
from ..core.trajectory import write_tum
from .cli import INTERRUPTED_EXIT, UsageError, distinct_outputs, fail, output_path

PROG = "lingbot_map_offline"

# options that belong to one camera's run (a robot's TF and depth, exports, sessions): refused with several
SINGLE_CAMERA_OPTIONS = (("frames", "--frames"), ("images", "--images"), ("video", "--video"),
                         ("depth_topic", "--depth-topic"), ("camera_frame", "--camera-frame"),
                         ("plot", "--plot"), ("ply", "--ply"),
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
    if args.primary_camera and args.primary_camera not in names:
        raise UsageError(f"--primary-camera {args.primary_camera!r} is not one of the cameras {names}")
    return dict(zip(names, topics))


def check_camera_args(args: argparse.Namespace) -> dict[str, str]:
    """Several ``--topic``: the cameras and their outputs checked before the model is built."""
    from .offline import OUT_SUFFIXES, TUM_SUFFIXES, robot_mode

    if not args.bag:
        raise UsageError("several --topic options need --bag (the cameras of one recording)")
    for dest, option in SINGLE_CAMERA_OPTIONS:
        if getattr(args, dest, None):
            raise UsageError(f"{option} goes with one --topic (run that camera alone for it)")
    if args.base_frame:
        from ..core.settings import SETTINGS_BY_NAME, robot_problems
        from .offline import robot_values

        problems = robot_problems(robot_values(args))
        if args.scale_source == "depth":
            problems.append("--scale-source depth goes with one --topic (one depth topic per run)")
        lo, hi = SETTINGS_BY_NAME["camera_timeout"].range
        if not lo <= args.camera_timeout <= hi:
            problems.append(f"--camera-timeout must be in [{lo}, {hi}] (got {args.camera_timeout:g})")
        if problems:
            raise UsageError("; ".join(problems))
    elif robot_mode(args) or args.primary_camera or args.odom_frame:
        raise UsageError("several cameras in one world need --base-frame (each camera's estimate becomes the body "
                         "pose through base_frame -> its camera frame in the bag's TF)")
    if args.max_frames < 0:
        raise UsageError(f"--max-frames must be >= 0 (got {args.max_frames})")
    cameras = cameras_of(args)
    pairs = [("--out (body)", args.out), ("--tum (body)", args.tum)] if args.base_frame else []
    if args.base_frame:
        output_path(args.out, "--out", (".npz",))
        if args.tum:
            output_path(args.tum, "--tum", TUM_SUFFIXES)
    for name in cameras:
        output_path(camera_output(args.out, name), "--out", (".npz",) if args.base_frame else OUT_SUFFIXES)
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
    rig = None
    if args.base_frame:
        from .bag_io import BagError

        try:
            rig = _bag_rig(args, cameras, group, say)
        except BagError as exc:
            return fail(PROG, f"--bag {exc}")
    width = getattr(args, "image_width", 518)  # the node's preprocessing at --image-width (and --camera-aspect)
    aspect = getattr(args, "camera_aspect", 0.0)
    preprocess = {n: FramePreprocessor(width=width, max_height=planned_height(width, aspect))
                  for n in names}  # one per camera, as the node's channels
    by_topic = {topic: name for name, topic in cameras.items()}
    results: dict[str, list[FrameResult]] = {n: [] for n in names}
    dropped = {n: 0 for n in names}
    fed = {n: 0 for n in names}

    def run(tick: dict) -> None:
        outcomes = group.step(tick)
        for name in tick:  # the tick's frames in the bag's order: the order a node fed frame by frame places them
            outcome = outcomes[name]
            if outcome.error is not None:  # refused, or the model raised (a new session of this camera)
                assert isinstance(outcome.error, (SessionError, InferenceFailed))
                dropped[name] += 1
                say(f"camera {name}: frame {tick[name][1].index} dropped: {outcome.error}")
            if rig is not None:
                for r in outcome.results:
                    rig.place(name, r)
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
                if rig is not None:
                    for r in outcome.results:
                        rig.place(name, r)
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
        if rig is None:
            save_results(results[name], out, tum, with_depth=args.with_depth)
        else:
            save_results(results[name], out, "", with_depth=args.with_depth,
                         extra_arrays=_world_arrays(rig, name, results[name]))
            placed = rig.placed[name]
            if tum and placed:
                write_tum(tum, [float(r.stamp) for r in results[name] if r.stamp.ns in placed],
                          [placed[r.stamp.ns].camera for r in results[name] if r.stamp.ns in placed])
            elif tum:
                say(f"camera {name}: no frame placed in the world ({_why(rig, name)}); {tum} not written")
                tum = ""
        written += [x for x in (out, tum) if x]
    if rig is not None and rig.body:
        _save_body(rig, args.out, args.tum)
        written = [x for x in (args.out, args.tum) if x] + written
        say(f"rig: {len(rig.body)} body poses in {args.world_frame} (primary {rig.rig.primary}, "
            f"{len(rig.handovers)} hand-overs); placed "
            + ", ".join(f"{n} {len(rig.placed[n])} of {len(results[n])}" for n in names))
    elif rig is not None:
        say("rig: no frame was placed in the world (see the reasons above); no body trajectory written")
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


def _bag_rig(args: argparse.Namespace, cameras: dict[str, str], group, say: Callable[[str], None]):
    """The cameras' frames on the robot (``bag_robot.BagRig``): each camera's frame is its topic's
    ``frame_id`` (the node's ``<name>_optical`` when the header has none)."""
    from .bag_io import bag_recording_info
    from .bag_robot import BagRig
    from .offline import robot_values

    frames, duration = {}, 0.0
    for name, topic in cameras.items():
        frame_id, _, duration = bag_recording_info(args.bag, topic)
        if not frame_id:
            say(f"camera {name}: image header has no frame_id: its frames are looked up as {name}_optical")
        frames[name] = frame_id or f"{name}_optical"
    values = robot_values(args)
    values["camera_timeout"] = args.camera_timeout
    rig = BagRig(args.bag, values, frames, args.primary_camera or next(iter(cameras)), say, duration)
    for name in cameras:  # a camera's new session (a fault) re-anchors it, as the node's listener does
        group.manager(name).on_new_session = lambda start, name=name: rig.begin_stream(name)
    say(f"rig: {args.world_frame} -> {args.odom_frame or args.base_frame} from the bag's TF; cameras "
        + ", ".join(f"{n} in {f}" for n, f in frames.items()) + f"; primary {rig.rig.primary}; stalled after "
        f"{args.camera_timeout:g} s of stamps without a placed frame")
    return rig


def _why(rig, name: str) -> str:
    """The last reason a camera's frame was withheld (the node's note in its frame status)."""
    reasons = list(rig.withheld[name].values())
    return reasons[-1] if reasons else "no result"


def _world_arrays(rig, name: str, results: list[FrameResult]) -> dict:
    """A camera's frames in the one world: ``world_pose`` [S, 4, 4] (NaN where none), ``placed``, ``drives``,
    ``stamp_ns`` (the key of its poses on ROS topics)."""
    import numpy as np

    placed = [rig.placed[name].get(r.stamp.ns) for r in results]
    nan = np.full((4, 4), np.nan)
    return {"world_pose": np.stack([p.camera if p is not None else nan for p in placed]),  # [S, 4, 4]
            "placed": np.array([p is not None for p in placed]),
            "stamp_ns": np.array([r.stamp.ns for r in results], np.int64),  # the header stamps, exact
            "drives": np.array([p is not None and p.drives for p in placed])}


def _save_body(rig, out: str, tum: str) -> None:
    """The body trajectory (what ``~/pose`` carries), atomically: ``stamp``, ``pose`` [N, 4, 4], ``camera``."""
    import numpy as np

    from ..core.files import atomic_open

    stamps = np.array([b.stamp_ns * 1e-9 for b in rig.body])
    poses = np.stack([b.pose for b in rig.body])  # [N, 4, 4]
    with atomic_open(Path(out), "wb") as f:
        np.savez(f, stamp=stamps, stamp_ns=np.array([b.stamp_ns for b in rig.body], np.int64), pose=poses,
                 camera=np.array([b.camera for b in rig.body]))
    if tum:
        write_tum(tum, list(stamps), list(poses))


__all__ = ["camera_output", "cameras_of", "check_camera_args", "default_camera_name", "run_cameras"]
