"""DROID-W (``--dataset droid_w``): the scenes as the DROID-W authors publish them.

Layout: ``ROOT/downtown1/images_anonymized/<unix seconds>.jpg`` (1600x1200) and ``traj_gt.txt`` (or
``traj_gt_fastlivo.txt``): TUM lines ``stamp tx ty tz qx qy qz qw``, camera-to-world. As the official
reader does, the images are sorted by stamp, each frame takes the nearest ground-truth pose within
0.05 s (several frames may share one; a frame without one stays in the stream and out of the
scores), and every frame is resized by PIL Lanczos to width 518 with the height rounded, then floored
to a multiple of 14 (518x378).
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np

from ...core.trajectory import nearest_within, pose_matrices, read_tum
from .base import (
    DatasetError,
    DatasetReader,
    OfficialResult,
    Protocol,
    Sequence,
    area_budget,
    chain,
    need,
    no_pose,
    resize_to_width,
    strided,
)

MAX_DT = 0.05  # seconds: the official reader's ASSOC_TOLERANCE
IMAGES = "images_anonymized"
POSE_FILES = ("traj_gt.txt", "traj_gt_fastlivo.txt")  # the first that exists, as the official reader picks

PROTOCOL = Protocol(
    title="DROID-W",
    stride=1,
    prepare=chain(lambda rgb: resize_to_width(rgb, lanczos=True, rounded=True), area_budget),
    image="1600x1200 -> 518x378 (PIL Lanczos to width 518, height rounded, then floored to a multiple of 14)",
    ground_truth=f"each frame: the nearest traj_gt.txt pose within {MAX_DT} s",
    auc=False,
    official=OfficialResult(scenes=7, ate=0.909, rpe_trans=0.184, rpe_rot_deg=6.115),
    source=("benchmark/datasets/droid_w.py", "benchmark/configs/datasets/droid_w.yaml",
            "benchmark/configs/droid_w.yaml", "benchmark/README.md"),
)


def pose_file(folder: Path) -> Optional[Path]:
    return next((folder / n for n in POSE_FILES if (folder / n).is_file()), None)


class DroidWReader(DatasetReader):
    name = "droid_w"
    protocol = PROTOCOL

    def find(self, root: Path) -> list[str]:
        names = sorted(p.name for p in root.iterdir()
                       if p.is_dir() and not p.name.startswith(".") and (p / IMAGES).is_dir() and pose_file(p))
        if not names:
            raise DatasetError(f"{root}: no DROID-W scene (expected folders like downtown1/ with {IMAGES}/ and "
                               f"{POSE_FILES[0]})")
        return names

    def load(self, root: Path, name: str, stride: int) -> Sequence:
        folder = root / name
        image_dir = need(folder / IMAGES, "JPEG frames named by their Unix stamps", folder=True)
        frames = []
        for p in image_dir.iterdir():
            if p.suffix.lower() in (".jpg", ".jpeg"):
                try:
                    frames.append((float(p.stem), p))
                except ValueError:
                    raise DatasetError(f"{p}: not a DROID-W image name (<unix seconds>.jpg)") from None
        if not frames:
            raise DatasetError(f"{image_dir}: no .jpg images")
        frames = strided(sorted(frames, key=lambda f: f[0]), stride)
        stamps = np.array([s for s, _ in frames])
        gt_file = pose_file(folder) or need(folder / POSE_FILES[0], "the TUM ground truth of the scene")
        try:
            gt_stamps, pos, quat = read_tum(gt_file)
        except ValueError as exc:
            raise DatasetError(str(exc)) from None
        if gt_stamps.size == 0:
            raise DatasetError(f"{gt_file}: no poses in the file")
        match = nearest_within(stamps, gt_stamps, MAX_DT)
        if (match < 0).all():
            raise DatasetError(f"{gt_file}: no pose within {MAX_DT} s of any image in {image_dir}")
        gt = no_pose(len(frames))
        hit = match >= 0
        gt[hit] = pose_matrices(pos[match[hit]], quat[match[hit]])
        notes = [f"{int((~hit).sum())} of {len(frames)} frames have no ground-truth pose within {MAX_DT} s"] \
            if (~hit).any() else []
        return Sequence("droid_w", name, [p for _, p in frames], stamps, gt, str(gt_file), notes)


READER = DroidWReader()
