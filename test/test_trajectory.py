"""trajectory.py against independent references: TUM files read back, association against brute force,
ATE/RPE against evo called directly (to 1e-9) and against hand-built cases, the pose AUC against a
float64 transcription of the official benchmark's definition."""
from __future__ import annotations

import copy
import math
import re

import numpy as np
import pytest

from lingbot_map_ros.core import trajectory as tr
from lingbot_map_ros.core.geometry import quaternion_to_matrix, quaternion_xyzw_from_matrix, se3, sim3_apply_to_poses


def random_rotation(rng: np.random.Generator, n: int | None = None) -> np.ndarray:
    q = rng.normal(size=(4,) if n is None else (n, 4))
    return quaternion_to_matrix(q)


def trajectory(rng: np.random.Generator, n: int = 40) -> np.ndarray:
    pos = np.cumsum(rng.normal(size=(n, 3)) * 0.3, axis=0)
    return se3(random_rotation(rng, n), pos)


def noisy_copy(rng: np.random.Generator, gt: np.ndarray, scale: float = 0.4, rot_noise: float = 0.02) -> np.ndarray:
    """A Sim(3)-moved, scaled estimate of ``gt`` with position and rotation noise."""
    est = sim3_apply_to_poses(scale, random_rotation(rng), rng.normal(size=3), gt)
    est[:, :3, 3] += rng.normal(size=(len(gt), 3)) * 0.02
    wobble = quaternion_to_matrix(np.concatenate([rng.normal(size=(len(gt), 3)) * rot_noise, np.ones((len(gt), 1))],
                                                 1))
    est[:, :3, :3] = est[:, :3, :3] @ wobble
    return est


# -- TUM files ---------------------------------------------------------------------------------
def test_tum_round_trip(tmp_path) -> None:
    rng = np.random.default_rng(10)
    poses = se3(random_rotation(rng, 7), rng.normal(size=(7, 3)))
    stamps = 1_700_000_000.0 + np.cumsum(rng.uniform(0.01, 0.1, size=7))
    path = tmp_path / "traj.txt"
    tr.write_tum(path, stamps, poses)
    lines = path.read_text().splitlines()
    assert lines[0].startswith("#") and len(lines) == 8
    for line in lines[1:]:
        parts = line.split()
        assert len(parts) == 8 and re.fullmatch(r"\d+\.\d{9}", parts[0])
    st, pos, quat = tr.read_tum(path)
    np.testing.assert_allclose(st, stamps, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(pos, poses[:, :3, 3])
    np.testing.assert_array_equal(quat, quaternion_xyzw_from_matrix(poses[:, :3, :3]))
    np.testing.assert_allclose(tr.pose_matrices(pos, quat), poses, atol=1e-12)


def test_read_tum_formats_and_errors(tmp_path) -> None:
    ok = tmp_path / "ok.txt"
    ok.write_text("# c\n\n1.5,1,2,3,0,0,0,1\n2.5 4 5 6 0 0 1 0\n")
    st, pos, quat = tr.read_tum(ok)
    np.testing.assert_array_equal(st, [1.5, 2.5])
    np.testing.assert_array_equal(pos, [[1, 2, 3], [4, 5, 6]])
    np.testing.assert_array_equal(quat[1], [0, 0, 1, 0])
    bad = tmp_path / "bad.txt"
    bad.write_text("1 2 3 4 5 6 7 8\n1 2 3\n")
    with pytest.raises(ValueError, match=":2: expected 8 values"):
        tr.read_tum(bad)
    with pytest.raises(ValueError, match="stamps"):
        tr.write_tum(tmp_path / "x.txt", [0.0], np.stack([np.eye(4)] * 2))


# -- association -------------------------------------------------------------------------------
def brute_force_associate(a: np.ndarray, b: np.ndarray, max_dt: float) -> list[list[int]]:
    """TUM's associate.py: every pair within max_dt, closest first, each stamp used once."""
    cands = sorted((abs(x - y), i, j) for i, x in enumerate(a) for j, y in enumerate(b) if abs(x - y) <= max_dt)
    used_a, used_b, out = set(), set(), []
    for _, i, j in cands:
        if i not in used_a and j not in used_b:
            used_a.add(i)
            used_b.add(j)
            out.append([i, j])
    return sorted(out)


def test_associate_equals_brute_force() -> None:
    rng = np.random.default_rng(3)
    for trial in range(60):
        a = rng.uniform(0, 1, size=rng.integers(0, 30))
        b = np.sort(rng.uniform(0, 1, size=rng.integers(1, 40)))  # a ground truth is time-ordered
        if trial % 3 == 0:
            b = rng.permutation(b)  # but the rule does not need it
        max_dt = float(rng.choice([0.005, 0.02, 0.08]))
        assert tr.associate(a, b, max_dt).tolist() == brute_force_associate(a, b, max_dt), trial


def test_associate_takes_a_farther_free_stamp_when_both_neighbours_are_taken() -> None:
    # a[1] and a[2] take a[0]'s two neighbours; a[0] is still within 0.02 s of b[2]
    a, b = [0.0, 0.0049, -0.0049], [-0.005, 0.005, 0.0149]
    assert tr.associate(a, b, 0.02).tolist() == [[0, 2], [1, 1], [2, 0]] == brute_force_associate(a, b, 0.02)
    assert tr.associate([], b).shape == (0, 2)


def test_nearest_within_equals_brute_force() -> None:
    rng = np.random.default_rng(4)
    for trial in range(60):
        ref = np.sort(rng.uniform(0, 1, size=rng.integers(1, 50)))
        if trial % 4 == 0:
            ref = np.repeat(ref, 2)  # duplicate ground-truth stamps: the first listed wins
        query = rng.uniform(-0.1, 1.1, size=rng.integers(0, 40))
        max_dt = float(rng.choice([0.002, 0.02, 0.3]))
        expect = []
        for q in query:
            d = np.abs(ref - q)
            k = int(np.argmin(d))  # the official reader's rule
            expect.append(k if d[k] <= max_dt else -1)
        assert tr.nearest_within(query, ref, max_dt).tolist() == expect, trial
    # two frames may share one pose (the official rule is not one to one)
    assert tr.nearest_within([0.0, 0.001], [0.0005, 5.0], 0.02).tolist() == [0, 0]
    assert tr.nearest_within([1.0], [], 0.02).tolist() == [-1]


# -- ATE / RPE: evo ------------------------------------------------------------------------------
def evo_directly(est: np.ndarray, gt: np.ndarray, align: bool, scale: bool, delta: int = 1) -> dict:
    """evo's own entry points (what evo_ape / evo_rpe run), on evo trajectories built here."""
    from evo import main_ape, main_rpe
    from evo.core.metrics import PoseRelation, Unit
    from evo.core.trajectory import PoseTrajectory3D

    def traj(p):
        return PoseTrajectory3D(poses_se3=list(p), timestamps=np.arange(len(p), dtype=np.float64))

    out = {}
    ape = main_ape.ape(traj(gt), traj(est), PoseRelation.translation_part, align=align, correct_scale=scale)
    out["ate"] = ape.stats
    for name, rel in (("trans", PoseRelation.translation_part), ("rot", PoseRelation.rotation_angle_deg)):
        r = main_rpe.rpe(traj(gt), traj(est), rel, delta=delta, delta_unit=Unit.frames, all_pairs=True,
                         align=align, correct_scale=scale)
        out[name] = r.stats
    return out


@pytest.mark.parametrize("align", ["sim3", "se3", "none"])
def test_metrics_equal_evo_called_directly(align) -> None:
    rng = np.random.default_rng({"sim3": 20, "se3": 21, "none": 22}[align])
    for delta in (1, 3):
        gt = trajectory(rng, 50)
        est = noisy_copy(rng, gt)
        ours = tr.trajectory_metrics(est, gt, align=align, delta=delta)
        ref = evo_directly(copy.deepcopy(est), gt, align=align != "none", scale=align == "sim3", delta=delta)
        for key, value in (("ate_rmse", ref["ate"]["rmse"]), ("ate_mean", ref["ate"]["mean"]),
                           ("ate_median", ref["ate"]["median"]), ("ate_max", ref["ate"]["max"]),
                           ("rpe_trans_rmse", ref["trans"]["rmse"]), ("rpe_trans_mean", ref["trans"]["mean"]),
                           ("rpe_rot_rmse_deg", ref["rot"]["rmse"]), ("rpe_rot_mean_deg", ref["rot"]["mean"])):
            assert getattr(ours, key) == pytest.approx(value, abs=1e-9, rel=0), (key, delta)
        assert ours.pairs == 50 and ours.ate_errors.shape == (50,) and ours.aligned_positions.shape == (50, 3)


def test_metrics_of_known_trajectories() -> None:
    rng = np.random.default_rng(11)
    gt = trajectory(rng)
    est = sim3_apply_to_poses(0.37, random_rotation(rng), rng.normal(size=3), gt)
    m = tr.trajectory_metrics(est, gt)
    assert m.ate_rmse == pytest.approx(0.0, abs=1e-9) and m.rpe_trans_rmse == pytest.approx(0.0, abs=1e-9)
    assert m.rpe_rot_mean_deg == pytest.approx(0.0, abs=1e-5) and m.scale == pytest.approx(1 / 0.37)
    assert tr.trajectory_metrics(est, gt, align="se3").ate_rmse > 0.1  # the scale differs
    # a 10 deg error in one frame's orientation: the two relative motions through it err by 10 deg each
    bad = gt.copy()
    turn = quaternion_to_matrix([0.0, 0.0, math.sin(math.radians(5)), math.cos(math.radians(5))])
    bad[10, :3, :3] = bad[10, :3, :3] @ turn
    assert tr.trajectory_metrics(bad, gt, delta=1).rpe_rot_mean_deg == pytest.approx(2 * 10.0 / 39, rel=1e-9)
    assert tr.trajectory_metrics(bad, gt, delta=5).rpe_rot_mean_deg == pytest.approx(2 * 10.0 / 35, rel=1e-9)
    assert tr.trajectory_metrics(bad, gt, delta=1).rpe_rot_rmse_deg == pytest.approx(math.sqrt(2 * 100 / 39), rel=1e-9)
    # an ATE by hand: positions off by a known vector field after an exact alignment
    shifted = gt.copy()
    shifted[:, :3, 3] += np.tile([[0.03, 0.0, 0.0], [-0.03, 0.0, 0.0]], (20, 1))  # zero mean, no rotation fit
    assert tr.trajectory_metrics(shifted, gt, align="none").ate_rmse == pytest.approx(0.03, rel=1e-12)
    with pytest.raises(ValueError, match="align"):
        tr.trajectory_metrics(est, gt, align="affine")
    with pytest.raises(ValueError, match="need at least"):
        tr.trajectory_metrics(est[:2], gt[:2])


def test_slightly_non_orthogonal_ground_truth_is_projected_onto_so3() -> None:
    rng = np.random.default_rng(12)
    gt = trajectory(rng, 20)
    skewed = gt.copy()
    skewed[:, :3, :3] *= 1.0 + 1e-4 * rng.normal(size=(20, 3, 3))  # KinectFusion-like rotations
    np.testing.assert_allclose(tr.orthonormalize(skewed[:, :3, :3]), gt[:, :3, :3], atol=1e-3)
    rots = tr.orthonormalize(skewed[:, :3, :3])
    np.testing.assert_allclose(rots @ np.swapaxes(rots, 1, 2), np.broadcast_to(np.eye(3), (20, 3, 3)), atol=1e-12)
    assert np.all(np.linalg.det(rots) > 0)


# -- the official pose AUC -----------------------------------------------------------------------
def official_quaternion(r: np.ndarray) -> np.ndarray:
    """Rotation [N, 3, 3] -> (x, y, z, w) by Shepperd's four cases (the official code's method)."""
    out = np.zeros((len(r), 4))
    for k, m in enumerate(r):
        tr_ = np.trace(m)
        if tr_ > 0:
            s = 0.5 / math.sqrt(tr_ + 1.0)
            out[k] = [(m[2, 1] - m[1, 2]) * s, (m[0, 2] - m[2, 0]) * s, (m[1, 0] - m[0, 1]) * s, 0.25 / s]
        elif m[0, 0] > m[1, 1] and m[0, 0] > m[2, 2]:
            s = 2.0 * math.sqrt(1.0 + m[0, 0] - m[1, 1] - m[2, 2])
            out[k] = [0.25 * s, (m[0, 1] + m[1, 0]) / s, (m[0, 2] + m[2, 0]) / s, (m[2, 1] - m[1, 2]) / s]
        elif m[1, 1] > m[2, 2]:
            s = 2.0 * math.sqrt(1.0 + m[1, 1] - m[0, 0] - m[2, 2])
            out[k] = [(m[0, 1] + m[1, 0]) / s, 0.25 * s, (m[1, 2] + m[2, 1]) / s, (m[0, 2] - m[2, 0]) / s]
        else:
            s = 2.0 * math.sqrt(1.0 + m[2, 2] - m[0, 0] - m[1, 1])
            out[k] = [(m[0, 2] + m[2, 0]) / s, (m[1, 2] + m[2, 1]) / s, 0.25 * s, (m[1, 0] - m[0, 1]) / s]
    return out


def official_errors(est_c2w: np.ndarray, gt_c2w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The official AUC evaluator's steps in float64: c2w -> w2c (matrix inverse), both aligned to
    their first camera, pairs i < j, relative pose W_i W_j^-1, quaternion and direction losses."""
    eps = 1e-15
    w_gt, w_est = np.linalg.inv(gt_c2w), np.linalg.inv(est_c2w)
    w_gt, w_est = w_gt @ np.linalg.inv(w_gt[0]), w_est @ np.linalg.inv(w_est[0])
    i, j = np.triu_indices(len(gt_c2w), k=1)
    rel_gt = w_gt[i] @ np.linalg.inv(w_gt[j])
    rel_est = w_est[i] @ np.linalg.inv(w_est[j])
    q_gt, q_est = official_quaternion(rel_gt[:, :3, :3]), official_quaternion(rel_est[:, :3, :3])
    loss_q = np.maximum(1 - (q_est * q_gt).sum(1) ** 2, eps)
    rot = np.degrees(np.arccos(1 - 2 * loss_q))
    t_gt, t_est = rel_gt[:, :3, 3], rel_est[:, :3, 3]
    t_est = t_est / (np.linalg.norm(t_est, axis=1, keepdims=True) + eps)
    t_gt = t_gt / (np.linalg.norm(t_gt, axis=1, keepdims=True) + eps)
    loss_t = np.maximum(1 - (t_est * t_gt).sum(1) ** 2, eps)
    trans = np.degrees(np.arccos(np.sqrt(1 - loss_t)))
    trans[~np.isfinite(trans)] = 1e6
    return rot, np.minimum(trans, np.abs(180 - trans))


def official_auc(rot: np.ndarray, trans: np.ndarray, threshold: int) -> float:
    worst = np.maximum(rot, trans)
    hist, _ = np.histogram(worst, bins=np.arange(threshold + 1))
    return float(np.mean(np.cumsum(hist.astype(float) / len(worst))) * 100)


def accuracy_curve_auc(rot: np.ndarray, trans: np.ndarray, threshold: int) -> float:
    """The same number seen as the area under the accuracy curve sampled at 1, 2, ..., T degrees."""
    worst = np.maximum(rot, trans)
    steps = [np.mean(worst < k) if k < threshold else np.mean(worst <= k) for k in range(1, threshold + 1)]
    return float(np.mean(steps) * 100)


def test_pairwise_errors_equal_the_official_definition() -> None:
    rng = np.random.default_rng(30)
    gt = trajectory(rng, 25)
    est = noisy_copy(rng, gt, scale=2.5)
    est[:, :3, :3] = est[:, :3, :3] @ quaternion_to_matrix(
        np.concatenate([rng.normal(size=(25, 3)) * 0.2, np.ones((25, 1))], 1))  # errors across many degrees
    rot, trans = tr.pairwise_angle_errors(est, gt)
    ref_rot, ref_trans = official_errors(est, gt)
    np.testing.assert_allclose(rot, ref_rot, rtol=0, atol=1e-6)
    np.testing.assert_allclose(trans, ref_trans, rtol=0, atol=1e-6)
    assert rot.max() > 10 and trans.max() > 1  # the errors span the thresholds


@pytest.mark.parametrize("seed", [31, 32, 33])
def test_auc_equals_the_official_definition(seed) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(10, 40))
    gt = trajectory(rng, n)
    est = noisy_copy(rng, gt, scale=float(rng.uniform(0.1, 5)), rot_noise=0.005)
    ref_rot, ref_trans = official_errors(est, gt)
    auc = tr.pose_auc(est, gt, chunk_rows=7)  # chunks of rows: the counts must not depend on them
    assert auc.pairs == n * (n - 1) // 2
    for t in tr.AUC_THRESHOLDS_DEG:
        assert auc.auc(t) == pytest.approx(official_auc(ref_rot, ref_trans, t), abs=1e-9)
        assert auc.auc(t) == pytest.approx(accuracy_curve_auc(ref_rot, ref_trans, t), abs=1e-9)
        assert auc.racc(t) == pytest.approx(np.mean(ref_rot < t) * 100, abs=1e-9)
        assert auc.tacc(t) == pytest.approx(np.mean(ref_trans < t) * 100, abs=1e-9)
    assert 0 < auc.auc(3) < auc.auc(30) < 100


def test_auc_micro_pools_pairs_and_survives_json() -> None:
    rng = np.random.default_rng(34)
    seqs = []
    for n in (12, 20):
        gt = trajectory(rng, n)
        seqs.append((noisy_copy(rng, gt), gt))
    parts = [tr.pose_auc(e, g) for e, g in seqs]
    pooled = tr.PoseAUC.from_json(parts[0].to_json()).merged(tr.PoseAUC.from_json(parts[1].to_json()))
    errs = [official_errors(e, g) for e, g in seqs]
    rot, trans = np.concatenate([r for r, _ in errs]), np.concatenate([t for _, t in errs])
    for t in tr.AUC_THRESHOLDS_DEG:
        assert pooled.auc(t) == pytest.approx(official_auc(rot, trans, t), abs=1e-9)
    assert pooled.pairs == 66 + 190
    # identical trajectories: every pair within every threshold's first degree
    perfect = tr.pose_auc(seqs[0][1], seqs[0][1])
    assert perfect.auc(30) == pytest.approx(100.0) and perfect.racc(3) == 100.0
