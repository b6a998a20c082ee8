"""The one interface every dataset reader has, the official protocol each one carries, and the image
steps the official benchmark applies before its model sees a frame.

A reader knows one dataset's published layout: ``find(root)`` lists its sequences, ``load(root,
name, stride)`` gives a ``Sequence``: image paths, a stamp per frame and the ground-truth pose of
each frame (NaN where the dataset has none), read from the dataset's own files. Everything a reader
refuses is a ``DatasetError``: one line that names the file and what is wrong with it, so the
benchmark can fail that sequence and go on with the others.

``Protocol`` holds the facts of the official LingBot-Map benchmark for the dataset (frame stride,
the image the model is fed, how ground truth is matched, whether the pose AUC is reported, the
official numbers of ``lingbot-map.pt``) and ``source``: the files of the official repository's
``benchmark/`` folder each fact comes from. Datasets the official benchmark has no entry for
(EuRoC, TartanAir) carry our own protocol, marked ``official=None``.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional
from typing import Sequence as Seq

import cv2
import numpy as np

PATCH = 14  # the official image steps keep both sides multiples of the patch size
AREA_BUDGET = 255_000  # official method config: W * H <= this after the dataset's own resize
OFFICIAL_WIDTH = 518  # official dataset configs' load_img_size


class DatasetError(ValueError):
    """A dataset folder or file the reader cannot use; ``str(exc)`` names the file (one line)."""


@dataclass(frozen=True)
class OfficialResult:
    """The official table's numbers for ``lingbot-map.pt`` (streaming) on one dataset."""

    scenes: int
    ate: float
    rpe_trans: float
    rpe_rot_deg: float
    auc_macro: Optional[tuple[float, float, float, float]] = None  # AUC@3, @5, @15, @30 (percent)
    auc_micro: Optional[tuple[float, float, float, float]] = None
    # The point-cloud table: accuracy, completeness, Chamfer (metres), precision, recall, F1 (percent)
    points: Optional[tuple[float, float, float, float, float, float]] = None


@dataclass(frozen=True)
class Protocol:
    """How the official benchmark runs and scores one dataset."""

    title: str  # the dataset's name in the official table
    stride: int  # every stride-th frame of a sequence is used
    prepare: Callable[[np.ndarray], np.ndarray]  # RGB uint8 -> the RGB uint8 the official model is fed
    image: str  # what ``prepare`` does, in words
    ground_truth: str  # how a frame gets its ground-truth pose, in words
    auc: bool  # the official table reports the pose AUC for this dataset
    official: Optional[OfficialResult]
    source: tuple[str, ...]  # files of the official repository (benchmark/...) the facts come from
    notes: tuple[str, ...] = ()
    # The official scene list: only these scenes count (None: every scene the layout holds), less
    # ``excluded`` ones. A sequence name's first path part is its scene (``chess/seq-03`` -> chess).
    scenes: Optional[tuple[str, ...]] = None
    excluded: tuple[str, ...] = ()

    def is_official_scene(self, sequence: str) -> bool:
        """Whether the official benchmark runs ``sequence`` (``--all-scenes`` runs the others too)."""
        scene = sequence.split("/", 1)[0]
        if scene == ".":
            return True  # a scene folder given itself: the user chose it
        return scene not in self.excluded and (self.scenes is None or scene in self.scenes)


@dataclass
class Sequence:
    """One sequence, read and strided: what the benchmark feeds and what it scores against."""

    dataset: str
    name: str  # as the dataset names it, e.g. "chess/seq-03"
    images: list[Path]  # [N], in playback order
    stamps: np.ndarray  # [N] seconds (the frame index where the layout has no time)
    gt_c2w: np.ndarray  # [N, 4, 4] camera(optical)-to-world, NaN where the frame has no ground truth
    ground_truth: str  # the file(s) the poses came from (named in messages)
    notes: list[str] = field(default_factory=list)

    @property
    def safe_name(self) -> str:
        """The name as one folder name (``chess/seq-03`` -> ``chess_seq-03``)."""
        return re.sub(r"[^\w.-]+", "_", self.name).strip("_") or "sequence"

    @property
    def frames_with_gt(self) -> int:
        return int(np.isfinite(self.gt_c2w.reshape(len(self.gt_c2w), -1)).all(axis=1).sum())


class DatasetReader:
    """What every dataset module implements (one instance per module, registered by name)."""

    name: str = ""
    protocol: Protocol

    def find(self, root: Path) -> list[str]:
        """Sequence names under ``root`` in the dataset's published layout (``DatasetError`` when the
        folder holds none: the message says what was expected)."""
        raise NotImplementedError

    def load(self, root: Path, name: str, stride: int) -> Sequence:
        """One sequence with every ``stride``-th frame and its ground truth (``DatasetError``)."""
        raise NotImplementedError


# --------------------------------------------------------------------------------------- helpers
def need(path: Path, what: str = "", folder: bool = False) -> Path:
    """``path`` exists (a folder with ``folder``), else ``DatasetError`` naming it and, in ``what``,
    what it should hold."""
    if not (path.is_dir() if folder else path.is_file()):
        kind = "folder" if folder else "file"
        raise DatasetError(f"{path}: no such {kind}" + (f" ({what})" if what else ""))
    return path


def strided(items: Seq, stride: int) -> list:
    if stride < 1:
        raise ValueError(f"stride must be >= 1 (got {stride})")
    return list(items)[::stride]


def numbers(path: Path, line: str, lineno: int, count: Optional[int] = None) -> list[float]:
    """The floats of one text line; ``DatasetError`` naming ``path:lineno`` when it has others."""
    try:
        values = [float(v) for v in line.replace(",", " ").split()]
    except ValueError:
        raise DatasetError(f"{path}:{lineno}: not a line of numbers: {line.strip()[:60]!r}") from None
    if count is not None and len(values) != count:
        raise DatasetError(f"{path}:{lineno}: expected {count} numbers, got {len(values)}")
    return values


def matrix_file(path: Path, rows: int = 4) -> np.ndarray:
    """A text file holding one ``rows x 4`` matrix (7-Scenes ``frame-*.pose.txt``)."""
    lines = [(i, t) for i, t in enumerate(need(path).read_text().splitlines(), 1) if t.strip()]
    if len(lines) != rows:
        raise DatasetError(f"{path}: expected {rows} rows of 4 numbers, got {len(lines)} lines")
    return np.array([numbers(path, t, i, 4) for i, t in lines], dtype=np.float64)


def homogeneous(top: np.ndarray) -> np.ndarray:
    """[..., 3, 4] or [..., 4, 4] -> [..., 4, 4] with the last row 0 0 0 1."""
    out = np.zeros(top.shape[:-2] + (4, 4))
    out[..., :3, :] = top[..., :3, :]
    out[..., 3, 3] = 1.0
    return out


def no_pose(n: int) -> np.ndarray:
    return np.full((n, 4, 4), np.nan)


# ----------------------------------------------------------------- the official image steps
def resize_to_width(rgb: np.ndarray, width: int = OFFICIAL_WIDTH, lanczos: bool = False,
                    rounded: bool = False) -> np.ndarray:
    """The official readers' ``load_img_size``: width ``width``, height ``int(width * h / w)`` floored
    to a multiple of 14 (a slight squash, no crop); OpenCV bilinear, or PIL Lanczos (Tanks and
    Temples, Oxford Spires, DROID-W). ``rounded``: the height is rounded before the floor
    (``round(width * h / w)``, Python's rounding, as the DROID-W reader does). An image already
    ``width`` wide is kept as it is, as the official readers do (PIL would copy it unchanged)."""
    h, w = rgb.shape[:2]
    if w == width:
        return rgb
    # each reader's own expression: int(width * (h / w)), or round(width * h / w) (DROID-W)
    height = round(width * h / w) if rounded else int(width * (float(h) / w))
    height = max(height // PATCH * PATCH, PATCH)
    if lanczos:
        from PIL import Image

        return np.asarray(Image.fromarray(rgb).resize((width, height), Image.Resampling.LANCZOS)).copy()
    return cv2.resize(rgb, (width, height), interpolation=cv2.INTER_LINEAR)


def area_budget(rgb: np.ndarray, budget: int = AREA_BUDGET, align: int = PATCH) -> np.ndarray:
    """The official loader's resize for every dataset: scale down (never up) so ``W * H <= budget``,
    both sides floored to multiples of ``align``; OpenCV bilinear (640x480 -> 574x434)."""
    h, w = rgb.shape[:2]
    scale = min(math.sqrt(budget / (w * h)), 1.0)
    new_w = max(int(w * scale) // align * align, align)
    new_h = max(int(h * scale) // align * align, align)
    if (new_w, new_h) == (w, h):
        return rgb
    return cv2.resize(rgb, (new_w, new_h), interpolation=cv2.INTER_LINEAR)


def cover_crop(rgb: np.ndarray, size_wh: tuple[int, int]) -> np.ndarray:
    """Scale (OpenCV area) so the image covers ``size_wh``, then centre-crop to exactly that size
    (the official KITTI reader's 504x280)."""
    h, w = rgb.shape[:2]
    tw, th = size_wh
    scale = max(tw / w, th / h)
    rw, rh = int(round(w * scale)), int(round(h * scale))
    resized = cv2.resize(rgb, (rw, rh), interpolation=cv2.INTER_AREA)
    x0, y0 = (rw - tw) // 2, (rh - th) // 2
    return np.ascontiguousarray(resized[y0:y0 + th, x0:x0 + tw])


def chain(*steps: Callable[[np.ndarray], np.ndarray]) -> Callable[[np.ndarray], np.ndarray]:
    def run(rgb: np.ndarray) -> np.ndarray:
        for step in steps:
            rgb = step(rgb)
        return rgb

    return run


def unchanged(rgb: np.ndarray) -> np.ndarray:
    return rgb


__all__ = ["AREA_BUDGET", "DatasetError", "DatasetReader", "OfficialResult", "Protocol", "Sequence", "area_budget",
           "chain", "cover_crop", "homogeneous", "matrix_file", "need", "no_pose", "numbers", "resize_to_width",
           "strided", "unchanged"]
