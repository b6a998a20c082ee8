"""Reconstruction core and message builders against independent references.

* unprojection vs a float64 NumPy implementation written here from the convention (pixel centres
  at integer coordinates, depth = optical-axis z, X_world = R X_cam + t), on fresh random depth,
  intrinsics and poses, with invalid pixels mixed in;
* every point re-projects onto the pixel it came from, with that pixel's depth as its camera z;
* the voxel map vs a plain-Python dictionary model of the same rules, and bounded over 5000 frames;
* PLY and COLMAP files parsed back by the readers of ``map_files.py``;
* PointCloud2 / CameraInfo / confidence Image layouts read back field by field.
"""
from __future__ import annotations

import math
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from map_files import quat_wxyz_to_matrix, read_colmap, read_ply

from lingbot_map_ros.core.reconstruction import (
    PointBatch,
    VoxelMap,
    pack_rgb,
    point_records,
    unpack_rgb,
    unproject_depth,
    write_colmap_text,
    write_ply,
)


# ------------------------------------------------------------------------------------ helpers
def random_rotation(rng: np.random.Generator) -> np.ndarray:
    """Uniform random rotation (QR of a Gaussian matrix, sign-fixed, det +1)."""
    q, r = np.linalg.qr(rng.normal(size=(3, 3)))
    q = q * np.sign(np.diag(r))
    if np.linalg.det(q) < 0:
        q[:, 0] = -q[:, 0]
    return q


def random_camera(rng: np.random.Generator, h: int, w: int) -> tuple[np.ndarray, np.ndarray]:
    fov_w = rng.uniform(0.6, 2.2)
    k = np.eye(3)
    k[0, 0] = (w / 2) / math.tan(fov_w / 2)
    k[1, 1] = k[0, 0] * rng.uniform(0.8, 1.25)
    k[0, 2] = w / 2 + rng.uniform(-3, 3)
    k[1, 2] = h / 2 + rng.uniform(-3, 3)
    c2w = np.eye(4)
    c2w[:3, :3] = random_rotation(rng)
    c2w[:3, 3] = rng.uniform(-5, 5, 3)
    return k, c2w


def random_frame(rng: np.random.Generator, h: int, w: int, bad_fraction: float = 0.05):
    depth = rng.uniform(0.2, 20.0, (h, w)).astype(np.float32)
    conf = (1.0 + np.exp(rng.normal(0, 1.0, (h, w)))).astype(np.float32)
    n_bad = int(bad_fraction * h * w)
    for bad in (np.nan, np.inf, -np.inf, 0.0, -1.0):
        idx = rng.integers(0, h * w, n_bad)
        depth.reshape(-1)[idx] = bad
    conf.reshape(-1)[rng.integers(0, h * w, n_bad)] = np.nan
    image = rng.uniform(0, 1, (3, h, w)).astype(np.float32)
    return depth, conf, image


def reference_unprojection(depth, conf, image, k, c2w, stride, min_conf):
    """float64, explicit per-pixel formulas: (u, v) list, world points, colours, confidences."""
    h, w = depth.shape
    fx, fy, cx, cy = k[0, 0], k[1, 1], k[0, 2], k[1, 2]
    uv, pts, cols, confs = [], [], [], []
    for v in range(0, h, stride):
        for u in range(0, w, stride):
            d = float(depth[v, u])
            c = float(conf[v, u])
            if not (math.isfinite(d) and d > 0 and not math.isnan(c) and c >= min_conf):
                continue
            cam = np.array([(u - cx) / fx * d, (v - cy) / fy * d, d])
            uv.append((u, v))
            pts.append(c2w[:3, :3] @ cam + c2w[:3, 3])
            cols.append([int(np.rint(np.float32(image[ch, v, u]) * np.float32(255.0))) for ch in range(3)])  # half-even
            confs.append(c)
    return (np.array(uv, np.int64).reshape(-1, 2), np.array(pts).reshape(-1, 3),
            np.array(cols, np.int64).reshape(-1, 3), np.array(confs))


# ------------------------------------------------------------------------------------ unprojection
@pytest.mark.parametrize("stride,min_conf", [(1, 0.0), (3, 1.8), (4, 2.5)])
def test_unprojection_matches_float64_reference(stride, min_conf):
    rng = np.random.default_rng()  # fresh inputs every run
    h, w = int(rng.integers(20, 60)), int(rng.integers(20, 70))
    depth, conf, image = random_frame(rng, h, w)
    k, c2w = random_camera(rng, h, w)
    batch = unproject_depth(torch.from_numpy(depth), k, c2w, confidence=conf, image=torch.from_numpy(image),
                            stride=stride, min_confidence=min_conf)
    uv, pts, cols, confs = reference_unprojection(depth, conf, image, k, c2w, stride, min_conf)
    assert len(batch) == len(uv) > 0
    np.testing.assert_array_equal(batch.pixel_uv.numpy(), uv)
    scale = np.abs(pts).max(axis=1, keepdims=True) + 1.0
    err = np.abs(batch.xyz.numpy().astype(np.float64) - pts) / scale
    assert err.max() < 5e-6, err.max()
    np.testing.assert_array_equal(batch.rgb.numpy().astype(np.int64), cols)
    np.testing.assert_allclose(batch.confidence.numpy(), confs, rtol=0, atol=0)
    assert batch.xyz.dtype == torch.float32 and batch.rgb.dtype == torch.uint8


def test_points_reproject_onto_their_pixel_depth():
    """World point -> camera (inverse pose, float64) -> K -> nearest pixel: its depth equals z."""
    rng = np.random.default_rng()
    h, w = 378, 518
    depth, conf, image = random_frame(rng, h, w, bad_fraction=0.01)
    k, c2w = random_camera(rng, h, w)
    batch = unproject_depth(depth, k, c2w, confidence=conf, image=image, stride=4, min_confidence=0.0)
    p = batch.xyz.numpy().astype(np.float64)
    cam = (p - c2w[:3, 3]) @ c2w[:3, :3]  # R^T (p - t) for row vectors
    assert np.all(cam[:, 2] > 0)
    u = np.rint(k[0, 0] * cam[:, 0] / cam[:, 2] + k[0, 2]).astype(np.int64)
    v = np.rint(k[1, 1] * cam[:, 1] / cam[:, 2] + k[1, 2]).astype(np.int64)
    np.testing.assert_array_equal(np.stack([u, v], 1), batch.pixel_uv.numpy())
    z_ref = depth[v, u].astype(np.float64)
    assert np.max(np.abs(cam[:, 2] - z_ref) / z_ref) <= 1e-4


def test_unprojection_bounds_and_identity_pose():
    rng = np.random.default_rng()
    h, w = 30, 40
    depth = rng.uniform(1, 2, (h, w)).astype(np.float32)
    k = np.array([[50.0, 0, w / 2], [0, 50.0, h / 2], [0, 0, 1]])
    full = unproject_depth(depth, k, np.eye(4))
    assert len(full) == h * w
    # identity pose: z is the depth itself, and the principal point pixel lies on the optical axis
    np.testing.assert_array_equal(full.xyz[:, 2].numpy(), depth.reshape(-1))
    centre = (full.pixel_uv[:, 0] == w // 2) & (full.pixel_uv[:, 1] == h // 2)
    np.testing.assert_array_equal(full.xyz[centre, :2].numpy(), np.zeros((1, 2), np.float32))
    few = unproject_depth(depth, k, np.eye(4), max_points=97)
    assert len(few) == 97
    assert set(map(tuple, few.pixel_uv.numpy())) <= set(map(tuple, full.pixel_uv.numpy()))
    assert len(unproject_depth(np.full((h, w), np.nan, np.float32), k, np.eye(4))) == 0
    with pytest.raises(ValueError):
        unproject_depth(depth, k, np.eye(4), stride=0)


def test_packed_rgb_round_trips_and_is_always_finite():
    every = torch.arange(1 << 24, dtype=torch.int32)
    rgb = torch.stack([(every >> 16) & 255, (every >> 8) & 255, every & 255], 1).to(torch.uint8)  # [2^24, 3]
    packed = pack_rgb(rgb).numpy()
    assert packed.dtype == np.float32 and np.all(np.isfinite(packed))
    np.testing.assert_array_equal(packed.view(np.uint32), every.numpy().astype(np.uint32))
    sample = np.random.default_rng().integers(0, 1 << 24, 1000)
    np.testing.assert_array_equal(unpack_rgb(packed[sample]), rgb.numpy()[sample])


def test_point_records_layout():
    rng = np.random.default_rng()
    n = 50
    b = PointBatch(torch.from_numpy(rng.normal(size=(n, 3)).astype(np.float32)),
                   torch.from_numpy(rng.integers(0, 256, (n, 3)).astype(np.uint8)),
                   torch.from_numpy(rng.uniform(1, 9, n).astype(np.float32)))
    rec = point_records(b)
    assert rec.shape == (n, 5) and rec.dtype == np.float32
    np.testing.assert_array_equal(rec[:, :3], b.xyz.numpy())
    np.testing.assert_array_equal(unpack_rgb(rec[:, 3]), b.rgb.numpy())
    np.testing.assert_array_equal(rec[:, 4], b.confidence.numpy())


# ------------------------------------------------------------------------------------ voxel map
class ReferenceVoxelMap:
    """The VoxelMap rules written as a dictionary of voxels, one point at a time."""

    def __init__(self, voxel: float, max_points: int):
        self.voxel, self.max_points, self.seq = voxel, max_points, 0
        self.v: dict = {}

    def add(self, xyz, rgb, conf):
        self.seq += 1
        for p, c, q in zip(xyz.astype(np.float64), rgb.astype(np.float64), conf.astype(np.float64)):
            key = tuple(int(math.floor(x / self.voxel)) for x in p)
            wgt = min(max(q, 1e-6), 1e3)
            e = self.v.setdefault(key, {"w": 0.0, "p": np.zeros(3), "c": np.zeros(3), "conf": -math.inf, "seen": 0})
            e["w"] += wgt
            e["p"] += wgt * p
            e["c"] += wgt * c
            e["conf"] = max(e["conf"], q)
            e["seen"] = self.seq
        if len(self.v) > self.max_points:
            # drop by (last seen, confidence) ascending; ties beyond that: by voxel key (stable sort of keys)
            order = sorted(sorted(self.v), key=lambda kk: (self.v[kk]["seen"], self.v[kk]["conf"]))
            for kk in order[: len(self.v) - self.max_points]:
                del self.v[kk]


def test_voxel_map_matches_dictionary_reference():
    rng = np.random.default_rng()
    voxel, cap = 0.25, 60
    vm, ref = VoxelMap(voxel, cap), ReferenceVoxelMap(voxel, cap)
    for frame in range(12):
        n = int(rng.integers(10, 40))
        centre = np.array([frame * 0.5, 0.0, 0.0])  # a moving camera: old voxels fall out
        xyz = (centre + rng.uniform(-1, 1, (n, 3))).astype(np.float32)
        rgb = rng.integers(0, 256, (n, 3)).astype(np.uint8)
        conf = rng.uniform(1, 5, n).astype(np.float32)
        vm.add(PointBatch(torch.from_numpy(xyz), torch.from_numpy(rgb), torch.from_numpy(conf)))
        vm.flush()
        ref.add(xyz, rgb, conf)
        assert len(vm) == len(ref.v) <= cap
    got = {tuple(k): i for i, k in enumerate(vm.voxel_indices().tolist())}
    assert set(got) == set(ref.v)
    pts = vm.points()
    seen = vm.last_seen().numpy()
    for key, i in got.items():
        e = ref.v[key]
        np.testing.assert_allclose(pts.xyz[i].numpy(), e["p"] / e["w"], rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(pts.rgb[i].numpy(), np.clip(np.rint(e["c"] / e["w"]), 0, 255))
        assert pts.confidence[i].item() == pytest.approx(e["conf"], rel=1e-6)
        assert seen[i] == e["seen"]
        # every fused point stays inside its voxel
        assert np.all(np.floor(pts.xyz[i].numpy().astype(np.float64) / voxel) == np.array(key))


def test_voxel_map_queue_reset_and_out_of_range():
    vm = VoxelMap(1.0, 10)
    far = torch.tensor([[1e9, 0, 0], [0.5, 0.5, 0.5], [float("nan"), 0, 0]], dtype=torch.float32)
    vm.add(PointBatch(far, torch.zeros(3, 3, dtype=torch.uint8), torch.ones(3)))
    assert vm.pending_points == 1 and vm.dropped_out_of_range == 1
    assert len(vm) == 1 and vm.pending_points == 0
    vm.reset()
    assert len(vm) == 0 and vm.dropped_out_of_range == 0
    with pytest.raises(ValueError):
        VoxelMap(0.0, 10)
    assert vm.configure(2.0, 10) is True and vm.configure(2.0, 20) is False


@pytest.mark.slow
def test_voxel_map_bounded_over_5000_frames():
    """A camera sweeping new space for 5000 frames: the map holds exactly max_points voxels once full
    and its tensors (map + queue) never grow past a fixed byte budget."""
    rng = np.random.default_rng()
    cap, per_frame = 4000, 300
    vm = VoxelMap(0.05, cap)
    budget = None
    sizes = []
    for frame in range(5000):
        centre = np.array([0.02 * frame, np.sin(frame / 50.0), 0.0])
        xyz = torch.from_numpy((centre + rng.uniform(-0.5, 0.5, (per_frame, 3))).astype(np.float32))
        vm.add(PointBatch(xyz, torch.zeros(per_frame, 3, dtype=torch.uint8), torch.full((per_frame,), 2.0)))
        assert vm.pending_points <= cap + per_frame
        if frame % 97 == 0:
            sizes.append(len(vm))
            nbytes = vm.nbytes()
            budget = budget or 48 * (2 * cap + per_frame)  # 48 bytes per voxel/queued point, map + queue
            assert nbytes <= budget, (frame, nbytes)
    assert len(vm) == cap
    assert max(sizes) <= cap and sizes[-1] == cap
    assert vm.evicted > 0
    # what is left is the recent part of the sweep: every voxel was seen in the last frames
    assert vm.last_seen().min().item() > 5000 - 100


# ------------------------------------------------------------------------------------ files
def test_ply_round_trip(tmp_path):
    rng = np.random.default_rng()
    n = int(rng.integers(1, 500))
    xyz = rng.normal(size=(n, 3)).astype(np.float32)
    rgb = rng.integers(0, 256, (n, 3)).astype(np.uint8)
    conf = rng.uniform(1, 10, n).astype(np.float32)
    path = tmp_path / "sub" / "map.ply"
    assert write_ply(path, torch.from_numpy(xyz), rgb, conf, comment="test map") == n
    meta, v = read_ply(path)
    assert meta["comments"] == ["comment test map"]
    np.testing.assert_array_equal(np.stack([v["x"], v["y"], v["z"]], 1), xyz)
    np.testing.assert_array_equal(np.stack([v["red"], v["green"], v["blue"]], 1), rgb)
    np.testing.assert_array_equal(v["confidence"], conf)
    assert [p.name for p in path.parent.iterdir()] == ["map.ply"]  # no temporary file left behind
    write_ply(path, np.zeros((0, 3)))
    assert len(read_ply(path)[1]) == 0


def test_colmap_text_round_trip_and_projection(tmp_path):
    rng = np.random.default_rng()
    h, w, s = 42, 56, 5
    poses, ks, names = [], [], []
    for i in range(s):
        k, c2w = random_camera(rng, h, w)
        poses.append(c2w)
        ks.append(k)
        names.append(f"frame_{i:06d}.png")
    depth, conf, image = random_frame(rng, h, w, bad_fraction=0.0)
    pts = unproject_depth(depth, ks[2], poses[2], confidence=conf, image=image, stride=7)
    write_colmap_text(tmp_path, np.stack(poses), np.stack(ks), (h, w), names, pts.xyz, pts.rgb)
    cams, images, points = read_colmap(tmp_path)
    assert sorted(cams) == sorted(images) == list(range(1, s + 1))
    for i in range(1, s + 1):
        model, cw, ch, params = cams[i]
        k = ks[i - 1]
        assert (model, cw, ch) == ("PINHOLE", w, h)
        np.testing.assert_allclose(params, [k[0, 0], k[1, 1], k[0, 2] + 0.5, k[1, 2] + 0.5], rtol=1e-15)
        q, t, cam_id, name, pts2d = images[i]
        assert cam_id == i and name == names[i - 1] and pts2d.strip() == ""
        r_cw = quat_wxyz_to_matrix(q)
        # world-to-camera: R_cw R_c2w = I, t_cw = -R_cw c
        np.testing.assert_allclose(r_cw @ poses[i - 1][:3, :3], np.eye(3), atol=1e-12)
        np.testing.assert_allclose(t, -r_cw @ poses[i - 1][:3, 3], atol=1e-12)
    assert len(points) == len(pts)
    # COLMAP's projection of each point into image 3 (its source) lands on the pixel centre u+0.5, v+0.5
    q, t, cam_id, _, _ = images[3]
    fx, fy, cx, cy = cams[cam_id][3]
    r_cw = quat_wxyz_to_matrix(q)
    for j, (xyz, rgb, err, track) in points.items():
        c = r_cw @ np.array(xyz) + np.array(t)
        u, v = pts.pixel_uv[j - 1].tolist()
        assert fx * c[0] / c[2] + cx == pytest.approx(u + 0.5, abs=2e-3)
        assert fy * c[1] / c[2] + cy == pytest.approx(v + 0.5, abs=2e-3)
        assert rgb == pts.rgb[j - 1].tolist() and err == 0.0 and track == []
    with pytest.raises(ValueError):
        write_colmap_text(tmp_path, np.stack(poses), np.stack(ks), (h, w), ["a b"] * s)


# ------------------------------------------------------------------------------------ ROS builders


def read_point_cloud2(msg) -> dict:
    """Every field of a PointCloud2 read back by its own offset/datatype (no helper library)."""
    fmt = {7: "f", 8: "d", 2: "B", 6: "I"}
    endian = ">" if msg.is_bigendian else "<"
    data = bytes(msg.data)
    assert len(data) == msg.row_step * msg.height
    out = {}
    for f in msg.fields:
        code = endian + fmt[f.datatype]
        size = struct.calcsize(code)
        vals = [struct.unpack_from(code, data, r * msg.row_step + i * msg.point_step + f.offset)[0]
                for r in range(msg.height) for i in range(msg.width)]
        out[f.name] = np.array(vals)
        assert f.offset + size * f.count <= msg.point_step
    return out


def test_point_cloud2_layout_read_back():
    pytest.importorskip("sensor_msgs.msg")  # the ROS builders need the message packages
    from builtin_interfaces.msg import Time

    from lingbot_map_ros.ros.reconstruction import point_cloud2

    rng = np.random.default_rng()
    n = int(rng.integers(1, 300))
    b = PointBatch(torch.from_numpy(rng.normal(size=(n, 3)).astype(np.float32)),
                   torch.from_numpy(rng.integers(0, 256, (n, 3)).astype(np.uint8)),
                   torch.from_numpy(rng.uniform(1, 9, n).astype(np.float32)))
    msg = point_cloud2(point_records(b), Time(sec=5, nanosec=7), "w")
    assert msg.header.frame_id == "w" and (msg.header.stamp.sec, msg.header.stamp.nanosec) == (5, 7)
    assert [(f.name, f.offset, f.datatype, f.count) for f in msg.fields] == [
        ("x", 0, 7, 1), ("y", 4, 7, 1), ("z", 8, 7, 1), ("rgb", 12, 7, 1), ("confidence", 16, 7, 1)]
    assert (msg.height, msg.width, msg.point_step, msg.row_step) == (1, n, 20, 20 * n)
    assert msg.is_dense is True and msg.is_bigendian is False
    f = read_point_cloud2(msg)
    np.testing.assert_array_equal(np.stack([f["x"], f["y"], f["z"]], 1).astype(np.float32), b.xyz.numpy())
    np.testing.assert_array_equal(unpack_rgb(f["rgb"].astype(np.float32)), b.rgb.numpy())
    np.testing.assert_array_equal(f["confidence"].astype(np.float32), b.confidence.numpy())
    with pytest.raises(ValueError):
        point_cloud2(np.full((1, 5), np.nan, np.float32), Time(), "w")
    empty = point_cloud2(np.zeros((0, 5), np.float32), Time(), "w")  # an emptied map
    assert (empty.width, empty.row_step, len(empty.data), empty.point_step) == (0, 0, 0, 20)


def test_camera_info_and_confidence_image():
    pytest.importorskip("sensor_msgs.msg")  # the ROS builders need the message packages
    from builtin_interfaces.msg import Time

    from lingbot_map_ros.ros.reconstruction import camera_info, confidence_image

    rng = np.random.default_rng()
    h, w = 40, 60
    k, _ = random_camera(rng, h, w)
    info = camera_info(k, (h, w), Time(sec=3), "cam")
    assert (info.height, info.width, info.header.frame_id, info.header.stamp.sec) == (h, w, "cam", 3)
    np.testing.assert_array_equal(np.array(info.k).reshape(3, 3), k)
    p = np.array(info.p).reshape(3, 4)
    np.testing.assert_array_equal(p[:, :3], k)
    np.testing.assert_array_equal(p[:, 3], 0)
    assert info.distortion_model == "plumb_bob" and list(info.d) == [0.0] * 5
    np.testing.assert_array_equal(np.array(info.r).reshape(3, 3), np.eye(3))

    conf = rng.uniform(1, 3, (h, w)).astype(np.float32)
    conf[0, 0], conf[1, 1], conf[2, 2] = np.nan, np.inf, -np.inf
    img = confidence_image(conf, Time(sec=3), "cam")
    assert (img.encoding, img.height, img.width, img.step) == ("32FC1", h, w, 4 * w)
    back = np.frombuffer(bytes(img.data), "<f4").reshape(h, w)
    assert np.all(np.isfinite(back))
    assert back[0, 0] == 0 and back[1, 1] == np.finfo(np.float32).max and back[2, 2] == 0
    np.testing.assert_array_equal(back[3:], conf[3:])


# ------------------------------------------------------------------------------------ RViz config
def test_rviz_config_has_the_displays_by_name():
    import yaml

    cfg = yaml.safe_load((Path(__file__).resolve().parents[1] / "config" / "lingbot_map.rviz").read_text())
    vm = cfg["Visualization Manager"]
    assert vm["Global Options"]["Fixed Frame"] == "lingbot_world"
    displays = {d["Name"]: d for d in vm["Displays"]}
    expected = {"TF": ("rviz_default_plugins/TF", None),
                "Path": ("rviz_default_plugins/Path", "/lingbot_map/path"),
                "Pose": ("rviz_default_plugins/Pose", "/lingbot_map/pose"),
                "Points": ("rviz_default_plugins/PointCloud2", "/lingbot_map/points"),
                "Map": ("rviz_default_plugins/PointCloud2", "/lingbot_map/map_points"),
                "Depth": ("rviz_default_plugins/Image", "/lingbot_map/depth")}
    for name, (cls, topic) in expected.items():
        d = displays[name]
        assert d["Class"] == cls and d["Enabled"] is True
        if topic is not None:
            assert d["Topic"]["Value"] == topic
    # the map is latched (transient local) on the node's side; the clouds carry packed rgb
    assert displays["Map"]["Topic"]["Durability Policy"] == "Transient Local"
    assert displays["Points"]["Color Transformer"] == displays["Map"]["Color Transformer"] == "RGB8"


def test_bench_points_runs_and_reports_every_step():
    from lingbot_map_ros.tools.bench_points import run

    rows = run("cpu", 42, 56, [2, 4], frames=4, map_max_points=500, voxel=0.01, merge_every=2)
    steps = {(r[0], r[2]) for r in rows}
    for stride in (2, 4):
        for step in ("unproject", "records", "message", "points total", "map add", "map merge"):
            assert (stride, step) in steps
    points = {r[0]: r[1] for r in rows}
    assert points == {2: 21 * 28, 4: 11 * 14}  # every pixel valid in the benchmark's input
    assert all(r[3] >= 0 for r in rows if not r[2].startswith("map size"))
    assert all(r[3] <= 500 for r in rows if r[2].startswith("map size"))


def test_launch_rviz_argument(tmp_path, monkeypatch):
    """rviz:=false (default) adds nothing; rviz:=true starts rviz2 with the package's config where the
    ament index has rviz2, and logs that it is missing where it has not."""
    pytest.importorskip("launch")
    pytest.importorskip("launch_ros")
    import importlib.util

    from launch.actions import DeclareLaunchArgument, LogInfo
    from launch_ros.actions import Node

    from launch import LaunchContext

    path = Path(__file__).resolve().parents[1] / "launch" / "lingbot_map.launch.py"
    spec = importlib.util.spec_from_file_location("lingbot_launch_under_test", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    args = {e.name: e for e in mod.generate_launch_description().entities if isinstance(e, DeclareLaunchArgument)}
    assert args["rviz"].default_value[0].text == "false"
    assert (Path(__file__).resolve().parents[1] / mod.RVIZ_CONFIG).is_file()

    def actions(value: str, prefix: Path):
        monkeypatch.setenv("AMENT_PREFIX_PATH", str(prefix))
        ctx = LaunchContext()
        ctx.launch_configurations["rviz"] = value
        ctx.launch_configurations["world_frame"] = mod.RVIZ_FIXED_FRAME  # the config's own fixed frame
        return mod._rviz(ctx)

    empty = tmp_path / "empty_prefix"
    empty.mkdir()
    assert actions("false", empty) == []
    missing = actions("true", empty)
    assert len(missing) == 1 and isinstance(missing[0], LogInfo)
    fake = tmp_path / "prefix"
    (fake / "share" / "ament_index" / "resource_index" / "packages").mkdir(parents=True)
    (fake / "share" / "ament_index" / "resource_index" / "packages" / "rviz2").write_text("")
    (fake / "share" / "rviz2").mkdir()
    (fake / "share" / "ament_index" / "resource_index" / "packages" / "lingbot_map_ros").write_text("")
    (fake / "share" / "lingbot_map_ros").mkdir()
    started = actions("true", fake)
    assert len(started) == 1 and isinstance(started[0], Node)
    assert started[0].node_executable == "rviz2"


def test_point_batch_from_records_round_trip():
    rng = np.random.default_rng()
    n = 64
    b = PointBatch(torch.from_numpy(rng.normal(size=(n, 3)).astype(np.float32)),
                   torch.from_numpy(rng.integers(0, 256, (n, 3)).astype(np.uint8)),
                   torch.from_numpy(rng.uniform(1, 9, n).astype(np.float32)))
    back = PointBatch.from_records(point_records(b))
    for a, c in ((b.xyz, back.xyz), (b.rgb, back.rgb), (b.confidence, back.confidence)):
        assert torch.equal(a, c)


@pytest.mark.gpu
def test_unprojection_on_cuda_matches_cpu():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    rng = np.random.default_rng()
    h, w = 96, 128
    depth, conf, image = random_frame(rng, h, w)
    k, c2w = random_camera(rng, h, w)
    for _ in range(3):  # the pinned staging buffers are reused from frame to frame
        cpu = unproject_depth(depth, k, c2w, confidence=conf, image=image, stride=3, min_confidence=1.5)
        gpu = unproject_depth(depth, k, c2w, confidence=conf, image=image, stride=3, min_confidence=1.5,
                              device="cuda")
        assert torch.equal(cpu.pixel_uv, gpu.pixel_uv.cpu()) and torch.equal(cpu.rgb, gpu.rgb.cpu())
        torch.testing.assert_close(gpu.xyz.cpu(), cpu.xyz, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(point_records(gpu)[:, 3:], point_records(cpu)[:, 3:])
        depth, conf, image = random_frame(rng, h, w)
