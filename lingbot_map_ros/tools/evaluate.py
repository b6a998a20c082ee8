"""``lingbot_map_eval``: compare an estimated TUM trajectory with a ground-truth TUM file.

Prints the absolute trajectory error (ATE: RMSE of camera centres after the best similarity, rigid
or no alignment) and the relative pose error (RPE over frame offset ``--delta``), computed with
``geometry.py`` after associating the two files by timestamp (TUM's associate rule). LingBot-Map's
translation has no metric scale, hence ``--align sim3`` by default.

When the field's standard tool, ``evo``, is importable, its numbers for the same pairs are printed
too (APE/RPE translation part; the settings of ``evo_ape -as`` and ``evo_rpe -as --all_pairs``), so
results can be quoted either way; evo is not a dependency.
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from typing import Optional

import numpy as np

from ..core.geometry import (
    align_trajectory,
    associate,
    pose_matrices,
    read_tum,
    rpe,
    umeyama_sim3,
)
from .cli import OneLineParser, UsageError, fail, need_file

PROG = "lingbot_map_eval"


@dataclass(frozen=True)
class Evaluation:
    matched: int
    est_poses: int
    gt_poses: int
    align: str
    scale: float  # similarity scale est -> gt (1 unless sim3)
    ate_rmse: float
    ate_mean: float
    ate_median: float
    ate_max: float
    delta: int
    rpe_trans_rmse: float
    rpe_rot_mean_deg: float


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog=PROG, description=__doc__)
    p.add_argument("est", help="estimated trajectory (TUM: stamp tx ty tz qx qy qz qw)")
    p.add_argument("gt", help="ground-truth trajectory (TUM; TUM RGB-D's groundtruth.txt works as is)")
    p.add_argument("--align", default="sim3", choices=["sim3", "se3", "none"],
                   help="alignment before ATE (sim3: rotation, translation and scale; LingBot-Map has no metric "
                   "scale)")
    p.add_argument("--max-dt", "--tolerance", dest="max_dt", type=float, default=0.02,
                   help="association tolerance: largest stamp difference of a matched pair, in seconds "
                   "(TUM's associate.py uses 0.02)")
    p.add_argument("--delta", type=int, default=1, help="RPE frame offset")
    p.add_argument("--no-evo", action="store_true", help="do not print evo's numbers even if evo is installed")
    return p


def stamp_warnings(path: str) -> list[str]:
    """Duplicate or out-of-order stamps in a TUM file: association pairs each stamp once, closest
    first, so such a file silently loses poses or pairs the wrong ones. Warned, not refused."""
    from .frame_sources import stamp_problems

    stamps, _, _ = read_tum(path)
    problems = stamp_problems(stamps)
    return [f"warning: {path}: {problems} (association may drop or mis-pair poses)"] if problems else []


def load_pairs(est_path: str, gt_path: str, max_dt: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int]:
    """Associated ``(stamps, est c2w [M,4,4], gt c2w [M,4,4], n_est, n_gt)``."""
    se, pe, qe = read_tum(est_path)
    sg, pg, qg = read_tum(gt_path)
    pairs = associate(se, sg, max_dt)
    i, j = pairs[:, 0], pairs[:, 1]
    return se[i], pose_matrices(pe[i], qe[i]), pose_matrices(pg[j], qg[j]), se.size, sg.size


def evaluate(est_path: str, gt_path: str, align: str = "sim3", max_dt: float = 0.02, delta: int = 1) -> Evaluation:
    _, est, gt, n_est, n_gt = load_pairs(est_path, gt_path, max_dt)
    m = est.shape[0]
    need = 3 if align != "none" else 2
    if m < max(need, delta + 1):
        raise ValueError(
            f"only {m} poses associated within {max_dt} s (of {n_est} estimated, {n_gt} reference); "
            f"need at least {max(need, delta + 1)} - check the stamps or --max-dt"
        )
    aligned = align_trajectory(est, gt, align)
    err = np.linalg.norm(aligned - gt[:, :3, 3], axis=1)
    scale = umeyama_sim3(est[:, :3, 3], gt[:, :3, 3])[0] if align == "sim3" else 1.0
    rel = rpe(est, gt, delta=delta, align_scale=align == "sim3")
    return Evaluation(
        matched=m, est_poses=n_est, gt_poses=n_gt, align=align, scale=float(scale),
        ate_rmse=float(np.sqrt((err * err).mean())), ate_mean=float(err.mean()),
        ate_median=float(np.median(err)), ate_max=float(err.max()), delta=delta,
        rpe_trans_rmse=rel.trans_rmse, rpe_rot_mean_deg=rel.rot_mean_deg,
    )


def evo_numbers(est_path: str, gt_path: str, align: str, max_dt: float, delta: int) -> Optional[dict]:
    """The same metrics through evo (None when evo is not installed)."""
    try:
        import evo
        from evo.core import metrics, sync
        from evo.core.units import Unit
        from evo.tools import file_interface
    except ImportError:
        return None
    ref = file_interface.read_tum_trajectory_file(gt_path)
    est = file_interface.read_tum_trajectory_file(est_path)
    ref, est = sync.associate_trajectories(ref, est, max_diff=max_dt)
    if align != "none":
        est.align(ref, correct_scale=align == "sim3")
    out = {"version": getattr(evo, "__version__", "?")}
    ape = metrics.APE(metrics.PoseRelation.translation_part)
    ape.process_data((ref, est))
    out["ate_rmse"] = ape.get_statistic(metrics.StatisticsType.rmse)
    for name, relation, stat in (
        ("rpe_trans_rmse", metrics.PoseRelation.translation_part, metrics.StatisticsType.rmse),
        ("rpe_rot_mean_deg", metrics.PoseRelation.rotation_angle_deg, metrics.StatisticsType.mean),
    ):
        # all_pairs: every (i, i + delta), as geometry.rpe (evo_rpe --all_pairs)
        r = metrics.RPE(relation, delta=delta, delta_unit=Unit.frames, all_pairs=True)
        r.process_data((ref, est))
        out[name] = r.get_statistic(stat)
    return out


def report(ev: Evaluation, max_dt: float) -> str:
    lines = [
        f"associated {ev.matched} poses (estimated {ev.est_poses}, reference {ev.gt_poses}, max dt {max_dt:g} s)",
        f"alignment {ev.align}" + (f": scale {ev.scale:.6g}" if ev.align == "sim3" else ""),
        f"ATE RMSE {ev.ate_rmse:.6g}  (mean {ev.ate_mean:.6g}, median {ev.ate_median:.6g}, max {ev.ate_max:.6g})",
        f"RPE delta {ev.delta} frame(s): translation RMSE {ev.rpe_trans_rmse:.6g}, "
        f"rotation mean {ev.rpe_rot_mean_deg:.6g} deg",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``lingbot_map_eval``; a reader that leaves early (``| head``) ends it quietly, not with a traceback."""
    try:
        return _run(argv)
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the interpreter's final flush must not fail again
        return 0


def _run(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    try:
        need_file(args.est, "estimated trajectory", "write it with lingbot_map_offline --tum")
        need_file(args.gt, "ground truth")
        if args.max_dt < 0:
            raise UsageError(f"--max-dt must be >= 0 (got {args.max_dt:g})")
        if args.delta < 1:
            raise UsageError(f"--delta must be >= 1 (got {args.delta})")
        for line in stamp_warnings(args.est) + stamp_warnings(args.gt):
            print(f"{PROG}: {line}", file=sys.stderr)
        ev = evaluate(args.est, args.gt, args.align, args.max_dt, args.delta)
    except (OSError, ValueError, UsageError) as exc:
        return fail(PROG, str(exc))
    print(report(ev, args.max_dt))
    if not args.no_evo:
        try:
            theirs = evo_numbers(args.est, args.gt, args.align, args.max_dt, args.delta)
        except Exception as exc:  # noqa: BLE001 - evo is optional; its failure must not hide ours
            print(f"evo: failed ({type(exc).__name__}: {exc})")
        else:
            if theirs is None:
                print("evo: not installed (pip install evo) - numbers above are from geometry.py")
            else:
                print(
                    f"evo {theirs['version']}: ATE RMSE {theirs['ate_rmse']:.6g}, RPE translation RMSE "
                    f"{theirs['rpe_trans_rmse']:.6g}, rotation mean {theirs['rpe_rot_mean_deg']:.6g} deg"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
