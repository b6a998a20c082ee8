"""VBR, the Vision Benchmark in Rome (``--dataset vbr``): the aligned sequences as LoGeR's preparation
writes them (the layout the official benchmark reads).

Layout: ``ROOT/campus_train0_processed_aligned/rgb/000000.png, ...`` with ``intrinsics.txt``, and
``ROOT/processed_gt/campus_train0_gt.txt``: TUM lines ``index tx ty tz qx qy qz qw`` (camera-to-
world) whose first column is the frame index, so frame ``i`` (the ``i``-th image by name) takes the
line whose index is ``i``, and a frame without one has no ground truth. Every frame is used, cover-fit
resized (OpenCV area) and centre-cropped to 504x280.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ...core.trajectory import pose_matrices, read_tum
from .base import (
    DatasetError,
    DatasetReader,
    OfficialResult,
    Protocol,
    Sequence,
    area_budget,
    chain,
    cover_crop,
    need,
    no_pose,
    strided,
)

SUFFIX = "_processed_aligned"
GT_DIR = "processed_gt"
OFFICIAL_SIZE_WH = (504, 280)

PROTOCOL = Protocol(
    title="VBR",
    stride=1,
    prepare=chain(lambda rgb: cover_crop(rgb, OFFICIAL_SIZE_WH), area_budget),
    image="-> 504x280 (OpenCV area resize to cover 504x280, centre crop)",
    ground_truth=f"frame i: the line of {GT_DIR}/<scene>_gt.txt whose first column is i",
    auc=False,
    official=OfficialResult(scenes=7, ate=31.204, rpe_trans=2.717, rpe_rot_deg=4.564),
    source=("benchmark/datasets/vbr.py", "benchmark/configs/datasets/vbr.yaml", "benchmark/configs/vbr.yaml",
            "benchmark/README.md"),
)


class VbrReader(DatasetReader):
    name = "vbr"
    protocol = PROTOCOL

    def find(self, root: Path) -> list[str]:
        names = sorted(p.name[:-len(SUFFIX)] for p in root.iterdir()
                       if p.is_dir() and p.name.endswith(SUFFIX) and (p / "rgb").is_dir()
                       and (p / "intrinsics.txt").is_file())
        if not names:
            raise DatasetError(f"{root}: no VBR sequence (expected folders like campus_train0{SUFFIX}/ with rgb/ "
                               f"and intrinsics.txt, beside {GT_DIR}/)")
        return names

    def load(self, root: Path, name: str, stride: int) -> Sequence:
        rgb = need(root / f"{name}{SUFFIX}" / "rgb", "000000.png, ...", folder=True)
        images = sorted(p for p in rgb.iterdir() if p.suffix.lower() == ".png")
        if not images:
            raise DatasetError(f"{rgb}: no .png images")
        gt_file = need(root / GT_DIR / f"{name}_gt.txt", "the ground truth: frame-index tx ty tz qx qy qz qw")
        try:
            index, pos, quat = read_tum(gt_file)
        except ValueError as exc:
            raise DatasetError(str(exc)) from None
        if index.size == 0:
            raise DatasetError(f"{gt_file}: no poses in the file")
        poses = no_pose(len(images))
        frame = index.astype(np.int64)  # the official reader's int(float(column 0))
        inside = (frame >= 0) & (frame < len(images))
        if not inside.any():
            raise DatasetError(f"{gt_file}: no line's frame index is one of the {len(images)} images in {rgb}")
        # a later line with the same index wins, as the official dictionary does
        poses[frame[inside]] = pose_matrices(pos[inside], quat[inside])
        keep = strided(range(len(images)), stride)
        return Sequence("vbr", name, [images[i] for i in keep], np.array(keep, dtype=np.float64), poses[keep],
                        str(gt_file))


READER = VbrReader()
