"""TUM RGB-D (``--dataset tum``): the sequences as the TUM benchmark publishes them.

Layout: ``ROOT/rgbd_dataset_freiburg1_desk/`` with ``rgb/<stamp>.png`` (the file name is the stamp
in seconds) and ``groundtruth.txt`` (``stamp tx ty tz qx qy qz qw``, the colour camera's optical
centre in the motion-capture frame); ROOT may also be one sequence folder itself. As the official
reader does, the images come from ``rgb/`` sorted by stamp (``rgb.txt`` is not needed), and each
frame takes the nearest ground-truth pose within 0.02 s (several frames may share one); frames with
none stay in the stream and out of the scores.
"""
from __future__ import annotations

from pathlib import Path

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

MAX_DT = 0.02  # seconds: the official reader's ASSOC_TOLERANCE (TUM's associate.py default)

PROTOCOL = Protocol(
    title="TUM RGB-D",
    stride=1,
    prepare=chain(resize_to_width, area_budget),
    image="640x480 -> 518x378 (OpenCV bilinear to width 518, height floored to a multiple of 14)",
    ground_truth=f"each frame: the nearest groundtruth.txt pose within {MAX_DT} s",
    auc=False,
    official=OfficialResult(scenes=9, ate=0.045, rpe_trans=0.013, rpe_rot_deg=0.513),
    source=("benchmark/datasets/tum.py", "benchmark/configs/datasets/tum.yaml", "benchmark/configs/tum.yaml",
            "benchmark/README.md"),
    notes=("the official table's 9 scenes are the Freiburg 1 sequences with ground truth",),
)


def _is_sequence(folder: Path) -> bool:
    return (folder / "rgb").is_dir()


class TumReader(DatasetReader):
    name = "tum"
    protocol = PROTOCOL

    def find(self, root: Path) -> list[str]:
        if _is_sequence(root):
            return ["."]
        names = sorted(p.name for p in root.iterdir() if p.is_dir() and _is_sequence(p))
        if not names:
            raise DatasetError(f"{root}: no TUM RGB-D sequence (expected folders like rgbd_dataset_freiburg1_desk/ "
                               "with rgb/ and groundtruth.txt)")
        return names

    def load(self, root: Path, name: str, stride: int) -> Sequence:
        folder = root / name
        rgb = need(folder / "rgb", "the sequence's images, named by their stamps", folder=True)
        images = []
        for p in rgb.iterdir():
            if p.suffix.lower() == ".png":
                try:
                    images.append((float(p.stem), p))
                except ValueError:
                    raise DatasetError(f"{p}: not a TUM image name (<stamp in seconds>.png)") from None
        if not images:
            raise DatasetError(f"{rgb}: no .png images")
        images = strided(sorted(images, key=lambda x: x[0]), stride)
        stamps = np.array([s for s, _ in images])
        gt_file = need(folder / "groundtruth.txt", "the TUM ground truth: stamp tx ty tz qx qy qz qw")
        try:
            gt_stamps, pos, quat = read_tum(gt_file)
        except ValueError as exc:
            raise DatasetError(str(exc)) from None
        if gt_stamps.size == 0:
            raise DatasetError(f"{gt_file}: no poses in the file")
        match = nearest_within(stamps, gt_stamps, MAX_DT)
        if (match < 0).all():
            raise DatasetError(
                f"{gt_file}: no pose within {MAX_DT} s of any image in {rgb} (ground truth "
                f"{gt_stamps.min():.3f}..{gt_stamps.max():.3f} s, images {stamps.min():.3f}..{stamps.max():.3f} s)")
        gt = no_pose(len(images))
        hit = match >= 0
        gt[hit] = pose_matrices(pos[match[hit]], quat[match[hit]])
        label = folder.resolve().name if name == "." else name
        notes = [f"{int((~hit).sum())} of {len(images)} frames have no ground-truth pose within {MAX_DT} s"] \
            if (~hit).any() else []
        return Sequence("tum", label, [p for _, p in images], stamps, gt, str(gt_file), notes)


READER = TumReader()
