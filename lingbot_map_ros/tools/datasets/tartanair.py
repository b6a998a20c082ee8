"""TartanAir (``--dataset tartanair``): the trajectories as TartanAir publishes them.

Layout: ``ROOT/abandonedfactory/Easy/P000/image_left/000000_left.png, ...`` and ``pose_left.txt``
(one line ``tx ty tz qx qy qz qw`` per image: the left camera in the world, both in TartanAir's NED
convention, x forward, y right, z down). The camera axes are turned into the optical convention
(x right, y down, z forward) so that relative rotations compare with the model's. Any folder
below ROOT holding ``image_left/`` and ``pose_left.txt`` is a sequence.

The official LingBot-Map benchmark has no TartanAir entry, so this protocol is ours: every frame,
the node's image size (width 518), pose line i for image i; the layout has no time, so the stamps
are frame indices. No official numbers to compare with.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from ...core.trajectory import pose_matrices
from .base import DatasetError, DatasetReader, Protocol, Sequence, need, numbers, strided, unchanged

# Columns: the optical axes (x right, y down, z forward) written in the NED camera axes.
NED_TO_OPTICAL = np.array([[0.0, 0.0, 1.0, 0.0],
                           [1.0, 0.0, 0.0, 0.0],
                           [0.0, 1.0, 0.0, 0.0],
                           [0.0, 0.0, 0.0, 1.0]])
_IMAGE = re.compile(r"^(\d+)_left\.png$")
MAX_DEPTH = 4  # folder levels searched below ROOT (env/difficulty/trajectory)

PROTOCOL = Protocol(
    title="TartanAir",
    stride=1,
    prepare=unchanged,
    image="640x480 -> the node's preprocessing (width 518)",
    ground_truth="image i: line i of pose_left.txt (NED -> optical axes)",
    auc=False,
    official=None,
    source=(),
    notes=("not in the official benchmark: protocol of this package",),
)


def _is_sequence(folder: Path) -> bool:
    return (folder / "image_left").is_dir()


class TartanAirReader(DatasetReader):
    name = "tartanair"
    protocol = PROTOCOL

    def find(self, root: Path) -> list[str]:
        found: list[str] = []
        level = [root]
        for _ in range(MAX_DEPTH):
            found += [p.relative_to(root).as_posix() or "." for p in level if _is_sequence(p)]
            level = [c for p in level if not _is_sequence(p) for c in sorted(p.iterdir()) if c.is_dir()]
        if not found:
            raise DatasetError(f"{root}: no TartanAir trajectory (expected folders like abandonedfactory/Easy/P000/ "
                               "with image_left/ and pose_left.txt)")
        return sorted(found)

    def load(self, root: Path, name: str, stride: int) -> Sequence:
        folder = root / name
        images = sorted((int(m.group(1)), p) for p in (folder / "image_left").iterdir() if (m := _IMAGE.match(p.name)))
        if not images:
            raise DatasetError(f"{folder / 'image_left'}: no NNNNNN_left.png images")
        pose_file = need(folder / "pose_left.txt", "one line tx ty tz qx qy qz qw per image")
        rows = [numbers(pose_file, t, i, 7) for i, t in enumerate(pose_file.read_text().splitlines(), 1) if t.strip()]
        if len(rows) != len(images):
            raise DatasetError(f"{pose_file}: {len(rows)} poses for {len(images)} images in {folder / 'image_left'}")
        values = np.array(rows, dtype=np.float64)
        poses = pose_matrices(values[:, :3], values[:, 3:]) @ NED_TO_OPTICAL
        keep = strided(range(len(images)), stride)
        label = folder.resolve().name if name == "." else name
        return Sequence("tartanair", label, [images[i][1] for i in keep], np.array(keep, dtype=np.float64),
                        poses[keep], str(pose_file))


READER = TartanAirReader()
