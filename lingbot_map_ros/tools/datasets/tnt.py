"""Tanks and Temples (``--dataset tnt``): the training scenes' image sets with their COLMAP camera logs.

Layout: ``ROOT/Barn/000001.jpg, 000002.jpg, ...`` (1-indexed) and ``ROOT/Barn/Barn_COLMAP_SfM.log``:
per image a line ``i i 0`` and the 4 rows of its camera-to-world matrix (the log's entry k is image
k + 1). The official table's 6 scenes: Barn, Caterpillar, Church, Ignatius, Meetingroom, Truck; other
scene folders are found too, and run only with ``--all-scenes``.
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
    need,
    numbers,
    resize_to_width,
    strided,
)

OFFICIAL_SCENES = ("Barn", "Caterpillar", "Church", "Ignatius", "Meetingroom", "Truck")

PROTOCOL = Protocol(
    title="Tanks and Temples",
    stride=1,
    prepare=chain(lambda rgb: resize_to_width(rgb, lanczos=True), area_budget),
    image="1920x1080 -> 518x280 (PIL Lanczos to width 518, height floored to a multiple of 14)",
    ground_truth="image k: entry k - 1 of <scene>_COLMAP_SfM.log",
    auc=True,
    official=OfficialResult(scenes=6, ate=0.210, rpe_trans=0.087, rpe_rot_deg=0.572),
    source=("benchmark/datasets/tnt.py", "benchmark/configs/datasets/tat.yaml", "benchmark/configs/tat.yaml",
            "benchmark/README.md"),
    scenes=OFFICIAL_SCENES,
)


def read_log(path: Path) -> np.ndarray:
    """``*_COLMAP_SfM.log`` -> camera-to-world [N, 4, 4] (5 non-blank lines per camera)."""
    rows = [(i, t) for i, t in enumerate(need(path, "the scene's camera poses").read_text().splitlines(), 1)
            if t.strip()]
    if not rows or len(rows) % 5:
        raise DatasetError(f"{path}: {len(rows)} lines, expected 5 per camera (an index line and 4 matrix rows)")
    mats = [[numbers(path, t, i, 4) for i, t in rows[k + 1:k + 5]] for k in range(0, len(rows), 5)]
    return np.array(mats, dtype=np.float64)


class TntReader(DatasetReader):
    name = "tnt"
    protocol = PROTOCOL

    def find(self, root: Path) -> list[str]:
        if any(root.glob("*_COLMAP_SfM.log")):
            return ["."]
        names = [s for s in OFFICIAL_SCENES if (root / s).is_dir()]
        names += sorted(p.name for p in root.iterdir()
                        if p.is_dir() and p.name not in names and (p / f"{p.name}_COLMAP_SfM.log").is_file())
        if not names:
            raise DatasetError(f"{root}: no Tanks and Temples scene (expected folders like Barn/ with 000001.jpg, "
                               "... and Barn_COLMAP_SfM.log)")
        return names

    def load(self, root: Path, name: str, stride: int) -> Sequence:
        folder = root / name
        scene = folder.resolve().name if name == "." else name
        frames = []
        for p in folder.glob("*.jpg"):
            if p.stem.isdigit():
                frames.append((int(p.stem), p))
        if not frames:
            raise DatasetError(f"{folder}: no 000001.jpg, ... images")
        frames = strided(sorted(frames), stride)
        log = folder / f"{scene}_COLMAP_SfM.log"
        poses = read_log(log)
        if frames[-1][0] > len(poses) or frames[0][0] < 1:
            raise DatasetError(f"{log}: {len(poses)} cameras, but the images run to {frames[-1][1].name}")
        return Sequence("tnt", scene, [p for _, p in frames], np.array([float(k) for k, _ in frames]),
                        poses[[k - 1 for k, _ in frames]], str(log))


READER = TntReader()
