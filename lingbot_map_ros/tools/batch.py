"""``lingbot_map_batch``: ``lingbot_map_offline`` over many recordings, one output folder each.

    lingbot_map_batch /data/recordings --out results/ --ply --save-session
    lingbot_map_batch --list bags.txt --out results/ --ray auto -- --model-preset full --checkpoint m.pt

A recording is a rosbag2 folder (``metadata.yaml``), a ROS 1 ``.bag`` file, a video file or a folder
of images; a folder that is none of these is a folder of recordings (each entry one). Every
recording runs through ``lingbot_map_offline`` itself (its ``main``, in this process or on a Ray
worker with ``--ray``) and gets ``OUT/<name>/``: ``traj.tum``, ``result.npz``, and with the flags
``map.ply``, ``colmap/``, ``session/`` and ``plot.png``. The folder appears complete or not at all
(written aside, then renamed into place: ``core/files.atomic_directory``), so a recording that fails
or is interrupted leaves nothing half written, and a second run skips the recordings whose folder is
there with the same options (``--force`` runs them again). Options after ``--`` go to
``lingbot_map_offline`` unchanged (the model, the session settings, ``--topic``, ``--fps``, ...;
see ``lingbot_map_offline --help``).

Why a tool of its own and not a mode of ``lingbot_map_offline``: offline's outputs are files named
by the user (``--out x.npz --tum x.tum``); for many recordings the names are chosen here, per
recording, and the offline tool stays the one-recording tool whose result each folder equals.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from ..core.files import atomic_directory, atomic_open
from .cli import INTERRUPTED_EXIT, OneLineParser, UsageError, fail, one_line, output_dir
from .frame_sources import IMAGE_SUFFIXES

PROG = "lingbot_map_batch"
VIDEO_SUFFIXES = (".mp4", ".avi", ".mkv", ".mov", ".webm", ".m4v", ".mpg", ".mpeg")
MARKER = "batch.json"  # written last into a recording's folder: what made it (resume compares it)
# offline options this tool sets per recording: refused after --
OWNED = ("--frames", "--images", "--video", "--bag", "--out", "--tum", "--plot", "--ply", "--colmap",
         "--save-session", "--stamps", "--quiet")
FAILED_EXIT = 1


@dataclass(frozen=True)
class Recording:
    kind: str  # the lingbot_map_offline source option: bag | video | images
    path: str
    name: str  # its output folder under --out


@dataclass
class RecordingOutcome:
    """What one recording came to (plain data: it travels back from a Ray worker)."""

    name: str
    folder: str = ""
    frames: int = 0
    kept: bool = False
    reason: str = ""  # one line, when it failed

    @property
    def failed(self) -> bool:
        return bool(self.reason)


def build_parser() -> argparse.ArgumentParser:
    from .ray_runner import add_ray_options

    p = OneLineParser(prog=PROG, description=__doc__)
    p.add_argument("recordings", nargs="*", metavar="RECORDING",
                   help="a bag, a video, an image folder, or a folder of them")
    p.add_argument("--list", default="", metavar="FILE", help="a text file with one recording path per line "
                   "(# comments); with or instead of RECORDING")
    p.add_argument("--out", required=True, help="results folder (created): OUT/<recording name>/ per recording")
    p.add_argument("--ply", action="store_true", help="also write map.ply (the fused points)")
    p.add_argument("--colmap", action="store_true", help="also write colmap/ (COLMAP text and the frames)")
    p.add_argument("--save-session", action="store_true", help="also write session/ (the saved session)")
    p.add_argument("--plot", action="store_true", help="also write plot.png (trajectory, latency, cache)")
    p.add_argument("--force", action="store_true", help="run every recording again, even those already done")
    p.add_argument("--quiet", action="store_true", help="print only errors and the final line")
    add_ray_options(p)
    return p


def recording_kind(path: Path) -> Optional[str]:
    """``bag``, ``video`` or ``images`` for a recording; None for anything else (a folder of them)."""
    if path.is_file():
        if path.suffix == ".bag":
            return "bag"
        return "video" if path.suffix.lower() in VIDEO_SUFFIXES else None
    if not path.is_dir():
        return None
    if (path / "metadata.yaml").is_file():
        return "bag"
    if any(f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES for f in path.iterdir()):
        return "images"
    return None


def find_recordings(paths: list[str]) -> list[Recording]:
    """Every recording named or inside a named folder; ``UsageError`` for a path that holds none,
    and for two recordings that would share an output folder."""
    found: list[Recording] = []
    for raw in paths:
        path = Path(raw).expanduser()
        if not path.exists():
            raise UsageError(f"{raw}: no such file or folder")
        kind = recording_kind(path)
        if kind is not None:
            found.append(Recording(kind, str(path), path.stem if kind == "video" or path.suffix == ".bag"
                                   else path.name))
            continue
        inside = [(e, recording_kind(e)) for e in sorted(path.iterdir())] if path.is_dir() else []
        inside = [(e, k) for e, k in inside if k is not None]
        if not inside:
            raise UsageError(f"{raw}: not a recording (a bag, a video of {', '.join(VIDEO_SUFFIXES)}, a folder of "
                             f"{', '.join(IMAGE_SUFFIXES)} images) nor a folder of recordings")
        found += [Recording(k, str(e), e.stem if k == "video" or e.suffix == ".bag" else e.name) for e, k in inside]
    names: dict[str, str] = {}
    for r in found:
        if r.name in names:
            raise UsageError(f"{r.path} and {names[r.name]} would both write {r.name}/; rename one or run them apart")
        names[r.name] = r.path
    return found


def read_list(path: str) -> list[str]:
    try:
        lines = Path(path).expanduser().read_text().splitlines()
    except OSError as exc:
        raise UsageError(f"--list {path}: {exc.strerror or exc}") from None
    base = Path(path).expanduser().parent
    return [str(base / ln.strip()) if not Path(ln.strip()).is_absolute() else ln.strip()
            for ln in lines if ln.strip() and not ln.strip().startswith("#")]


def check_offline_options(extra: list[str]) -> None:
    """The options after ``--`` as lingbot_map_offline would take them: refused here, before any work."""
    from . import offline

    for opt in extra:
        if opt.split("=", 1)[0] in OWNED:
            raise UsageError(f"{opt}: {PROG} sets it per recording; give the flag of {PROG} instead (--help)")
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            args = offline.build_parser().parse_args(["--frames", "x.npy", "--out", "x.npz", *extra])
            offline.check_session_args(offline.build_parser(), args)
        except SystemExit:
            raise UsageError(f"options for lingbot_map_offline: {one_line(err.getvalue())}") from None


class RecordingRunner:
    """Runs one recording after another through ``lingbot_map_offline`` (the serial loop's and each Ray
    worker's unit of work)."""

    def __init__(self, args: argparse.Namespace, extra: list[str]) -> None:
        self.args = args
        self.extra = list(extra)
        self.out = Path(args.out).expanduser()

    def marker(self, rec: Recording) -> dict:
        """What a finished folder must have been made with to be kept."""
        a = self.args
        return {"recording": str(Path(rec.path).resolve()), "kind": rec.kind, "offline_options": self.extra,
                "ply": a.ply, "colmap": a.colmap, "save_session": a.save_session, "plot": a.plot}

    def run(self, rec: Recording, progress: Optional[Callable[[int, str], Any]] = None) -> RecordingOutcome:
        from . import offline

        folder = self.out / rec.name
        want = self.marker(rec)
        if not self.args.force:
            try:
                stored = json.loads((folder / MARKER).read_text())
            except (OSError, ValueError):
                stored = None
            if stored is not None and stored.get("made_with") == json.loads(json.dumps(want)):
                return RecordingOutcome(rec.name, str(folder), int(stored.get("frames", 0)), kept=True)
        err = io.StringIO()
        try:
            with atomic_directory(folder) as tmp:
                argv = [f"--{rec.kind}", rec.path, "--out", str(tmp / "result.npz"), "--tum", str(tmp / "traj.tum"),
                        "--quiet", *self.extra]
                argv += ["--ply", str(tmp / "map.ply")] if self.args.ply else []
                argv += ["--colmap", str(tmp / "colmap")] if self.args.colmap else []
                argv += ["--save-session", str(tmp / "session")] if self.args.save_session else []
                argv += ["--plot", str(tmp / "plot.png")] if self.args.plot else []
                with contextlib.redirect_stderr(err):  # offline --quiet prints errors only: the reason, below
                    code = offline.main(argv)
                if code == INTERRUPTED_EXIT:  # Ctrl-C / SIGTERM inside offline: the whole run stops
                    raise KeyboardInterrupt
                if code != 0:
                    raise _OfflineFailed(code)
                import numpy as np

                with np.load(tmp / "result.npz") as npz:
                    frames = int(npz["c2w"].shape[0])
                with atomic_open(tmp / MARKER, "w") as f:
                    f.write(json.dumps({"made_with": want, "frames": frames}, indent=1))
        except _OfflineFailed as exc:
            errors = [ln for ln in err.getvalue().splitlines() if "error:" in ln or "interrupted" in ln]
            why = errors[-1].split("error:", 1)[-1].strip() if errors else f"lingbot_map_offline exited {exc.code}"
            return RecordingOutcome(rec.name, str(folder), reason=one_line(why))
        return RecordingOutcome(rec.name, str(folder), frames)


class _OfflineFailed(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1:]
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    try:
        if args.ray not in (None, "local", "auto") and Path(args.ray).exists():
            raise UsageError(f"--ray took the recording {args.ray} as its address: write --ray=local (or "
                             "--ray=ADDRESS), or put --ray after the recordings")
        paths = list(args.recordings) + (read_list(args.list) if args.list else [])
        if not paths:
            raise UsageError("no recording given: name them, a folder of them, or --list FILE")
        recordings = find_recordings(paths)
        output_dir(args.out, "--out")
        check_offline_options(extra)
        if args.ray is not None:
            from .ray_runner import check_ray_args

            check_ray_args(args)
    except UsageError as exc:
        return fail(PROG, str(exc))
    Path(args.out).expanduser().mkdir(exist_ok=True)
    outcomes: list[Optional[RecordingOutcome]] = [None] * len(recordings)
    previous = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    try:
        if args.ray is None:
            runner = RecordingRunner(args, extra)
            for k, rec in enumerate(recordings):
                outcomes[k] = runner.run(rec)
                _report(outcomes[k], f"[{k + 1}/{len(recordings)}]", args.quiet)
        else:
            from .ray_runner import run_recordings_on_ray

            run_recordings_on_ray(args, extra, recordings, outcomes,
                                  lambda o, pos: _report(o, pos, args.quiet))
    except KeyboardInterrupt:
        done = sum(1 for o in outcomes if o is not None and not o.failed)
        print(f"{PROG}: interrupted with {done} of {len(recordings)} recordings done (kept under {args.out}); the "
              "same command again resumes", file=sys.stderr, flush=True)
        return INTERRUPTED_EXIT
    except UsageError as exc:
        return fail(PROG, str(exc))
    finally:
        signal.signal(signal.SIGTERM, previous)
    failed = [o for o in outcomes if o is None or o.failed]
    print(f"{PROG}: {len(recordings) - len(failed)} of {len(recordings)} recordings done -> {args.out}"
          + (f"; failed: {', '.join(o.name for o in failed if o)}" if failed else ""), file=sys.stderr, flush=True)
    return FAILED_EXIT if failed else 0


def _report(outcome: RecordingOutcome, position: str, quiet: bool) -> None:
    if outcome.failed:
        print(f"{PROG}: error: {position} {outcome.name}: {outcome.reason}", file=sys.stderr, flush=True)
    elif not quiet:
        state = "done before, kept" if outcome.kept else f"{outcome.frames} poses"
        print(f"[{PROG}] {position} {outcome.name}: {state} -> {outcome.folder}", file=sys.stderr, flush=True)


def _sigterm_as_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
