"""``lingbot_map_eval``: compare an estimated TUM trajectory with a ground-truth TUM file.

Prints the absolute trajectory error (ATE: RMSE of camera centres after the best similarity, rigid
or no alignment) and the relative pose error (RPE over every frame pair ``(i, i + --delta)``), after
associating the two files by timestamp (TUM's associate rule, ``core/trajectory.associate``). The
alignment and both metrics are evo's (``core/trajectory.trajectory_metrics``: the settings of
``evo_ape -as`` and ``evo_rpe -as --all_pairs``), so the numbers are the field's standard ones.
LingBot-Map's translation has no metric scale, hence ``--align sim3`` by default.

A ground truth on a straight line (a robot driving straight) leaves the rotation about the line
free, and evo refuses it ("Degenerate covariance rank"); the alignment is then one of the equally
good least-squares solutions (``core/trajectory.line_alignment``), with the same ATE RMSE and RPE
for all of them, and the report says so. A trajectory that does not move is refused in one line.
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass

import numpy as np

from ..core.trajectory import EVO_MISSING, associate, pose_matrices, read_tum, trajectory_metrics
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
    rpe_rot_rmse_deg: float
    evo_version: str
    alignment_note: str = ""  # non-empty: the alignment is one of several equally good ones (a straight line)


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
    try:
        import evo
    except ImportError:
        raise UsageError(EVO_MISSING) from None
    stamps, est, gt, n_est, n_gt = load_pairs(est_path, gt_path, max_dt)
    m = est.shape[0]
    need = 3 if align != "none" else 2
    if m < max(need, delta + 1):
        raise ValueError(
            f"only {m} poses associated within {max_dt} s (of {n_est} estimated, {n_gt} reference); "
            f"need at least {max(need, delta + 1)} - check the stamps or --max-dt"
        )
    res = trajectory_metrics(est, gt, align=align, delta=delta, stamps=stamps)
    return Evaluation(
        matched=m, est_poses=n_est, gt_poses=n_gt, align=align, scale=res.scale,
        ate_rmse=res.ate_rmse, ate_mean=res.ate_mean, ate_median=res.ate_median, ate_max=res.ate_max, delta=delta,
        rpe_trans_rmse=res.rpe_trans_rmse, rpe_rot_mean_deg=res.rpe_rot_mean_deg,
        rpe_rot_rmse_deg=res.rpe_rot_rmse_deg, evo_version=str(getattr(evo, "__version__", "?")),
        alignment_note=res.alignment_note,
    )


def report(ev: Evaluation, max_dt: float) -> str:
    lines = [
        f"associated {ev.matched} poses (estimated {ev.est_poses}, reference {ev.gt_poses}, max dt {max_dt:g} s)",
        f"alignment {ev.align}" + (f": scale {ev.scale:.6g}" if ev.align == "sim3" else "")
        + (f" (note: {ev.alignment_note})" if ev.alignment_note else ""),
        f"ATE RMSE {ev.ate_rmse:.6g}  (mean {ev.ate_mean:.6g}, median {ev.ate_median:.6g}, max {ev.ate_max:.6g})",
        f"RPE delta {ev.delta} frame(s): translation RMSE {ev.rpe_trans_rmse:.6g}, "
        f"rotation mean {ev.rpe_rot_mean_deg:.6g} deg (RMSE {ev.rpe_rot_rmse_deg:.6g} deg)",
        f"metrics: evo {ev.evo_version} (APE/RPE, all pairs, Umeyama alignment)",
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
