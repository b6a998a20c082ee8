"""Oxford Spires (``--dataset oxford``): the scenes as the official benchmark's preparation writes them.

Layout: ``ROOT/keble-college-02/`` with ``images/000000.png, ...`` (1440x1080), ``poses_c2w.txt``
(one line of 16 numbers per frame: the row-major 4x4 camera-to-world matrix) and ``intrinsics.txt``.
Frame ``i`` is ``images/{i:06d}.png`` with pose line ``i`` (one frame per pose line, as the official
reader lists them); every 12th frame is used. Four scenes whose reference cloud is not aligned with
their poses are left out by the official protocol (10 remain); ``--all-scenes`` runs them too.
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

POSES = "poses_c2w.txt"
# benchmark/datasets/oxford_spires.py: EXCLUDED_SCENES
EXCLUDED = ("blenheim-palace-01", "blenheim-palace-02", "blenheim-palace-05", "christ-church-01")

PROTOCOL = Protocol(
    title="Oxford Spires",
    stride=12,
    prepare=chain(lambda rgb: resize_to_width(rgb, lanczos=True), area_budget),
    image="1440x1080 -> 518x378 (PIL Lanczos to width 518, height floored to a multiple of 14)",
    ground_truth="frame i: line i of poses_c2w.txt (4x4 camera-to-world, row-major)",
    auc=True,
    official=OfficialResult(scenes=10, ate=5.374, rpe_trans=0.930, rpe_rot_deg=3.694),
    source=("benchmark/datasets/oxford_spires.py", "benchmark/configs/datasets/oxford.yaml",
            "benchmark/configs/oxford.yaml", "benchmark/README.md"),
    excluded=EXCLUDED,
)


def read_poses(path: Path) -> np.ndarray:
    """``poses_c2w.txt`` -> camera-to-world [N, 4, 4]."""
    rows = [(i, t) for i, t in enumerate(need(path, "16 numbers per frame").read_text().splitlines(), 1) if t.strip()]
    if not rows:
        raise DatasetError(f"{path}: no poses in the file")
    return np.array([numbers(path, t, i, 16) for i, t in rows], dtype=np.float64).reshape(-1, 4, 4)


class OxfordSpiresReader(DatasetReader):
    name = "oxford"
    protocol = PROTOCOL

    def find(self, root: Path) -> list[str]:
        if (root / POSES).is_file():
            return ["."]
        names = sorted(p.name for p in root.iterdir()
                       if p.is_dir() and (p / "images").is_dir() and (p / POSES).is_file())
        if not names:
            raise DatasetError(f"{root}: no Oxford Spires scene (expected folders like keble-college-02/ with "
                               f"images/000000.png, ... and {POSES})")
        return names

    def load(self, root: Path, name: str, stride: int) -> Sequence:
        folder = root / name
        poses = read_poses(folder / POSES)
        keep = strided(range(len(poses)), stride)
        images = [need(folder / "images" / f"{i:06d}.png", f"{POSES} has {len(poses)} poses") for i in keep]
        gt = poses[keep]
        gt[~np.isfinite(gt.reshape(len(gt), -1)).all(axis=1)] = np.nan
        label = folder.resolve().name if name == "." else name
        return Sequence("oxford", label, images, np.array(keep, dtype=np.float64), gt, str(folder / POSES))


READER = OxfordSpiresReader()
