"""EuRoC MAV (``--dataset euroc``): the ASL folder layout of the EuRoC sequences (MH_01_easy, V1_01_easy, ...).

Layout: ``ROOT/MH_01_easy/mav0/cam0/data/<ns>.png`` (left camera, grey; ``cam0/data.csv`` lists
``stamp_ns,filename`` when present), ``mav0/cam0/sensor.yaml`` (``T_BS``: the camera in the body
frame) and ``mav0/state_groundtruth_estimate0/data.csv`` (``stamp_ns, p x y z, q w x y z, ...``: the
body in the world). The camera's pose is ``T_WB T_BS``.

The official LingBot-Map benchmark has no EuRoC entry, so this protocol is ours: every frame, the
node's image size (width 518), and TUM's association rule (nearest ground-truth pose within 0.02 s;
the ground truth runs at 200 Hz). No official numbers to compare with.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ...core.geometry import quaternion_to_matrix, se3
from ...core.trajectory import nearest_within
from ..frame_sources import stamp_from_name
from .base import DatasetError, DatasetReader, Protocol, Sequence, need, no_pose, numbers, strided, unchanged

MAX_DT = 0.02

PROTOCOL = Protocol(
    title="EuRoC MAV",
    stride=1,
    prepare=unchanged,
    image="752x480 grey -> the node's preprocessing (width 518)",
    ground_truth=f"each frame: the nearest state_groundtruth_estimate0 pose within {MAX_DT} s, times T_BS",
    auc=False,
    official=None,
    source=(),
    notes=("not in the official benchmark: protocol of this package",),
)


def ns_to_seconds(ns: int) -> float:
    return ns // 1_000_000_000 + (ns % 1_000_000_000) * 1e-9


def read_t_bs(path: Path) -> np.ndarray:
    """``T_BS`` (4x4, row-major ``data:`` list) from a EuRoC ``sensor.yaml``."""
    import yaml

    try:
        doc = yaml.safe_load(need(path, "the camera's T_BS").read_text())
        data = np.array(doc["T_BS"]["data"], dtype=np.float64).reshape(4, 4)
    except (yaml.YAMLError, KeyError, TypeError, ValueError):
        raise DatasetError(f"{path}: no T_BS with 16 numbers in 'data'") from None
    return data


def read_ground_truth(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """``state_groundtruth_estimate0/data.csv`` -> (stamps [N] s, body-to-world [N, 4, 4])."""
    stamps, poses = [], []
    for lineno, line in enumerate(need(path, "the ground truth: stamp_ns, p xyz, q wxyz, ...").read_text()
                                  .splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        values = numbers(path, line, lineno)
        if len(values) < 8:
            raise DatasetError(f"{path}:{lineno}: expected at least 8 numbers (stamp, position, quaternion w x y z)")
        head = line.replace(",", " ").split()[0]
        if not head.isdigit():
            raise DatasetError(f"{path}:{lineno}: the stamp {head!r} is not an integer in nanoseconds")
        stamps.append(ns_to_seconds(int(head)))
        qw, qx, qy, qz = values[4:8]
        poses.append(se3(quaternion_to_matrix([qx, qy, qz, qw]), values[1:4]))
    if not poses:
        raise DatasetError(f"{path}: no poses in the file")
    return np.array(stamps), np.stack(poses)


def _is_sequence(folder: Path) -> bool:
    return (folder / "mav0" / "cam0").is_dir()


class EurocReader(DatasetReader):
    name = "euroc"
    protocol = PROTOCOL

    def find(self, root: Path) -> list[str]:
        if _is_sequence(root):
            return ["."]
        names = sorted(p.name for p in root.iterdir() if p.is_dir() and _is_sequence(p))
        if not names:
            raise DatasetError(f"{root}: no EuRoC sequence (expected folders like MH_01_easy/ with mav0/cam0/data/)")
        return names

    def load(self, root: Path, name: str, stride: int) -> Sequence:
        mav = root / name / "mav0"
        data = need(mav / "cam0" / "data", "the left camera's <stamp_ns>.png images", folder=True)
        images = []
        for p in data.iterdir():
            if p.suffix.lower() == ".png":
                stamp = stamp_from_name(p.stem)
                if stamp is None or not p.stem.isdigit():
                    raise DatasetError(f"{p}: not a EuRoC image name (<stamp in ns>.png)")
                images.append((int(p.stem), p))
        if not images:
            raise DatasetError(f"{data}: no .png images")
        images = strided(sorted(images), stride)
        stamps = np.array([ns_to_seconds(ns) for ns, _ in images])
        t_bs = read_t_bs(mav / "cam0" / "sensor.yaml")
        gt_file = mav / "state_groundtruth_estimate0" / "data.csv"
        gt_stamps, body = read_ground_truth(gt_file)
        match = nearest_within(stamps, gt_stamps, MAX_DT)
        if (match < 0).all():
            raise DatasetError(f"{gt_file}: no pose within {MAX_DT} s of any image in {data}")
        gt = no_pose(len(images))
        gt[match >= 0] = body[match[match >= 0]] @ t_bs
        label = (root / name).resolve().name if name == "." else name
        missing = int((match < 0).sum())
        notes = [f"{missing} of {len(images)} frames have no ground-truth pose within {MAX_DT} s"] if missing else []
        return Sequence("euroc", label, [p for _, p in images], stamps, gt, str(gt_file), notes)


READER = EurocReader()
