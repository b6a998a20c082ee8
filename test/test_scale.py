"""The metric scale (core/scale.py) and the robot-frame algebra (core/geometry.py's last section), without ROS.

References are independent: brute-force pixel loops for the depth grid, float64 matrix products
written out for the frame algebra, and the scale laws themselves (a sensor k times the model gives
k, a second lock keeps the anchor where it was, ...). Inputs are fresh random data.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from lingbot_map_ros.core.config import MODEL_WIDTH_PX, model_input_height
from lingbot_map_ros.core.geometry import (
    body_pose,
    body_twist,
    odom_correction,
    pose_difference,
    quaternion_to_matrix,
    quaternion_xyzw_from_matrix,
    relative_pose,
    rotation_vector,
    scale_pose,
    se3,
    transform_matrix,
)
from lingbot_map_ros.core.scale import (
    DEPTH_SAMPLE_STRIDE,
    ESTIMATING,
    LOCKED,
    MODEL_UNITS,
    RE_ESTIMATING,
    DepthSample,
    MetricMap,
    ScaleEstimator,
    depth_grid_indices,
    depth_ratio,
    model_depth_grid,
)


def random_pose(rng: np.random.Generator, scale: float = 1.0) -> np.ndarray:
    q = rng.normal(size=4)
    return se3(quaternion_to_matrix(q / np.linalg.norm(q)), rng.normal(size=3) * scale)


def inverse_by_solve(m: np.ndarray) -> np.ndarray:
    return np.linalg.solve(m, np.eye(4))


# ------------------------------------------------------------------------------------------- geometry
def test_frame_algebra_against_plain_matrix_products():
    rng = np.random.default_rng(1)
    for _ in range(20):
        cam, ext, odom_base = random_pose(rng), random_pose(rng, 0.3), random_pose(rng, 5.0)
        body = body_pose(cam, ext)
        np.testing.assert_allclose(body, cam @ inverse_by_solve(ext), atol=1e-12)
        np.testing.assert_allclose(body @ ext, cam, atol=1e-12)  # T_w_base T_base_cam = T_w_cam
        ref = random_pose(rng)
        np.testing.assert_allclose(relative_pose(ref, cam), inverse_by_solve(ref) @ cam, atol=1e-12)
        np.testing.assert_allclose(relative_pose(cam, cam), np.eye(4), atol=1e-12)
        w_odom = odom_correction(body, odom_base)
        np.testing.assert_allclose(w_odom @ odom_base, body, atol=1e-11)  # map -> odom -> base = the estimate


def test_transform_matrix_normalises_and_matches_the_quaternion():
    rng = np.random.default_rng(2)
    for _ in range(10):
        rot = random_pose(rng)[:3, :3]
        q = quaternion_xyzw_from_matrix(rot) * rng.uniform(0.5, 2.0)  # a non-unit quaternion, same rotation
        t = rng.normal(size=3)
        m = transform_matrix(t, q)
        np.testing.assert_allclose(m[:3, :3], rot, atol=1e-12)
        np.testing.assert_allclose(m[:3, 3], t)
        np.testing.assert_allclose(m[:3, :3] @ m[:3, :3].T, np.eye(3), atol=1e-12)


def test_scale_pose_keeps_rotation_and_scales_position():
    rng = np.random.default_rng(3)
    p = random_pose(rng)
    k, b = 2.5, rng.normal(size=3)
    s = scale_pose(p, k, b)
    np.testing.assert_array_equal(s[:3, :3], p[:3, :3])
    np.testing.assert_allclose(s[:3, 3], k * p[:3, 3] + b)


def test_rotation_vector_and_twist_of_a_constant_motion():
    rng = np.random.default_rng(4)
    for angle in (0.0, 1e-9, 0.3, 2.0, math.pi - 1e-6):
        axis = rng.normal(size=3)
        axis /= np.linalg.norm(axis)
        k = np.array([[0, -axis[2], axis[1]], [axis[2], 0, -axis[0]], [-axis[1], axis[0], 0]])
        rot = np.eye(3) + math.sin(angle) * k + (1 - math.cos(angle)) * k @ k  # Rodrigues
        np.testing.assert_allclose(rotation_vector(rot), axis * angle, atol=1e-9)
    # a body moving 0.5 m/s forward while yawing 0.2 rad/s, sampled 0.1 s apart
    start = random_pose(rng)
    dt, v, w = 0.1, 0.5, 0.2
    yaw = np.array([[math.cos(w * dt), -math.sin(w * dt), 0], [math.sin(w * dt), math.cos(w * dt), 0], [0, 0, 1]])
    step = se3(yaw, yaw @ np.array([v * dt, 0, 0]))  # motion in the body frame, translation seen at the end
    lin, ang = body_twist(start, start @ step, dt)
    np.testing.assert_allclose(lin, [v, 0, 0], atol=1e-12)
    np.testing.assert_allclose(ang, [0, 0, w], atol=1e-12)
    with pytest.raises(ValueError):
        body_twist(start, start, 0.0)


def test_pose_difference():
    rng = np.random.default_rng(5)
    a = random_pose(rng)
    rot = quaternion_to_matrix([0, 0, math.sin(0.05), math.cos(0.05)])  # 0.1 rad about z
    b = a @ se3(rot, [0.0, 0.0, 0.0])
    b[:3, 3] += [0.03, 0.04, 0.0]
    dist, angle = pose_difference(a, b)
    assert dist == pytest.approx(0.05) and angle == pytest.approx(0.1)


# ------------------------------------------------------------------------------------------- depth grid
@pytest.mark.parametrize("colour_wh,depth_wh", [((640, 480), (640, 480)), ((640, 480), (320, 240)),
                                                ((518, 392), (518, 392)), ((480, 640), (480, 640)),
                                                ((1280, 720), (848, 477))])
def test_depth_grid_maps_model_pixels_to_the_sensor_pixel_under_them(colour_wh, depth_wh):
    rows, cols = depth_grid_indices(colour_wh, depth_wh)
    w0, h0 = colour_wh
    wd, hd = depth_wh
    new_h = model_input_height(w0, h0)
    model_h = min(new_h, MODEL_WIDTH_PX)
    crop = (new_h - model_h) // 2
    s = DEPTH_SAMPLE_STRIDE
    # brute force: the model pixel's centre in the resized-then-cropped image, back into the camera
    # image's continuous coordinates, then the depth pixel containing it
    want_rows = [min(int(((i + crop + 0.5) * h0 / new_h) * hd / h0), hd - 1) for i in range(s // 2, model_h, s)]
    want_cols = [min(int(((j + 0.5) * w0 / MODEL_WIDTH_PX) * wd / w0), wd - 1)
                 for j in range(s // 2, MODEL_WIDTH_PX, s)]
    assert rows.tolist() == want_rows and cols.tolist() == want_cols
    depth = np.zeros((model_h, MODEL_WIDTH_PX), np.float32)
    assert model_depth_grid(depth).shape == (len(rows), len(cols))


def test_depth_grid_refuses_another_aspect_ratio():
    with pytest.raises(ValueError, match="aspect ratio"):
        depth_grid_indices((640, 480), (640, 360))


def test_depth_ratio_is_the_median_over_valid_pixels():
    rng = np.random.default_rng(6)
    model = rng.uniform(0.5, 2.0, size=(98, 130)).astype(np.float32)
    k = 2.5
    sensor = (k * model * (1 + 0.01 * rng.standard_normal(model.shape))).astype(np.float32)
    holes = rng.random(model.shape) < 0.2
    sensor[holes] = 0.0
    sensor[rng.random(model.shape) < 0.05] = np.nan
    sensor[0, :5] = 100.0  # beyond the sensor's range
    model_bad = model.copy()
    model_bad[1, :5] = 0.0
    sample = depth_ratio(sensor, model_bad)
    valid = np.isfinite(sensor) & (sensor >= 0.1) & (sensor <= 30.0) & (model_bad > 1e-6)
    assert sample.ratio == pytest.approx(float(np.median(sensor[valid] / model_bad[valid])), rel=1e-6)
    assert sample.ratio == pytest.approx(k, rel=2e-3)
    assert sample.valid_fraction == pytest.approx(valid.mean())
    empty = depth_ratio(np.zeros_like(sensor), model)
    assert empty.ratio is None and "valid" in empty.reason


# ------------------------------------------------------------------------------------------- estimator
def test_model_and_fixed_sources():
    m = ScaleEstimator("model")
    assert m.map is not None and m.map.factor == 1.0 and m.status().state == MODEL_UNITS
    assert not m.status().metric and not m.wants_depth
    f = ScaleEstimator("fixed", factor=0.37)
    assert f.map.factor == 0.37 and f.status().state == LOCKED and f.status().metric
    with pytest.raises(ValueError):
        ScaleEstimator("sonar")


def test_depth_scale_locks_when_the_last_samples_agree():
    rng = np.random.default_rng(7)
    est = ScaleEstimator("depth", min_samples=5)
    assert est.map is None and est.status().state == ESTIMATING and est.wants_depth
    est.add_depth(DepthSample(9.0, 1.0))  # an outlier first: the window of the last 5 must pass it
    est.miss("no depth partner: none")
    est.add_depth(DepthSample(None, 0.01, "1 % valid"))
    values = 2.5 * (1 + 0.005 * rng.standard_normal(5))
    for i, v in enumerate(values):
        assert est.map is None, f"locked after {i} good samples"
        est.add_depth(DepthSample(float(v), 0.9))
    status = est.status()
    assert status.state == LOCKED and est.map.factor == pytest.approx(float(np.median(values)))
    assert status.spread == pytest.approx(float(np.max(np.abs(values - np.median(values))) / np.median(values)))
    assert status.rejected == {"no depth partner": 1, "too few valid pixels": 1}
    assert not est.wants_depth  # locked: no more decoding
    np.testing.assert_array_equal(est.map.offset, np.zeros(3))


def test_depth_scale_that_never_agrees_says_why():
    est = ScaleEstimator("depth", min_samples=3)
    for v in [1.0, 2.0, 3.0] * 5:
        est.add_depth(DepthSample(v, 0.9))
    assert est.map is None
    assert "do not agree" in est.status().problem
    est2 = ScaleEstimator("depth", min_samples=3)
    for _ in range(20):
        est2.miss("no depth partner: no depth image paired with this keyframe")
    assert "no depth partner" in est2.status().problem


def test_window_switch_re_estimates_and_keeps_the_anchor_in_place():
    est = ScaleEstimator("depth", min_samples=2)
    for _ in range(2):
        est.add_depth(DepthSample(2.0, 1.0))
    first = est.map
    anchor = np.array([0.3, -1.0, 4.0])  # the new window's first position, in world units
    est.start_window(anchor)
    assert est.status().state == RE_ESTIMATING and est.map is first and est.wants_depth
    for _ in range(2):
        est.add_depth(DepthSample(2.2, 1.0))
    m = est.map
    assert m.factor == pytest.approx(2.2) and est.status().state == LOCKED and est.status().relocks == 1
    np.testing.assert_allclose(m.offset + m.factor * anchor, first.factor * anchor)  # no jump at the anchor
    x = np.array([1.0, 2.0, 3.0])  # motion after the anchor is measured with the new factor
    np.testing.assert_allclose((m.factor * x + m.offset) - (m.factor * anchor + m.offset), 2.2 * (x - anchor))
    pose = se3(np.eye(3), x)
    np.testing.assert_allclose(m.pose(pose)[:3, 3], m.factor * x + m.offset)
    est.start_session()  # a new session is a new unit: nothing metric again
    assert est.map is None and est.status().relocks == 0


def test_metric_map_continued_chain():
    a = MetricMap(2.0)
    b = a.continued(3.0, np.array([1.0, 0.0, 0.0]))
    c = b.continued(1.5, np.array([2.0, 1.0, 0.0]))
    for m_prev, m_next, anchor in ((a, b, [1.0, 0, 0]), (b, c, [2.0, 1.0, 0])):
        p = np.array(anchor)
        np.testing.assert_allclose(m_prev.factor * p + m_prev.offset, m_next.factor * p + m_next.offset)


def test_odometry_travel_ratio():
    rng = np.random.default_rng(8)
    k = 2.5
    est = ScaleEstimator("odometry", min_travel=0.5)
    model = np.cumsum(rng.normal(scale=0.02, size=(200, 3)), axis=0)
    lever = np.array([0.1, 0.0, 0.2])
    locked_at = None
    for i, p in enumerate(model):
        est.add_positions(p, k * p, k * p - lever)
        if est.map is not None:
            locked_at = i
            break
    assert locked_at is not None
    steps = np.linalg.norm(np.diff(model[: locked_at + 1], axis=0), axis=1)
    assert k * steps.sum() >= 0.5 > k * steps[:-1].sum()  # locked at the frame the travel passed 0.5 m
    assert est.map.factor == pytest.approx(k, rel=1e-9)


def test_odometry_jump_is_left_out_and_zero_travel_never_locks():
    est = ScaleEstimator("odometry", min_travel=0.9)  # 30 steps of 3 cm: the jump at step 20 comes first
    pts = [np.array([0.01 * i, 0, 0]) for i in range(40)]
    odom = [3.0 * p for p in pts]
    odom[20:] = [o + np.array([5.0, 0, 0]) for o in odom[20:]]  # odometry reset: a 5 m jump
    for p, o in zip(pts, odom):
        est.add_positions(p, o, o)
    assert est.map.factor == pytest.approx(3.0, rel=1e-9)
    assert est.status().rejected == {"odometry jump": 1}
    assert est.status().travel_m == pytest.approx(0.9, rel=1e-9)
    still = ScaleEstimator("odometry", min_travel=0.5)
    for _ in range(150):
        still.add_positions(np.zeros(3), np.zeros(3), np.zeros(3))
    assert still.map is None and "travelled 0.00 m" in still.status().problem


def test_median_helper_matches_numpy():
    from lingbot_map_ros.core.scale import _median

    rng = np.random.default_rng(9)
    for n in (1, 2, 3, 10, 11, 1000):
        a = rng.normal(size=n)
        assert _median(a) == pytest.approx(float(np.median(a)), rel=0, abs=1e-15)
    assert math.isnan(_median([]))
