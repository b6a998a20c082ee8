"""Frame sources for offline runs: a ``.npy`` of model-sized frames, an image folder, a video, a bag.

Images, video and bag frames go through the same ``FramePreprocessor`` as the node, so an offline
run of a recording gives the node's poses. Each source yields ``(frame [3, H, W] float32, stamp_sec)``.

Stamps matter as much as poses: a trajectory is evaluated by associating its stamps with a ground
truth's, so every source carries the recording's own time where it has one:

* image folders: numeric file names are stamps - TUM RGB-D ``1305031102.175304.png`` (seconds) and
  EuRoC ``1403636579763555584.png`` (nanoseconds, 16 digits or more); else ``--stamps FILE`` (one
  stamp per line in name order, or TUM ``rgb.txt`` lines ``stamp path``); else ``--fps`` (i / fps);
  else the frame index;
* videos: the container's presentation time of each frame;
* bags: the header stamp of each message.

``open_*`` check their input before any work (missing, empty, unreadable, undecodable first frame)
and raise ``SourceError`` - one sentence naming the file and what to do.
"""
from __future__ import annotations

import contextlib
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence

import numpy as np
import torch

from ..core.preprocess import FramePreprocessor
from ..core.trajectory import data_lines
from .cli import UsageError

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")  # any case; the official demo's *.jpg/*.png plus *.jpeg
IMAGE_PATTERNS = tuple(f"*{s}" for s in IMAGE_SUFFIXES)  # kept for callers of the old name

FrameAndStamp = tuple[torch.Tensor, float]


class SourceError(UsageError):
    """An input that cannot be read as frames; ``str(exc)`` names the file and what to do."""


@dataclass
class FrameSource:
    """A checked input: what it is, how many frames (None: unknown), and the frames themselves."""

    description: str
    total: Optional[int]
    open: Callable[[], Iterator[FrameAndStamp]]
    stamps_from: str = ""  # where the stamps come from (said in the log)

    def __iter__(self) -> Iterator[FrameAndStamp]:
        return self.open()


# ------------------------------------------------------------------------------------------ .npy


def npy_frames(path: str | Path) -> Iterator[FrameAndStamp]:
    """float32 ``[S, 3, H, W]`` in [0, 1], already model-sized (the parity-check input)."""
    frames = np.load(path, mmap_mode="r")
    if frames.ndim != 4 or frames.shape[1] != 3:
        raise ValueError(f"{path}: expected [S, 3, H, W], got {frames.shape}")
    for i in range(frames.shape[0]):
        yield torch.from_numpy(np.array(frames[i], dtype=np.float32)), float(i)


def open_npy(path: str | Path) -> FrameSource:
    p = Path(path)
    if not p.is_file():
        raise SourceError(f"--frames {path}: no such file (a float32 .npy [S, 3, H, W] in [0, 1])")
    try:
        frames = np.load(p, mmap_mode="r")
    except Exception as exc:  # noqa: BLE001 - numpy raises several types for a non-npy file
        raise SourceError(f"--frames {path}: not a .npy array ({exc})") from None
    if frames.ndim != 4 or frames.shape[1] != 3:
        raise SourceError(f"--frames {path}: expected float32 [S, 3, H, W], got shape {tuple(frames.shape)}")
    return FrameSource(f"{path}: {frames.shape[0]} model-sized frames", int(frames.shape[0]),
                       lambda: npy_frames(p), "frame indices")


# ------------------------------------------------------------------------------------------ images


def load_rgb_image(path: str | Path) -> np.ndarray:
    """PIL open + EXIF orientation + RGBA over white + RGB, as the official loader (§2.1 step 2)."""
    from PIL import Image, ImageOps

    with Image.open(path) as im:
        im = ImageOps.exif_transpose(im)
        if im.mode == "RGBA":
            white = Image.new("RGBA", im.size, (255, 255, 255, 255))
            im = Image.alpha_composite(white, im)
        return np.asarray(im.convert("RGB"))


_SECONDS = re.compile(r"^\d+\.\d+$")
_INTEGER = re.compile(r"^\d+$")
NS_DIGITS = 16  # an integer name this long is nanoseconds (EuRoC: 19 digits); shorter ones are frame numbers


def stamp_from_name(stem: str) -> Optional[float]:
    """The stamp a file name states, in seconds, or None.

    ``1305031102.175304`` -> seconds (TUM RGB-D); ``1403636579763555584`` (>= 16 digits) -> ns
    (EuRoC, ASL); ``000123`` is a frame number, not a time.
    """
    if _SECONDS.match(stem):
        return float(stem)
    if _INTEGER.match(stem) and len(stem) >= NS_DIGITS:
        ns = int(stem)
        return ns // 1_000_000_000 + (ns % 1_000_000_000) * 1e-9
    return None


def image_paths(folder: str | Path) -> list[Path]:
    """Every ``*.jpg``/``*.jpeg``/``*.png`` (any case) directly in ``folder``, sorted by name."""
    return sorted(p for p in Path(folder).iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)


def read_stamps_file(path: str | Path) -> list[tuple[float, Optional[str]]]:
    """``[(stamp, path or None)]`` from a stamps file: ``stamp`` or ``stamp path`` per line.

    TUM's ``rgb.txt`` (``1305031102.175304 rgb/1305031102.175304.png``) and plain lists of numbers
    both work; ``#`` lines and blank lines are skipped; a bad line is refused with its number.
    """
    rows: list[tuple[float, Optional[str]]] = []
    for lineno, parts in data_lines(path):
        try:
            stamp = float(parts[0])
        except ValueError:
            raise SourceError(f"--stamps {path}:{lineno}: {parts[0]!r} is not a stamp in seconds") from None
        rows.append((stamp, parts[1] if len(parts) > 1 else None))
    if not rows:
        raise SourceError(f"--stamps {path}: no stamps in the file")
    return rows


def stamp_problems(stamps: Sequence[float]) -> str:
    """``"2 duplicate stamps, 1 going backwards"`` or ``""``: what breaks association with a ground truth.

    A duplicate is a stamp seen before anywhere in the file, not only on the line above: a recording
    played twice repeats every stamp after a single step back.
    """
    s = np.asarray(stamps, dtype=np.float64).reshape(-1)
    if s.size < 2:
        return ""
    d = np.diff(s)
    parts = []
    duplicates = int(s.size - np.unique(s).size)
    if duplicates:
        parts.append(f"{duplicates} duplicate stamps")
    if (d < 0).any():
        parts.append(f"{int((d < 0).sum())} going backwards")
    return ", ".join(parts)


def folder_stamps(folder: Path, paths: list[Path], stamps_file: str = "",
                  fps: float = 0.0) -> tuple[list[Path], list[float], str]:
    """``(paths, stamps, where they came from)`` for an image folder (rules in the module docstring).

    With a ``stamp path`` stamps file, its lines decide which images are used and in which order
    (paths relative to the stamps file's folder, or file names in ``folder``).
    """
    if stamps_file:
        rows = read_stamps_file(stamps_file)
        if all(p is not None for _, p in rows):
            base = Path(stamps_file).parent
            by_name = {p.name: p for p in paths}
            chosen = []
            for stamp, rel in rows:
                cand = base / rel  # type: ignore[operator]
                found = cand if cand.is_file() else by_name.get(Path(rel).name)  # type: ignore[arg-type]
                if found is None:
                    raise SourceError(f"--stamps {stamps_file}: image {rel} is neither in {base} nor in {folder}")
                chosen.append(found)
            return chosen, [s for s, _ in rows], f"{stamps_file} (stamp path lines)"
        if any(p is not None for _, p in rows):
            raise SourceError(f"--stamps {stamps_file}: mixes 'stamp' and 'stamp path' lines; use one form")
        if len(rows) != len(paths):
            raise SourceError(f"--stamps {stamps_file}: {len(rows)} stamps for {len(paths)} images in {folder}; "
                              "give one stamp per image (in file-name order)")
        return paths, [s for s, _ in rows], str(stamps_file)
    named = [stamp_from_name(p.stem) for p in paths]
    if all(s is not None for s in named):
        order = sorted(range(len(paths)), key=lambda i: named[i])  # type: ignore[arg-type, return-value]
        return [paths[i] for i in order], [float(named[i]) for i in order], "file names"  # type: ignore[arg-type]
    if fps > 0:
        return paths, [i / fps for i in range(len(paths))], f"--fps {fps:g}"
    return paths, [float(i) for i in range(len(paths))], "frame indices (no stamps in the names: use --stamps or --fps)"


def _check_images(paths: Sequence[Path]) -> None:
    """Open every image's header (cheap, no decoding): a corrupt or mislabelled file is named now."""
    from PIL import Image, UnidentifiedImageError

    for p in paths:
        try:
            with Image.open(p) as im:
                im.size  # noqa: B018 - reading the header is the check
        except (UnidentifiedImageError, OSError) as exc:
            raise SourceError(f"{p}: not a readable image ({type(exc).__name__}); remove or replace it") from None


def open_images(folder: str | Path, stamps_file: str = "", fps: float = 0.0,
                preprocessor: Optional[FramePreprocessor] = None) -> FrameSource:
    d = Path(folder)
    if not d.is_dir():
        raise SourceError(f"--images {folder}: no such folder")
    paths = image_paths(d)
    if not paths:
        raise SourceError(f"--images {folder}: no *.jpg, *.jpeg or *.png files in the folder")
    if stamps_file and not Path(stamps_file).is_file():
        raise SourceError(f"--stamps {stamps_file}: no such file")
    paths, stamps, how = folder_stamps(d, paths, stamps_file, fps)
    _check_images(paths)
    prep = preprocessor or FramePreprocessor()

    def frames() -> Iterator[FrameAndStamp]:
        for path, stamp in zip(paths, stamps):
            try:
                rgb = load_rgb_image(path)
            except OSError as exc:
                raise SourceError(f"{path}: cannot decode the image ({exc})") from None
            yield prep(rgb), stamp

    return FrameSource(f"{folder}: {len(paths)} images", len(paths), frames, how)


def image_folder_frames(folder: str | Path, preprocessor: Optional[FramePreprocessor] = None,
                        stamps_file: str = "", fps: float = 0.0) -> Iterator[FrameAndStamp]:
    """The frames of an image folder with their stamps (see ``open_images``)."""
    return iter(open_images(folder, stamps_file, fps, preprocessor))


# ------------------------------------------------------------------------------------------ video


def video_frames(
    path: str | Path, fps: float = 0.0, preprocessor: Optional[FramePreprocessor] = None
) -> Iterator[FrameAndStamp]:
    """Decode with OpenCV; keep every round(src_fps / fps)-th frame when ``fps`` > 0.

    Stamps are the container's presentation times (``CAP_PROP_POS_MSEC`` of each decoded frame),
    which stay right for variable-frame-rate files; index / fps when the container gives none.
    Unlike the official demo, frames are not re-encoded as JPEG (MODEL_SPEC §2.3).
    """
    import cv2

    cap = cv2.VideoCapture(str(path))
    if not cap.isOpened():
        raise SourceError(f"--video {path}: cannot open the video (not a video, or a codec OpenCV lacks)")
    src_fps = cap.get(cv2.CAP_PROP_FPS) or 30.0
    stride = max(1, round(src_fps / fps)) if fps > 0 else 1
    prep = preprocessor or FramePreprocessor()
    index = 0
    last = -1.0
    try:
        while True:
            ok, bgr = cap.read()
            if not ok:
                break
            msec = cap.get(cv2.CAP_PROP_POS_MSEC)
            stamp = msec / 1e3 if (msec > 0 or index == 0) and msec / 1e3 > last else index / src_fps
            last = stamp
            if index % stride == 0:
                yield prep(np.ascontiguousarray(bgr[:, :, ::-1])), stamp
            index += 1
    finally:
        cap.release()


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Silence file descriptor 2 for a moment: FFmpeg prints its own complaints ("moov atom not
    found") from C, which would turn the tool's one-line error into several."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def still_image_format(path: Path) -> Optional[str]:
    """The format name (``PNG``, ``JPEG``, ...) when ``path`` holds one still image, else None.

    Why: FFmpeg's image demuxer opens a PNG or JPEG as a video of one frame, so ``--video photo.png``
    would "succeed" with a trajectory of one pose. Decided by the file's content (Pillow), not its
    name; an animated image (GIF, APNG: more than one frame) is left to the video decoder."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            return str(im.format) if getattr(im, "n_frames", 1) == 1 else None
    except (UnidentifiedImageError, OSError, ValueError):
        return None


def open_video(path: str | Path, fps: float = 0.0, preprocessor: Optional[FramePreprocessor] = None) -> FrameSource:
    import cv2

    p = Path(path)
    if not p.is_file():
        raise SourceError(f"--video {path}: no such file")
    still = still_image_format(p)
    if still:
        raise SourceError(f"--video {path}: a still image ({still}), not a video; for images use --images "
                          "with their folder")
    with _quiet_stderr():
        cap = cv2.VideoCapture(str(p))
        try:
            ok = cap.isOpened() and cap.read()[0]
            count = int(cap.get(cv2.CAP_PROP_FRAME_COUNT) or 0)
            src_fps = cap.get(cv2.CAP_PROP_FPS) or 30.0
        finally:
            cap.release()
    if not ok:
        raise SourceError(f"--video {path}: cannot decode a frame (not a video, or a codec OpenCV lacks)")
    stride = max(1, round(src_fps / fps)) if fps > 0 else 1
    total = -(-count // stride) if count > 0 else None
    return FrameSource(f"{path}: video at {src_fps:g} fps" + (f", every {stride}-th frame" if stride > 1 else ""),
                       total, lambda: video_frames(p, fps, preprocessor), "the container's timestamps")


# ------------------------------------------------------------------------------------------ bags


def bag_frames(
    path: str | Path, topic: str = "", preprocessor: Optional[FramePreprocessor] = None
) -> Iterator[FrameAndStamp]:
    """rosbag2 (mcap or sqlite3) or ROS 1 ``Image``/``CompressedImage`` messages, stamped by their headers."""
    from ..ros.image_io import UnsupportedImage
    from .bag_io import iter_bag_images

    prep = preprocessor or FramePreprocessor()
    index = 0
    images = iter_bag_images(path, topic)
    while True:
        try:
            rgb, stamp = next(images)
        except StopIteration:
            return
        except UnsupportedImage as exc:
            raise SourceError(f"--bag {path}: message {index} of {topic or 'the image topic'}: {exc}") from None
        yield prep(rgb), stamp
        index += 1


def open_bag(path: str | Path, topic: str = "", preprocessor: Optional[FramePreprocessor] = None) -> FrameSource:
    from .bag_io import BagError, bag_kind, check_first_image

    try:
        kind, _ = bag_kind(path)
        chosen, msgtype, count = check_first_image(path, topic)
    except BagError as exc:
        raise SourceError(f"--bag {exc}") from None
    name = "ROS 1 bag" if kind == "ros1" else "rosbag2"
    return FrameSource(f"{path} ({name}): {chosen} ({msgtype.rsplit('/', 1)[-1]}, {count} messages)", count or None,
                       lambda: bag_frames(path, chosen, preprocessor), "message header stamps")


__all__ = ["FrameSource", "IMAGE_SUFFIXES", "SourceError", "bag_frames", "folder_stamps", "image_folder_frames",
           "image_paths", "load_rgb_image", "npy_frames", "open_bag", "open_images", "open_npy", "open_video",
           "read_stamps_file", "stamp_from_name", "stamp_problems", "still_image_format", "video_frames"]
