"""Pose maths on the CPU in float64: pose encoding, intrinsics, frame conventions, quaternions, Sim(3).

Why float64 numpy and not torch: these run once per frame on 9 numbers, where clarity and precision
matter more than speed, and the node must not need a device to publish a pose. Trajectory files and
metrics are in ``trajectory.py``. Conventions (docs/model.md §11): the decoded matrix is the
camera(optical)-to-world transform ``X_world = R X_cam + t`` of an OpenCV/REP 103 optical camera;
quaternions are scalar-last ``(x, y, z, w)`` everywhere, as in ROS and TUM files.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence, Union

import numpy as np

ArrayLike = Union[np.ndarray, Sequence[float], Sequence[Sequence[float]]]

# FoV range (degrees) allowed in *published* intrinsics. The model's FoV goes through a ReLU, so 0
# (infinite focal length) and >= 180 deg (negative focal length) are possible raw outputs; the raw
# values stay untouched in pose_enc, only what leaves the node is clamped.
PUBLISHED_FOV_RANGE_DEG: tuple[float, float] = (1.0, 170.0)

# Columns = body axes (REP 103: x forward, y left, z up) written in optical axes (x right, y down,
# z forward): x_body = z_opt, y_body = -x_opt, z_body = -y_opt.
R_OPTICAL_BODY = np.array(
    [[0.0, -1.0, 0.0],
     [0.0, 0.0, -1.0],
     [1.0, 0.0, 0.0]]
)


def _as_f64(x: ArrayLike) -> np.ndarray:
    """float64 numpy copy of numpy/list/torch input (a torch tensor may live on any device)."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()  # type: ignore[union-attr]
    return np.array(x, dtype=np.float64)


# ---------------------------------------------------------------------------------------------
# quaternions
# ---------------------------------------------------------------------------------------------
def quaternion_to_matrix(q_xyzw: ArrayLike) -> np.ndarray:
    """[..., 4] (x, y, z, w), any non-zero norm -> rotation [..., 3, 3] (official formula, s = 2/|q|^2).

    A zero quaternion gives NaN, as the official decode does; check ``np.isfinite`` before use.
    """
    q = _as_f64(q_xyzw)
    x, y, z, w = q[..., 0], q[..., 1], q[..., 2], q[..., 3]
    with np.errstate(divide="ignore", invalid="ignore"):
        s = 2.0 / (x * x + y * y + z * z + w * w)
        r = np.stack(
            [
                1 - s * (y * y + z * z), s * (x * y - z * w), s * (x * z + y * w),
                s * (x * y + z * w), 1 - s * (x * x + z * z), s * (y * z - x * w),
                s * (x * z - y * w), s * (y * z + x * w), 1 - s * (x * x + y * y),
            ],
            axis=-1,
        )
    return r.reshape(q.shape[:-1] + (3, 3))


def normalize_quaternion(q_xyzw: ArrayLike) -> np.ndarray:
    """[..., 4] -> unit quaternion(s); sign kept. Raises ValueError on a zero or non-finite norm.

    ROS consumers (TF, RViz) reject or misdraw non-unit quaternions, and the model's are not unit.
    """
    q = _as_f64(q_xyzw)
    n = np.linalg.norm(q, axis=-1, keepdims=True)
    bad = ~np.isfinite(n) | (n == 0.0)
    if np.any(bad):
        raise ValueError(f"cannot normalise {int(bad.sum())} quaternion(s) with zero or non-finite norm")
    return q / n


def quaternion_xyzw_from_matrix(rot: ArrayLike) -> np.ndarray:
    """Rotation [..., 3, 3] -> unit quaternion [..., 4] (x, y, z, w) with w >= 0.

    Uses the best-conditioned of the four classic formulas per matrix (largest of trace and diagonal),
    so precision does not collapse near 180 deg rotations. ``w >= 0`` is the official windowed code's
    standardisation (docs/model.md §15).
    """
    m = _as_f64(rot)
    if m.shape == (3, 3):
        one = _quaternion_xyzw_of_one(m)
        if one is not None:
            return one
    m00, m01, m02 = m[..., 0, 0], m[..., 0, 1], m[..., 0, 2]
    m10, m11, m12 = m[..., 1, 0], m[..., 1, 1], m[..., 1, 2]
    m20, m21, m22 = m[..., 2, 0], m[..., 2, 1], m[..., 2, 2]
    tr = m00 + m11 + m22
    cands = np.stack(  # [..., 4 candidates, 4 components], each proportional to q
        [
            np.stack([1 + 2 * m00 - tr, m10 + m01, m20 + m02, m21 - m12], -1),
            np.stack([m01 + m10, 1 + 2 * m11 - tr, m21 + m12, m02 - m20], -1),
            np.stack([m02 + m20, m12 + m21, 1 + 2 * m22 - tr, m10 - m01], -1),
            np.stack([m21 - m12, m02 - m20, m10 - m01, 1 + tr], -1),
        ],
        axis=-2,
    )
    choice = np.argmax(np.stack([m00, m11, m22, tr], -1), axis=-1)  # [...]
    q = np.take_along_axis(cands, choice[..., None, None], axis=-2)[..., 0, :]
    q = q / np.linalg.norm(q, axis=-1, keepdims=True)
    return np.where(q[..., 3:4] < 0, -q, q)


def _quaternion_xyzw_of_one(m: np.ndarray) -> Optional[np.ndarray]:
    """``quaternion_xyzw_from_matrix`` of one finite [3, 3] matrix, the same formulas and choice in Python
    floats: the array form costs tens of microseconds of NumPy calls per matrix, and the node converts
    several poses per frame. None for a non-finite matrix (the array form decides what it gives)."""
    (m00, m01, m02), (m10, m11, m12), (m20, m21, m22) = m.tolist()
    tr = m00 + m11 + m22
    if not math.isfinite(tr + m01 + m02 + m10 + m12 + m20 + m21):
        return None
    pivots = (m00, m11, m22, tr)
    choice = pivots.index(max(pivots))  # the first largest, as np.argmax
    if choice == 0:
        q = (1 + 2 * m00 - tr, m10 + m01, m20 + m02, m21 - m12)
    elif choice == 1:
        q = (m01 + m10, 1 + 2 * m11 - tr, m21 + m12, m02 - m20)
    elif choice == 2:
        q = (m02 + m20, m12 + m21, 1 + 2 * m22 - tr, m10 - m01)
    else:
        q = (m21 - m12, m02 - m20, m10 - m01, 1 + tr)
    norm = math.sqrt(q[0] * q[0] + q[1] * q[1] + q[2] * q[2] + q[3] * q[3])
    if norm == 0.0:  # not a rotation
        return None
    sign = -1.0 if q[3] / norm < 0 else 1.0
    return np.array([sign * v / norm for v in q])


# ---------------------------------------------------------------------------------------------
# pose encoding and intrinsics
# ---------------------------------------------------------------------------------------------
def decode_pose_encoding(pose_enc: ArrayLike, image_hw: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """pose_enc [..., 9] -> (c2w [..., 4, 4], K [..., 3, 3]) for the model input size ``image_hw``.

    Exactly docs/model.md §11 in float64: rotation from the non-unit quaternion with s = 2/|q|^2,
    translation = camera centre, ``fy = (H/2)/tan(fov_h/2)``, ``fx = (W/2)/tan(fov_w/2)``,
    ``cx = W/2``, ``cy = H/2``. Raw: a zero FoV gives an infinite focal length here on purpose (the
    guard belongs to what is published, see ``intrinsics_for_camera``).
    """
    enc = _as_f64(pose_enc)
    if enc.shape[-1] != 9:
        raise ValueError(f"pose encoding must have 9 values in its last axis, got shape {enc.shape}")
    h, w = float(image_hw[0]), float(image_hw[1])
    batch = enc.shape[:-1]
    c2w = np.zeros(batch + (4, 4))
    c2w[..., :3, :3] = quaternion_to_matrix(enc[..., 3:7])
    c2w[..., :3, 3] = enc[..., :3]
    c2w[..., 3, 3] = 1.0
    k = np.zeros(batch + (3, 3))
    with np.errstate(divide="ignore"):
        k[..., 0, 0] = (w / 2.0) / np.tan(enc[..., 8] / 2.0)
        k[..., 1, 1] = (h / 2.0) / np.tan(enc[..., 7] / 2.0)
    k[..., 0, 2] = w / 2.0
    k[..., 1, 2] = h / 2.0
    k[..., 2, 2] = 1.0
    return c2w, k


def guard_focal(
    focal: ArrayLike, size_px: float, fov_limits_deg: tuple[float, float] = PUBLISHED_FOV_RANGE_DEG
) -> tuple[np.ndarray, np.ndarray]:
    """Clamp focal length(s) so the FoV over ``size_px`` lies in ``fov_limits_deg``.

    Returns ``(guarded, clamped_mask)``. Infinite focal (FoV 0) -> the narrowest allowed FoV;
    non-positive focal (FoV >= 180 deg) -> the widest. NaN stays NaN: there is nothing to guess from.
    """
    f = _as_f64(focal)
    lo, hi = fov_limits_deg
    if not 0.0 < lo < hi < 180.0:
        raise ValueError(f"fov_limits_deg must satisfy 0 < min < max < 180, got {fov_limits_deg}")
    f_min = (size_px / 2.0) / math.tan(math.radians(hi) / 2.0)  # widest FoV
    f_max = (size_px / 2.0) / math.tan(math.radians(lo) / 2.0)  # narrowest FoV
    guarded = np.where(f <= 0.0, f_min, np.clip(f, f_min, f_max))
    clamped = (guarded != f) & ~np.isnan(f)
    return guarded, clamped


def intrinsics_for_camera(
    k_model: ArrayLike,
    original_wh: tuple[int, int],
    model_hw: tuple[int, int],
    crop_offset_y: int,
    fov_limits_deg: Optional[tuple[float, float]] = PUBLISHED_FOV_RANGE_DEG,
) -> np.ndarray:
    """Model-input intrinsics [..., 3, 3] -> intrinsics of the original camera image [..., 3, 3].

    Undoes the resize and crop (docs/model.md §11): ``s_x = W/W0``, ``s_y = new_h/H0`` with
    ``new_h = H + 2*crop_offset_y``; ``fx0 = fx/s_x``, ``fy0 = fy/s_y``, ``cx0 = cx/s_x``,
    ``cy0 = (cy + crop_offset_y)/s_y``. The principal point keeps the model's convention (image centre
    in continuous pixel coordinates, no half-pixel shift).

    This is for *publishing*: focal lengths are first clamped so the FoV stays inside
    ``fov_limits_deg`` (default ``PUBLISHED_FOV_RANGE_DEG``) because the model's ReLU'd FoV can be 0
    (infinite focal) or >= 180 deg (negative focal). ``fov_limits_deg=None`` maps without guarding.
    The raw ``pose_enc`` is never modified.
    """
    k = _as_f64(k_model).copy()
    w0, h0 = float(original_wh[0]), float(original_wh[1])
    h, w = float(model_hw[0]), float(model_hw[1])
    if min(w0, h0, h, w) <= 0 or crop_offset_y < 0:
        raise ValueError(
            f"sizes must be positive and the crop offset >= 0 (got {original_wh}, {model_hw}, {crop_offset_y})"
        )
    if fov_limits_deg is not None:
        k[..., 0, 0] = guard_focal(k[..., 0, 0], w, fov_limits_deg)[0]
        k[..., 1, 1] = guard_focal(k[..., 1, 1], h, fov_limits_deg)[0]
    sx = w / w0
    sy = (h + 2.0 * crop_offset_y) / h0
    out = np.zeros_like(k)
    out[..., 0, 0] = k[..., 0, 0] / sx
    out[..., 1, 1] = k[..., 1, 1] / sy
    out[..., 0, 2] = k[..., 0, 2] / sx
    out[..., 1, 2] = (k[..., 1, 2] + crop_offset_y) / sy
    out[..., 2, 2] = 1.0
    return out


# ---------------------------------------------------------------------------------------------
# frames, SE(3), Sim(3)
# ---------------------------------------------------------------------------------------------
def se3(rot: ArrayLike, trans: ArrayLike) -> np.ndarray:
    """Rotation [..., 3, 3] and translation [..., 3] -> homogeneous [..., 4, 4]."""
    r, t = _as_f64(rot), _as_f64(trans)
    out = np.zeros(np.broadcast_shapes(r.shape[:-2], t.shape[:-1]) + (4, 4))
    out[..., :3, :3] = r
    out[..., :3, 3] = t
    out[..., 3, 3] = 1.0
    return out


def se3_inverse(pose: ArrayLike) -> np.ndarray:
    """Inverse of rigid transform(s) [..., 4, 4] (or [..., 3, 4]) in closed form: [R^T | -R^T t]."""
    p = _as_f64(pose)
    rt = np.swapaxes(p[..., :3, :3], -1, -2)
    return se3(rt, -np.einsum("...ij,...j->...i", rt, p[..., :3, 3]))


def optical_to_body(c2w_optical: ArrayLike, rebase_world: bool = False) -> np.ndarray:
    """Pose(s) [..., 4, 4] of an optical frame -> pose(s) of the body frame at the same camera.

    The body frame is REP 103's x forward, y left, z up (x_body = z_opt, y_body = -x_opt,
    z_body = -y_opt): ``c2w_body = c2w_opt @ R_OPTICAL_BODY``. With ``rebase_world`` the world frame
    (the first camera's optical axes) is re-expressed in body axes too, so a camera that never moved
    sits at the identity and "up" is roughly +z - what RViz users expect.
    """
    pose = _as_f64(c2w_optical)
    if pose.shape[-2:] == (3, 4):
        pose = se3(pose[..., :3, :3], pose[..., :3, 3])
    out = pose.copy()
    out[..., :3, :3] = pose[..., :3, :3] @ R_OPTICAL_BODY
    if rebase_world:
        out[..., :3, :3] = R_OPTICAL_BODY.T @ out[..., :3, :3]
        out[..., :3, 3] = np.einsum("ij,...j->...i", R_OPTICAL_BODY.T, pose[..., :3, 3])
    return out


def sim3_apply_to_poses(scale: float, rot: ArrayLike, trans: ArrayLike, c2w: ArrayLike) -> np.ndarray:
    """Map c2w pose(s) [..., 4, 4] by ``X -> s R X + t`` (docs/model.md §15).

    Rotation becomes ``R R_i`` and centre ``s R c_i + t``; the result is again a rigid c2w (the scale
    lives in the world, not in the camera).
    """
    p = _as_f64(c2w)
    r, t = _as_f64(rot), _as_f64(trans)
    if p.shape[-2:] == (3, 4):
        p = se3(p[..., :3, :3], p[..., :3, 3])
    return se3(r @ p[..., :3, :3], scale * np.einsum("ij,...j->...i", r, p[..., :3, 3]) + t)


def sim3_apply_to_points(scale: float, rot: ArrayLike, trans: ArrayLike, points: ArrayLike) -> np.ndarray:
    """Points [..., 3] -> ``s R p + t``."""
    return scale * np.einsum("ij,...j->...i", _as_f64(rot), _as_f64(points)) + _as_f64(trans)


def window_alignment(
    c2w_anchor_prev: ArrayLike, c2w_anchor_next: ArrayLike, scale: float = 1.0
) -> tuple[float, np.ndarray, np.ndarray]:
    """Sim(3) that maps window ``w`` onto the already aligned window ``w-1`` (docs/model.md §15).

    From the anchor frame's pose in both windows, ``(R_a, c_a)`` (previous) and ``(R_b, c_b)`` (next):
    ``R = R_a R_b^T`` and ``t = c_a - s R c_b``; ``scale`` comes from ``alignment_scale`` (depth).
    Returns ``(s, R [3,3], t [3])`` for ``sim3_apply_to_poses``.
    """
    a, b = _as_f64(c2w_anchor_prev), _as_f64(c2w_anchor_next)
    rot = a[:3, :3] @ b[:3, :3].T
    trans = a[:3, 3] - scale * rot @ b[:3, 3]
    return float(scale), rot, trans


def alignment_scale(
    depth_prev: ArrayLike,
    depth_next: ArrayLike,
    eps: float = float(np.finfo(np.float32).eps),
    limits: tuple[float, float] = (1e-3, 1e3),
) -> float:
    """Scale of window ``w`` relative to ``w-1``: median of ``depth_prev / depth_next`` (docs/model.md §15).

    Over all pixels of the paired frames, keeping finite ratios where ``|depth_next| > eps``; the
    median is the lower middle element for even counts (PyTorch's rule); clamped to ``limits``.
    Returns 1.0 when no pixel qualifies (the official code would fail; a unit scale keeps going).
    """
    d_prev, d_next = _as_f64(depth_prev), _as_f64(depth_next)
    if d_prev.shape != d_next.shape:
        raise ValueError(f"depth shapes differ: {d_prev.shape} vs {d_next.shape}")
    keep = np.abs(d_next) > eps
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = d_prev[keep] / d_next[keep]
    ratio = ratio[np.isfinite(ratio)]
    if ratio.size == 0:
        return 1.0
    k = (ratio.size - 1) // 2
    med = float(np.partition(ratio, k)[k])
    return float(np.clip(med, limits[0], limits[1]))


def umeyama_sim3(src: ArrayLike, dst: ArrayLike, with_scale: bool = True) -> tuple[float, np.ndarray, np.ndarray]:
    """Least-squares ``(s, R, t)`` with ``dst ~ s R src + t`` (Umeyama 1991) for points [N, 3].

    Reflections are excluded (det R = +1). ``with_scale=False`` gives the rigid (SE(3)) fit with s = 1.
    Needs at least 3 points that are not all identical.
    """
    x, y = _as_f64(src), _as_f64(dst)
    if x.shape != y.shape or x.ndim != 2 or x.shape[1] != 3:
        raise ValueError(f"need two [N, 3] point sets of equal shape, got {x.shape} and {y.shape}")
    if x.shape[0] < 3:
        raise ValueError(f"need at least 3 points to fit a Sim(3), got {x.shape[0]}")
    mx, my = x.mean(0), y.mean(0)
    xc, yc = x - mx, y - my
    var_x = float((xc * xc).sum(1).mean())
    if var_x <= 0.0:
        raise ValueError("source points are all identical: rotation and scale are undefined")
    cov = yc.T @ xc / x.shape[0]  # [3, 3]
    u, d, vt = np.linalg.svd(cov)
    sign = np.eye(3)
    if np.linalg.det(u) * np.linalg.det(vt) < 0:
        sign[2, 2] = -1.0
    rot = u @ sign @ vt
    scale = float(np.trace(np.diag(d) @ sign) / var_x) if with_scale else 1.0
    trans = my - scale * rot @ mx
    return scale, rot, trans


__all__ = [
    "PUBLISHED_FOV_RANGE_DEG",
    "R_OPTICAL_BODY",
    "alignment_scale",
    "decode_pose_encoding",
    "guard_focal",
    "intrinsics_for_camera",
    "normalize_quaternion",
    "optical_to_body",
    "quaternion_to_matrix",
    "quaternion_xyzw_from_matrix",
    "se3",
    "se3_inverse",
    "sim3_apply_to_points",
    "sim3_apply_to_poses",
    "umeyama_sim3",
    "window_alignment",
]


# ---------------------------------------------------------------------------------------------
# Robot frames (REP 103 / REP 105): body, world, odom, and a metric scale on the world
# ---------------------------------------------------------------------------------------------
# Notation: ``T_a_b`` is the pose of frame b in frame a (``p_a = T_a_b p_b``), the transform tf2
# returns for ``lookup_transform(a, b)``. The model's world is the first camera's optical frame.
def transform_matrix(translation: ArrayLike, rotation_xyzw: ArrayLike) -> np.ndarray:
    """A TF transform (translation [3], quaternion [4] x y z w of any non-zero norm) -> [4, 4].

    The quaternion is normalised first: tf2 accepts slightly non-unit ones, and the matrix must stay
    rigid for the inverses below to be exact. Scalar arithmetic on purpose: this runs for every
    lookup on the inference thread, where numpy's per-call overhead on 4 numbers costs ~10x more.
    """
    tx, ty, tz = (float(v) for v in translation)
    x, y, z, w = (float(v) for v in rotation_xyzw)
    n = math.sqrt(x * x + y * y + z * z + w * w)
    if not (n > 0.0 and math.isfinite(n)):
        raise ValueError(f"cannot normalise the quaternion {(x, y, z, w)}")
    x, y, z, w = x / n, y / n, z / n, w / n
    return np.array([
        [1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w), tx],
        [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w), ty],
        [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y), tz],
        [0.0, 0.0, 0.0, 1.0],
    ])


def _pose(m: ArrayLike) -> np.ndarray:
    """A [4, 4] float64 array, without a copy when it is one already (these run per frame)."""
    return m if isinstance(m, np.ndarray) and m.dtype == np.float64 and m.shape == (4, 4) \
        else np.asarray(m, dtype=np.float64).reshape(4, 4)


def rigid_inverse(m: np.ndarray) -> np.ndarray:
    """``[R^T | -R^T t]`` of one rigid [4, 4] (``se3_inverse`` without its batch machinery)."""
    out = np.zeros((4, 4))
    rt = m[:3, :3].T
    out[:3, :3] = rt
    out[:3, 3] = -(rt @ m[:3, 3])
    out[3, 3] = 1.0
    return out


def scale_pose(pose: ArrayLike, factor: float, offset: ArrayLike = (0.0, 0.0, 0.0)) -> np.ndarray:
    """Pose [4, 4] of a world whose unit changes by ``x -> factor x + offset``: the rotation stays,
    the position becomes ``factor t + offset`` (a similarity without rotation, as a metric scale is)."""
    out = np.array(_pose(pose), dtype=np.float64)
    out[:3, 3] = float(factor) * out[:3, 3] + np.asarray(offset, dtype=np.float64)
    return out


def body_pose(camera_pose: ArrayLike, base_to_camera: ArrayLike) -> np.ndarray:
    """``T_w_base = T_w_cam T_base_cam^-1``: the body pose that carries the camera at ``camera_pose``.

    Both translations must be in one unit (metres once a metric scale is applied; the extrinsic's
    metres are taken as model units otherwise, which keeps ``T_w_base T_base_cam = T_w_cam`` exact).
    """
    return _pose(camera_pose) @ rigid_inverse(_pose(base_to_camera))


def relative_pose(reference: ArrayLike, pose: ArrayLike) -> np.ndarray:
    """``reference^-1 pose``: ``pose`` seen from the frame whose pose is ``reference`` (the node's world
    with ``base_frame`` is the session's first body pose)."""
    return rigid_inverse(_pose(reference)) @ _pose(pose)


def odom_correction(body_in_world: ArrayLike, base_in_odom: ArrayLike) -> np.ndarray:
    """``T_world_odom = T_world_base T_odom_base^-1`` (REP 105's map -> odom): with the robot's own
    ``odom -> base`` at the same stamp, ``T_world_odom T_odom_base`` is exactly the body estimate."""
    return _pose(body_in_world) @ rigid_inverse(_pose(base_in_odom))


def rotation_vector(rot: ArrayLike) -> np.ndarray:
    """Rotation [3, 3] -> axis * angle [3] (rad), through the w >= 0 unit quaternion (stable near 0
    and near pi: the best-conditioned of the four quaternion formulas; scalar arithmetic, per frame)."""
    m = np.asarray(rot, dtype=np.float64).tolist()
    (m00, m01, m02), (m10, m11, m12), (m20, m21, m22) = m
    tr = m00 + m11 + m22
    best = max(tr, m00, m11, m22)
    if best == tr:
        q = (m21 - m12, m02 - m20, m10 - m01, 1 + tr)
    elif best == m00:
        q = (1 + 2 * m00 - tr, m10 + m01, m20 + m02, m21 - m12)
    elif best == m11:
        q = (m01 + m10, 1 + 2 * m11 - tr, m21 + m12, m02 - m20)
    else:
        q = (m02 + m20, m12 + m21, 1 + 2 * m22 - tr, m10 - m01)
    x, y, z, w = q
    if w < 0:
        x, y, z, w = -x, -y, -z, -w
    s = math.sqrt(x * x + y * y + z * z)
    if s < 1e-15 * max(abs(w), 1e-300):
        return np.zeros(3)
    k = 2.0 * math.atan2(s, w) / s
    return np.array([x * k, y * k, z * k])


def body_twist(previous: ArrayLike, current: ArrayLike, dt: float) -> tuple[np.ndarray, np.ndarray]:
    """Velocity of a body between two of its world poses ``dt`` seconds apart, in the body frame
    (nav_msgs/Odometry's twist is in ``child_frame_id``): linear ``R_cur^T (p_cur - p_prev) / dt`` and
    angular ``log(R_prev^T R_cur) / dt`` (a constant-rate rotation's axis is the same in both frames)."""
    if not dt > 0.0:
        raise ValueError(f"dt must be positive (got {dt})")
    a, b = _pose(previous), _pose(current)
    linear = b[:3, :3].T @ (b[:3, 3] - a[:3, 3]) / dt
    angular = rotation_vector(a[:3, :3].T @ b[:3, :3]) / dt
    return linear, angular


def pose_difference(a: ArrayLike, b: ArrayLike) -> tuple[float, float]:
    """(distance between the origins, rotation angle in rad) between two poses [4, 4]: how far a
    transform that should be constant (a robot's extrinsic) moved between two lookups."""
    pa, pb = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    d = pa[:3, 3] - pb[:3, 3]
    return float(math.sqrt(float(d @ d))), float(np.linalg.norm(rotation_vector(pa[:3, :3].T @ pb[:3, :3])))


__all__ += [
    "body_pose", "body_twist", "odom_correction", "pose_difference", "relative_pose", "rigid_inverse",
    "rotation_vector", "scale_pose", "transform_matrix",
]
