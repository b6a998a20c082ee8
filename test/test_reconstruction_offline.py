"""``lingbot_map_offline --with-depth --ply --colmap`` on the tiny preset, checked against an
independent float64 unprojection of the depth and poses the tool itself saved."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from map_files import quat_wxyz_to_matrix, read_colmap, read_ply
from PIL import Image

from lingbot_map_ros.tools import offline


@pytest.mark.slow
def test_offline_depth_ply_and_colmap(tmp_path):
    n, h, w, stride = 5, 28, 42, 3
    frames = torch.rand(n, 3, h, w, generator=torch.Generator().manual_seed(int(np.random.default_rng().integers(1e6))))
    npy = tmp_path / "frames.npy"
    np.save(npy, frames.numpy())
    out, ply, colmap = tmp_path / "r.npz", tmp_path / "map.ply", tmp_path / "colmap"
    rc = offline.main(["--frames", str(npy), "--model-preset", "tiny", "--device", "cpu", "--dtype", "float32",
                       "--attention-backend", "sdpa", "--scale-frames", "2", "--sliding-window", "3",
                       "--camera-iterations", "1", "--with-depth", "--ply", str(ply), "--colmap", str(colmap),
                       "--points-stride", str(stride), "--points-min-confidence", "0",
                       "--map-voxel-size", "1e-4", "--quiet", "--out", str(out)])
    assert rc == 0
    r = np.load(out)
    assert r["depth"].shape == (n, h, w) and r["depth_conf"].shape == (n, h, w)
    assert r["depth"].dtype == np.float32 and np.all(r["depth"] > 0) and r["has_depth"].all()

    cams, images, points = read_colmap(colmap)
    assert len(cams) == len(images) == n
    # the exported intrinsics: the raw ones, with a focal length outside a 1..170 deg FoV clamped
    # (the tiny random head often outputs FoV 0 = infinite focal length)
    used = {}
    for i in range(1, n + 1):
        s = int(images[i][3].split("_")[1].split(".")[0])
        fx, fy, cx, cy = cams[images[i][2]][3]
        raw = r["intrinsics"][s]
        for f, f_raw, size in ((fx, raw[0, 0], w), (fy, raw[1, 1], h)):
            lo, hi = (size / 2) / np.tan(np.radians(170) / 2), (size / 2) / np.tan(np.radians(1) / 2)
            assert f == pytest.approx(min(max(f_raw, lo), hi) if f_raw > 0 else lo, rel=1e-12)
        assert (cx - 0.5, cy - 0.5) == (raw[0, 2], raw[1, 2])
        used[s] = np.array([[fx, 0, cx - 0.5], [0, fy, cy - 0.5], [0, 0, 1.0]])

    # independent reference: every strided pixel of every frame, float64
    ref_xyz, ref_rgb = [], []
    img = frames.numpy()
    for s in range(n):
        k, c2w = used[s], r["c2w"][s]
        v, u = np.mgrid[0:h:stride, 0:w:stride]
        d = r["depth"][s][v, u].astype(np.float64)
        cam = np.stack([(u - k[0, 2]) / k[0, 0] * d, (v - k[1, 2]) / k[1, 1] * d, d], -1).reshape(-1, 3)
        ref_xyz.append(cam @ c2w[:3, :3].T + c2w[:3, 3])
        ref_rgb.append(np.rint(img[s][:, v, u].reshape(3, -1).T.astype(np.float32) * np.float32(255)))
    ref_xyz, ref_rgb = np.concatenate(ref_xyz), np.concatenate(ref_rgb)

    _, vert = read_ply(ply)
    got = np.stack([vert["x"], vert["y"], vert["z"]], 1).astype(np.float64)
    # 1e-4 voxels: a reference point shares one only with another closer than the voxel's diagonal (the
    # tiny random model sometimes gives two frames nearly the same pose and depth); the map fuses such
    # points into their weighted mean, and keeps every other point alone, where it was. The checks below
    # hold for any share of points alone; the guard only keeps the exact one-to-one part meaningful
    # (about one random scene in ten has 85-97 % of its points alone, the rest all of them)
    diagonal = np.sqrt(3) * 1e-4
    pair = np.linalg.norm(ref_xyz[:, None, :] - ref_xyz[None, :, :], axis=-1)  # [R, R]
    np.fill_diagonal(pair, np.inf)
    alone = pair.min(axis=1) > diagonal  # [R]
    assert alone.mean() > 0.5, "the scene is too crowded for this test's 1e-4 voxels"
    dist = np.linalg.norm(ref_xyz[:, None, :] - got[None, :, :], axis=-1)  # [R, G]
    nearest = dist.argmin(axis=1)
    reach = dist[np.arange(len(ref_xyz)), nearest]  # [R]
    assert np.max(reach[alone]) < 1e-4 and np.max(reach, initial=0.0) < diagonal
    assert len(set(nearest[alone].tolist())) == alone.sum()  # one to one for the points alone
    assert alone.sum() < len(got) <= len(ref_xyz) or len(got) == len(ref_xyz) == alone.sum()
    got_rgb = np.stack([vert["red"], vert["green"], vert["blue"]], 1)
    np.testing.assert_array_equal(got_rgb[nearest[alone]], ref_rgb[alone])

    assert len(points) == len(got)
    for i in range(1, n + 1):
        q, t, cam_id, name, _ = images[i]
        png = np.asarray(Image.open(colmap / "images" / name))
        assert png.shape == (h, w, 3)
        s = int(name.split("_")[1].split(".")[0])
        np.testing.assert_array_equal(png, np.rint(img[s].transpose(1, 2, 0) * np.float32(255)).astype(np.uint8))
        np.testing.assert_allclose(quat_wxyz_to_matrix(q), r["c2w"][s][:3, :3].T, atol=1e-9)
        assert cams[cam_id][1:3] == (w, h)


def test_offline_depth_every_saves_the_depth_of_the_frames_it_ran_on(tmp_path):
    """--depth-every 2: the depth rows are those of the scale frames and frames 0, 2, 4, ...; has_depth
    says which; poses and the rows equal those of a run with depth on every frame."""
    n = 7
    frames = torch.rand(n, 3, 28, 42, generator=torch.Generator().manual_seed(9))
    npy = tmp_path / "frames.npy"
    np.save(npy, frames.numpy())
    saved = {}
    for every in (1, 2):
        out = tmp_path / f"every{every}.npz"
        rc = offline.main(["--frames", str(npy), "--model-preset", "tiny", "--device", "cpu", "--dtype", "float32",
                           "--attention-backend", "sdpa", "--scale-frames", "3", "--sliding-window", "3",
                           "--camera-iterations", "1", "--with-depth", "--depth-every", str(every), "--quiet",
                           "--out", str(out)])
        assert rc == 0
        saved[every] = np.load(out)
    has = saved[2]["has_depth"]
    assert has.tolist() == [True, True, True, False, True, False, True]
    assert saved[2]["depth"].shape == (int(has.sum()), 28, 42)
    np.testing.assert_array_equal(saved[2]["pose_enc"], saved[1]["pose_enc"])
    np.testing.assert_array_equal(saved[2]["depth"], saved[1]["depth"][has])
    np.testing.assert_array_equal(saved[2]["depth_conf"], saved[1]["depth_conf"][has])


def test_offline_rejects_out_of_range_reconstruction_options(tmp_path, capsys):
    npy = tmp_path / "f.npy"
    np.save(npy, np.zeros((2, 3, 28, 28), np.float32))
    rc = offline.main(["--frames", str(npy), "--model-preset", "tiny", "--ply", str(tmp_path / "m.ply"),
                       "--points-stride", "0", "--out", str(tmp_path / "r.npz")])
    assert rc == 2 and "--points-stride must be in [1, 64]" in capsys.readouterr().err
