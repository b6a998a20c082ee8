"""Microsoft 7-Scenes (``--dataset 7scenes``): the test sequences as the dataset publishes them.

Layout: ``ROOT/chess/TestSplit.txt`` (lines ``sequence3``) and ``ROOT/chess/seq-03/`` with
``frame-000000.color.png`` and ``frame-000000.pose.txt`` (a 4x4 camera-to-world matrix, the
KinectFusion track). As the official benchmark does, each test sequence is one scene (18 in all)
and every 5th frame is used.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from .base import (
    DatasetError,
    DatasetReader,
    OfficialResult,
    Protocol,
    Sequence,
    area_budget,
    matrix_file,
    need,
    strided,
)

SPLIT_FILE = "TestSplit.txt"  # the official config's _split: test

PROTOCOL = Protocol(
    title="7-Scenes",
    stride=5,
    prepare=area_budget,
    image="640x480 -> 574x434 (OpenCV bilinear down to W*H <= 255000, sides floored to multiples of 14)",
    ground_truth="each frame: its frame-NNNNNN.pose.txt",
    auc=True,
    official=OfficialResult(scenes=18, ate=0.079, rpe_trans=0.020, rpe_rot_deg=0.579,
                            auc_macro=(12.35, 23.23, 60.01, 78.09), auc_micro=(13.20, 24.61, 61.45, 79.06),
                            points=(0.036, 0.044, 0.040, 79.03, 86.17, 82.38)),
    source=("benchmark/datasets/seven_scenes.py", "benchmark/configs/datasets/seven_scenes.yaml",
            "benchmark/configs/seven_scenes.yaml", "benchmark/configs/methods/lingbot_map.yaml",
            "benchmark/benchmark/geometry/resize.py", "benchmark/README.md"),
)

_SEQUENCE_LINE = re.compile(r"^sequence(\d+)$", re.I)
_FRAME = re.compile(r"^frame-(\d+)\.color\.png$")


class SevenScenesReader(DatasetReader):
    name = "7scenes"
    protocol = PROTOCOL

    def find(self, root: Path) -> list[str]:
        names: list[str] = []
        scenes = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
        for scene in scenes:
            split = scene / SPLIT_FILE
            if not split.is_file():
                if any(scene.glob("seq-*")):
                    names.append(scene.name)  # a scene without its split file: load() says so
                continue
            for lineno, line in enumerate(split.read_text().splitlines(), 1):
                if not line.strip():
                    continue
                m = _SEQUENCE_LINE.match(line.strip())
                if not m:
                    raise DatasetError(f"{split}:{lineno}: expected 'sequenceN', got {line.strip()[:40]!r}")
                names.append(f"{scene.name}/seq-{int(m.group(1)):02d}")
        if not names:
            raise DatasetError(f"{root}: no 7-Scenes scene (expected folders like chess/ with {SPLIT_FILE} "
                               "and seq-01/)")
        return names

    def load(self, root: Path, name: str, stride: int) -> Sequence:
        if "/" not in name:
            need(root / name / SPLIT_FILE, "the scene's list of test sequences")
        folder = need(root / name, f"listed in {Path(name).parent / SPLIT_FILE}", folder=True)
        frames = sorted((int(m.group(1)), p) for p in folder.iterdir() if (m := _FRAME.match(p.name)))
        if not frames:
            raise DatasetError(f"{folder}: no frame-NNNNNN.color.png images")
        frames = strided(frames, stride)
        poses = []
        for index, image in frames:
            pose = matrix_file(folder / f"frame-{index:06d}.pose.txt")
            poses.append(pose if np.isfinite(pose).all() else np.full((4, 4), np.nan))
        return Sequence("7scenes", name, [p for _, p in frames], np.array([float(i) for i, _ in frames]),
                        np.stack(poses), str(folder / "frame-*.pose.txt"))


READER = SevenScenesReader()
