"""Depth messages as robots send them (ros/depth_io.py): 16UC1 mm, mono16, 32FC1 m, padded rows, big
endian, compressedDepth PNG (16UC1 and quantised 32FC1), and what is refused with which kind.

The reference is the depth array itself, read with the same grid indices by plain numpy indexing;
the compressedDepth messages are built here the way image_transport's codec builds them (12-byte
header, 16-bit PNG; for 32FC1 inverse depth quantised with a, b).
"""
from __future__ import annotations

import struct

import numpy as np
import pytest

pytest.importorskip("sensor_msgs.msg")
cv2 = pytest.importorskip("cv2")
from sensor_msgs.msg import CompressedImage, Image  # noqa: E402

from lingbot_map_ros.core.scale import depth_grid_indices  # noqa: E402
from lingbot_map_ros.ros.depth_io import (  # noqa: E402
    BadDepth,
    GridCache,
    compressed_depth_grid,
    decode_compressed_depth,
    image_depth_grid,
)

W, H = 160, 120  # colour and depth (registered)


def depth_image(values: np.ndarray, encoding: str, pad: int = 0, big_endian: bool = False) -> Image:
    h, w = values.shape
    arr = values.astype(values.dtype.newbyteorder(">" if big_endian else "<"))
    row = arr.view(np.uint8).reshape(h, -1)
    if pad:
        row = np.concatenate([row, np.full((h, pad), 0xAB, np.uint8)], axis=1)
    return Image(height=h, width=w, encoding=encoding, is_bigendian=int(big_endian), step=int(row.shape[1]),
                 data=row.tobytes())


def compressed_depth(depth_m: np.ndarray, encoding: str, depth_max: float = 10.0, quant: float = 100.0):
    if encoding == "16UC1":
        raw = np.round(depth_m * 1000).astype(np.uint16)
        header = struct.pack("<iff", 0, 0.0, 0.0)
    else:
        a = quant * (quant + 1.0)
        b = 1.0 - a / depth_max
        with np.errstate(divide="ignore", invalid="ignore"):
            inv = np.where((depth_m > 0) & (depth_m < depth_max), a / depth_m + b, 0)
        raw = inv.astype(np.uint16)
        header = struct.pack("<iff", 0, a, b)
    ok, png = cv2.imencode(".png", raw)
    assert ok
    return CompressedImage(format=f"{encoding}; compressedDepth png", data=header + png.tobytes())


@pytest.fixture
def depth_m() -> np.ndarray:
    rng = np.random.default_rng(11)
    d = rng.uniform(0.4, 6.0, size=(H, W)).astype(np.float32)
    d[rng.random(d.shape) < 0.1] = 0.0
    return d


def reference(depth: np.ndarray) -> np.ndarray:
    rows, cols = depth_grid_indices((W, H), (depth.shape[1], depth.shape[0]))
    return depth[np.ix_(rows, cols)]


@pytest.mark.parametrize("encoding", ["16UC1", "mono16"])
@pytest.mark.parametrize("pad,big", [(0, False), (6, False), (0, True)])
def test_16bit_millimetres(depth_m, encoding, pad, big):
    mm = np.round(depth_m * 1000).astype(np.uint16)
    got = image_depth_grid(depth_image(mm, encoding, pad, big), (W, H), GridCache())
    np.testing.assert_array_equal(got, reference(mm).astype(np.float32) * np.float32(1e-3))


def test_32fc1_metres_with_nan(depth_m):
    d = depth_m.copy()
    d[5, :] = np.nan
    got = image_depth_grid(depth_image(d, "32FC1", pad=4), (W, H), GridCache())
    np.testing.assert_array_equal(got, reference(d))


def test_depth_of_another_size_is_resampled_when_registered_and_refused_otherwise(depth_m):
    half = depth_m[::2, ::2].copy()  # same aspect ratio: registered at half resolution
    got = image_depth_grid(depth_image(half, "32FC1"), (W, H), GridCache())
    np.testing.assert_array_equal(got, reference(half))
    with pytest.raises(BadDepth) as e:
        image_depth_grid(depth_image(depth_m[:90], "32FC1"), (W, H), GridCache())
    assert e.value.kind == "size" and "aspect ratio" in str(e.value)


def test_bad_encodings_and_short_data(depth_m):
    with pytest.raises(BadDepth) as e:
        image_depth_grid(depth_image(depth_m.astype(np.uint8), "8UC1"), (W, H), GridCache())
    assert e.value.kind == "encoding" and "16UC1" in str(e.value)
    msg = depth_image(depth_m, "32FC1")
    msg.data = msg.data[: len(msg.data) // 2]
    with pytest.raises(BadDepth) as e:
        image_depth_grid(msg, (W, H), GridCache())
    assert e.value.kind == "data"


def test_compressed_depth_16uc1(depth_m):
    msg = compressed_depth(depth_m, "16UC1")
    raw, enc = decode_compressed_depth(msg)
    assert enc == "16UC1" and raw.dtype == np.uint16
    np.testing.assert_array_equal(raw, np.round(depth_m * 1000).astype(np.uint16))
    got = compressed_depth_grid(msg, (W, H), GridCache())
    np.testing.assert_array_equal(got, reference(np.round(depth_m * 1000).astype(np.uint16)).astype(np.float32)
                                  * np.float32(1e-3))


def test_compressed_depth_32fc1_inverse_quantisation(depth_m):
    msg = compressed_depth(depth_m, "32FC1")
    depth, enc = decode_compressed_depth(msg)
    assert enc == "32FC1"
    valid = depth_m > 0
    assert np.isnan(depth[~valid]).all()
    # quantised inverse depth: the error grows with depth^2 / (a) ~ 6^2 / 10100 at the far end
    err = np.abs(depth[valid] - depth_m[valid])
    assert (err <= depth_m[valid] ** 2 / 10100 + 1e-4).all(), float(err.max())


def test_compressed_depth_refusals(depth_m):
    msg = compressed_depth(depth_m, "16UC1")
    for fmt, kind in (("16UC1; compressedDepth rvl", "encoding"), ("rgb8; jpeg compressed bgr8", "encoding"),
                      ("8UC1; compressedDepth png", "encoding")):
        bad = CompressedImage(format=fmt, data=msg.data)
        with pytest.raises(BadDepth) as e:
            decode_compressed_depth(bad)
        assert e.value.kind == kind, fmt
    broken = CompressedImage(format="16UC1; compressedDepth png", data=bytes(msg.data[:40]))
    with pytest.raises(BadDepth) as e:
        decode_compressed_depth(broken)
    assert e.value.kind == "data"
