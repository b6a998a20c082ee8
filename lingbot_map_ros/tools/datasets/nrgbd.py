"""Neural RGB-D (``--dataset nrgbd``): the synthetic scenes as the Neural RGB-D authors publish them.

Layout: ``ROOT/breakfast_room/`` with ``images/img0.png``, ``img1.png``, ... and ``poses.txt``: one
4x4 camera-to-world matrix per frame, 4 lines each, in the OpenGL convention (camera looking down
-z, y up). As the official reader does, the poses are turned into the OpenCV optical convention by
negating their y and z axes, and every 5th frame is used.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .base import (
    DatasetError,
    DatasetReader,
    OfficialResult,
    Protocol,
    Sequence,
    area_budget,
    need,
    numbers,
    strided,
)

PROTOCOL = Protocol(
    title="Neural RGB-D",
    stride=5,
    prepare=area_budget,
    image="640x480 -> 574x434 (OpenCV bilinear down to W*H <= 255000, sides floored to multiples of 14)",
    ground_truth="frame i: the i-th matrix of poses.txt (OpenGL -> OpenCV axes)",
    auc=False,
    official=OfficialResult(scenes=9, ate=0.056, rpe_trans=0.019, rpe_rot_deg=0.257,
                            points=(0.074, 0.030, 0.052, 51.77, 89.68, 65.10)),
    source=("benchmark/datasets/neural_rgbd.py", "benchmark/configs/datasets/neural_rgbd.yaml",
            "benchmark/configs/methods/lingbot_map.yaml", "benchmark/benchmark/geometry/resize.py",
            "benchmark/README.md"),
)

GL_TO_CV = np.diag([1.0, -1.0, -1.0, 1.0])  # right-multiplied: negates the camera's y and z axes


def read_poses(path: Path) -> np.ndarray:
    """``poses.txt`` -> OpenGL c2w [N, 4, 4] (non-finite entries kept: the frame has no ground truth)."""
    rows = [(i, t) for i, t in enumerate(need(path, "4 lines per camera-to-world matrix").read_text().splitlines(), 1)
            if t.strip()]
    if not rows or len(rows) % 4:
        raise DatasetError(f"{path}: {len(rows)} lines of numbers, expected 4 per camera (a multiple of 4)")
    values = np.array([numbers(path, t, i, 4) for i, t in rows], dtype=np.float64)
    return values.reshape(-1, 4, 4)


class NeuralRgbdReader(DatasetReader):
    name = "nrgbd"
    protocol = PROTOCOL

    def find(self, root: Path) -> list[str]:
        if (root / "poses.txt").is_file():
            return ["."]
        names = sorted(p.name for p in root.iterdir() if p.is_dir() and (p / "images").is_dir())
        if not names:
            raise DatasetError(f"{root}: no Neural RGB-D scene (expected folders like breakfast_room/ with images/ "
                               "and poses.txt)")
        return names

    def load(self, root: Path, name: str, stride: int) -> Sequence:
        folder = root / name
        poses = read_poses(folder / "poses.txt") @ GL_TO_CV
        images_dir = need(folder / "images", "img0.png, img1.png, ...", folder=True)
        indices = strided(range(len(poses)), stride)
        images = []
        for i in indices:
            images.append(need(images_dir / f"img{i}.png", f"poses.txt has {len(poses)} cameras"))
        gt = poses[indices]
        gt[~np.isfinite(gt.reshape(len(gt), -1)).all(axis=1)] = np.nan
        label = folder.resolve().name if name == "." else name
        return Sequence("nrgbd", label, images, np.array(indices, dtype=np.float64), gt, str(folder / "poses.txt"))


READER = NeuralRgbdReader()
