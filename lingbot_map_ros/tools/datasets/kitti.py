"""KITTI odometry (``--dataset kitti``): the colour sequences as the KITTI odometry benchmark publishes them.

Layout: ``ROOT/sequences/05/image_2/000000.png`` (left colour camera) with ``times.txt`` (seconds,
one per image), and ``ROOT/poses/05.txt``: one 3x4 row-major camera-to-world matrix per frame, of
the left grey camera (cam0; the official reader keeps it as the colour camera's pose: the fixed
baseline between the two is absorbed by the Sim(3) alignment). Sequences 11-21 have no public
ground truth and are skipped, as the official benchmark does; the official table's 11 scenes are
00-10. Every frame is used, cover-fit resized and centre-cropped to 504x280.
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
    chain,
    cover_crop,
    homogeneous,
    need,
    numbers,
    strided,
)

OFFICIAL_SIZE_WH = (504, 280)
GT_SEQUENCES = tuple(f"{i:02d}" for i in range(11))  # the sequences KITTI publishes poses for

PROTOCOL = Protocol(
    title="KITTI (504x280)",
    stride=1,
    prepare=chain(lambda rgb: cover_crop(rgb, OFFICIAL_SIZE_WH), area_budget),
    image="1241x376 -> 504x280 (OpenCV area resize to cover 504x280, centre crop)",
    ground_truth="frame i: line i of poses/NN.txt (cam0 poses)",
    auc=False,
    official=OfficialResult(scenes=11, ate=24.046, rpe_trans=2.861, rpe_rot_deg=0.696),
    source=("benchmark/datasets/kitti.py", "benchmark/configs/datasets/kitti_504x280.yaml",
            "benchmark/configs/kitti.yaml", "benchmark/README.md"),
    scenes=GT_SEQUENCES,
)


class KittiReader(DatasetReader):
    name = "kitti"
    protocol = PROTOCOL

    def find(self, root: Path) -> list[str]:
        seqs = need(root / "sequences", "KITTI odometry: sequences/NN/image_2/ and poses/NN.txt", folder=True)
        names = sorted(p.name for p in seqs.iterdir() if p.is_dir())
        # without public ground truth (11-21): skipped unless a poses file was put there
        names = [n for n in names if n in GT_SEQUENCES or (root / "poses" / f"{n}.txt").is_file()]
        if not names:
            raise DatasetError(f"{seqs}: no sequence 00-10 (the ones with ground truth in poses/)")
        return names

    def load(self, root: Path, name: str, stride: int) -> Sequence:
        folder = root / "sequences" / name
        image_dir = need(folder / "image_2", "the left colour camera's 000000.png, ...", folder=True)
        images = sorted(p for p in image_dir.iterdir() if p.suffix.lower() == ".png")
        if not images:
            raise DatasetError(f"{image_dir}: no .png images")
        times_file = need(folder / "times.txt", "one stamp in seconds per image")
        times = [numbers(times_file, t, i, 1)[0] for i, t in enumerate(times_file.read_text().splitlines(), 1)
                 if t.strip()]
        if len(times) != len(images):
            raise DatasetError(f"{times_file}: {len(times)} stamps for {len(images)} images in {image_dir}")
        poses_file = need(root / "poses" / f"{name}.txt", "the sequence's ground truth: 12 numbers per frame")
        rows = [numbers(poses_file, t, i, 12) for i, t in enumerate(poses_file.read_text().splitlines(), 1)
                if t.strip()]
        if len(rows) != len(images):
            raise DatasetError(f"{poses_file}: {len(rows)} poses for {len(images)} images in {image_dir}")
        poses = homogeneous(np.array(rows, dtype=np.float64).reshape(-1, 3, 4))
        keep = strided(range(len(images)), stride)
        return Sequence("kitti", name, [images[i] for i in keep], np.array([times[i] for i in keep]),
                        poses[keep], str(poses_file))


READER = KittiReader()
