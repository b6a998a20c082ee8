"""The official benchmark's point-cloud metrics and the alignment before them.

Definitions (``benchmark/benchmark/evaluation/points.py`` of the official repository):

* **Accuracy**: mean distance from each predicted point to its nearest reference point;
* **Completeness**: mean distance from each reference point to its nearest predicted point;
* **Chamfer**: their mean;
* **Precision / Recall** at threshold ``T``: percent of predicted (reference) points whose nearest
  neighbour in the other cloud is closer than ``T`` (strictly); **F1**: their harmonic mean.

The official datasets evaluate at one threshold: 0.05 m for 7-Scenes and Neural RGB-D, 0.25 m for
ETH3D (``EVAL_THRESHOLDS`` here). Before the metrics, the prediction is aligned to the reference: a
Sim(3) Umeyama fit on pixel-wise corresponding points (both depth maps valid), then point-to-point
ICP (identity start, correspondence distance 0.1 m, at most 20 iterations, relative fitness and
RMSE tolerance 1e-6); 7-Scenes and Neural RGB-D first thin both clouds on a 4/512 m voxel grid and
score the thinned clouds, ETH3D scores the full clouds.

Nearest neighbours come from SciPy's ``cKDTree`` (exact Euclidean, float64; SciPy is already a
dependency through evo). The official code runs Open3D's ICP and voxel filter; Open3D is not a
dependency here (its PyPI wheel for CPython 3.11 is 105 MB and requires dash, flask, nbformat and
ipywidgets), so ``icp_point_to_point`` and ``voxel_downsample`` follow Open3D's documented rules on
``cKDTree``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.geometry import umeyama_sim3 as fit_sim3

# Dataset -> the official evaluation threshold (metres) and ICP settings.
EVAL_THRESHOLDS = {"7scenes": 0.05, "nrgbd": 0.05, "eth3d": 0.25}
ICP_MAX_DISTANCE = 0.1  # configs/seven_scenes.yaml, eth3d.yaml, neural_rgbd.yaml: icp_threshold
ICP_MAX_ITERATIONS = 20
ICP_TOLERANCE = 1e-6
VOXEL_SIZE = 4.0 / 512.0  # 7-Scenes and Neural RGB-D thin both clouds before ICP and scoring
VOXEL_DATASETS = ("7scenes", "nrgbd")


@dataclass(frozen=True)
class CloudMetrics:
    accuracy: float
    completeness: float
    chamfer: float
    precision: float  # percent, at ``threshold``
    recall: float
    f1: float
    threshold: float
    predicted_points: int
    reference_points: int

    def to_json(self) -> dict:
        return dict(self.__dict__)


def _xyz(points: np.ndarray, what: str) -> np.ndarray:
    p = np.asarray(points, dtype=np.float64)
    if p.ndim != 2 or p.shape[1] < 3 or p.shape[0] == 0:
        raise ValueError(f"{what}: expected points [N, 3] with N > 0, got shape {p.shape}")
    if not np.isfinite(p[:, :3]).all():
        raise ValueError(f"{what}: non-finite coordinates")
    return p[:, :3]


def nearest_distances(source: np.ndarray, target: np.ndarray) -> np.ndarray:
    """[N] Euclidean distance from each source point to its nearest target point (exact)."""
    from scipy.spatial import cKDTree

    return cKDTree(_xyz(target, "target")).query(_xyz(source, "source"), k=1)[0]


def cloud_metrics(predicted: np.ndarray, reference: np.ndarray, threshold: float) -> CloudMetrics:
    """The official metrics of two clouds already in one frame."""
    to_ref = nearest_distances(predicted, reference)  # [N]
    to_pred = nearest_distances(reference, predicted)  # [M]
    acc, comp = float(to_ref.mean()), float(to_pred.mean())
    prec = float((to_ref < threshold).mean() * 100.0)
    rec = float((to_pred < threshold).mean() * 100.0)
    f1 = 2.0 * prec * rec / (prec + rec) if prec + rec > 0 else 0.0
    return CloudMetrics(acc, comp, (acc + comp) / 2.0, prec, rec, f1, threshold, len(to_ref), len(to_pred))


def umeyama_sim3(source: np.ndarray, target: np.ndarray) -> np.ndarray:
    """4x4 similarity ``T`` minimising ``sum |target_i - T source_i|^2`` over corresponding points:
    the package's one Umeyama fit (``core.geometry.umeyama_sim3``, float64, reflection-safe) as a matrix."""
    x, y = _xyz(source, "source"), _xyz(target, "target")
    if x.shape != y.shape:
        raise ValueError(f"corresponding points needed: {x.shape} vs {y.shape}")
    scale, rot, trans = fit_sim3(x, y)
    return _matrix(scale * rot, trans)


def transform(points: np.ndarray, t: np.ndarray) -> np.ndarray:
    p = _xyz(points, "points")
    return p @ t[:3, :3].T + t[:3, 3]


def voxel_downsample(points: np.ndarray, voxel: float) -> np.ndarray:
    """The mean of the points in each occupied cube of side ``voxel``, Open3D's ``voxel_down_sample``
    grid: cubes anchored half a voxel below the cloud's minimum corner. Rows in cube order (Open3D's
    order is a hash map's; the metrics do not depend on it)."""
    p = _xyz(points, "points")
    keys = np.floor((p - (p.min(0) - voxel / 2)) / voxel).astype(np.int64)  # [N, 3]
    _, inverse, counts = np.unique(keys, axis=0, return_inverse=True, return_counts=True)
    sums = np.zeros((len(counts), 3))
    np.add.at(sums, inverse.reshape(-1), p)
    return sums / counts[:, None]


def icp_point_to_point(source: np.ndarray, target: np.ndarray, max_distance: float = ICP_MAX_DISTANCE,
                       max_iterations: int = ICP_MAX_ITERATIONS, tolerance: float = ICP_TOLERANCE) -> np.ndarray:
    """Rigid 4x4 moving ``source`` onto ``target``: point-to-point ICP from the identity.

    Each iteration pairs every source point with its nearest target point closer than
    ``max_distance``, fits the rigid motion of the pairs (Kabsch) and composes it. It stops after
    ``max_iterations`` or when both the fitness (share of source points paired) and the inlier RMSE
    change by less than ``tolerance`` from the previous iteration, as Open3D's ``registration_icp``
    does (its "relative" criteria compare plain differences)."""
    from scipy.spatial import cKDTree

    src, tree = _xyz(source, "source"), cKDTree(_xyz(target, "target"))
    tgt = tree.data

    def pairs(points: np.ndarray) -> tuple[np.ndarray, np.ndarray, float, float]:
        dist, idx = tree.query(points, k=1, distance_upper_bound=max_distance)
        inlier = np.isfinite(dist)
        rmse = float(np.sqrt((dist[inlier] ** 2).mean())) if inlier.any() else 0.0
        return inlier, idx, float(inlier.mean()), rmse

    total, moved = np.eye(4), src
    inlier, idx, fitness, rmse = pairs(moved)
    for _ in range(max_iterations):
        if inlier.sum() < 3:
            break
        step = _kabsch(moved[inlier], tgt[idx[inlier]])
        total = step @ total
        moved = moved @ step[:3, :3].T + step[:3, 3]
        before = (fitness, rmse)
        inlier, idx, fitness, rmse = pairs(moved)
        if abs(before[0] - fitness) < tolerance and abs(before[1] - rmse) < tolerance:
            break
    return total


def _kabsch(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The rigid fit of one ICP step: Umeyama without scale."""
    _, rot, trans = fit_sim3(x, y, with_scale=False)
    return _matrix(rot, trans)


def _matrix(linear: np.ndarray, trans: np.ndarray) -> np.ndarray:
    out = np.eye(4)
    out[:3, :3] = linear
    out[:3, 3] = trans
    return out


def evaluate_reconstruction(dataset: str, pred_corresponding: np.ndarray, ref_corresponding: np.ndarray,
                            predicted: np.ndarray, reference: np.ndarray) -> tuple[CloudMetrics, np.ndarray]:
    """The official per-scene pipeline for ``dataset`` (7scenes, nrgbd, eth3d): Umeyama on the
    pixel-wise pairs, (voxel thinning,) ICP, metrics. ``predicted`` are the predicted points of the
    pixels valid in both depth maps, ``reference`` every valid reference point. Returns the metrics
    and the total 4x4 alignment applied to the prediction."""
    if dataset not in EVAL_THRESHOLDS:
        raise ValueError(f"no official point-cloud protocol for {dataset!r} (one of {', '.join(EVAL_THRESHOLDS)})")
    sim3 = umeyama_sim3(pred_corresponding, ref_corresponding)
    moved, ref = transform(predicted, sim3), _xyz(reference, "reference")
    if dataset in VOXEL_DATASETS:
        moved, ref = voxel_downsample(moved, VOXEL_SIZE), voxel_downsample(ref, VOXEL_SIZE)
    rigid = icp_point_to_point(moved, ref)
    return cloud_metrics(transform(moved, rigid), ref, EVAL_THRESHOLDS[dataset]), rigid @ sim3


__all__ = ["CloudMetrics", "EVAL_THRESHOLDS", "cloud_metrics", "evaluate_reconstruction", "icp_point_to_point",
           "nearest_distances", "transform", "umeyama_sim3", "voxel_downsample"]
