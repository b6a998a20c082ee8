"""Depth camera messages -> metres, sampled where the model's depth map has its pixels.

What robots send (REP 118): ``sensor_msgs/Image`` ``16UC1`` in millimetres (``mono16`` read the same,
as OpenNI-style drivers label it) or ``32FC1`` in metres, and through image_transport's
``compressedDepth`` a ``CompressedImage`` whose ``format`` reads ``"16UC1; compressedDepth png"`` or
``"32FC1; compressedDepth png"``: a 12-byte configuration header (int32 format, two float32
quantisation parameters ``a``, ``b``) followed by a 16-bit PNG. 16UC1 PNGs hold millimetres; 32FC1
ones hold quantised inverse depth, ``depth = a / (v - b)`` for ``v != 0`` (0: no depth).

Only the pixels under the model's sampled depth grid are read (``core.scale.depth_grid_indices``):
for raw images the rest is never converted, so a pair costs well under a millisecond on the
executor thread. Anything else is refused with the reason (``BadDepth``), never guessed.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..core.scale import DEPTH_SAMPLE_STRIDE, depth_grid_indices

DEPTH_SCALE_M = {"16UC1": 1e-3, "mono16": 1e-3, "32FC1": 1.0}  # encoding -> metres per unit
_DTYPES = {"16UC1": np.uint16, "mono16": np.uint16, "32FC1": np.float32}
COMPRESSED_DEPTH_HEADER = struct.Struct("<iff")  # compressionFormat, depthParam[0] (a), depthParam[1] (b)


class BadDepth(ValueError):
    """A depth message the node cannot use; ``kind`` ("encoding", "size" or "data") names its counter."""

    def __init__(self, kind: str, reason: str):
        super().__init__(reason)
        self.kind = kind


@dataclass(frozen=True)
class RefusedDepth:
    """What a colour frame's depth slot holds when its partner arrived but was refused (``BadDepth``):
    the keyframe that waits for its depth stops at once with ``reason``, rather than at ``tf_timeout``
    as for a partner that has not arrived."""

    reason: str


class GridCache:
    """The sampling indices per (colour size, depth size): computed once, reused for every pair."""

    def __init__(self, stride: int = DEPTH_SAMPLE_STRIDE, width: Callable[[], int] = lambda: 518,
                 max_height: Callable[[], int] = lambda: 0):
        """``width``: the model input width now (the ``image_width`` parameter); ``max_height``: the
        preprocessor's height cap (``config.planned_height`` of ``camera_aspect``; 0: the width)."""
        self.stride = stride
        self._width = width
        self._max_height = max_height
        self._cache: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}

    def indices(self, colour_wh: tuple[int, int], depth_wh: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
        width, max_height = int(self._width()), int(self._max_height())
        key = (tuple(colour_wh), tuple(depth_wh), width, max_height)
        if key not in self._cache:
            try:
                self._cache[key] = depth_grid_indices(colour_wh, depth_wh, self.stride, width, max_height)
            except ValueError as exc:
                raise BadDepth("size", str(exc)) from None
            if len(self._cache) > 8:  # sizes only change with the camera: keep a few
                self._cache.pop(next(iter(self._cache)))
        return self._cache[key]


def _bytes(data) -> np.ndarray:
    """Message ``data`` (bytes, array.array, numpy, list) -> a flat uint8 array (a view where it can be)."""
    try:
        return np.frombuffer(data, dtype=np.uint8)
    except TypeError:
        return np.asarray(data, dtype=np.uint8).reshape(-1)


def _sample(read: Callable[[np.ndarray, np.ndarray], np.ndarray], scale: float, rows: np.ndarray,
            cols: np.ndarray) -> np.ndarray:
    """``read(rows, cols)`` (the raw values under the grid) in metres, float32 [h', w']."""
    raw = read(rows, cols)
    out = raw.astype(np.float32)
    if scale != 1.0:
        out *= np.float32(scale)
    return out


def image_depth_grid(msg, colour_wh: tuple[int, int], grid: GridCache) -> np.ndarray:
    """A ``sensor_msgs/Image`` depth message -> metres under the model grid, float32 [h', w']."""
    encoding = msg.encoding
    if encoding not in _DTYPES:
        raise BadDepth("encoding", f"depth encoding {encoding!r} is not supported: send 16UC1 (mm) or 32FC1 (m)")
    h, w, step = int(msg.height), int(msg.width), int(msg.step)
    dtype = np.dtype(_DTYPES[encoding]).newbyteorder(">" if msg.is_bigendian else "<")
    if h <= 0 or w <= 0:
        raise BadDepth("size", f"empty depth image {w}x{h}")
    if step < w * dtype.itemsize or step % dtype.itemsize or len(msg.data) < step * h:
        raise BadDepth("data", f"depth image {w}x{h} {encoding}: step {step} and {len(msg.data)} data bytes "
                               f"do not hold {h} rows of {w} values")
    rows, cols = grid.indices(colour_wh, (w, h))
    values = _bytes(msg.data)[: step * h].view(dtype).reshape(h, step // dtype.itemsize)
    return _sample(lambda r, c: values[np.ix_(r, c)], DEPTH_SCALE_M[encoding], rows, cols)


def decode_compressed_depth(msg) -> tuple[np.ndarray, str]:
    """A ``compressedDepth`` ``CompressedImage`` -> (depth [H, W] as sent: uint16 mm or float32 m, encoding)."""
    import cv2

    fmt = str(msg.format)
    encoding = fmt.split(";", 1)[0].strip()
    if "compresseddepth" not in fmt.replace(" ", "").lower():
        raise BadDepth("encoding", f"compressed depth format {fmt!r} is not compressedDepth (image_transport's "
                                   "depth codec): subscribe to the driver's .../compressedDepth topic")
    if "rvl" in fmt.lower():
        raise BadDepth("encoding", f"compressed depth format {fmt!r}: the RVL codec is not supported, use png")
    if encoding not in ("16UC1", "32FC1"):
        raise BadDepth("encoding", f"compressed depth encoding {encoding!r} is not supported: 16UC1 or 32FC1")
    data = bytes(msg.data)
    if len(data) <= COMPRESSED_DEPTH_HEADER.size:
        raise BadDepth("data", f"compressedDepth message of {len(data)} bytes holds no image")
    _, a, b = COMPRESSED_DEPTH_HEADER.unpack_from(data)
    png = cv2.imdecode(np.frombuffer(data, np.uint8, offset=COMPRESSED_DEPTH_HEADER.size), cv2.IMREAD_UNCHANGED)
    if png is None or png.dtype != np.uint16 or png.ndim != 2:
        raise BadDepth("data", f"compressedDepth payload is not a 16-bit one-channel PNG ({fmt!r})")
    if encoding == "16UC1":
        return png, encoding
    inv = png.astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        depth = np.where(png > 0, np.float32(a) / (inv - np.float32(b)), np.float32(np.nan)).astype(np.float32)
    return depth, encoding


def compressed_depth_grid(msg, colour_wh: tuple[int, int], grid: GridCache) -> np.ndarray:
    """A ``compressedDepth`` message -> metres under the model grid, float32 [h', w']."""
    depth, encoding = decode_compressed_depth(msg)
    rows, cols = grid.indices(colour_wh, (depth.shape[1], depth.shape[0]))
    return _sample(lambda r, c: depth[np.ix_(r, c)], DEPTH_SCALE_M[encoding], rows, cols)


__all__ = ["BadDepth", "DEPTH_SCALE_M", "GridCache", "compressed_depth_grid", "decode_compressed_depth",
           "image_depth_grid"]
