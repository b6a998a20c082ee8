"""Readers of the map files the package writes, written here from the formats' documentation (binary
PLY, COLMAP's text model): the reconstruction tests parse what the writers produced with them."""
from __future__ import annotations

from pathlib import Path

import numpy as np


def read_ply(path: Path) -> tuple[dict, np.ndarray]:
    """Minimal binary PLY reader: header -> numpy structured array of the vertex element."""
    raw = path.read_bytes()
    end = raw.index(b"end_header\n") + len(b"end_header\n")
    header = raw[:end].decode("ascii").splitlines()
    assert header[0] == "ply" and header[1] == "format binary_little_endian 1.0"
    types = {"float": "<f4", "uchar": "u1", "double": "<f8", "int": "<i4"}
    props, count = [], None
    for line in header:
        parts = line.split()
        if parts[0] == "element":
            assert parts[1] == "vertex"
            count = int(parts[2])
        elif parts[0] == "property":
            props.append((parts[2], types[parts[1]]))
    dt = np.dtype(props)
    assert len(raw) - end == count * dt.itemsize
    return {"comments": [h for h in header if h.startswith("comment")]}, np.frombuffer(raw[end:], dt)


def read_colmap(directory: Path):
    """Reader of COLMAP's three text files, from the format's documentation."""
    def rows(name):
        return [ln for ln in (directory / name).read_text().splitlines() if not ln.startswith("#")]

    cams = {}
    for ln in rows("cameras.txt"):
        p = ln.split()
        cams[int(p[0])] = (p[1], int(p[2]), int(p[3]), [float(x) for x in p[4:]])
    lines = rows("images.txt")
    images = {}
    for head, pts2d in zip(lines[0::2], lines[1::2]):
        p = head.split()
        images[int(p[0])] = ([float(x) for x in p[1:5]], [float(x) for x in p[5:8]], int(p[8]), p[9], pts2d)
    points = {}
    for ln in rows("points3D.txt"):
        p = ln.split()
        points[int(p[0])] = ([float(x) for x in p[1:4]], [int(x) for x in p[4:7]], float(p[7]), p[8:])
    return cams, images, points


def quat_wxyz_to_matrix(q):
    w, x, y, z = np.asarray(q, np.float64) / np.linalg.norm(q)
    return np.array([[1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
                     [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
                     [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)]])
