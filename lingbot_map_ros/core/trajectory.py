"""Trajectory files and trajectory metrics: TUM files, stamp association, ATE/RPE through evo, pose AUC.

Why apart from ``geometry.py``: geometry is the pose maths a session needs for every frame; this is
what evaluation needs once per trajectory. The metrics the field computes with evo (ATE, RPE and the
Umeyama alignment) are computed *by* evo (PyPI ``evo``, pinned in ``scripts/setup_env.sh``), so our
numbers are the ones any reviewer gets from ``evo_ape``/``evo_rpe``; evo is imported only inside
those functions, so writing a TUM file (the node's ``~/save_trajectory``) never needs it. The pose
AUC of the official LingBot-Map benchmark has no evo counterpart and is written here, in float64.

Conventions as in ``geometry.py``: poses are camera(optical)-to-world ``[N, 4, 4]``; quaternions are
scalar-last ``(x, y, z, w)``; stamps are seconds.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Iterator, Optional, Sequence, Union

import numpy as np

from .files import atomic_open
from .geometry import quaternion_to_matrix, quaternion_xyzw_from_matrix, se3, umeyama_sim3

ArrayLike = Union[np.ndarray, Sequence[float], Sequence[Sequence[float]]]

EVO_MISSING = "evo is not installed: run scripts/setup_env.sh again, or pip install evo==1.38.1"
# The official benchmark's pose AUC thresholds (degrees) and its clamp of the squared-cosine losses.
AUC_THRESHOLDS_DEG: tuple[int, ...] = (3, 5, 15, 30)
AUC_LOSS_EPS = 1e-15
AUC_NON_FINITE_DEG = 1e6  # a translation angle that cannot be computed counts as a miss


def _f64(x: ArrayLike) -> np.ndarray:
    return np.array(x, dtype=np.float64)


# ---------------------------------------------------------------------------------------------
# TUM files
# ---------------------------------------------------------------------------------------------
def pose_matrices(positions: ArrayLike, quats_xyzw: ArrayLike) -> np.ndarray:
    """Positions [N, 3] and quaternions [N, 4] (any norm) -> c2w [N, 4, 4]."""
    return se3(quaternion_to_matrix(quats_xyzw), positions)


def write_tum(path: Union[str, os.PathLike], stamps_sec: ArrayLike, c2w_list: ArrayLike) -> None:
    """Write ``timestamp tx ty tz qx qy qz qw`` lines (TUM RGB-D format) for c2w poses [N, 4|3, 4].

    Stamps get 9 decimals (nanoseconds; float64 resolves ~0.2 us at current epoch times); pose values
    17 significant digits so reading back reproduces them exactly. Quaternions are unit with w >= 0.
    Written atomically (``files.atomic_open``): never half a trajectory under the name.
    """
    stamps = _f64(stamps_sec).reshape(-1)
    poses = _f64(c2w_list)
    if poses.ndim != 3 or poses.shape[1:] not in ((4, 4), (3, 4)) or poses.shape[0] != stamps.shape[0]:
        raise ValueError(f"need N stamps and N poses [N, 4, 4]; got {stamps.shape[0]} stamps, poses {poses.shape}")
    quats = quaternion_xyzw_from_matrix(poses[:, :3, :3])
    with atomic_open(path, "w", encoding="ascii") as f:
        f.write("# timestamp tx ty tz qx qy qz qw\n")
        for stamp, pose, q in zip(stamps, poses, quats):
            vals = " ".join(f"{v:.17g}" for v in (*pose[:3, 3], *q))
            f.write(f"{stamp:.9f} {vals}\n")


def data_lines(path: Union[str, os.PathLike]) -> Iterator[tuple[int, list[str]]]:
    """``(line number, values)`` of a text table's data lines: '#' lines and blanks skipped; values
    split on spaces, tabs or commas (the TUM trajectory and image-list formats)."""
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            text = line.strip()
            if text and not text.startswith("#"):
                yield lineno, text.replace(",", " ").split()


def read_tum(path: Union[str, os.PathLike]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """TUM file -> (stamps [N], positions [N, 3], quats_xyzw [N, 4]); '#' lines and blanks skipped.

    Accepts spaces, tabs or commas between values; any other line shape raises with its line number.
    """
    rows: list[list[float]] = []
    for lineno, parts in data_lines(path):
        if len(parts) != 8:
            raise ValueError(
                f"{path}:{lineno}: expected 8 values (timestamp tx ty tz qx qy qz qw), got {len(parts)}"
            )
        try:
            rows.append([float(p) for p in parts])
        except ValueError as exc:
            raise ValueError(f"{path}:{lineno}: {exc}") from None
    data = np.array(rows, dtype=np.float64).reshape(-1, 8)
    return data[:, 0].copy(), data[:, 1:4].copy(), data[:, 4:8].copy()


# ---------------------------------------------------------------------------------------------
# association
# ---------------------------------------------------------------------------------------------
def associate(stamps_a: ArrayLike, stamps_b: ArrayLike, max_dt: float = 0.02) -> np.ndarray:
    """Match timestamps of two trajectories one to one, closest first, within ``max_dt`` seconds.

    Returns index pairs [M, 2] (``i`` into a, ``j`` into b) sorted by ``i`` - the rule of the TUM
    benchmark's associate.py: every pair within ``max_dt`` is a candidate (not only the nearest
    neighbours: when both neighbours of a stamp are taken, a farther free one within reach still
    counts), taken greedily by time difference, ties by ``i`` then ``j``.
    """
    a, b = _f64(stamps_a).reshape(-1), _f64(stamps_b).reshape(-1)
    if a.size == 0 or b.size == 0:
        return np.zeros((0, 2), dtype=np.int64)
    order_b = np.argsort(b, kind="stable")
    bs = b[order_b]
    slack = 4 * np.spacing(np.abs(a) + max_dt)  # a window a little wide; the exact test is below
    lo = np.searchsorted(bs, a - max_dt - slack, side="left")  # [A] the candidates of a[i]: bs[lo[i]:hi[i]]
    hi = np.searchsorted(bs, a + max_dt + slack, side="right")
    counts = np.maximum(hi - lo, 0)
    ci = np.repeat(np.arange(a.size), counts)
    cj = order_b[np.repeat(lo, counts) + (np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts))]
    dt = np.abs(a[ci] - b[cj])
    keep = dt <= max_dt
    ci, cj, dt = ci[keep], cj[keep], dt[keep]
    used_a: set[int] = set()
    used_b: set[int] = set()
    pairs = []
    for k in np.lexsort((cj, ci, dt)):
        i, j = int(ci[k]), int(cj[k])
        if i not in used_a and j not in used_b:
            used_a.add(i)
            used_b.add(j)
            pairs.append((i, j))
    pairs.sort()
    return np.array(pairs, dtype=np.int64).reshape(-1, 2)


def nearest_within(query: ArrayLike, reference: ArrayLike, max_dt: float) -> np.ndarray:
    """For each query stamp, the index of the nearest reference stamp within ``max_dt`` s, else -1.

    The official LingBot-Map benchmark's rule for a frame's ground truth (each RGB frame independently
    takes its nearest ground-truth pose within 0.02 s; two frames may share one): unlike ``associate``
    nothing is one to one. Of two equally near stamps the earlier wins, of equal stamps the first
    listed (``argmin`` over a time-ordered ground truth, as the official reader does).
    """
    q, r = _f64(query).reshape(-1), _f64(reference).reshape(-1)
    out = np.full(q.shape, -1, dtype=np.int64)
    if q.size == 0 or r.size == 0:
        return out
    order = np.argsort(r, kind="stable")
    rs = r[order]  # sorted reference stamps
    right = np.clip(np.searchsorted(rs, q), 0, rs.size - 1)  # first stamp >= q (or the last one)
    left = np.clip(right - 1, 0, rs.size - 1)  # the stamp before it
    d_left, d_right = np.abs(q - rs[left]), np.abs(q - rs[right])
    best = np.where(d_right < d_left, right, left)
    best = np.searchsorted(rs, rs[best], side="left")  # the first of equal stamps: first listed (stable)
    dist = np.minimum(d_left, d_right)
    hit = dist <= max_dt
    out[hit] = order[best[hit]]
    return out


# ---------------------------------------------------------------------------------------------
# ATE / RPE through evo
# ---------------------------------------------------------------------------------------------
def orthonormalize(rot: ArrayLike) -> np.ndarray:
    """Nearest rotation(s) [..., 3, 3] to ``rot`` (SVD, det +1).

    Ground truths such as 7-Scenes' KinectFusion poses are a little off SO(3), and evo's relative
    poses invert rotations by transposing: the official benchmark projects every rotation onto SO(3)
    before evo, and so does this module.
    """
    u, _, vt = np.linalg.svd(_f64(rot))
    fix = np.ones(u.shape[:-1])
    fix[..., -1] = np.sign(np.linalg.det(u @ vt))
    return (u * fix[..., None, :]) @ vt


def evo_trajectory(c2w: ArrayLike, stamps: Optional[ArrayLike] = None):
    """c2w [N, 4, 4] -> ``evo.core.trajectory.PoseTrajectory3D`` (rotations projected onto SO(3))."""
    try:
        from evo.core.trajectory import PoseTrajectory3D
    except ImportError:
        raise RuntimeError(EVO_MISSING) from None
    poses = _f64(c2w)
    if poses.ndim != 3 or poses.shape[1:] not in ((4, 4), (3, 4)):
        raise ValueError(f"need poses [N, 4, 4], got shape {poses.shape}")
    poses = se3(orthonormalize(poses[:, :3, :3]), poses[:, :3, 3])
    t = np.arange(poses.shape[0], dtype=np.float64) if stamps is None else _f64(stamps).reshape(-1)
    return PoseTrajectory3D(poses_se3=list(poses), timestamps=t)


@dataclass(frozen=True)
class TrajectoryMetrics:
    """ATE and RPE of one associated trajectory pair, as evo computes them."""

    pairs: int  # associated poses
    align: str  # sim3 | se3 | none
    scale: float  # alignment scale est -> gt (1 unless sim3)
    rotation: np.ndarray  # [3, 3] alignment rotation
    translation: np.ndarray  # [3] alignment translation
    ate_rmse: float
    ate_mean: float
    ate_median: float
    ate_max: float
    delta: int  # RPE frame offset
    rpe_trans_rmse: float
    rpe_trans_mean: float
    rpe_rot_rmse_deg: float
    rpe_rot_mean_deg: float
    ate_errors: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0))  # [N] per pose
    aligned_positions: np.ndarray = field(repr=False, default_factory=lambda: np.zeros((0, 3)))  # [N, 3]
    alignment_note: str = ""  # one line when the alignment is not unique (a straight-line trajectory)


class DegenerateTrajectory(ValueError):
    """No alignment can be fitted (a trajectory that does not move); ``str(exc)`` is the one-line reason."""


# A trajectory is "still" when its positions spread less than this (metres, or the estimate's units)
# around their mean: nothing to align. Far below any camera's motion, far above float rounding.
STILL_SPREAD = 1e-9


def line_alignment(est_xyz: np.ndarray, gt_xyz: np.ndarray, with_scale: bool) -> tuple[np.ndarray, np.ndarray,
                                                                                     float, str]:
    """Umeyama's least-squares alignment ``est -> gt`` where evo refuses it: positions [N, 3] on a line.

    Why it is still well-posed: with collinear points the rotation about the line is free, but
    Umeyama's closed form (rotation ``U S V^T``, scale ``tr(D S) / var(est)``) still attains the least-
    squares minimum (von Neumann's trace inequality holds at any rank), so the ATE RMSE is the
    unique minimum, and the RPE, which sees the alignment only through its scale (unique too), is
    unchanged. Only the per-pose errors (mean, median, max, the plot) depend on the free rotation,
    and the returned note says so. A trajectory that does not move at all has no alignment:
    ``DegenerateTrajectory`` names it. Returns ``(rotation [3, 3], translation [3], scale, note)``.
    """
    x, y = _f64(est_xyz), _f64(gt_xyz)  # [N, 3]
    spread = {}
    for name, pts in (("ground truth", y), ("estimate", x)):
        centred = pts - pts.mean(axis=0)
        sv = np.linalg.svd(centred, compute_uv=False) / np.sqrt(len(pts))  # RMS extent along each axis
        if sv[0] <= STILL_SPREAD:
            raise DegenerateTrajectory(
                f"the {name} does not move (all {len(pts)} positions within {sv[0]:.2g} of their mean): "
                "no alignment can be fitted; ATE and RPE need a moving camera")
        spread[name] = sv
    scale, rot, trans = umeyama_sim3(x, y, with_scale=with_scale)  # the closed form attains the minimum at any rank
    lines = [n for n, sv in spread.items() if sv[1] <= 1e-6 * sv[0]]
    what = f"the {' and the '.join(lines)} lie{'s' if len(lines) == 1 else ''} on a straight line" if lines else \
        "the estimate and the ground truth move together along fewer than two axes"
    note = (f"{what}: the rotation about it is not determined; "
            "aligned with one least-squares solution (ATE RMSE and RPE are the same for all of them, the per-pose "
            "errors are not)")
    return rot, trans, scale, note


def trajectory_metrics(est_c2w: ArrayLike, gt_c2w: ArrayLike, align: str = "sim3", delta: int = 1,
                       stamps: Optional[ArrayLike] = None) -> TrajectoryMetrics:
    """ATE and RPE of associated poses ``est_c2w[i] <-> gt_c2w[i]`` [N, 4, 4] through evo's API.

    ``align``: ``sim3`` (Umeyama with scale: the model's translation has no metric scale), ``se3`` or
    ``none``; the alignment is fitted once on the positions and used for both metrics, as
    ``evo_ape -as`` and ``evo_rpe -as`` do. ATE: evo's APE of the translation part. RPE: evo's RPE
    over every pair ``(i, i + delta)`` (``--all_pairs``, delta in frames), translation part and
    rotation angle in degrees; RMSE and mean of both.
    """
    try:
        from evo.core import metrics
    except ImportError:
        raise RuntimeError(EVO_MISSING) from None
    if align not in ("sim3", "se3", "none"):
        raise ValueError(f"align must be 'sim3', 'se3' or 'none', got {align!r}")
    est, gt = _f64(est_c2w), _f64(gt_c2w)
    if est.shape[0] != gt.shape[0]:
        raise ValueError(f"trajectories differ in length: {est.shape[0]} vs {gt.shape[0]} (associate first)")
    need = 3 if align != "none" else 2
    if est.shape[0] < max(need, delta + 1):
        raise ValueError(f"{est.shape[0]} associated poses; need at least {max(need, delta + 1)}")
    if delta < 1:
        raise ValueError(f"delta must be >= 1 (got {delta})")
    ref, moved = evo_trajectory(gt, stamps), evo_trajectory(est, stamps)
    rot, trans, scale, note = np.eye(3), np.zeros(3), 1.0, ""
    if align != "none":
        from evo.core.geometry import GeometryException

        try:
            rot, trans, scale = moved.align(ref, correct_scale=align == "sim3")
        except GeometryException:  # "Degenerate covariance rank": a straight line, or no motion at all
            rot, trans, scale, note = line_alignment(moved.positions_xyz, ref.positions_xyz, align == "sim3")
            if align == "sim3":
                moved.scale(scale)
            moved.transform(se3(rot, trans))  # as evo's align applies its own result
    ape = metrics.APE(metrics.PoseRelation.translation_part)
    ape.process_data((ref, moved))
    rpe = {}
    for name, relation in (("trans", metrics.PoseRelation.translation_part),
                           ("rot", metrics.PoseRelation.rotation_angle_deg)):
        r = metrics.RPE(relation, delta=delta, delta_unit=metrics.Unit.frames, all_pairs=True)
        r.process_data((ref, moved))
        rpe[name] = r.get_all_statistics()
    stats = ape.get_all_statistics()
    return TrajectoryMetrics(
        pairs=int(est.shape[0]), align=align, scale=float(scale), rotation=np.asarray(rot, np.float64),
        translation=np.asarray(trans, np.float64).reshape(3), ate_rmse=float(stats["rmse"]),
        ate_mean=float(stats["mean"]), ate_median=float(stats["median"]), ate_max=float(stats["max"]), delta=delta,
        rpe_trans_rmse=float(rpe["trans"]["rmse"]), rpe_trans_mean=float(rpe["trans"]["mean"]),
        rpe_rot_rmse_deg=float(rpe["rot"]["rmse"]), rpe_rot_mean_deg=float(rpe["rot"]["mean"]),
        ate_errors=np.asarray(ape.error, np.float64), aligned_positions=np.asarray(moved.positions_xyz, np.float64),
        alignment_note=note,
    )


# ---------------------------------------------------------------------------------------------
# pose AUC (the official benchmark's; evo has none)
# ---------------------------------------------------------------------------------------------
def pairwise_angle_errors(est_c2w: ArrayLike, gt_c2w: ArrayLike, rows: Optional[slice] = None
                          ) -> tuple[np.ndarray, np.ndarray]:
    """Rotation and translation-direction errors (degrees) of every frame pair ``i < j``.

    The official definition: the relative pose of a pair is ``W_i W_j^-1`` of the world-to-camera
    matrices (``= C_i^-1 C_j`` of the camera-to-world ones, so the official "align to the first
    camera" step cancels out); the rotation error is ``arccos(1 - 2 max(1 - (q_est . q_gt)^2, eps))``
    and the translation error ``arccos(sqrt(1 - max(1 - (t_est . t_gt)^2, eps)))`` of the directions
    ``t / (|t| + eps)`` (sign-free, at most 90 deg; a non-finite one counts as 1e6 deg).

    Computed without forming the pairs' matrices: with ``B_i = R_est,i R_gt,i^T`` the cosine of a
    pair's rotation error is ``(<B_i, B_j>_F - 1) / 2`` and the dot product of its translations
    ``d_est^T B_i d_gt`` with ``d = c_j - c_i``. ``rows`` restricts ``i`` (chunks of a long
    sequence); the pairs come in ``np.triu_indices`` order. Returns ``(rot_deg [M], trans_deg [M])``.
    """
    est, gt = _f64(est_c2w), _f64(gt_c2w)
    if est.shape != gt.shape or est.ndim != 3 or est.shape[1:] not in ((4, 4), (3, 4)):
        raise ValueError(f"need two pose arrays [N, 4, 4] of one shape, got {est.shape} and {gt.shape}")
    n = est.shape[0]
    r_est, r_gt = orthonormalize(est[:, :3, :3]), orthonormalize(gt[:, :3, :3])
    c_est, c_gt = est[:, :3, 3], gt[:, :3, 3]
    b = r_est @ np.swapaxes(r_gt, -1, -2)  # [N, 3, 3]
    b_flat = b.reshape(n, 9)
    rot_parts, trans_parts = [], []
    for i in range(n)[rows or slice(None)]:
        js = slice(i + 1, n)
        cos_rot = (b_flat[js] @ b_flat[i] - 1.0) / 2.0  # [n - i - 1]
        loss_q = np.clip((1.0 - cos_rot) / 2.0, AUC_LOSS_EPS, 1.0)  # = 1 - (q_est . q_gt)^2
        rot_parts.append(np.degrees(np.arccos(1.0 - 2.0 * loss_q)))
        d_est, d_gt = c_est[js] - c_est[i], c_gt[js] - c_gt[i]  # [n - i - 1, 3]
        # relative translations R_i^T d of both, their dot product through B_i
        dot = np.einsum("ka,ab,kb->k", d_est, b[i], d_gt)
        norms = (np.linalg.norm(d_est, axis=1) + AUC_LOSS_EPS) * (np.linalg.norm(d_gt, axis=1) + AUC_LOSS_EPS)
        with np.errstate(invalid="ignore", divide="ignore"):
            cos_t = dot / norms
            loss_t = np.maximum(1.0 - cos_t * cos_t, AUC_LOSS_EPS)
            err_t = np.degrees(np.arccos(np.sqrt(1.0 - loss_t)))
        err_t[~np.isfinite(err_t)] = AUC_NON_FINITE_DEG
        trans_parts.append(np.minimum(err_t, np.abs(180.0 - err_t)))
    empty = np.zeros(0)
    return (np.concatenate(rot_parts) if rot_parts else empty, np.concatenate(trans_parts) if trans_parts else empty)


@dataclass
class PoseAUC:
    """What the official pose AUC needs of one or more sequences: integer counts, so sequences pool
    exactly (the official "micro" aggregate) and a JSON holds them without every pair's error.

    ``hist[T][k]``: pairs whose ``max(rot, trans)`` error lies in bin ``k`` of ``0, 1, ..., T`` degrees
    (``numpy.histogram``'s bins, the last one closed); ``rot_below[T]`` / ``trans_below[T]``: pairs with
    that error ``< T``.
    """

    pairs: int = 0
    hist: dict[int, np.ndarray] = field(default_factory=dict)
    rot_below: dict[int, int] = field(default_factory=dict)
    trans_below: dict[int, int] = field(default_factory=dict)
    thresholds: tuple[int, ...] = AUC_THRESHOLDS_DEG

    def add_errors(self, rot_deg: np.ndarray, trans_deg: np.ndarray) -> None:
        worst = np.maximum(rot_deg, trans_deg)
        self.pairs += int(worst.size)
        for t in self.thresholds:
            counts, _ = np.histogram(worst, bins=np.arange(t + 1))
            self.hist[t] = self.hist.get(t, np.zeros(t, np.int64)) + counts
            self.rot_below[t] = self.rot_below.get(t, 0) + int((rot_deg < t).sum())
            self.trans_below[t] = self.trans_below.get(t, 0) + int((trans_deg < t).sum())

    def auc(self, threshold: int) -> float:
        """Percent: mean over the ``T`` one-degree steps of the fraction of pairs within the step."""
        if not self.pairs:
            return float("nan")
        return float(np.mean(np.cumsum(self.hist[threshold]) / self.pairs) * 100.0)

    def racc(self, threshold: int) -> float:
        return float(self.rot_below[threshold] / self.pairs * 100.0) if self.pairs else float("nan")

    def tacc(self, threshold: int) -> float:
        return float(self.trans_below[threshold] / self.pairs * 100.0) if self.pairs else float("nan")

    def merged(self, other: "PoseAUC") -> "PoseAUC":
        """The pooled counts of two sets of pairs (micro aggregation)."""
        out = PoseAUC(thresholds=self.thresholds)
        out.pairs = self.pairs + other.pairs
        for t in self.thresholds:
            out.hist[t] = self.hist.get(t, np.zeros(t, np.int64)) + other.hist.get(t, np.zeros(t, np.int64))
            out.rot_below[t] = self.rot_below.get(t, 0) + other.rot_below.get(t, 0)
            out.trans_below[t] = self.trans_below.get(t, 0) + other.trans_below.get(t, 0)
        return out

    def summary(self) -> dict[str, float]:
        out: dict[str, float] = {"pairs": self.pairs}
        for t in self.thresholds:
            out[f"auc@{t}"] = self.auc(t)
            out[f"racc@{t}"] = self.racc(t)
            out[f"tacc@{t}"] = self.tacc(t)
        return out

    def to_json(self) -> dict:
        return {"pairs": self.pairs, "thresholds": list(self.thresholds),
                "hist": {str(t): self.hist[t].tolist() for t in self.thresholds},
                "rot_below": {str(t): self.rot_below[t] for t in self.thresholds},
                "trans_below": {str(t): self.trans_below[t] for t in self.thresholds}}

    @classmethod
    def from_json(cls, data: dict) -> "PoseAUC":
        thresholds = tuple(int(t) for t in data["thresholds"])
        return cls(pairs=int(data["pairs"]), thresholds=thresholds,
                   hist={t: np.asarray(data["hist"][str(t)], np.int64) for t in thresholds},
                   rot_below={t: int(data["rot_below"][str(t)]) for t in thresholds},
                   trans_below={t: int(data["trans_below"][str(t)]) for t in thresholds})


def pose_auc(est_c2w: ArrayLike, gt_c2w: ArrayLike, thresholds: Sequence[int] = AUC_THRESHOLDS_DEG,
             chunk_rows: int = 256) -> PoseAUC:
    """The official pose AUC counts of one sequence (all pairs ``i < j``), in chunks of rows so a
    long sequence never holds all ``N (N - 1) / 2`` errors at once."""
    est = _f64(est_c2w)
    out = PoseAUC(thresholds=tuple(int(t) for t in thresholds))
    for start in range(0, max(est.shape[0] - 1, 0), chunk_rows):
        out.add_errors(*pairwise_angle_errors(est, gt_c2w, rows=slice(start, start + chunk_rows)))
    return out


__all__ = [
    "AUC_THRESHOLDS_DEG",
    "DegenerateTrajectory",
    "EVO_MISSING",
    "PoseAUC",
    "TrajectoryMetrics",
    "associate",
    "line_alignment",
    "data_lines",
    "evo_trajectory",
    "nearest_within",
    "orthonormalize",
    "pairwise_angle_errors",
    "pose_auc",
    "pose_matrices",
    "read_tum",
    "trajectory_metrics",
    "write_tum",
]
