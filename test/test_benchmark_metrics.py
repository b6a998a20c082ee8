"""The benchmark's scores against independent references: trajectories of the Oxford Spires, VBR and
DROID-W layouts scored as evo scores them when called directly; the point-cloud metrics (and the
Umeyama + ICP alignment before them) against float64 brute-force nearest neighbours on synthetic
clouds with a known transform; the depth metrics against the official formulas written out."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from benchmark_layouts import write_droid_w, write_oxford, write_vbr

from lingbot_map_ros.core.geometry import quaternion_to_matrix, se3
from lingbot_map_ros.tools import depth_metrics as dm
from lingbot_map_ros.tools import point_metrics as pm
from lingbot_map_ros.tools.benchmark import score_sequence
from lingbot_map_ros.tools.datasets import READERS


# ---------------------------------------------------------------------------------- trajectories
def _estimate(gt_c2w: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The ground truth in another frame and scale, with noise; a pose where the ground truth is NaN
    too (the model poses every frame)."""
    filled = np.where(np.isnan(gt_c2w), np.eye(4), gt_c2w)
    world = se3(quaternion_to_matrix([0.2, -0.1, 0.3, 0.9]), [3.0, -1.0, 0.5])
    est = world @ filled
    est[:, :3, 3] = est[:, :3, 3] * 0.37 + rng.normal(0, 0.01, (len(est), 3))
    return est


def _evo_direct(est: np.ndarray, gt: np.ndarray) -> tuple[float, float, float]:
    from evo.core import metrics, sync  # noqa: F401
    from evo.core.trajectory import PoseTrajectory3D

    t = np.arange(len(gt), dtype=np.float64)
    ref = PoseTrajectory3D(poses_se3=list(gt), timestamps=t)
    moved = PoseTrajectory3D(poses_se3=list(est), timestamps=t)
    moved.align(ref, correct_scale=True)
    ape = metrics.APE(metrics.PoseRelation.translation_part)
    ape.process_data((ref, moved))
    out = [ape.get_statistic(metrics.StatisticsType.rmse)]
    for relation in (metrics.PoseRelation.translation_part, metrics.PoseRelation.rotation_angle_deg):
        rpe = metrics.RPE(relation, delta=1, delta_unit=metrics.Unit.frames, all_pairs=True)
        rpe.process_data((ref, moved))
        out.append(rpe.get_statistic(metrics.StatisticsType.rmse))
    return tuple(out)


@pytest.mark.parametrize("dataset, write, name, stride", [
    ("oxford", lambda r: write_oxford(r, n=40), "keble-college-02", 12),
    ("vbr", lambda r: write_vbr(r, n=9, gt_frames=(0, 1, 2, 3, 5, 6, 8)), "campus_train0", 1),
    ("droid_w", lambda r: write_droid_w(r, n=30, seed=3), "downtown1", 1),
])
def test_new_datasets_are_scored_as_evo_scores_them(tmp_path, dataset, write, name, stride):
    write(tmp_path / "data")
    reader = READERS[dataset]
    seq = reader.load(tmp_path / "data", name, stride)
    est = _estimate(seq.gt_c2w, np.random.default_rng(1))
    results = {i: SimpleNamespace(c2w=est[i], image_hw=(14, 518)) for i in range(len(seq.images))}
    config = {"stride": stride, "image_size": "official"}
    m = score_sequence(seq, results, tmp_path / "out", config, reader.protocol, 1.0)
    valid = np.isfinite(seq.gt_c2w.reshape(len(seq.gt_c2w), -1)).all(axis=1)
    assert m["evaluated"] == int(valid.sum()) >= 3 and m["frames"] == len(seq.images)
    if dataset != "oxford":
        assert not valid.all()  # frames without ground truth stay in the stream, out of the scores
    ate, rpe_t, rpe_r = _evo_direct(est[valid], seq.gt_c2w[valid])
    assert m["ate"] == pytest.approx(ate, abs=1e-9)
    assert m["rpe_trans"] == pytest.approx(rpe_t, abs=1e-9)
    assert m["rpe_rot"] == pytest.approx(rpe_r, abs=1e-9)


# ---------------------------------------------------------------------------------- point clouds
def _brute_nearest(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """float64 distance from each row of a to its nearest row of b, by every pair."""
    d2 = ((a[:, None, :] - b[None, :, :]) ** 2).sum(-1)
    return np.sqrt(d2.min(1))


def _surface(n: int, rng: np.random.Generator) -> np.ndarray:
    """Points on a wavy patch of ~2 m, so ICP has structure to lock on."""
    uv = rng.uniform(-1, 1, (n, 2))
    return np.column_stack([uv, 0.2 * np.sin(3 * uv[:, 0]) * np.cos(2 * uv[:, 1])])


@pytest.mark.parametrize("threshold", [0.01, 0.05, 0.25])
def test_cloud_metrics_equal_brute_force_float64(threshold):
    rng = np.random.default_rng(0)
    ref = _surface(900, rng)
    pred = ref[:700] + rng.normal(0, 0.02, (700, 3))
    pred = np.vstack([pred, rng.uniform(-1.5, 1.5, (50, 3))])  # outliers
    m = pm.cloud_metrics(pred, ref, threshold)
    to_ref, to_pred = _brute_nearest(pred, ref), _brute_nearest(ref, pred)
    assert m.accuracy == pytest.approx(to_ref.mean(), abs=1e-12)
    assert m.completeness == pytest.approx(to_pred.mean(), abs=1e-12)
    assert m.chamfer == pytest.approx((to_ref.mean() + to_pred.mean()) / 2, abs=1e-12)
    p, r = (to_ref < threshold).mean() * 100, (to_pred < threshold).mean() * 100
    assert m.precision == pytest.approx(p, abs=1e-12) and m.recall == pytest.approx(r, abs=1e-12)
    assert m.f1 == pytest.approx(2 * p * r / (p + r), abs=1e-12)
    assert (m.predicted_points, m.reference_points) == (750, 900)


def test_umeyama_recovers_a_known_similarity():
    rng = np.random.default_rng(1)
    src = rng.normal(size=(200, 3))
    truth = se3(quaternion_to_matrix([0.3, -0.2, 0.1, 0.93]), [1.0, 2.0, -0.5])
    truth[:3, :3] *= 2.5
    fit = pm.umeyama_sim3(src, pm.transform(src, truth))
    np.testing.assert_allclose(fit, truth, rtol=0, atol=1e-10)


def test_icp_recovers_a_small_known_rigid_motion():
    rng = np.random.default_rng(2)
    ref = _surface(3000, rng)
    motion = se3(quaternion_to_matrix([0.01, -0.015, 0.02, 1.0]), [0.03, -0.02, 0.015])  # within 0.1 m
    moved = pm.transform(ref, np.linalg.inv(motion))
    fit = pm.icp_point_to_point(moved, ref)
    np.testing.assert_allclose(pm.transform(moved, fit), ref, rtol=0, atol=1e-6)


@pytest.mark.parametrize("dataset", ["7scenes", "eth3d"])
def test_the_official_pipeline_aligns_then_scores(dataset):
    """A prediction in another frame and scale (a Sim(3) off the reference) with depth noise: after
    Umeyama on the pixel pairs and ICP the metrics equal brute-force ones of the truly aligned cloud."""
    rng = np.random.default_rng(3)
    ref = _surface(2500, rng)
    noisy = ref + rng.normal(0, 0.003, ref.shape)
    off = se3(quaternion_to_matrix([0.4, 0.1, -0.3, 0.85]), [5.0, -2.0, 1.0])
    off[:3, :3] *= 0.4
    pred = pm.transform(noisy, off)
    metrics, total = pm.evaluate_reconstruction(dataset, pred, ref, pred, ref)
    aligned = pm.transform(pred, total)
    np.testing.assert_allclose(aligned, noisy, rtol=0, atol=2e-3)  # the alignment undid the offset
    thr = pm.EVAL_THRESHOLDS[dataset]
    if dataset == "7scenes":  # both clouds thinned on the 4/512 m grid after Umeyama, before ICP and scoring
        sim3 = pm.umeyama_sim3(pred, ref)
        a = pm.transform(pm.voxel_downsample(pm.transform(pred, sim3), pm.VOXEL_SIZE), total @ np.linalg.inv(sim3))
        b = pm.voxel_downsample(ref, pm.VOXEL_SIZE)
    else:  # ETH3D scores the full clouds
        a, b = aligned, ref
    to_ref, to_pred = _brute_nearest(a, b), _brute_nearest(b, a)
    assert metrics.threshold == thr
    assert metrics.accuracy == pytest.approx(to_ref.mean(), abs=1e-9)
    assert metrics.completeness == pytest.approx(to_pred.mean(), abs=1e-9)
    assert metrics.precision == pytest.approx((to_ref < thr).mean() * 100, abs=1e-9)
    assert metrics.recall == pytest.approx((to_pred < thr).mean() * 100, abs=1e-9)


def test_voxel_downsample_is_the_mean_per_cube():
    # Open3D's grid starts half a voxel below the minimum: [-0.5, 0.5), [0.5, 1.5), ... along x here
    pts = np.array([[0.0, 0, 0], [0.4, 0.2, 0], [0.6, 0, 0], [1.4, 0, 0], [3.0, 3.0, 3.0]])
    out = pm.voxel_downsample(pts, 1.0)
    expect = {(0.2, 0.1, 0.0), (1.0, 0.0, 0.0), (3.0, 3.0, 3.0)}
    assert {tuple(np.round(p, 12)) for p in out} == expect


def test_bad_clouds_are_refused_in_one_line():
    with pytest.raises(ValueError, match=r"source: expected points \[N, 3\]"):
        pm.cloud_metrics(np.zeros((0, 3)), np.zeros((4, 3)), 0.05)
    with pytest.raises(ValueError, match="non-finite"):
        pm.cloud_metrics(np.full((3, 3), np.nan), np.zeros((4, 3)), 0.05)
    with pytest.raises(ValueError, match="no official point-cloud protocol for 'tum'"):
        pm.evaluate_reconstruction("tum", np.zeros((3, 3)), np.zeros((3, 3)), np.zeros((3, 3)), np.zeros((3, 3)))


# ------------------------------------------------------------------------------------------ depth
def test_depth_metrics_follow_the_official_formulas():
    rng = np.random.default_rng(4)
    frames, p_all, g_all = [], [], []
    for k in range(3):
        ref = rng.uniform(0.5, 12.0, (20, 30))
        ref[0, :5] = 0.0  # invalid (not > 0)
        ref[1, :3] = 11.0  # outside the 0..10 m clip of Neural RGB-D
        pred = (ref * (1 + rng.normal(0, 0.1, ref.shape))) / (2.0 + k)  # another scale per frame
        pred[2, 0] = np.nan
        frames.append((pred, ref))
        valid = (ref > 0) & (ref < 10) & np.isfinite(pred) & (pred > 0)
        s = np.median(ref[valid]) / np.median(pred[valid])
        p_all.append(s * pred[valid])
        g_all.append(ref[valid])
    frames.append((np.ones((5, 5)), np.ones((5, 5))))  # 25 valid pixels < 100: skipped
    out = dm.depth_metrics(frames, dm.GT_CLIP["nrgbd"])
    p, g = np.concatenate(p_all), np.concatenate(g_all)
    r = np.maximum(p / g, g / p)
    assert out["frames"] == 3 and out["pixels"] == p.size
    assert out["abs_rel"] == pytest.approx(np.mean(np.abs(p - g) / g), rel=1e-12)
    assert out["sq_rel"] == pytest.approx(np.mean((p - g) ** 2 / g), rel=1e-12)
    assert out["rmse"] == pytest.approx(np.sqrt(np.mean((p - g) ** 2)), rel=1e-12)
    assert out["log_rmse"] == pytest.approx(np.sqrt(np.mean(np.log(p / g) ** 2)), rel=1e-12)
    for key, t in (("delta_1_25", 1.25), ("delta_1_25_2", 1.5625), ("delta_1_25_3", 1.953125)):
        assert out[key] == pytest.approx((r < t).mean() * 100, rel=1e-12)
    assert dm.depth_metrics([frames[-1]]) == {}


def test_icp_and_voxel_grid_equal_open3d_where_it_is_installed():
    """Open3D is not a dependency; where it is installed, the official code's calls give the same."""
    o3d = pytest.importorskip("open3d")
    rng = np.random.default_rng(6)
    ref = _surface(3000, rng)
    src = np.vstack([_surface(2500, rng) + rng.normal(0, 0.02, (2500, 3)), rng.uniform(-2, 2, (300, 3))])
    src = pm.transform(src, se3(quaternion_to_matrix([0.05, -0.08, 0.06, 1.0]), [0.06, -0.05, 0.04]))
    clouds = []
    for pts in (src, ref):
        cloud = o3d.geometry.PointCloud()
        cloud.points = o3d.utility.Vector3dVector(pts)
        clouds.append(cloud)
    reg = o3d.pipelines.registration
    theirs = reg.registration_icp(clouds[0], clouds[1], 0.1, np.eye(4), reg.TransformationEstimationPointToPoint(),
                                  reg.ICPConvergenceCriteria(relative_fitness=1e-6, relative_rmse=1e-6,
                                                             max_iteration=20))
    np.testing.assert_allclose(pm.icp_point_to_point(src, ref), np.asarray(theirs.transformation), rtol=0, atol=1e-12)
    ours = pm.voxel_downsample(src, pm.VOXEL_SIZE)
    down = np.asarray(clouds[0].voxel_down_sample(pm.VOXEL_SIZE).points)
    assert {tuple(p) for p in np.round(ours, 9)} == {tuple(p) for p in np.round(down, 9)}


# ---------------------------------------------------------------------------- dataset aggregates
def _auc(errors: list[float], t: int) -> float:
    hist, _ = np.histogram(np.array(errors), bins=np.arange(t + 1))
    return float(np.mean(np.cumsum(hist) / len(errors)) * 100)


def test_summary_aggregates_both_auc_conventions_and_marks_extra_scenes():
    from lingbot_map_ros.core.trajectory import AUC_THRESHOLDS_DEG, PoseAUC
    from lingbot_map_ros.tools.benchmark_report import DatasetSummary, dataset_tables

    def counts(rot, trans):
        auc = PoseAUC()
        auc.add_errors(np.array(rot), np.array(trans))
        return auc.to_json()

    barn = {"sequence": "Barn", "frames": 3, "evaluated": 3, "ate": 0.1, "rpe_trans": 0.2, "rpe_rot": 1.0,
            "auc": counts([0.5, 2.5, 10.0], [0.1, 0.2, 40.0]), "auc_inverse_convention": counts([1.5], [0.3])}
    court = {"sequence": "Courthouse", "frames": 2, "evaluated": 2, "ate": 0.3, "rpe_trans": 0.4, "rpe_rot": 2.0,
             "auc": counts([1.5], [0.3]), "auc_inverse_convention": counts([7.2, 0.2], [0.1, 3.3])}
    s = DatasetSummary("tnt", READERS["tnt"].protocol, done=[barn, court])
    j = s.to_json()
    worst = {"Barn": ([0.5, 2.5, 40.0], [1.5]), "Courthouse": ([1.5], [7.2, 3.3])}  # max(rot, trans) per pair
    for k, key in enumerate(("auc", "auc_inverse_convention")):
        per = [worst["Barn"][k], worst["Courthouse"][k]]
        macro = [np.mean([_auc(e, t) for e in per]) for t in AUC_THRESHOLDS_DEG]
        micro = [_auc(per[0] + per[1], t) for t in AUC_THRESHOLDS_DEG]
        prefix = "auc" if key == "auc" else "auc_inverse_convention"
        np.testing.assert_allclose(j[f"{prefix}_macro"], macro, rtol=0, atol=1e-9)
        np.testing.assert_allclose(j[f"{prefix}_micro"], micro, rtol=0, atol=1e-9)
    assert j["outside_official_scenes"] == ["Courthouse"] and j["ate"] == pytest.approx(0.2)
    table = "\n".join(dataset_tables(s))
    assert "| Courthouse * |" in table and "| Barn |" in table and "1 of them outside the official scenes" in table
