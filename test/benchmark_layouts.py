"""Small synthetic sequences in each benchmark dataset's published layout, with known trajectories.

Each writer puts images, stamps and ground truth in the dataset's own files and formats (written
here from the formats' descriptions, independently of the readers) and returns what a reader must
find: the image paths in order, the stamps, and the camera(optical)-to-world pose of every frame in
float64. Images are tiny (a few pixels high: the model input is then 518x14) unless a test needs a
dataset's real image size.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from lingbot_map_ros.core.geometry import quaternion_to_matrix, quaternion_xyzw_from_matrix, se3, se3_inverse


@dataclass
class Written:
    images: list[Path]
    stamps: np.ndarray  # [N]
    c2w: np.ndarray  # [N, 4, 4] the frames' true optical camera-to-world poses (NaN: none written)


def trajectory(n: int, seed: int = 0) -> np.ndarray:
    """A smooth camera path [n, 4, 4] (rotations off every axis, a curved translation)."""
    t = np.linspace(0.0, 2.0, n) + 0.1 * seed
    q = np.stack([0.1 * np.sin(t), 0.2 * np.cos(t), 0.05 * t, np.ones(n)], 1)
    return se3(quaternion_to_matrix(q), np.stack([np.sin(t), np.cos(2 * t), 0.3 * t + seed], 1))


def image(seed: int, hw: tuple[int, int] = (4, 148)) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (*hw, 3), dtype=np.uint8)


def save(path: Path, rgb: np.ndarray) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    assert cv2.imwrite(str(path), np.ascontiguousarray(rgb[:, :, ::-1]))
    return path


def tum_line(stamp: float, c2w: np.ndarray) -> str:
    q = quaternion_xyzw_from_matrix(c2w[:3, :3])
    return " ".join(f"{v:.17g}" for v in (stamp, *c2w[:3, 3], *q))


def write_tum(root: Path, name: str = "rgbd_dataset_freiburg1_xyz", n: int = 10, seed: int = 0,
              hw: tuple[int, int] = (4, 148), gt_offset: float = 0.0) -> Written:
    """``rgb/<stamp>.png`` at ~30 Hz and ``groundtruth.txt`` at 100 Hz (shifted by ``gt_offset`` s)."""
    seq = root / name
    stamps = np.round(1305031102.175 + np.arange(n) / 30.0 + 0.0013 * np.sin(np.arange(n)), 6)
    images = [save(seq / "rgb" / f"{s:.6f}.png", image(seed * 100 + i, hw)) for i, s in enumerate(stamps)]
    gt_stamps = np.round(stamps[0] - 0.05 + np.arange(int((stamps[-1] - stamps[0] + 0.1) * 100)) / 100.0, 4)
    gt_poses = trajectory(len(gt_stamps), seed)
    lines = ["# ground truth trajectory", "# timestamp tx ty tz qx qy qz qw"]
    lines += [tum_line(s + gt_offset, p) for s, p in zip(gt_stamps, gt_poses)]
    (seq / "groundtruth.txt").write_text("\n".join(lines) + "\n")
    (seq / "rgb.txt").write_text("".join(f"{s:.6f} rgb/{s:.6f}.png\n" for s in stamps))
    nearest = np.abs(stamps[:, None] - (gt_stamps[None, :] + gt_offset)).argmin(1)
    return Written(images, stamps, gt_poses[nearest])


def write_7scenes(root: Path, scene: str = "chess", sequences: tuple[int, ...] = (3, 5), n: int = 12,
                  hw: tuple[int, int] = (4, 148)) -> dict[str, Written]:
    """``chess/TestSplit.txt`` and ``chess/seq-0K/frame-NNNNNN.{color.png,pose.txt}``."""
    (root / scene).mkdir(parents=True, exist_ok=True)
    (root / scene / "TestSplit.txt").write_text("".join(f"sequence{k}\n" for k in sequences))
    (root / scene / "TrainSplit.txt").write_text("sequence1\n")
    out = {}
    for k in sequences:
        folder = root / scene / f"seq-{k:02d}"
        poses = trajectory(n, k)
        images = []
        for i in range(n):
            images.append(save(folder / f"frame-{i:06d}.color.png", image(k * 100 + i, hw)))
            (folder / f"frame-{i:06d}.pose.txt").write_text(
                "\n".join("\t".join(f"{v:.10e}" for v in row) for row in poses[i]) + "\n")
        out[f"{scene}/seq-{k:02d}"] = Written(images, np.arange(n, dtype=np.float64), poses)
    return out


def write_nrgbd(root: Path, scene: str = "breakfast_room", n: int = 12, hw: tuple[int, int] = (4, 148)) -> Written:
    """``images/imgN.png`` and ``poses.txt`` (4 lines per OpenGL camera-to-world matrix)."""
    poses = trajectory(n, 2)
    gl = poses @ np.diag([1.0, -1.0, -1.0, 1.0])  # the OpenGL camera: y up, looking down -z
    folder = root / scene
    images = [save(folder / "images" / f"img{i}.png", image(200 + i, hw)) for i in range(n)]
    (folder / "poses.txt").write_text("".join(" ".join(f"{v:.12f}" for v in row) + "\n" for m in gl for row in m))
    (folder / "focal.txt").write_text("554.2562584220408\n")
    return Written(images, np.arange(n, dtype=np.float64), poses)


def write_kitti(root: Path, seq: str = "05", n: int = 8, hw: tuple[int, int] = (4, 148)) -> Written:
    """``sequences/05/image_2/NNNNNN.png`` with ``times.txt`` and ``poses/05.txt`` (3x4 row-major)."""
    poses = trajectory(n, 5)
    folder = root / "sequences" / seq
    images = [save(folder / "image_2" / f"{i:06d}.png", image(500 + i, hw)) for i in range(n)]
    stamps = np.arange(n) * 0.103643
    (folder / "times.txt").write_text("".join(f"{s:.6e}\n" for s in stamps))
    (folder / "calib.txt").write_text("P2: 7.18e+02 0 6.07e+02 4.5e+01 0 7.18e+02 1.85e+02 -1.1e-01 0 0 1 3.7e-03\n")
    (root / "poses").mkdir(parents=True, exist_ok=True)
    (root / "poses" / f"{seq}.txt").write_text("".join(" ".join(f"{v:.9e}" for v in p[:3].reshape(-1)) + "\n"
                                                       for p in poses))
    return Written(images, stamps, poses)


def write_eth3d_published(root: Path, scene: str = "courtyard", n: int = 6, hw: tuple[int, int] = (4, 148)) -> Written:
    """``dslr_calibration_undistorted/images.txt`` (COLMAP text, world-to-camera) and the images."""
    poses = trajectory(n, 3)
    folder = root / scene
    names = [f"dslr_images_undistorted/DSC_{300 + 7 * i:04d}.JPG" for i in range(n)]
    images = [save(folder / "images" / nm, image(300 + i, hw)) for i, nm in enumerate(names)]
    lines = ["# Image list with two lines of data per image:",
             "#   IMAGE_ID, QW, QX, QY, QZ, TX, TY, TZ, CAMERA_ID, NAME", "#   POINTS2D[] as (X, Y, POINT3D_ID)"]
    for k in reversed(range(n)):  # COLMAP lists images in any order
        w2c = se3_inverse(poses[k])
        qx, qy, qz, qw = quaternion_xyzw_from_matrix(w2c[:3, :3])
        lines.append(" ".join(str(v) for v in (k + 1, qw, qx, qy, qz, *w2c[:3, 3], 1, names[k])))
        lines.append("" if k % 2 else "12.5 40.25 -1 100.0 30.0 17")
    (folder / "dslr_calibration_undistorted").mkdir(parents=True, exist_ok=True)
    (folder / "dslr_calibration_undistorted" / "images.txt").write_text("\n".join(lines) + "\n")
    return Written(images, np.arange(n, dtype=np.float64), poses)


def write_eth3d_prepared(root: Path, scene: str = "delivery_area", names: tuple[str, ...] = ("DSC_0710", "DSC_0711",
                         "DSC_0715", "DSC_0716"), hw: tuple[int, int] = (4, 148)) -> Written:
    """The official benchmark's ETH3D layout: ``custom_undistorted_cam/<name>.npz`` (extrinsics =
    world-to-camera) and ``images/custom_undistorted/<name>.JPG``; DSC_0711 is one of the views the
    official protocol drops."""
    poses = trajectory(len(names), 4)
    folder = root / scene
    kept_images, kept = [], []
    for i, nm in enumerate(names):
        img = save(folder / "images" / "custom_undistorted" / f"{nm}.JPG", image(400 + i, hw))
        (folder / "custom_undistorted_cam").mkdir(parents=True, exist_ok=True)
        np.savez(folder / "custom_undistorted_cam" / f"{nm}.npz", intrinsics=np.eye(3, dtype=np.float32),
                 extrinsics=se3_inverse(poses[i]))
        if nm != "DSC_0711":
            kept_images.append(img)
            kept.append(poses[i])
    return Written(kept_images, np.arange(len(kept), dtype=np.float64), np.stack(kept))


def write_tnt(root: Path, scene: str = "Barn", n: int = 6, hw: tuple[int, int] = (4, 148)) -> Written:
    """``Barn/000001.jpg, ...`` (1-indexed) and ``Barn_COLMAP_SfM.log`` (an index line, 4 matrix rows)."""
    poses = trajectory(n, 6)
    folder = root / scene
    images = [save(folder / f"{i + 1:06d}.jpg", image(600 + i, hw)) for i in range(n)]
    text = "".join(f"{i} {i} 0\n" + "".join(" ".join(f"{v:.12f}" for v in row) + "\n" for row in poses[i])
                   for i in range(n))
    (folder / f"{scene}_COLMAP_SfM.log").write_text(text)
    return Written(images, np.arange(1, n + 1, dtype=np.float64), poses)


# EuRoC cam0's T_BS (the camera in the body frame), as in the dataset's sensor.yaml
EUROC_T_BS = np.array([[0.0148655429818, -0.999880929698, 0.00414029679422, -0.0216401454975],
                       [0.999557249008, 0.0149672133247, 0.025715529948, -0.064676986768],
                       [-0.0257744366974, 0.00375618835797, 0.999660727178, 0.00981073058949],
                       [0.0, 0.0, 0.0, 1.0]])


def write_euroc(root: Path, name: str = "MH_01_easy", n: int = 8, hw: tuple[int, int] = (4, 148)) -> Written:
    """``mav0/cam0/data/<ns>.png`` (+ data.csv, sensor.yaml) and ``state_groundtruth_estimate0/data.csv``
    at 200 Hz with the body's pose (quaternion w x y z)."""
    mav = root / name / "mav0"
    ns = 1403636579763555584 + np.arange(n, dtype=np.int64) * 50_000_000  # 20 Hz
    images = [save(mav / "cam0" / "data" / f"{t}.png", image(700 + i, hw)) for i, t in enumerate(ns)]
    (mav / "cam0" / "data.csv").write_text("#timestamp [ns],filename\n" + "".join(f"{t},{t}.png\n" for t in ns))
    data = ", ".join(f"{v:.12f}" for v in EUROC_T_BS.reshape(-1))
    (mav / "cam0" / "sensor.yaml").write_text(
        "sensor_type: camera\ncomment: VI-Sensor cam0 (MT9M034)\nT_BS:\n  cols: 4\n  rows: 4\n"
        f"  data: [{data}]\nrate_hz: 20\nresolution: [752, 480]\n")
    gt_ns = ns[0] - 20_000_000 + np.arange((n + 1) * 10, dtype=np.int64) * 5_000_000  # 200 Hz
    body = trajectory(len(gt_ns), 7)
    rows = []
    for t, p in zip(gt_ns, body):
        qx, qy, qz, qw = quaternion_xyzw_from_matrix(p[:3, :3])
        rows.append(",".join([str(t), *(f"{v:.12f}" for v in (*p[:3, 3], qw, qx, qy, qz)), *["0.0"] * 9]))
    gt_dir = mav / "state_groundtruth_estimate0"
    gt_dir.mkdir(parents=True, exist_ok=True)
    (gt_dir / "data.csv").write_text(
        "#timestamp, p_RS_R_x [m], p_RS_R_y [m], p_RS_R_z [m], q_RS_w [], q_RS_x [], q_RS_y [], q_RS_z [], "
        "v_RS_R_x [m s^-1], v_RS_R_y [m s^-1], v_RS_R_z [m s^-1], b_w_RS_S_x [rad s^-1], b_w_RS_S_y [rad s^-1], "
        "b_w_RS_S_z [rad s^-1], b_a_RS_S_x [m s^-2], b_a_RS_S_y [m s^-2], b_a_RS_S_z [m s^-2]\n"
        + "\n".join(rows) + "\n")
    nearest = np.abs(ns[:, None] - gt_ns[None, :]).argmin(1)
    return Written(images, ns / 1e9, body[nearest] @ EUROC_T_BS)


# Columns: TartanAir's NED camera axes (x forward, y right, z down) written in optical axes.
OPTICAL_FROM_NED = np.array([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])


def write_tartanair(root: Path, rel: str = "abandonedfactory/Easy/P001", n: int = 8,
                    hw: tuple[int, int] = (4, 148)) -> Written:
    """``image_left/NNNNNN_left.png`` and ``pose_left.txt`` (tx ty tz qx qy qz qw, NED camera)."""
    optical = trajectory(n, 8)
    ned = optical.copy()
    # the NED camera's axes in the world: x_ned = z_opt, y_ned = x_opt, z_ned = y_opt
    ned[:, :3, :3] = optical[:, :3, :3] @ OPTICAL_FROM_NED
    folder = root / rel
    images = [save(folder / "image_left" / f"{i:06d}_left.png", image(800 + i, hw)) for i in range(n)]
    (folder / "pose_left.txt").write_text("".join(
        " ".join(f"{v:.9e}" for v in (*p[:3, 3], *quaternion_xyzw_from_matrix(p[:3, :3]))) + "\n" for p in ned))
    return Written(images, np.arange(n, dtype=np.float64), optical)


def write_oxford(root: Path, scene: str = "keble-college-02", n: int = 26, hw: tuple[int, int] = (4, 148)) -> Written:
    """``images/NNNNNN.png`` and ``poses_c2w.txt`` (16 numbers per line, row-major camera-to-world)."""
    poses = trajectory(n, 9)
    folder = root / scene
    images = [save(folder / "images" / f"{i:06d}.png", image(900 + i, hw)) for i in range(n)]
    (folder / "poses_c2w.txt").write_text("".join(" ".join(f"{v:.15e}" for v in p.reshape(-1)) + "\n" for p in poses))
    (folder / "intrinsics.txt").write_text("1000.0 1000.0 720.0 540.0 1440 1080\n")
    return Written(images, np.arange(n, dtype=np.float64), poses)


def write_vbr(root: Path, scene: str = "campus_train0", n: int = 8, hw: tuple[int, int] = (4, 148),
              gt_frames: tuple[int, ...] | None = None) -> Written:
    """``<scene>_processed_aligned/rgb/NNNNNN.png`` + ``intrinsics.txt`` and
    ``processed_gt/<scene>_gt.txt`` (TUM lines whose stamp is the frame index; lines written in
    reverse order, and only for ``gt_frames`` when given)."""
    poses = trajectory(n, 10)
    folder = root / f"{scene}_processed_aligned"
    images = [save(folder / "rgb" / f"{i:06d}.png", image(1000 + i, hw)) for i in range(n)]
    (folder / "intrinsics.txt").write_text("700.0 0 694.0\n0 700.0 350.0\n0 0 1\n")
    frames = range(n) if gt_frames is None else gt_frames
    (root / "processed_gt").mkdir(parents=True, exist_ok=True)
    (root / "processed_gt" / f"{scene}_gt.txt").write_text(
        "# frame tx ty tz qx qy qz qw\n" + "".join(tum_line(float(i), poses[i]) + "\n" for i in reversed(frames)))
    c2w = np.full((n, 4, 4), np.nan)
    c2w[list(frames)] = poses[list(frames)]
    return Written(images, np.arange(n, dtype=np.float64), c2w)


def write_droid_w(root: Path, scene: str = "downtown1", n: int = 10, hw: tuple[int, int] = (4, 148),
                  seed: int = 0, pose_file: str = "traj_gt.txt") -> tuple[Written, np.ndarray, np.ndarray]:
    """``images_anonymized/<unix seconds>.jpg`` at ~15 Hz (irregular) and a TUM ground truth at an
    irregular ~10 Hz with gaps, so some frames are more than 0.05 s from any pose. Returns the
    written sequence with ``c2w`` left NaN (the test associates by brute force) and the ground truth
    stamps and poses."""
    rng = np.random.default_rng(seed)
    stamps = np.round(1700000000.0 + np.cumsum(rng.uniform(0.04, 0.09, n)), 6)
    folder = root / scene
    images = [save(folder / "images_anonymized" / f"{s:.6f}.jpg", image(1100 + i, hw)) for i, s in enumerate(stamps)]
    gt_stamps = np.round(np.sort(rng.uniform(stamps[0] - 0.1, stamps[-1] + 0.1, 3 * n // 2)), 6)
    gt_stamps = gt_stamps[(gt_stamps < stamps[n // 2] - 0.08) | (gt_stamps > stamps[n // 2] + 0.08)]  # a gap
    gt_poses = trajectory(len(gt_stamps), 11)
    (folder / pose_file).write_text("".join(tum_line(s, p) + "\n" for s, p in zip(gt_stamps, gt_poses)))
    (root / "videos_mp4").mkdir(parents=True, exist_ok=True)
    return Written(images, stamps, np.full((n, 4, 4), np.nan)), gt_stamps, gt_poses
