"""image_io.message_to_rgb: every encoding against arrays built here, padding, byte order, rejections."""
from __future__ import annotations

import io
import os
import sys
import time
import types

os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")  # before anything may load rclpy

import cv2
import numpy as np
import pytest
from PIL import Image as PILImage

from lingbot_map_ros.ros import image_io
from lingbot_map_ros.ros.image_io import UnsupportedImage, message_to_rgb

try:
    from sensor_msgs.msg import CompressedImage as RosCompressedImage
    from sensor_msgs.msg import Image as RosImage
except ImportError:  # the duck-typed messages below still test everything
    RosImage = RosCompressedImage = None


def raw_msg(arr: np.ndarray, encoding: str, *, pad: int = 0, bigendian: bool = False, ros: bool = False):
    """Image message from [H, W(, C)] data; ``pad`` garbage bytes at the end of each row."""
    h, w = arr.shape[:2]
    itemsize = arr.dtype.itemsize
    if itemsize > 1:
        arr = arr.astype(arr.dtype.newbyteorder(">" if bigendian else "<"))
    rows = arr.reshape(h, -1).view(np.uint8)  # [H, W*C*itemsize]
    step = rows.shape[1] + pad
    buf = np.full((h, step), 0xAB, np.uint8)
    buf[:, : rows.shape[1]] = rows
    fields = dict(height=h, width=w, encoding=encoding, is_bigendian=int(bigendian), step=step)
    if ros and RosImage is not None:
        msg = RosImage(**fields)
        msg.data = buf.tobytes()
        return msg
    return types.SimpleNamespace(header=None, data=buf.tobytes(), **fields)


def compressed_msg(data: bytes, fmt: str = "jpeg", ros: bool = False):
    if ros and RosCompressedImage is not None:
        msg = RosCompressedImage(format=fmt)
        msg.data = data
        return msg
    return types.SimpleNamespace(header=None, format=fmt, data=data)


def pil_over_white(rgba: np.ndarray) -> np.ndarray:
    h, w = rgba.shape[:2]
    white = PILImage.new("RGBA", (w, h), (255, 255, 255, 255))
    return np.asarray(PILImage.alpha_composite(white, PILImage.fromarray(rgba)).convert("RGB"))


RNG = np.random.default_rng(0)
RGB = RNG.integers(0, 256, (5, 7, 3), dtype=np.uint8)
ALPHA = RNG.integers(0, 256, (5, 7, 1), dtype=np.uint8)
MONO = RNG.integers(0, 256, (5, 7), dtype=np.uint8)
MONO16 = RNG.integers(0, 65536, (5, 7), dtype=np.uint16)
RGB16 = RNG.integers(0, 65536, (5, 7, 3), dtype=np.uint16)


def to8(v: np.ndarray) -> np.ndarray:
    return np.floor(v.astype(np.float64) / 257.0 + 0.5).astype(np.uint8)


CASES = {
    "rgb8": (RGB, RGB),
    "bgr8": (RGB[..., ::-1], RGB),
    "rgba8": (np.concatenate([RGB, ALPHA], -1), pil_over_white(np.concatenate([RGB, ALPHA], -1))),
    "bgra8": (np.concatenate([RGB[..., ::-1], ALPHA], -1), pil_over_white(np.concatenate([RGB, ALPHA], -1))),
    "mono8": (MONO, np.repeat(MONO[..., None], 3, -1)),
    "8UC1": (MONO, np.repeat(MONO[..., None], 3, -1)),
    "mono16": (MONO16, np.repeat(to8(MONO16)[..., None], 3, -1)),
    "rgb16": (RGB16, to8(RGB16)),
    "bgr16": (RGB16[..., ::-1], to8(RGB16)),
    "bgra16": (np.concatenate([RGB16[..., ::-1], np.full((5, 7, 1), 65535, np.uint16)], -1), to8(RGB16)),
}


@pytest.mark.parametrize("encoding", sorted(CASES))
@pytest.mark.parametrize("pad", [0, 3, 13])
@pytest.mark.parametrize("bigendian", [False, True])
def test_raw_encodings(encoding: str, pad: int, bigendian: bool) -> None:
    data, expected = CASES[encoding]
    out = message_to_rgb(raw_msg(np.ascontiguousarray(data), encoding, pad=pad, bigendian=bigendian))
    assert out.dtype == np.uint8 and out.shape == (5, 7, 3) and out.flags.c_contiguous
    np.testing.assert_array_equal(out, expected)


@pytest.mark.skipif(RosImage is None, reason="sensor_msgs not importable")
@pytest.mark.parametrize("encoding", ["rgb8", "bgr8", "rgba8", "mono16"])
def test_real_ros_messages(encoding: str) -> None:
    data, expected = CASES[encoding]
    msg = raw_msg(np.ascontiguousarray(data), encoding, pad=4, ros=True)
    assert type(msg).__module__.startswith("sensor_msgs")
    np.testing.assert_array_equal(message_to_rgb(msg), expected)


def test_result_does_not_alias_message() -> None:
    msg = raw_msg(RGB, "rgb8")
    msg.data = bytearray(msg.data)  # writable buffer
    out = message_to_rgb(msg)
    out[:] = 0
    np.testing.assert_array_equal(message_to_rgb(msg), RGB)


def test_numpy_data_field_as_rosbags_gives_it() -> None:
    msg = raw_msg(RGB, "bgr8", pad=2)
    msg.data = np.frombuffer(msg.data, np.uint8).copy()
    np.testing.assert_array_equal(message_to_rgb(msg), RGB[..., ::-1])


# -- bayer / yuv through the converter backend ------------------------------------------------------
PATTERNS = {  # 2x2 tile of channel indices (0 R, 1 G, 2 B)
    "rggb": [[0, 1], [1, 2]],
    "bggr": [[2, 1], [1, 0]],
    "gbrg": [[1, 2], [0, 1]],
    "grbg": [[1, 0], [2, 1]],
}


@pytest.mark.parametrize("pattern", sorted(PATTERNS))
@pytest.mark.parametrize("bits", [8, 16])
def test_bayer_constant_colour(pattern: str, bits: int) -> None:
    """A flat colour mosaicked with the pattern must demosaic back to that colour everywhere."""
    colour = np.array([200, 90, 30], np.uint16)
    tile = np.array(PATTERNS[pattern])
    idx = np.tile(tile, (4, 5))  # [8, 10]
    raw = colour[idx]
    if bits == 16:
        raw = raw * 257  # full-range 16-bit version of the same colour
    raw = raw.astype(np.uint8 if bits == 8 else np.uint16)
    out = message_to_rgb(raw_msg(raw, f"bayer_{pattern}{bits}", pad=6))
    assert out.shape == (8, 10, 3)
    np.testing.assert_allclose(out[2:-2, 2:-2].astype(int), np.broadcast_to(colour, (4, 6, 3)), atol=1)


def test_yuv422_matches_opencv() -> None:
    uyvy = RNG.integers(0, 256, (6, 8, 2), dtype=np.uint8)
    expected = cv2.cvtColor(uyvy, cv2.COLOR_YUV2RGB_UYVY)
    np.testing.assert_array_equal(message_to_rgb(raw_msg(uyvy, "yuv422", pad=5)), expected)
    np.testing.assert_array_equal(message_to_rgb(raw_msg(uyvy, "uyvy")), expected)
    yuyv = RNG.integers(0, 256, (6, 8, 2), dtype=np.uint8)
    np.testing.assert_array_equal(message_to_rgb(raw_msg(yuyv, "yuyv")), cv2.cvtColor(yuyv, cv2.COLOR_YUV2RGB_YUYV))


def test_backend_selection_guards_broken_cv_bridge(monkeypatch) -> None:
    """A cv_bridge that imports but mishandles the probe (like PyPI's ROS 1 copy) is not used."""
    class Broken:
        def imgmsg_to_cv2(self, msg, desired_encoding="passthrough"):
            a = np.frombuffer(msg.data, np.uint8)  # ignores step: the classic ROS 1 bug
            return a[: msg.height * msg.width * 3].reshape(msg.height, msg.width, 3)[..., ::-1]

    class Working:
        def imgmsg_to_cv2(self, msg, desired_encoding="passthrough"):
            rows = np.frombuffer(msg.data, np.uint8).reshape(msg.height, msg.step)[:, : msg.width * 3]
            return rows.reshape(msg.height, msg.width, 3)[..., ::-1].copy()

    class Raises:
        def __init__(self):
            raise AttributeError("`np.ndarray.newbyteorder` was removed in the NumPy 2.0 release")

    for bridge, usable in ((Broken, False), (Raises, False), (Working, True)):
        monkeypatch.setitem(sys.modules, "cv_bridge", types.SimpleNamespace(CvBridge=bridge))
        assert (image_io._probe_cv_bridge() is not None) == usable
    monkeypatch.setitem(sys.modules, "cv_bridge", None)  # not installed
    assert image_io._probe_cv_bridge() is None
    assert image_io.converter_backend() in ("cv_bridge", "rosbags-image")


# -- compressed ------------------------------------------------------------------------------------
def test_compressed_png_exact() -> None:
    ok, buf = cv2.imencode(".png", RGB[..., ::-1])  # OpenCV writes BGR
    assert ok
    np.testing.assert_array_equal(message_to_rgb(compressed_msg(buf.tobytes(), "png")), RGB)
    ok, buf = cv2.imencode(".png", MONO)
    np.testing.assert_array_equal(message_to_rgb(compressed_msg(buf.tobytes(), "png")), CASES["mono8"][1])


def test_compressed_png_alpha_and_16_bit() -> None:
    rgba = np.concatenate([RGB, ALPHA], -1)
    ok, buf = cv2.imencode(".png", rgba[..., [2, 1, 0, 3]])
    np.testing.assert_array_equal(message_to_rgb(compressed_msg(buf.tobytes(), "png")), pil_over_white(rgba))
    ok, buf = cv2.imencode(".png", MONO16)
    np.testing.assert_array_equal(message_to_rgb(compressed_msg(buf.tobytes(), "png")), CASES["mono16"][1])


@pytest.mark.parametrize("ros", [False, True])
def test_compressed_jpeg_matches_pil_decode(ros: bool) -> None:
    img = cv2.resize(RNG.integers(0, 256, (6, 8, 3), dtype=np.uint8), (64, 48), interpolation=cv2.INTER_CUBIC)
    ok, buf = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 90])
    data = buf.tobytes()
    out = message_to_rgb(compressed_msg(data, "rgb8; jpeg compressed bgr8", ros=ros))
    pil = np.asarray(PILImage.open(io.BytesIO(data)).convert("RGB"))  # the demo's decoder
    np.testing.assert_array_equal(out, pil)
    cv = cv2.cvtColor(cv2.imdecode(buf, cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
    assert np.abs(out.astype(int) - cv).max() <= 2  # same image, whichever libjpeg
    assert np.abs(out.astype(int) - img[..., ::-1]).mean() < 4


# -- rejections ------------------------------------------------------------------------------------
def test_unsupported_encodings_rejected_with_reason() -> None:
    depth = np.zeros((4, 4), np.float32)
    with pytest.raises(UnsupportedImage, match="32FC1.*not a camera image"):
        message_to_rgb(raw_msg(depth.view(np.uint8).reshape(4, 16), "32FC1"))
    with pytest.raises(UnsupportedImage, match="16UC1"):
        message_to_rgb(raw_msg(np.zeros((4, 4), np.uint16), "16UC1"))
    with pytest.raises(UnsupportedImage, match="unsupported encoding 'hsv'.*supported: .*rgb8"):
        message_to_rgb(raw_msg(RGB, "hsv"))
    with pytest.raises(UnsupportedImage, match="empty encoding"):
        message_to_rgb(raw_msg(RGB, ""))


def test_geometry_rejections() -> None:
    msg = raw_msg(RGB, "rgb8")
    for field, value, pattern in (
        ("width", 0, "zero-sized"),
        ("height", 0, "zero-sized"),
        ("step", 20, r"step 20 is smaller than width\*bytes_per_pixel = 7\*3 = 21"),
        ("step", 22, r"data has 105 bytes but step\*height = 22\*5 = 110"),
        ("data", msg.data[:-1], r"data has 104 bytes"),
        ("data", msg.data + b"\0", r"data has 106 bytes"),
    ):
        bad = types.SimpleNamespace(**vars(msg))
        setattr(bad, field, value)
        with pytest.raises(UnsupportedImage, match=pattern):
            message_to_rgb(bad)
    with pytest.raises(UnsupportedImage, match="even width"):
        message_to_rgb(raw_msg(np.zeros((2, 3, 2), np.uint8), "yuv422"))


def test_compressed_rejections() -> None:
    with pytest.raises(UnsupportedImage, match="no data"):
        message_to_rgb(compressed_msg(b"", "jpeg"))
    with pytest.raises(UnsupportedImage, match="undecodable"):
        message_to_rgb(compressed_msg(RNG.integers(0, 256, 500, dtype=np.uint8).tobytes(), "jpeg"))
    ok, buf = cv2.imencode(".jpg", RGB)
    with pytest.raises(UnsupportedImage, match="undecodable"):
        message_to_rgb(compressed_msg(buf.tobytes()[: len(buf) // 2], "jpeg"))  # truncated
    with pytest.raises(UnsupportedImage, match="compressed depth"):
        message_to_rgb(compressed_msg(buf.tobytes(), "16UC1; compressedDepth png"))


def test_not_a_message() -> None:
    with pytest.raises(UnsupportedImage, match="no 'encoding'"):
        message_to_rgb(types.SimpleNamespace(data=b"", height=1))


def test_every_rejection_is_a_value_error() -> None:
    assert issubclass(UnsupportedImage, ValueError)


# -- speed -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("encoding,channels", [("rgb8", 3), ("bgr8", 3), ("mono8", 1), ("bgra8", 4)])
def test_raw_640x480_well_under_a_millisecond(encoding: str, channels: int) -> None:
    arr = RNG.integers(0, 256, (480, 640, channels), dtype=np.uint8)
    if channels == 4:
        arr[..., 3] = 255
    msg = raw_msg(arr if channels > 1 else arr[..., 0], encoding, pad=64)
    message_to_rgb(msg)
    best = min(_timed(message_to_rgb, msg) for _ in range(20))
    assert best < 1e-3, f"{encoding}: {best * 1e3:.3f} ms"


def _timed(fn, arg) -> float:
    start = time.perf_counter()
    fn(arg)
    return time.perf_counter() - start
