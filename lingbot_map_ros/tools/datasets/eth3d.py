"""ETH3D high-resolution multi-view (``--dataset eth3d``): the DSLR scenes, undistorted.

Two layouts of a scene folder ``ROOT/courtyard/`` are read:

* ETH3D's published one: ``dslr_calibration_undistorted/images.txt`` (COLMAP text: per image
  ``IMAGE_ID QW QX QY QZ TX TY TZ CAMERA_ID NAME`` - world-to-camera - then a line of 2D points)
  and the images under ``images/`` (``NAME`` is ``dslr_images_undistorted/DSC_0286.JPG``);
* the one the official benchmark reads (prepared as Pi3 does): ``custom_undistorted_cam/<name>.npz``
  (``extrinsics``: 4x4 world-to-camera) and ``images/custom_undistorted/<name>.JPG``.

Frames are ordered by name, and the official protocol's selection applies: of its 13 scenes,
``meadow`` and ``terrace`` are left out (11 remain; the benchmark runs them with ``--all-scenes``)
and a few views of five scenes are dropped.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ...core.geometry import quaternion_to_matrix, se3, se3_inverse
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

PUBLISHED = Path("dslr_calibration_undistorted") / "images.txt"
PREPARED = Path("custom_undistorted_cam")
# The official protocol's selection (benchmark/datasets/eth3d.py: SCENES, DA3_FILTER_SCENES, DA3_FILTER_KEYS).
SCENES = ("courtyard", "delivery_area", "electro", "facade", "kicker", "meadow", "office", "pipes", "playground",
          "relief", "relief_2", "terrace", "terrains")
LEFT_OUT_SCENES = ("meadow", "terrace")
LEFT_OUT_VIEWS = {
    "delivery_area": tuple(f"{i}.JPG" for i in range(711, 715)),
    "electro": tuple(f"{i}.JPG" for i in (9289, 9290, 9291, 9292, 9293, 9298)),
    "playground": tuple(f"{i}.JPG" for i in range(587, 593)),
    "relief": tuple(f"{i}.JPG" for i in range(427, 439)),
    "relief_2": tuple(f"{i}.JPG" for i in range(458, 469)),
}

PROTOCOL = Protocol(
    title="ETH3D",
    stride=1,
    prepare=chain(resize_to_width, area_budget),
    image="6048x4032 -> 518x336 (OpenCV bilinear to width 518, height floored to a multiple of 14)",
    ground_truth="each image: its world-to-camera pose, inverted",
    auc=True,
    official=OfficialResult(scenes=11, ate=0.439, rpe_trans=0.493, rpe_rot_deg=3.339,
                            auc_macro=(37.22, 50.83, 72.99, 81.10), auc_micro=(40.34, 56.15, 79.82, 87.97),
                            points=(0.168, 0.089, 0.128, 82.33, 92.51, 86.80)),
    source=("benchmark/datasets/eth3d.py", "benchmark/configs/datasets/eth3d.yaml", "benchmark/configs/eth3d.yaml",
            "benchmark/README.md"),
    scenes=SCENES,
    excluded=LEFT_OUT_SCENES,
)


def _left_out(scene: str, image_name: str) -> bool:
    return any(Path(image_name).name.endswith(key) for key in LEFT_OUT_VIEWS.get(scene, ()))


def read_colmap_images(path: Path) -> dict[str, np.ndarray]:
    """COLMAP ``images.txt`` -> {NAME: camera-to-world [4, 4]}. Every image takes two lines (the second,
    its 2D points, may be empty), so lines are paired as they stand, blank ones included."""
    lines = [(i, t) for i, t in enumerate(path.read_text().splitlines(), 1) if not t.startswith("#")]
    while lines and not lines[-1][1].strip():
        lines.pop()
    out: dict[str, np.ndarray] = {}
    for k in range(0, len(lines), 2):
        lineno, text = lines[k]
        parts = text.split()
        if len(parts) < 10:
            raise DatasetError(f"{path}:{lineno}: expected IMAGE_ID QW QX QY QZ TX TY TZ CAMERA_ID NAME")
        qw, qx, qy, qz, tx, ty, tz = numbers(path, " ".join(parts[1:8]), lineno, 7)
        w2c = se3(quaternion_to_matrix([qx, qy, qz, qw]), [tx, ty, tz])
        out[" ".join(parts[9:])] = se3_inverse(w2c)
    return out


class Eth3dReader(DatasetReader):
    name = "eth3d"
    protocol = PROTOCOL

    def find(self, root: Path) -> list[str]:
        def is_scene(p: Path) -> bool:
            return (p / PUBLISHED).is_file() or (p / PREPARED).is_dir()

        if is_scene(root):
            return ["."]
        names = sorted(p.name for p in root.iterdir() if p.is_dir() and is_scene(p))
        if not names:
            raise DatasetError(f"{root}: no ETH3D scene (expected folders like courtyard/ with {PUBLISHED} and "
                               f"images/, or {PREPARED}/*.npz)")
        return names

    def load(self, root: Path, name: str, stride: int) -> Sequence:
        folder = root / name
        scene = folder.resolve().name if name == "." else name
        if (folder / PUBLISHED).is_file():
            poses = read_colmap_images(folder / PUBLISHED)
            entries = [(n, folder / "images" / n, c2w) for n, c2w in poses.items()]
            gt_from = folder / PUBLISHED
        else:
            cams = sorted(need(folder / PREPARED, "one .npz per image", folder=True).glob("*.npz"))
            if not cams:
                raise DatasetError(f"{folder / PREPARED}: no .npz camera files")
            entries = []
            for cam in cams:
                try:
                    w2c = np.asarray(np.load(cam)["extrinsics"], dtype=np.float64)
                except (OSError, ValueError, KeyError) as exc:
                    raise DatasetError(f"{cam}: not a camera file with 'extrinsics' ({type(exc).__name__})") from None
                if w2c.shape != (4, 4):
                    raise DatasetError(f"{cam}: extrinsics of shape {w2c.shape}, expected 4x4")
                entries.append((f"{cam.stem}.JPG", folder / "images" / "custom_undistorted" / f"{cam.stem}.JPG",
                                np.linalg.inv(w2c)))
            gt_from = folder / PREPARED
        entries = [e for e in sorted(entries, key=lambda e: e[0]) if not _left_out(scene, e[0])]
        if not entries:
            raise DatasetError(f"{gt_from}: no images")
        entries = strided(entries, stride)
        for _, image, _ in entries:
            need(image, f"listed in {gt_from.name}")
        return Sequence("eth3d", scene, [e[1] for e in entries], np.arange(len(entries), dtype=np.float64),
                        np.stack([e[2] for e in entries]), str(gt_from))


READER = Eth3dReader()
