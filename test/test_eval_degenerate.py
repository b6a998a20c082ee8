"""A ground truth on a straight line (a robot driving straight): evo refuses its Umeyama alignment
("Degenerate covariance rank"); ``lingbot_map_eval`` and the benchmark align it with one of the
equally good least-squares solutions and say so, and refuse, in one line, a trajectory that does
not move.

The reference is evo itself on the same trajectories with the ground truth moved 1e-6 off its line
(a well-posed alignment): the least-squares minimum, hence the ATE RMSE, and the RPE are continuous
in the data, so they must agree to ~1e-5; the per-pose errors need not.
"""
from __future__ import annotations

import contextlib
import io
import json

import benchmark_layouts as layouts
import numpy as np
import pytest

from lingbot_map_ros.core.geometry import quaternion_to_matrix, se3
from lingbot_map_ros.core.trajectory import DegenerateTrajectory, line_alignment, trajectory_metrics, write_tum
from lingbot_map_ros.tools import benchmark, evaluate

TINY = ["--model-preset", "tiny", "--scale-frames", "2", "--sliding-window", "3", "--camera-iterations", "1",
        "--device", "cpu"]


def straight_drive(n: int = 30) -> np.ndarray:
    """Poses [n, 4, 4] moving along one line (x = 2 t, y = -1, z = 0.5) while the camera turns."""
    t = np.linspace(0.0, 3.0, n)
    q = np.stack([0.05 * np.sin(t), 0.3 * np.sin(2 * t), 0.1 * t, np.ones(n)], 1)
    return se3(quaternion_to_matrix(q), np.stack([2.0 * t, -np.ones(n), 0.5 * np.ones(n)], 1))


def estimate_of(gt: np.ndarray, seed: int = 0) -> np.ndarray:
    """A similarity transform of the ground truth plus noise in every direction (not on a line)."""
    rng = np.random.default_rng(seed)
    s, rot = 0.37, quaternion_to_matrix(np.array([0.2, -0.4, 0.1, 1.0]))
    est = gt.copy()
    est[:, :3, 3] = s * gt[:, :3, 3] @ rot.T + np.array([0.5, 2.0, -1.0]) + rng.normal(0, 0.02, (len(gt), 3))
    est[:, :3, :3] = rot @ gt[:, :3, :3]
    return est


def eval_main(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = evaluate.main(list(args))
    return code, out.getvalue(), err.getvalue()


def test_evo_refuses_a_straight_line_and_the_fallback_gives_the_well_posed_minimum():
    from evo.core.geometry import GeometryException, umeyama_alignment

    gt = straight_drive()
    est = estimate_of(gt)
    with pytest.raises(GeometryException, match="Degenerate covariance rank"):
        umeyama_alignment(est[:, :3, 3].T, gt[:, :3, 3].T, True)  # the defect: evo alone fails here
    m = trajectory_metrics(est, gt, align="sim3")
    assert "ground truth lies on a straight line" in m.alignment_note
    nudged = gt.copy()
    nudged[:, 1, 3] += 1e-6 * np.sin(np.arange(len(gt)) * 1.3)  # off the line: evo's own alignment works
    ref = trajectory_metrics(est, nudged, align="sim3")
    assert ref.alignment_note == ""
    assert m.ate_rmse == pytest.approx(ref.ate_rmse, abs=1e-5)
    assert m.scale == pytest.approx(ref.scale, rel=1e-5)
    assert m.rpe_trans_rmse == pytest.approx(ref.rpe_trans_rmse, abs=1e-5)
    assert m.rpe_rot_rmse_deg == pytest.approx(ref.rpe_rot_rmse_deg, abs=1e-6)
    # it is a minimum: no other rotation about the line does better
    rot, trans, scale, _ = line_alignment(est[:, :3, 3], gt[:, :3, 3], True)
    axis = np.array([1.0, 0.0, 0.0])
    for angle in np.linspace(0.1, 6.2, 12):
        k = np.array([[0, -axis[2], axis[1]], [axis[2], 0, -axis[0]], [-axis[1], axis[0], 0]])
        turn = np.eye(3) + np.sin(angle) * k + (1 - np.cos(angle)) * k @ k
        moved = scale * est[:, :3, 3] @ (turn @ rot).T
        moved += (gt[:, :3, 3] - moved).mean(0)
        assert np.sqrt(np.mean(np.sum((moved - gt[:, :3, 3]) ** 2, 1))) >= m.ate_rmse - 1e-9


def test_lingbot_map_eval_reports_the_fallback_and_refuses_a_still_ground_truth(tmp_path):
    gt = straight_drive()
    stamps = 100.0 + np.arange(len(gt)) / 10.0
    write_tum(tmp_path / "gt.tum", stamps, gt)
    write_tum(tmp_path / "est.tum", stamps, estimate_of(gt))
    code, out, err = eval_main(str(tmp_path / "est.tum"), str(tmp_path / "gt.tum"))
    assert code == 0, err
    assert "Traceback" not in err
    line = next(ln for ln in out.splitlines() if ln.startswith("alignment sim3"))
    assert "(note: the ground truth lies on a straight line: the rotation about it is not determined" in line
    nudged = gt.copy()
    nudged[:, 1, 3] += 1e-6 * np.sin(np.arange(len(gt)) * 1.3)
    ate = float(next(ln for ln in out.splitlines() if ln.startswith("ATE RMSE")).split()[2])
    assert ate == pytest.approx(trajectory_metrics(estimate_of(gt), nudged).ate_rmse, abs=1e-5)
    still = np.repeat(gt[:1], len(gt), axis=0)
    write_tum(tmp_path / "still.tum", stamps, still)
    code, out, err = eval_main(str(tmp_path / "est.tum"), str(tmp_path / "still.tum"))
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and out == ""
    assert "the ground truth does not move (all 30 positions within 0 of their mean)" in lines[0]
    with pytest.raises(DegenerateTrajectory):
        trajectory_metrics(estimate_of(gt), still)


def test_the_benchmark_scores_a_straight_drive_and_names_a_still_one(tmp_path):
    """The same shared metrics in the benchmark: the note in metrics.json and on the sequence's line; a
    ground truth that does not move fails that sequence with the reason, the others go on."""
    data = tmp_path / "tum"
    for name, seed in (("rgbd_dataset_freiburg1_straight", 0), ("rgbd_dataset_freiburg1_still", 1)):
        written = layouts.write_tum(data, name, n=6, seed=seed)
        gt_stamps = np.round(written.stamps[0] - 0.05 + np.arange(30) / 100.0, 4)
        poses = straight_drive(len(gt_stamps)) if name.endswith("straight") else np.repeat(
            straight_drive(1), len(gt_stamps), axis=0)
        (data / name / "groundtruth.txt").unlink()
        write_tum(data / name / "groundtruth.txt", gt_stamps, poses)
    out = tmp_path / "out"
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = benchmark.main(["--dataset", "tum", str(data), "--out", str(out), *TINY])
    assert code == 1, stderr.getvalue()
    m = json.loads((out / "tum" / "rgbd_dataset_freiburg1_straight" / "metrics.json").read_text())
    assert "ground truth lies on a straight line" in m["alignment_note"] and np.isfinite(m["ate"])
    assert "note: the ground truth lies on a straight line" in stderr.getvalue()
    row = next(ln for ln in stdout.getvalue().splitlines() if ln.startswith("| rgbd_dataset_freiburg1_still |"))
    assert "failed: " in row and "the ground truth does not move" in row
    assert "Traceback" not in stderr.getvalue()
