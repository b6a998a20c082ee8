"""The frames ``lingbot_map_benchmark`` hands the model, per dataset, against a reference that applies
the official loaders' steps independently (OpenCV / PIL calls written here from the official
readers' descriptions, then the official area budget), bit for bit: 574x434 for the 640x480
datasets, 504x280 for KITTI and VBR, 518 wide elsewhere. ``--image-size node`` feeds the node's
preprocessing at ``--image-width`` instead, and records that width."""
from __future__ import annotations

import math
from types import SimpleNamespace

import cv2
import numpy as np
import pytest
import torch
from benchmark_layouts import (
    write_7scenes,
    write_droid_w,
    write_eth3d_published,
    write_euroc,
    write_kitti,
    write_nrgbd,
    write_oxford,
    write_tnt,
    write_tum,
    write_vbr,
)
from PIL import Image

from lingbot_map_ros.core.preprocess import FramePreprocessor
from lingbot_map_ros.tools.benchmark import model_width, stream_sequence
from lingbot_map_ros.tools.datasets import READERS
from lingbot_map_ros.tools.frame_sources import load_rgb_image


# ------------------------------------------------------------- the reference: the official steps
def width_518(rgb: np.ndarray, pil: bool = False, rounded: bool = False) -> np.ndarray:
    h, w = rgb.shape[:2]
    if w == 518:
        return rgb
    height = (round(518 * h / w) if rounded else int(518 * (h / w))) // 14 * 14
    if pil:
        return np.asarray(Image.fromarray(rgb).resize((518, height), Image.LANCZOS))
    return cv2.resize(rgb, (518, height), interpolation=cv2.INTER_LINEAR)


def cover_504x280(rgb: np.ndarray) -> np.ndarray:
    h, w = rgb.shape[:2]
    s = max(504 / w, 280 / h)
    big = cv2.resize(rgb, (int(round(w * s)), int(round(h * s))), interpolation=cv2.INTER_AREA)
    y, x = (big.shape[0] - 280) // 2, (big.shape[1] - 504) // 2
    return big[y:y + 280, x:x + 504]


def budget(rgb: np.ndarray) -> np.ndarray:
    h, w = rgb.shape[:2]
    s = min(1.0, math.sqrt(255000 / (w * h)))
    size = (max(int(w * s) // 14 * 14, 14), max(int(h * s) // 14 * 14, 14))
    return cv2.resize(rgb, size, interpolation=cv2.INTER_LINEAR) if size != (w, h) else rgb


REFERENCE = {
    "tum": lambda rgb: budget(width_518(rgb)),
    "7scenes": budget,
    "nrgbd": budget,
    "kitti": lambda rgb: budget(cover_504x280(rgb)),
    "vbr": lambda rgb: budget(cover_504x280(rgb)),
    "eth3d": lambda rgb: budget(width_518(rgb)),
    "tnt": lambda rgb: budget(width_518(rgb, pil=True)),
    "oxford": lambda rgb: budget(width_518(rgb, pil=True)),
    "droid_w": lambda rgb: budget(width_518(rgb, pil=True, rounded=True)),
}

# dataset -> (writer of a 2-3 frame sequence at the camera's size (H, W), the sequence's name, the
# official model input (W, H) from the official README and readers)
CASES = {
    "tum": (lambda r, hw: write_tum(r, n=2, hw=hw), "rgbd_dataset_freiburg1_xyz", (480, 640), (518, 378)),
    "7scenes": (lambda r, hw: write_7scenes(r, "chess", (3,), n=2, hw=hw), "chess/seq-03", (480, 640), (574, 434)),
    "nrgbd": (lambda r, hw: write_nrgbd(r, n=2, hw=hw), "breakfast_room", (480, 640), (574, 434)),
    "kitti": (lambda r, hw: write_kitti(r, n=2, hw=hw), "05", (376, 1241), (504, 280)),
    "vbr": (lambda r, hw: write_vbr(r, n=2, hw=hw), "campus_train0", (700, 1388), (504, 280)),
    "eth3d": (lambda r, hw: write_eth3d_published(r, n=2, hw=hw), "courtyard", (1008, 1512), (518, 336)),
    "tnt": (lambda r, hw: write_tnt(r, n=2, hw=hw), "Barn", (1080, 1920), (518, 280)),
    "oxford": (lambda r, hw: write_oxford(r, n=2, hw=hw), "keble-college-02", (1080, 1440), (518, 378)),
    "droid_w": (lambda r, hw: write_droid_w(r, n=3, hw=hw), "downtown1", (1200, 1600), (518, 378)),
}


class RecordingManager:
    """Stands in for ``SessionManager``: keeps every frame pushed, answers with a pose."""

    def __init__(self) -> None:
        self.frames: list[torch.Tensor] = []

    def push(self, frame: torch.Tensor, stamp: int):
        self.frames.append(frame)
        return [SimpleNamespace(stamp=stamp, c2w=np.eye(4), session_id=0, image_hw=tuple(frame.shape[1:]))]

    def flush(self):
        return []


BAR = SimpleNamespace(update=lambda *a, **k: None)


@pytest.mark.parametrize("dataset", sorted(CASES))
def test_model_input_equals_the_official_steps_bit_for_bit(dataset, tmp_path):
    write, name, hw, official_wh = CASES[dataset]
    write(tmp_path, hw)
    reader = READERS[dataset]
    seq = reader.load(tmp_path, name, 1)
    manager = RecordingManager()
    stream_sequence(manager, seq, reader.protocol.prepare, BAR)  # width None: the official sizes
    assert len(manager.frames) == len(seq.images) >= 2
    for path, frame in zip(seq.images, manager.frames):
        ref = REFERENCE[dataset](load_rgb_image(path))
        assert (ref.shape[1], ref.shape[0]) == official_wh
        expected = torch.from_numpy(np.array(ref)).permute(2, 0, 1).to(torch.float64) / 255.0
        assert frame.dtype == torch.float32 and frame.shape == (3, official_wh[1], official_wh[0])
        assert torch.equal(frame.double(), expected.float().double()), dataset


def test_node_image_size_uses_the_node_preprocessing_at_the_given_width(tmp_path):
    write_7scenes(tmp_path, "chess", (3,), n=2, hw=(480, 640))
    seq = READERS["7scenes"].load(tmp_path, "chess/seq-03", 1)
    manager = RecordingManager()
    stream_sequence(manager, seq, lambda rgb: rgb, BAR, width=280)
    prep = FramePreprocessor(width=280)
    for path, frame in zip(seq.images, manager.frames):
        assert torch.equal(frame, prep(load_rgb_image(path)))
        assert frame.shape == (3, 210, 280)


def test_datasets_without_an_official_size_run_the_node_preprocessing(tmp_path):
    official = SimpleNamespace(image_size="official", image_width=518)
    assert model_width(official, READERS["7scenes"].protocol) is None
    assert model_width(official, READERS["euroc"].protocol) == 518  # EuRoC has no official size
    assert model_width(SimpleNamespace(image_size="node", image_width=280), READERS["7scenes"].protocol) == 280
    write_euroc(tmp_path, n=2, hw=(480, 752))
    reader = READERS["euroc"]
    seq = reader.load(tmp_path, "MH_01_easy", 1)
    manager = RecordingManager()
    stream_sequence(manager, seq, reader.protocol.prepare, BAR, width=model_width(official, reader.protocol))
    prep = FramePreprocessor(width=518)
    for path, frame in zip(seq.images, manager.frames):
        assert torch.equal(frame, prep(load_rgb_image(path))) and frame.shape[2] == 518
