"""ROS ``sensor_msgs/Image`` / ``CompressedImage`` -> RGB uint8 [H, W, 3], behind one function.

Why three paths:
- Common raw encodings (rgb8, bgr8, rgba8, bgra8, mono8/8UC1, and their 16-bit forms) are converted
  here with numpy views + OpenCV colour swaps: it is the fastest path (no per-pixel Python, well under
  1 ms at 640x480) and it applies the demo's colour rules exactly (alpha over white, grey replicated,
  ``preprocess.to_rgb``), which cv_bridge would not (it drops alpha).
- Compressed images are decoded with PIL, the decoder the official demo reads its frames with, so a
  JPEG/PNG gives exactly the demo's pixels (OpenCV is the fallback for formats PIL cannot open).
- Demosaicing and YUV 4:2:2 go to ROS 2 cv_bridge where it is importable and actually works (on a
  robot), else to rosbags-image. PyPI's ``cv_bridge`` is an old ROS 1 copy that fails on numpy 2;
  a one-time functional probe detects it (or any other broken bridge) and skips it.

16-bit data (mono16, rgb16, ..., 16-bit PNG) is scaled over its full range to 8 bits,
``round(v / 257)``, cv_bridge's rule, so a 12-bit camera left-aligned in 16 bits looks right. (The
demo would clip 16-bit PNGs at 255: useless for real data, so not reproduced.)

Everything unsupported raises ``UnsupportedImage`` with the reason; the node logs it and drops the
frame. This module imports no rclpy: it reads any object with the message's fields (rclpy messages,
rosbags typesys messages, simple namespaces).
"""
from __future__ import annotations

import io
import threading
import types
from typing import Any, Callable, Optional

import cv2
import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from ..core.preprocess import RGB_ENCODINGS, to_rgb

# Encodings handed to cv_bridge / rosbags-image (conversion to rgb8 is theirs): name -> (bytes/px, itemsize)
CONVERTER_ENCODINGS: dict[str, tuple[int, int]] = {
    **{f"bayer_{p}8": (1, 1) for p in ("rggb", "bggr", "gbrg", "grbg")},
    **{f"bayer_{p}16": (2, 2) for p in ("rggb", "bggr", "gbrg", "grbg")},
    "yuv422": (2, 1),  # UYVY
    "uyvy": (2, 1),
    "yuyv": (2, 1),
    "yuv422_yuy2": (2, 1),
}

_NOT_COLOUR_HINT = {
    "16UC1": "a depth image (16UC1), not a camera image",
    "32FC1": "a float depth/disparity image (32FC1), not a camera image",
    "nv12": "planar YUV (nv12) is not supported; publish rgb8/bgr8 or yuv422",
    "nv21": "planar YUV (nv21) is not supported; publish rgb8/bgr8 or yuv422",
}


class UnsupportedImage(ValueError):
    """A message that cannot become an RGB frame; ``str(exc)`` says why, ``kind`` names the class of
    problem the node counts it under (``unsupported``, ``zero_size``, ``data_length``)."""

    def __init__(self, reason: str, kind: str = "unsupported") -> None:
        super().__init__(reason)
        self.kind = kind


def supported_encodings() -> list[str]:
    """Every raw ``Image.encoding`` ``message_to_rgb`` accepts (converter ones need a backend)."""
    return sorted(RGB_ENCODINGS) + sorted(CONVERTER_ENCODINGS)


# ---------------------------------------------------------------------------------------------
# converter backends for bayer / yuv
# ---------------------------------------------------------------------------------------------
_backend_lock = threading.Lock()
_backend: Optional[tuple[str, Callable[[Any], np.ndarray]]] = None


def _probe_cv_bridge() -> Optional[Callable[[Any], np.ndarray]]:
    """ROS 2 cv_bridge's converter if it imports *and* converts a probe image correctly, else None.

    The probe (2x2 bgr8 with a padded row) catches the PyPI ROS 1 copy, which imports but fails on
    numpy 2 or ignores ``step``, without having to recognise it by name or version.
    """
    try:
        from cv_bridge import CvBridge  # type: ignore[import-not-found]

        bridge = CvBridge()
        probe = types.SimpleNamespace(
            header=None, height=2, width=2, encoding="bgr8", is_bigendian=0, step=8,
            data=bytes([1, 2, 3, 4, 5, 6, 0, 0, 7, 8, 9, 10, 11, 12, 0, 0]),
        )
        out = np.asarray(bridge.imgmsg_to_cv2(probe, desired_encoding="rgb8"))
        expected = np.array([[[3, 2, 1], [6, 5, 4]], [[9, 8, 7], [12, 11, 10]]], np.uint8)
        if out.shape != expected.shape or not np.array_equal(out, expected):
            return None
    except Exception:  # noqa: BLE001 - any failure means "do not use it"
        return None
    return lambda msg: np.asarray(bridge.imgmsg_to_cv2(msg, desired_encoding="rgb8"))


def _rosbags_converter() -> Optional[Callable[[Any], np.ndarray]]:
    """rosbags-image's ``message_to_cvimage(msg, 'rgb8')``, or None when not installed."""
    try:
        from rosbags.image import message_to_cvimage
    except Exception:  # noqa: BLE001
        return None
    return lambda msg: np.asarray(message_to_cvimage(msg, "rgb8"))


def converter_backend() -> str:
    """Name of the backend used for bayer/yuv: ``cv_bridge``, ``rosbags-image`` or ``none``."""
    return _get_backend()[0]


def _get_backend() -> tuple[str, Callable[[Any], np.ndarray]]:
    global _backend
    with _backend_lock:
        if _backend is None:
            conv = _probe_cv_bridge()
            if conv is not None:
                _backend = ("cv_bridge", conv)
            elif (conv := _rosbags_converter()) is not None:
                _backend = ("rosbags-image", conv)
            else:
                def _none(msg: Any) -> np.ndarray:
                    raise UnsupportedImage(
                        f"encoding {msg.encoding!r} needs ROS 2 cv_bridge or rosbags-image; neither is installed"
                    )
                _backend = ("none", _none)
        return _backend


# ---------------------------------------------------------------------------------------------
# raw images
# ---------------------------------------------------------------------------------------------
def _buffer(data: Any) -> np.ndarray:
    """Message ``data`` (bytes, bytearray, array.array, numpy array, list) -> flat uint8 view/array."""
    if isinstance(data, np.ndarray):
        return data.reshape(-1).view(np.uint8) if data.dtype.itemsize == 1 else data.view(np.uint8).reshape(-1)
    try:
        return np.frombuffer(data, dtype=np.uint8)
    except TypeError:
        return np.asarray(data, dtype=np.uint8).reshape(-1)  # a plain list: slow but correct


def _raw_rows(msg: Any, bytes_per_pixel: int) -> np.ndarray:
    """Validated pixel bytes [H, W * bytes_per_pixel] (a view; padding at row ends dropped)."""
    height, width, step = int(msg.height), int(msg.width), int(msg.step)
    if height <= 0 or width <= 0:
        raise UnsupportedImage(f"zero-sized image ({width}x{height})", kind="zero_size")
    row_bytes = width * bytes_per_pixel
    if step < row_bytes:
        raise UnsupportedImage(
            f"step {step} is smaller than width*bytes_per_pixel = {width}*{bytes_per_pixel} = {row_bytes} "
            f"for encoding {msg.encoding!r}"
        )
    buf = _buffer(msg.data)
    if buf.size != step * height:
        raise UnsupportedImage(f"data length mismatch: data has {buf.size} bytes but step*height = {step}*{height} "
                               f"= {step * height}", kind="data_length")
    return buf.reshape(height, step)[:, :row_bytes]


def _raw_to_rgb(msg: Any) -> np.ndarray:
    encoding = str(msg.encoding)
    if encoding in RGB_ENCODINGS:
        dtype, channels, _ = RGB_ENCODINGS[encoding]
        itemsize = np.dtype(dtype).itemsize
        rows = _raw_rows(msg, channels * itemsize)
        if itemsize > 1:
            # Unaligned or byte-swapped 16-bit data: one copy into native order.
            order = ">" if msg.is_bigendian else "<"
            rows = rows.view(np.dtype(dtype).newbyteorder(order)).astype(dtype)
        shape = rows.shape[:1] + (int(msg.width),) + ((channels,) if channels > 1 else ())
        return to_rgb(rows.reshape(shape), encoding)
    if encoding in CONVERTER_ENCODINGS:
        bytes_per_pixel, _ = CONVERTER_ENCODINGS[encoding]
        rows = _raw_rows(msg, bytes_per_pixel)
        if encoding.startswith("yuv") or encoding in ("uyvy", "yuyv"):
            if int(msg.width) % 2:
                raise UnsupportedImage(f"{encoding} needs an even width, got {msg.width}")
        # Hand the backend an unpadded copy so its own step handling (or lack of it) cannot matter.
        packed = types.SimpleNamespace(
            header=getattr(msg, "header", None), height=int(msg.height), width=int(msg.width),
            encoding=encoding, is_bigendian=int(bool(msg.is_bigendian)),
            step=rows.shape[1], data=np.ascontiguousarray(rows).reshape(-1),
        )
        name, convert = _get_backend()
        try:
            out = convert(packed)
        except UnsupportedImage:
            raise
        except Exception as exc:  # noqa: BLE001 - backend errors are many types
            raise UnsupportedImage(f"{name} could not convert {encoding!r}: {exc}") from exc
        if out.dtype != np.uint8 or out.shape != (int(msg.height), int(msg.width), 3):
            raise UnsupportedImage(f"{name} returned {out.dtype} {out.shape} for {encoding!r}, expected rgb8")
        return np.ascontiguousarray(out)
    if not encoding:
        raise UnsupportedImage("image has an empty encoding")
    hint = _NOT_COLOUR_HINT.get(encoding, "")
    if encoding in DEPTH_ENCODINGS:  # the same reason as the compressed form (no list: it is not a camera)
        raise UnsupportedImage(f"unsupported encoding {encoding!r}: {hint}")
    raise UnsupportedImage(
        f"unsupported encoding {encoding!r}{': ' + hint if hint else ''}; supported: {', '.join(supported_encodings())}"
    )


# ---------------------------------------------------------------------------------------------
# compressed images
# ---------------------------------------------------------------------------------------------
def _pil_to_rgb(img: Image.Image) -> np.ndarray:
    """Decoded PIL image -> RGB uint8, as the demo does (EXIF orientation, RGBA over white)."""
    img = ImageOps.exif_transpose(img)
    if img.mode in ("I;16", "I;16L", "I;16B", "I;16N"):
        return to_rgb(np.asarray(img).astype(np.uint16), "mono16")
    if img.mode in ("I", "F"):
        raise UnsupportedImage(f"compressed image decodes to mode {img.mode!r} (32-bit), not a camera image")
    if img.mode == "RGBA":
        return to_rgb(np.asarray(img), "rgba8")
    return np.array(img.convert("RGB"), dtype=np.uint8)


def _cv_decoded_to_rgb(arr: np.ndarray) -> np.ndarray:
    """OpenCV ``imdecode(..., IMREAD_UNCHANGED)`` result (BGR order) -> RGB uint8."""
    if arr.dtype not in (np.uint8, np.uint16):
        raise UnsupportedImage(f"compressed image decodes to {arr.dtype}, not a camera image")
    bits = 8 if arr.dtype == np.uint8 else 16
    channels = 1 if arr.ndim == 2 else arr.shape[2]
    names = {1: f"mono{bits}", 3: f"bgr{bits}", 4: f"bgra{bits}"}
    if channels not in names:
        raise UnsupportedImage(f"compressed image decodes to {channels} channels")
    return to_rgb(arr, names[channels])


# The raw encodings that are depth, not colour: refused raw and compressed with the same reason.
DEPTH_ENCODINGS = ("16UC1", "32FC1")


def _declared_depth(fmt: str) -> Optional[str]:
    """The depth encoding a ``CompressedImage.format`` declares, else None.

    image_transport writes ``"<source encoding>; <codec> compressed [<target>]"`` (``"16UC1; png
    compressed"``) and compressed_depth_image_transport ``"<encoding>; compressedDepth <codec>"``. The
    pixels of such a PNG decode as a 16-bit grey image that would pass for a camera frame, so the
    declared encoding decides, as it does for a raw Image.
    """
    source = fmt.split(";", 1)[0].strip()
    if source in DEPTH_ENCODINGS:
        return source
    if "compresseddepth" in fmt.lower():
        return "16UC1" if "32fc1" not in fmt.lower() else "32FC1"
    return None


def _compressed_to_rgb(msg: Any) -> np.ndarray:
    fmt = str(getattr(msg, "format", ""))
    depth = _declared_depth(fmt)
    if depth is not None:
        raise UnsupportedImage(f"unsupported encoding {depth!r} (compressed depth image, format {fmt!r}): "
                               f"{_NOT_COLOUR_HINT[depth]}")
    buf = _buffer(msg.data)
    if buf.size == 0:
        raise UnsupportedImage(f"compressed image (format {fmt!r}) has no data", kind="zero_size")
    try:
        img = Image.open(io.BytesIO(buf.tobytes()))
    except UnidentifiedImageError:
        img = None  # a format PIL does not know: OpenCV gets a try below
    except Exception as exc:  # noqa: BLE001 - e.g. DecompressionBombError
        raise UnsupportedImage(f"undecodable compressed data (format {fmt!r}): {exc}") from exc
    if img is not None:
        # PIL recognised the format, so a failure here is a broken (e.g. truncated) frame; OpenCV
        # would decode it partially and grey-fill the rest, which must not reach the model.
        try:
            with img:
                img.load()
                return _pil_to_rgb(img)
        except UnsupportedImage:
            raise
        except Exception as exc:  # noqa: BLE001
            raise UnsupportedImage(f"undecodable compressed data ({buf.size} bytes, format {fmt!r}): {exc}") from exc
    arr = cv2.imdecode(buf, cv2.IMREAD_UNCHANGED)
    if arr is None or arr.size == 0:
        raise UnsupportedImage(f"undecodable compressed data ({buf.size} bytes, format {fmt!r})")
    return _cv_decoded_to_rgb(arr)


# ---------------------------------------------------------------------------------------------
def message_to_rgb(msg: Any) -> np.ndarray:
    """``sensor_msgs/Image`` or ``CompressedImage`` -> new C-contiguous RGB uint8 array [H, W, 3].

    Raw images are checked before reading: non-empty, a known encoding, ``step >= width * bytes per
    pixel`` and ``len(data) == step * height``; row padding and ``is_bigendian`` are honoured.
    Raises ``UnsupportedImage`` (a ValueError) with the reason otherwise.
    """
    if hasattr(msg, "format") and not hasattr(msg, "encoding"):
        return _compressed_to_rgb(msg)
    for field in ("encoding", "height", "width", "step", "data"):
        if not hasattr(msg, field):
            raise UnsupportedImage(f"not an Image/CompressedImage message: {type(msg).__name__} has no {field!r}")
    return _raw_to_rgb(msg)


__all__ = [
    "CONVERTER_ENCODINGS",
    "UnsupportedImage",
    "converter_backend",
    "message_to_rgb",
    "supported_encodings",
]
