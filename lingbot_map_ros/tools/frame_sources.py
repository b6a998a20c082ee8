"""Frame sources for offline runs: a ``.npy`` of model-sized frames, an image folder, a video, a bag.

Images, video and bag frames go through the same ``FramePreprocessor`` as the node, so an offline
run of a recording gives the node's poses. Each source yields ``(frame [3, H, W] float32, stamp_sec)``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator, Optional

import numpy as np
import torch

from ..core.preprocess import FramePreprocessor

IMAGE_PATTERNS = ("*.jpg", "*.png", "*.JPG")  # the official demo's list (MODEL_SPEC §2.1)

FrameAndStamp = tuple[torch.Tensor, float]


def npy_frames(path: str | Path) -> Iterator[FrameAndStamp]:
    """float32 ``[S, 3, H, W]`` in [0, 1], already model-sized (the parity-check input)."""
    frames = np.load(path, mmap_mode="r")
    if frames.ndim != 4 or frames.shape[1] != 3:
        raise ValueError(f"{path}: expected [S, 3, H, W], got {frames.shape}")
    for i in range(frames.shape[0]):
        yield torch.from_numpy(np.array(frames[i], dtype=np.float32)), float(i)


def load_rgb_image(path: str | Path) -> np.ndarray:
    """PIL open + EXIF orientation + RGBA over white + RGB, as the official loader (§2.1 step 2)."""
    from PIL import Image, ImageOps

    with Image.open(path) as im:
        im = ImageOps.exif_transpose(im)
        if im.mode == "RGBA":
            white = Image.new("RGBA", im.size, (255, 255, 255, 255))
            im = Image.alpha_composite(white, im)
        return np.asarray(im.convert("RGB"))


def image_folder_frames(folder: str | Path, preprocessor: Optional[FramePreprocessor] = None) -> Iterator[FrameAndStamp]:
    folder = Path(folder)
    paths = sorted({p for pattern in IMAGE_PATTERNS for p in folder.glob(pattern)})
    if not paths:
        raise ValueError(f"{folder}: no {', '.join(IMAGE_PATTERNS)} files")
    prep = preprocessor or FramePreprocessor()
    for i, path in enumerate(paths):
        yield prep(load_rgb_image(path)), float(i)


def video_frames(path: str | Path, fps: float = 0.0, preprocessor: Optional[FramePreprocessor] = None) -> Iterator[FrameAndStamp]:
    """Decode with OpenCV; keep every round(src_fps / fps)-th frame when ``fps`` > 0.

    Unlike the official demo, frames are not re-encoded as JPEG (MODEL_SPEC §2.3).
    """
    import cv2

    cap = cv2.VideoCapture(str(path))
    if not cap.isOpened():
        raise ValueError(f"{path}: cannot open video")
    src_fps = cap.get(cv2.CAP_PROP_FPS) or 30.0
    stride = max(1, round(src_fps / fps)) if fps > 0 else 1
    prep = preprocessor or FramePreprocessor()
    index = 0
    try:
        while True:
            ok, bgr = cap.read()
            if not ok:
                break
            if index % stride == 0:
                yield prep(np.ascontiguousarray(bgr[:, :, ::-1])), index / src_fps
            index += 1
    finally:
        cap.release()


def bag_frames(path: str | Path, topic: str = "", preprocessor: Optional[FramePreprocessor] = None) -> Iterator[FrameAndStamp]:
    """rosbag2 (mcap or sqlite3) ``Image``/``CompressedImage`` messages, stamped by their headers."""
    from .bag_io import iter_bag_images

    prep = preprocessor or FramePreprocessor()
    for rgb, stamp in iter_bag_images(path, topic):
        yield prep(rgb), stamp
