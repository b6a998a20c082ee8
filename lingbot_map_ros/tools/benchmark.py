"""``lingbot_map_benchmark``: reproduce the official LingBot-Map benchmark table with one command.

    lingbot_map_benchmark --dataset tum /data/TUM-RGBD --checkpoint lingbot-map.pt --out results/

finds the sequences of each ``--dataset NAME DIR`` in the dataset's own published layout
(``tools/datasets/``), the official scene lists only unless ``--all-scenes``, streams every sequence
through the node's session (``SessionManager``) with the official benchmark's inputs (each frame at
the dataset's official size, the model in the official precision: ``core/precision.py``) and scores
it with the official protocol: the dataset's frame stride, its ground-truth association, a Sim(3)
alignment, ATE RMSE, RPE translation and rotation (RMSE over consecutive frames) computed by evo, and
the pose AUC@3/5/15/30 in both conventions in circulation where the official table has it. It
prints one table per dataset in the official table's columns, with the official numbers of
``lingbot-map.pt`` beside ours, and the per-sequence results.

Under ``--out``: ``summary.json`` and, per sequence, ``DATASET/SEQUENCE/traj.tum`` (the estimate,
TUM format), ``gt.tum`` (its frames' ground truth), ``plot.png`` and ``metrics.json``. A sequence
whose ``metrics.json`` holds the same settings is not run again, so an interrupted run resumes where
it stopped (``--force`` runs everything again). A sequence that cannot be read or scored (wrong
layout, missing ground truth, stamps that do not match) fails with a one-line reason naming the
file, and the others still run; the exit code is then 1.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import signal
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

from ..core.files import atomic_open
from ..core.precision import PRECISIONS
from ..core.settings import SETTINGS_BY_NAME
from .cli import INTERRUPTED_EXIT, OneLineParser, UsageError, fail, need_dir, output_dir
from .common import SESSION_OPTIONS, add_session_options, check_session_args, settings_from_args

PROG = "lingbot_map_benchmark"
AUTO_KEYFRAME_THRESHOLD = 320  # official method config: auto keyframe interval above this many frames
# Stored frames before the long-run policy acts: the official streaming run never switches windows
# (its "auto" keyframe interval keeps the stored frames near 320), so the policy must not act here.
# ``image_width`` None: not given (the official sizes are per dataset; an explicit width needs
# ``--image-size node``, see ``check_args``).
BENCHMARK_DEFAULTS = {"max_stored_frames": 1024, "image_width": None}
FAILED_EXIT = 1
AUC_CONVENTION = ("auc: relative pose W_i W_j^-1 of the world-to-camera matrices (the official README and auc.py); "
                  "auc_inverse_convention: W_i^-1 W_j (an earlier copy of the official evaluator)")


class SequenceFailed(Exception):
    """A sequence that cannot be run or scored; ``str(exc)`` is the one-line reason."""


def build_parser() -> argparse.ArgumentParser:
    from .datasets import READERS

    p = OneLineParser(prog=PROG, description=__doc__)
    p.add_argument("--dataset", nargs=2, action="append", metavar=("NAME", "DIR"), required=True,
                   help=f"a dataset and its folder, in the dataset's published layout; NAME is one of "
                   f"{', '.join(READERS)}; give --dataset again for more")
    p.add_argument("--out", required=True, help="results folder (created); the same command again resumes a run")
    p.add_argument("--sequences", nargs="+", default=[], metavar="NAME",
                   help="only these sequences (names as the tables print them)")
    p.add_argument("--stride", type=int, default=0,
                   help="use every N-th frame (default: 0 = the official protocol's: 5 for 7scenes and nrgbd, else 1)")
    p.add_argument("--max-frames", type=int, default=0,
                   help="at most this many frames per sequence, after the stride (a quick check; not the official "
                   "protocol; default: 0 = all)")
    p.add_argument("--image-size", choices=("official", "node"), default="official",
                   help="official: each frame gets the official benchmark's resize/crop and area budget, and the "
                   "model runs at that size (TUM 518x378, 7-Scenes 574x434, KITTI 504x280, ...); node: the node's "
                   "preprocessing only, at --image-width")
    p.add_argument("--all-scenes", action="store_true",
                   help="also run the scenes outside the official lists (Tanks and Temples beyond its 6, ETH3D's "
                   "meadow and terrace, Oxford Spires' 4 excluded ones); the tables mark them")
    p.add_argument("--precision", choices=PRECISIONS, default="official",
                   help="official: float32 aggregator weights under bf16 autocast, as the official benchmark runs; "
                   "node: the aggregator cast to --dtype, as the node runs (default: official)")
    p.add_argument("--keyframe-interval", dest="keyframe_choice", default="auto", metavar="auto|N",
                   help="'auto' (official: 1 up to 320 frames, else ceil(frames / 320)) or a number")
    p.add_argument("--force", action="store_true", help="run every sequence again, even those already done")
    p.add_argument("--quiet", action="store_true", help="print only the tables and errors (no progress)")
    add_session_options(p, names=[n for n in SESSION_OPTIONS if n != "keyframe_interval"],
                        overrides=BENCHMARK_DEFAULTS, with_depth=False)
    for action in p._actions:  # the node's description, and what it means here
        if action.dest == "image_width":
            action.help = ("with --image-size node only: the node's model input width (a multiple of 14, 224..518; "
                           "default 518), recorded in metrics.json; the official sizes are per dataset")
    from .ray_runner import add_ray_options

    add_ray_options(p)  # --ray: the same sequences on a Ray cluster's workers
    return p


def keyframe_interval(value: str, frames: int) -> int:
    """The official ``auto`` rule, or the number given."""
    if value == "auto":
        return 1 if frames <= AUTO_KEYFRAME_THRESHOLD else math.ceil(frames / AUTO_KEYFRAME_THRESHOLD)
    return int(value)


def check_args(args: argparse.Namespace) -> list[tuple[str, Path]]:
    """Every command-line problem before any work: ``UsageError`` (one line, exit 2)."""
    from .datasets import READERS
    from .plotting import available

    datasets = []
    for name, folder in args.dataset:
        if name not in READERS:
            raise UsageError(f"--dataset {name}: unknown dataset; use one of {', '.join(READERS)}")
        datasets.append((name, need_dir(folder, f"--dataset {name}", "the dataset's folder")))
    output_dir(args.out, "--out")
    if args.stride < 0 or args.max_frames < 0:
        raise UsageError("--stride and --max-frames must be >= 0")
    if args.image_width_given and args.image_size == "official":
        raise UsageError("--image-width needs --image-size node: with the official sizes each dataset has its own "
                         "model input (574x434 for 640x480 images, 504x280 for KITTI, ...)")
    if args.keyframe_choice != "auto" and not (args.keyframe_choice.isdigit() and int(args.keyframe_choice) > 0):
        raise UsageError(f"--keyframe-interval must be 'auto' or a positive number (got {args.keyframe_choice!r})")
    missing = available()
    if missing:
        raise UsageError(f"the per-sequence plots need matplotlib: {missing}")
    try:
        import evo  # noqa: F401
    except ImportError:
        from ..core.trajectory import EVO_MISSING

        raise UsageError(EVO_MISSING) from None
    return datasets


# ------------------------------------------------------------------------------------ one sequence
def run_config(args: argparse.Namespace, dataset: str, sequence: str, stride: int, kf: int) -> dict:
    """What a stored result must match to be reused: the same inputs, protocol and settings."""
    values = settings_from_args(args)
    settings = {name: values[name] for name in SESSION_OPTIONS}
    settings["keyframe_interval"] = kf
    from .datasets import READERS

    settings["image_width"] = model_width(args, READERS[dataset].protocol)  # None: the official size ran
    return {"dataset": dataset, "sequence": sequence, "stride": stride, "max_frames": args.max_frames,
            "image_size": args.image_size, "precision": args.precision, "settings": settings}


def model_width(args: argparse.Namespace, protocol) -> Optional[int]:
    """None: the model runs at the dataset's official size (``--image-size official`` and a dataset of
    the official benchmark); else the width of the node's preprocessing (``--image-width``, 518 by
    default; EuRoC and TartanAir have no official size)."""
    return None if args.image_size == "official" and protocol.official is not None else args.image_width


def stored_result(path: Path, config: dict) -> Optional[dict]:
    """The metrics of a finished sequence with the same config, else None (missing, other settings, bad)."""
    try:
        stored = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return stored if stored.get("config") == json.loads(json.dumps(config)) else None


def model_input(width: Optional[int]) -> Callable[[np.ndarray], Any]:
    """RGB uint8 -> the model's input tensor: at the image's own size (``width`` None: the official
    sizes, already applied by the protocol's ``prepare``), or by the node's preprocessing at ``width``
    (a new preprocessor per sequence, as the node's new session has)."""
    from ..core.preprocess import FramePreprocessor, exact_size_tensor

    return exact_size_tensor if width is None else FramePreprocessor(width=width)


def stream_sequence(manager, seq, prepare: Callable[[np.ndarray], np.ndarray], bar,
                    width: Optional[int] = None) -> dict[int, Any]:
    """Push every frame through the session; ``{frame index: FrameResult}`` of the frames with a pose.
    ``width``: see ``model_input``."""
    from ..core.session_manager import InferenceFailed
    from ..core.stream import SessionError
    from .frame_sources import load_rgb_image

    prep = model_input(width)
    results: dict[int, Any] = {}
    refused = 0

    def take(new) -> None:
        for r in new:
            results[int(r.stamp)] = r

    for i, path in enumerate(seq.images):
        try:
            rgb = prepare(load_rgb_image(path))
            frame = prep(rgb)  # [3, H, W] float32 in [0, 1]
        except (OSError, ValueError) as exc:
            raise SequenceFailed(f"{path}: cannot use the image ({exc})") from None
        try:
            take(manager.push(frame, i))
        except SessionError:
            refused += 1
        except InferenceFailed as exc:
            raise SequenceFailed(f"{path}: the model failed on this frame ({exc})") from None
        bar.update(1, extra=f"{len(results)} poses")
    take(manager.flush())
    sessions = {r.session_id for r in results.values()}
    if len(sessions) > 1:
        first_new = min(i for i, r in results.items() if r.session_id != results[min(results)].session_id)
        raise SequenceFailed(f"{seq.images[first_new]}: a new session (new world frame) started here; one sequence "
                             "needs one world frame: use --long-run-policy window or a larger --max-stored-frames")
    finite = {i: r for i, r in results.items() if np.isfinite(r.c2w).all()}
    if not finite:
        why = f"the session refused all {refused} frames" if refused else "no frame got a finite pose"
        raise SequenceFailed(f"{seq.images[0].parent}: {why}")
    return finite


def score_sequence(seq, results: dict[int, Any], folder: Path, config: dict, protocol, seconds: float) -> dict:
    """Write the trajectory, the ground truth, the plot and ``metrics.json`` (last: the completion mark)."""
    from ..core.geometry import se3_inverse
    from ..core.trajectory import pose_auc, trajectory_metrics, write_tum
    from .plotting import plot_against_ground_truth

    order = sorted(results)
    est = np.stack([results[i].c2w for i in order])  # [M, 4, 4]
    gt = seq.gt_c2w[order]
    valid = np.isfinite(gt.reshape(len(gt), -1)).all(axis=1)
    if valid.sum() < 3:
        raise SequenceFailed(f"{seq.ground_truth}: only {int(valid.sum())} of the {len(order)} frames with a pose "
                             "have a ground-truth pose; 3 are needed for a Sim(3) alignment")
    frames = np.array(order)[valid]
    m = trajectory_metrics(est[valid], gt[valid], align="sim3", delta=1, stamps=frames.astype(np.float64))
    auc = pose_auc(est[valid], gt[valid])
    # The other convention in circulation (``inv(W_i) W_j``): the same errors of the inverted poses.
    auc_inverse = pose_auc(se3_inverse(est[valid]), se3_inverse(gt[valid]))
    folder.mkdir(parents=True, exist_ok=True)
    for name, stamps, poses in (("traj.tum", seq.stamps[order], est), ("gt.tum", seq.stamps[frames], gt[valid])):
        write_tum(folder / name, stamps, poses)  # atomic
    plot_against_ground_truth(folder / "plot.png", gt[valid][:, :3, 3], m.aligned_positions, m.ate_errors,
                              title=f"{protocol.title}: {seq.name} (ATE {m.ate_rmse:.4f})")  # atomic
    import evo

    metrics = {
        "dataset": seq.dataset, "sequence": seq.name, "config": config,
        "frames": len(seq.images), "poses": len(order), "evaluated": int(valid.sum()),
        "ate": m.ate_rmse, "rpe_trans": m.rpe_trans_rmse, "rpe_rot": m.rpe_rot_rmse_deg,
        "ate_mean": m.ate_mean, "ate_median": m.ate_median, "ate_max": m.ate_max,
        "rpe_trans_mean": m.rpe_trans_mean, "rpe_rot_mean": m.rpe_rot_mean_deg, "sim3_scale": m.scale,
        "alignment_note": m.alignment_note,  # non-empty: a straight-line trajectory (core/trajectory.line_alignment)
        "auc": {**auc.to_json(), **auc.summary()},
        "auc_convention": AUC_CONVENTION,
        "auc_inverse_convention": {**auc_inverse.to_json(), **auc_inverse.summary()},
        "model_input_hw": list(results[order[0]].image_hw), "seconds": seconds,
        "fps": len(seq.images) / seconds if seconds > 0 else None,
        "ground_truth": seq.ground_truth, "notes": seq.notes, "evo": str(getattr(evo, "__version__", "?")),
        "protocol": {"stride": config["stride"], "image": protocol.image if config["image_size"] == "official"
                     else "the node's preprocessing", "ground_truth": protocol.ground_truth,
                     "official_source": list(protocol.source)},
        "files": {"trajectory": "traj.tum", "ground_truth": "gt.tum", "plot": "plot.png"},
    }
    with atomic_open(folder / "metrics.json", "w") as f:  # written last: marks the sequence done
        f.write(json.dumps(metrics, indent=1))
    return metrics


# ------------------------------------------------------------------------------------ one sequence, one model
@dataclasses.dataclass
class SequenceOutcome:
    """What one sequence came to: scored now, kept from an earlier run, or failed with a one-line reason.

    The one result a scheduler hands back (the serial loop here, ``ray_runner`` on a cluster): it
    travels between processes, so it holds only plain data."""

    dataset: str
    sequence: str  # the name the tables print
    metrics: Optional[dict] = None  # the metrics.json contents; None when it failed
    kept: bool = False  # finished by an earlier run with the same config: not run again
    reason: str = ""  # one line, when it failed
    folder: str = ""  # where its files are (set once the sequence is loaded)

    @property
    def failed(self) -> bool:
        return self.metrics is None


class SequenceRunner:
    """Runs one sequence after another with one model (``SessionManager``), built for the first one.

    The unit of work of both schedulers: the serial loop of ``main`` holds one, and so does each
    worker of ``ray_runner`` (one per GPU). Everything one sequence needs goes through ``run``, so a
    sequence gives the same numbers wherever it runs."""

    def __init__(self, args: argparse.Namespace, say: Callable[[str], None]) -> None:
        from .datasets import READERS

        self.args = args
        self.say = say
        self.out = Path(args.out).expanduser()
        self.readers = READERS
        self.manager = None

    def session(self):
        """The one ``SessionManager``, built when the first sequence needs it (``--precision``'s recipe)."""
        if self.manager is None:
            from ..core.precision import loader
            from ..core.session_manager import SessionManager
            from .common import runtime_from_args, stream_from_args

            self.runtime, self.stream = runtime_from_args(self.args), stream_from_args(self.args)
            self.manager = SessionManager.open(self.runtime, self.stream, log=self.say,
                                                load=loader(self.args.precision))
        return self.manager

    def run(self, dataset: str, root: Path, name: str, progress: Optional[Callable[[int, str], Any]] = None
            ) -> SequenceOutcome:
        """Load, stream and score one sequence (or keep its stored result). ``progress(frames, label)``
        makes the per-frame bar (default: ``Progress`` on stderr). A model that cannot be built raises."""
        from ..core.config import replace
        from .cli import one_line
        from .datasets import DatasetError
        from .datasets.base import unchanged
        from .progress import Progress

        reader = self.readers[dataset]
        protocol = reader.protocol
        stride = self.args.stride or protocol.stride
        try:
            seq = reader.load(root, name, stride)
        except (DatasetError, OSError) as exc:
            return SequenceOutcome(dataset, name, reason=one_line(str(exc)))
        if self.args.max_frames:
            keep = min(self.args.max_frames, len(seq.images))
            seq = dataclasses.replace(seq, images=seq.images[:keep], stamps=seq.stamps[:keep],
                                      gt_c2w=seq.gt_c2w[:keep])
        kf = keyframe_interval(self.args.keyframe_choice, len(seq.images))
        folder = self.out / dataset / seq.safe_name
        config = run_config(self.args, dataset, seq.name, stride, kf)
        stored = None if self.args.force else stored_result(folder / "metrics.json", config)
        if stored is not None:
            return SequenceOutcome(dataset, seq.name, metrics=stored, kept=True, folder=str(folder))
        prepare = protocol.prepare if self.args.image_size == "official" else unchanged
        manager = self.session()
        manager.apply(self.runtime, replace(self.stream, keyframe_interval=kf))
        manager.reset()
        start = time.perf_counter()
        label = f"{PROG} {dataset}/{seq.name}"
        bar = progress(len(seq.images), label) if progress is not None else Progress(
            len(seq.images), label, enabled=False if self.args.quiet else None)
        try:
            with bar:
                results = stream_sequence(manager, seq, prepare, bar, width=model_width(self.args, protocol))
            metrics = score_sequence(seq, results, folder, config, protocol, time.perf_counter() - start)
        except (SequenceFailed, DatasetError, OSError) as exc:
            return SequenceOutcome(dataset, seq.name, reason=one_line(str(exc)), folder=str(folder))
        except Exception as exc:  # noqa: BLE001 - evo refusing a degenerate trajectory: this sequence only
            return SequenceOutcome(dataset, seq.name, reason=one_line(
                f"{seq.ground_truth}: cannot score the trajectory ({type(exc).__name__}: {exc})"), folder=str(folder))
        return SequenceOutcome(dataset, seq.name, metrics=metrics, folder=str(folder))


# ------------------------------------------------------------------------------------ the run
class _Run:
    """One invocation: the datasets, the summaries, what was printed."""

    def __init__(self, args: argparse.Namespace, datasets: list[tuple[str, Path]]) -> None:
        from .benchmark_report import DatasetSummary
        from .datasets import READERS

        self.args = args
        self.datasets = datasets
        self.out = Path(args.out).expanduser()
        self.readers = READERS
        self.summaries = {name: DatasetSummary(name, READERS[name].protocol) for name, _ in datasets}
        self.quiet = args.quiet
        self.runner = SequenceRunner(args, self.say)

    def say(self, message: str) -> None:
        if not self.quiet:
            print(f"[{PROG}] {message}", file=sys.stderr, flush=True)

    def plan(self) -> list[tuple[str, Path, str]]:
        """``(dataset, root, sequence)`` of every sequence to run; a dataset without any fails here."""
        from .datasets import DatasetError

        todo = []
        for name, root in self.datasets:
            try:
                names = self.readers[name].find(root)
            except (DatasetError, OSError) as exc:
                self.summaries[name].failed.append(("(dataset)", str(exc)))
                print(f"{PROG}: error: --dataset {name}: {exc}", file=sys.stderr, flush=True)
                continue
            if self.args.sequences:
                names = [n for n in names if n in self.args.sequences or Path(n).name in self.args.sequences]
            protocol = self.readers[name].protocol
            outside = [n for n in names if not protocol.is_official_scene(n)]
            if outside and not self.args.all_scenes:
                self.say(f"--dataset {name}: {len(outside)} sequence(s) outside the official scene list not run "
                         f"({', '.join(outside)}); --all-scenes runs them")
                names = [n for n in names if protocol.is_official_scene(n)]
            todo += [(name, root, n) for n in names]
        return todo

    def one(self, dataset: str, root: Path, name: str, position: str) -> None:
        """The serial scheduler's step: run the sequence here, report it, count it."""
        outcome = self.runner.run(dataset, root, name)
        self.add(outcome)  # counted before its line: an interrupt right after the line keeps it
        self.report(outcome, position)
        if not outcome.failed and not outcome.kept:
            self.write_summary()

    def report(self, outcome: SequenceOutcome, position: str) -> None:
        """The sequence's line on stderr: its numbers, 'done before', or its one-line reason."""
        where = f"{position} {outcome.dataset}/{outcome.sequence}"
        m = outcome.metrics
        if m is None:
            print(f"{PROG}: error: {where}: {outcome.reason}", file=sys.stderr, flush=True)
        elif outcome.kept:
            self.say(f"{where}: done before (ATE {m['ate']:.4f}), kept")
        else:
            self.say(f"{where}: ATE {m['ate']:.4f}, RPE-trans {m['rpe_trans']:.4f}, RPE-rot {m['rpe_rot']:.3f} deg "
                     f"({m['evaluated']} of {m['frames']} frames scored, {m['fps']:.2f} frames/s, "
                     f"kf {m['config']['settings']['keyframe_interval']}) -> {outcome.folder}"
                     + (f"; note: {m['alignment_note']}" if m.get("alignment_note") else ""))

    def add(self, outcome: SequenceOutcome) -> None:
        """Count the outcome in its dataset's summary (call in plan order: the tables keep that order)."""
        summary = self.summaries[outcome.dataset]
        if outcome.metrics is None:
            summary.failed.append((outcome.sequence, outcome.reason))
        else:
            summary.done.append(outcome.metrics)

    def write_summary(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        doc = {"datasets": [s.to_json() for s in self.summaries.values()]}
        with atomic_open(self.out / "summary.json", "w") as f:
            f.write(json.dumps(doc, indent=1))

    def tables(self) -> str:
        from .benchmark_report import dataset_tables

        lines: list[str] = []
        for s in self.summaries.values():
            lines += dataset_tables(s) + [""]
        return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        args.image_width_given = args.image_width is not None
        if not args.image_width_given:
            args.image_width = SETTINGS_BY_NAME["image_width"].default  # recorded only with --image-size node
        if args.max_stored_frames == BENCHMARK_DEFAULTS["max_stored_frames"]:
            args.max_stored_frames = min(args.max_stored_frames, args.max_frame_num)  # a smaller --max-frame-num
        check_session_args(parser, args)
    except SystemExit as exc:  # --help, or a usage error already printed
        return int(exc.code or 0)
    try:
        datasets = check_args(args)
    except UsageError as exc:
        return fail(PROG, str(exc))
    run = _Run(args, datasets)
    todo = run.plan()
    previous = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    try:
        if args.ray is None:
            for k, (dataset, root, name) in enumerate(todo, 1):
                run.one(dataset, root, name, f"[{k}/{len(todo)}]")
        else:
            from .ray_runner import run_on_ray

            run_on_ray(run, todo)  # the same SequenceRunner.run on each worker; outcomes added in plan order
    except KeyboardInterrupt:
        run.write_summary()
        done = sum(len(s.done) for s in run.summaries.values())
        print(f"{PROG}: interrupted with {done} of {len(todo)} sequences done (kept under {run.out}); the same "
              "command again resumes", file=sys.stderr, flush=True)
        return INTERRUPTED_EXIT
    except UsageError as exc:  # --ray: Ray missing, or no cluster at the address
        return fail(PROG, str(exc))
    except (ValueError, OSError, RuntimeError) as exc:  # the model cannot be built (checkpoint, device)
        return fail(PROG, f"--checkpoint {args.checkpoint}: {exc}" if args.checkpoint else str(exc))
    finally:
        signal.signal(signal.SIGTERM, previous)
    run.write_summary()
    print(run.tables(), end="")
    failed = sum(len(s.failed) for s in run.summaries.values())
    return FAILED_EXIT if failed else 0


def _sigterm_as_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
