"""geometry.py against independent float64 references (quaternion sandwich products, projections)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lingbot_map_ros.core import geometry as g


# -- independent references --------------------------------------------------------------------
def hamilton(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Quaternion product p ⊗ q, both (x, y, z, w)."""
    px, py, pz, pw = p
    qx, qy, qz, qw = q
    return np.array([
        pw * qx + px * qw + py * qz - pz * qy,
        pw * qy - px * qz + py * qw + pz * qx,
        pw * qz + px * qy - py * qx + pz * qw,
        pw * qw - px * qx - py * qy - pz * qz,
    ])


def rotate(q: np.ndarray, v: np.ndarray) -> np.ndarray:
    """v' = q ⊗ (v, 0) ⊗ q* / |q|^2: defined for any non-zero q."""
    conj = np.array([-q[0], -q[1], -q[2], q[3]])
    return hamilton(hamilton(q, np.append(v, 0.0)), conj)[:3] / float(q @ q)


def reference_rotation(q: np.ndarray) -> np.ndarray:
    return np.stack([rotate(q, e) for e in np.eye(3)], axis=1)  # columns = rotated basis vectors


def random_rotation(rng: np.random.Generator) -> np.ndarray:
    q = rng.normal(size=4)
    return reference_rotation(q)


# -- decode --------------------------------------------------------------------------------------
def test_decode_matches_sandwich_product_reference() -> None:
    rng = np.random.default_rng(0)
    enc = np.zeros((6, 9))
    enc[:, :3] = rng.normal(size=(6, 3))
    enc[:, 3:7] = rng.normal(size=(6, 4)) * rng.uniform(0.1, 10.0, size=(6, 1))  # non-unit
    enc[:, 7:9] = rng.uniform(0.3, 2.5, size=(6, 2))
    h, w = 294, 518
    c2w, k = g.decode_pose_encoding(enc, (h, w))
    assert c2w.shape == (6, 4, 4) and k.shape == (6, 3, 3) and c2w.dtype == np.float64
    for i in range(6):
        r = reference_rotation(enc[i, 3:7])
        np.testing.assert_allclose(c2w[i, :3, :3], r, atol=1e-12)
        np.testing.assert_allclose(c2w[i, :3, 3], enc[i, :3], rtol=0, atol=0)
        np.testing.assert_array_equal(c2w[i, 3], [0, 0, 0, 1])
        fy = (h / 2) / math.tan(enc[i, 7] / 2)
        fx = (w / 2) / math.tan(enc[i, 8] / 2)
        np.testing.assert_allclose(k[i], [[fx, 0, w / 2], [0, fy, h / 2], [0, 0, 1]], rtol=1e-14)
        # camera-to-world: the optical axis (0,0,1) of the camera points along R's third column
        np.testing.assert_allclose(c2w[i, :3, :3] @ [0, 0, 1], r[:, 2], atol=1e-12)


def test_decode_batch_shapes_and_torch_input() -> None:
    rng = np.random.default_rng(1)
    enc = rng.normal(size=(2, 3, 9))
    enc[..., 7:] = 1.0
    c2w, k = g.decode_pose_encoding(enc, (392, 518))
    assert c2w.shape == (2, 3, 4, 4) and k.shape == (2, 3, 3, 3)
    c2w_t, k_t = g.decode_pose_encoding(torch.from_numpy(enc.astype(np.float32)), (392, 518))
    np.testing.assert_allclose(c2w_t, c2w, atol=1e-6)
    single, _ = g.decode_pose_encoding(enc[0, 0], (392, 518))
    assert single.shape == (4, 4)
    with pytest.raises(ValueError, match="9 values"):
        g.decode_pose_encoding(np.zeros(8), (10, 10))


def test_decode_identity_and_raw_degenerate_values() -> None:
    c2w, k = g.decode_pose_encoding([0, 0, 0, 0, 0, 0, -1, 1.0, 1.2], (294, 518))
    np.testing.assert_allclose(c2w, np.eye(4), atol=0)
    # zero quaternion -> NaN (as the official code); zero FoV -> infinite focal length (raw)
    c2w, k = g.decode_pose_encoding([0, 0, 0, 0, 0, 0, 0, 0.0, 0.0], (294, 518))
    assert np.isnan(c2w[:3, :3]).all()
    assert np.isinf(k[0, 0]) and np.isinf(k[1, 1])


# -- quaternions -------------------------------------------------------------------------------
def test_quaternion_from_matrix_round_trip() -> None:
    rng = np.random.default_rng(2)
    qs = rng.normal(size=(200, 4))
    # hard cases: 180 deg rotations (w = 0) and the identity, tiny angles
    qs[:3] = [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 1e-12]]
    qs[3] = [0, 0, 0, 1]
    qs[4] = [1e-9, -2e-9, 3e-9, 1]
    rots = np.stack([reference_rotation(q) for q in qs])
    out = g.quaternion_xyzw_from_matrix(rots)
    unit = qs / np.linalg.norm(qs, axis=1, keepdims=True)
    assert np.all(out[:, 3] >= 0)
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-14)
    # same rotation: q' = ±q
    dots = np.abs(np.sum(out * unit, axis=1))
    np.testing.assert_allclose(dots, 1.0, atol=1e-12)
    np.testing.assert_allclose(g.quaternion_to_matrix(out), rots, atol=1e-12)


def test_quaternion_of_one_matrix_is_the_batched_one() -> None:
    """One [3, 3] matrix takes a scalar path: the same quaternion as the same matrix in a batch (the
    array path), the hard cases included, and the same NaN for a non-finite matrix."""
    rng = np.random.default_rng(5)
    qs = rng.normal(size=(300, 4))
    qs[:4] = [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 1e-12], [0, 0, 0, 1]]
    qs[4:8] = [[1, 1, 0, 0], [0, 1, 1, 0], [1, 0, 1, 0], [1e-9, -2e-9, 3e-9, -1]]  # ties of the pivots, w < 0
    rots = np.stack([reference_rotation(q) for q in qs])
    batched = g.quaternion_xyzw_from_matrix(rots)
    for rot, expected in zip(rots, batched):
        np.testing.assert_allclose(g.quaternion_xyzw_from_matrix(rot), expected, rtol=0, atol=1e-15)
    bad = rots[10].copy()
    bad[1, 2] = np.nan
    np.testing.assert_array_equal(g.quaternion_xyzw_from_matrix(bad), g.quaternion_xyzw_from_matrix(bad[None])[0])
    zero = np.zeros((3, 3))
    np.testing.assert_array_equal(g.quaternion_xyzw_from_matrix(zero), g.quaternion_xyzw_from_matrix(zero[None])[0])


def test_normalize_quaternion() -> None:
    q = g.normalize_quaternion([0, 0, 3, 4])
    np.testing.assert_allclose(q, [0, 0, 0.6, 0.8])
    np.testing.assert_allclose(np.linalg.norm(g.normalize_quaternion(np.ones((5, 4)) * 7), axis=1), 1.0)
    with pytest.raises(ValueError, match="zero"):
        g.normalize_quaternion([0, 0, 0, 0])
    with pytest.raises(ValueError):
        g.normalize_quaternion([np.nan, 0, 0, 1])


# -- intrinsics --------------------------------------------------------------------------------
@pytest.mark.parametrize("w0,h0,model_hw,oy", [(1280, 720, (294, 518), 0), (640, 480, (392, 518), 0),
                                                (480, 640, (518, 518), 84)])
def test_intrinsics_for_camera_reprojects_consistently(w0, h0, model_hw, oy) -> None:
    """A 3D point projects to model pixel (u, v); the camera image pixel is (u/sx, (v+oy)/sy)."""
    h, w = model_hw
    new_h = h + 2 * oy
    _, k = g.decode_pose_encoding([0, 0, 0, 0, 0, 0, 1, 0.9, 1.1], model_hw)
    k0 = g.intrinsics_for_camera(k, (w0, h0), model_hw, oy)
    sx, sy = w / w0, new_h / h0
    rng = np.random.default_rng(3)
    for x in rng.normal(size=(10, 3)) + [0, 0, 5]:
        u, v, _ = k @ x / x[2]
        u0, v0, _ = k0 @ x / x[2]
        assert u0 == pytest.approx(u / sx, rel=1e-12)
        assert v0 == pytest.approx((v + oy) / sy, rel=1e-12)
    # principal point at the image centre of the camera image
    assert k0[0, 2] == pytest.approx(w0 / 2) and k0[1, 2] == pytest.approx(h0 / 2)


def test_intrinsics_guard_only_in_published_values() -> None:
    enc = np.array([[0, 0, 0, 0, 0, 0, 1, 0.0, 0.0],  # ReLU'd to zero: infinite focal
                    [0, 0, 0, 0, 0, 0, 1, 3.5, 3.5],  # >= pi: negative focal
                    [0, 0, 0, 0, 0, 0, 1, 1.0, 1.2]])  # normal
    _, k = g.decode_pose_encoding(enc, (294, 518))
    raw = k.copy()
    k0 = g.intrinsics_for_camera(k, (1280, 720), (294, 518), 0)
    np.testing.assert_array_equal(k, raw)  # the input is untouched
    assert np.all(np.isfinite(k0)) and np.all(k0[:, 0, 0] > 0) and np.all(k0[:, 1, 1] > 0)
    lo, hi = g.PUBLISHED_FOV_RANGE_DEG
    fov_w = np.degrees(2 * np.arctan((1280 / 2) / k0[:, 0, 0]))
    fov_h = np.degrees(2 * np.arctan((720 / 2) / k0[:, 1, 1]))
    np.testing.assert_allclose([fov_w[0], fov_h[0]], [lo, lo], rtol=1e-9)
    np.testing.assert_allclose([fov_w[1], fov_h[1]], [hi, hi], rtol=1e-9)
    np.testing.assert_allclose([fov_w[2], fov_h[2]], np.degrees([1.2, 1.0]), rtol=1e-9)
    unguarded = g.intrinsics_for_camera(k, (1280, 720), (294, 518), 0, fov_limits_deg=None)
    assert np.isinf(unguarded[0, 0, 0]) and unguarded[1, 0, 0] < 0
    f, clamped = g.guard_focal([np.inf, -3.0, 100.0, np.nan], 518)
    assert clamped.tolist() == [True, True, False, False] and np.isnan(f[3])


# -- frames --------------------------------------------------------------------------------------
def test_optical_to_body_axes() -> None:
    # Body-frame coordinates of optical points: forward, right, down.
    r = g.R_OPTICAL_BODY
    np.testing.assert_array_equal(r.T @ [0, 0, 1], [1, 0, 0])   # optical forward -> body +x
    np.testing.assert_array_equal(r.T @ [1, 0, 0], [0, -1, 0])  # optical right   -> body -y
    np.testing.assert_array_equal(r.T @ [0, 1, 0], [0, 0, -1])  # optical down    -> body -z
    assert np.linalg.det(r) == pytest.approx(1.0)
    rng = np.random.default_rng(4)
    pose = g.se3(random_rotation(rng), rng.normal(size=3))
    body = g.optical_to_body(pose)
    np.testing.assert_allclose(body[:3, 3], pose[:3, 3])  # same origin
    np.testing.assert_allclose(body[:3, 0], pose[:3, 2], atol=1e-15)  # x_body = z_opt (in world)
    np.testing.assert_allclose(body[:3, 1], -pose[:3, 0], atol=1e-15)
    np.testing.assert_allclose(body[:3, 2], -pose[:3, 1], atol=1e-15)
    np.testing.assert_allclose(g.optical_to_body(np.eye(4), rebase_world=True), np.eye(4), atol=0)
    # rebased: a camera 1 m forward (optical z) of the first one is at body +x
    moved = g.se3(np.eye(3), [0, 0, 1])
    np.testing.assert_allclose(g.optical_to_body(moved, rebase_world=True)[:3, 3], [1, 0, 0], atol=0)


def test_se3_inverse() -> None:
    rng = np.random.default_rng(5)
    poses = np.stack([g.se3(random_rotation(rng), rng.normal(size=3)) for _ in range(4)])
    np.testing.assert_allclose(poses @ g.se3_inverse(poses), np.broadcast_to(np.eye(4), (4, 4, 4)), atol=1e-12)


# -- Sim(3) ------------------------------------------------------------------------------------
def random_sim3(rng: np.random.Generator) -> tuple[float, np.ndarray, np.ndarray]:
    return float(rng.uniform(0.2, 5.0)), random_rotation(rng), rng.normal(size=3) * 3


def test_umeyama_recovers_random_sim3() -> None:
    rng = np.random.default_rng(6)
    for _ in range(20):
        s, r, t = random_sim3(rng)
        src = rng.normal(size=(30, 3))
        dst = s * src @ r.T + t
        s2, r2, t2 = g.umeyama_sim3(src, dst)
        assert s2 == pytest.approx(s, rel=1e-10)
        np.testing.assert_allclose(r2, r, atol=1e-10)
        np.testing.assert_allclose(t2, t, atol=1e-9)
        assert np.linalg.det(r2) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="at least 3"):
        g.umeyama_sim3(np.zeros((2, 3)), np.zeros((2, 3)))
    with pytest.raises(ValueError, match="identical"):
        g.umeyama_sim3(np.ones((4, 3)), np.zeros((4, 3)))


def test_umeyama_never_returns_reflection() -> None:
    rng = np.random.default_rng(7)
    src = rng.normal(size=(10, 3))
    dst = src * [1, 1, -1]  # a mirror image: best proper rotation, det +1
    _, r, _ = g.umeyama_sim3(src, dst)
    assert np.linalg.det(r) == pytest.approx(1.0)


def test_window_alignment_maps_next_window_onto_previous() -> None:
    rng = np.random.default_rng(8)
    prev = np.stack([g.se3(random_rotation(rng), rng.normal(size=3)) for _ in range(6)])
    s, r, t = random_sim3(rng)
    # the next window sees the same frames in its own world: prev = Sim3(next)
    inv_r = r.T
    nxt = g.sim3_apply_to_poses(1.0 / s, inv_r, -(inv_r @ t) / s, prev)
    s2, r2, t2 = g.window_alignment(prev[3], nxt[3], scale=s)
    np.testing.assert_allclose(r2, r, atol=1e-12)
    np.testing.assert_allclose(t2, t, atol=1e-12)
    np.testing.assert_allclose(g.sim3_apply_to_poses(s2, r2, t2, nxt), prev, atol=1e-11)
    pts = rng.normal(size=(5, 3))
    np.testing.assert_allclose(g.sim3_apply_to_points(s, r, t, pts), s * pts @ r.T + t, atol=1e-12)


def test_alignment_scale_median_rules() -> None:
    rng = np.random.default_rng(9)
    d_next = rng.uniform(0.5, 4.0, size=(2, 6, 8))
    d_prev = 2.5 * d_next
    d_next[0, 0, :3] = 0.0  # invalid: too small
    d_prev[1, 2, 2] = np.inf  # invalid ratio
    assert g.alignment_scale(d_prev, d_next) == pytest.approx(2.5)
    # even count: lower middle element (PyTorch median)
    assert g.alignment_scale([1.0, 2.0, 3.0, 4.0], [1.0, 1.0, 1.0, 1.0]) == 2.0
    assert g.alignment_scale([1e9], [1.0]) == 1e3
    assert g.alignment_scale([1.0], [0.0]) == 1.0  # nothing valid
