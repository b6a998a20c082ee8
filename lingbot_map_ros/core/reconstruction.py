"""Depth -> world points, a bounded voxel map, and the files users take away (PLY, COLMAP text).

No rclpy here: the node's ``ros/reconstruction.py`` and the offline tool both call these.

Conventions (MODEL_SPEC §11, the official ``depth_to_cam_coords_points``)
---------------------------------------------------------------------
* Camera frame = OpenCV / REP 103 optical frame: x right, y down, z forward (along the optical axis).
* Pixel ``(u, v)`` = (column, row) index of the depth map at the *model input size* ``H x W``. Its
  centre is the continuous image point ``(u, v)`` - the OpenCV and ``sensor_msgs/CameraInfo``
  convention, where the top-left pixel's centre is ``(0, 0)``. The official model uses exactly this
  (``meshgrid(arange(W), arange(H))`` against ``cx = W/2``, ``cy = H/2``), so no half-pixel shift is
  applied anywhere in the node.
* Depth ``d`` is the z coordinate in the camera frame (distance along the optical axis, not along the
  ray), in the model's normalised units (no metric scale). The camera point of pixel ``(u, v)`` is
  ``X_cam = d * ((u - cx) / fx, (v - cy) / fy, 1)``.
* ``c2w`` maps camera to world: ``X_world = R X_cam + t``; the world frame is the first camera's
  optical frame of the session.

Everything per pixel runs in torch on the tensors' device (the GPU on a GPU robot); only the
resulting, already filtered points leave it.
"""
from __future__ import annotations

import math
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np
import torch

from .files import atomic_write_bytes
from .geometry import quaternion_xyzw_from_matrix, se3_inverse
from .runtime import concrete_device

PathLike = Union[str, os.PathLike]
TensorLike = Union[torch.Tensor, np.ndarray]

# Voxel indices are packed into one int64 key, 21 bits per axis: |index| < 2**20 voxels per axis
# (e.g. +-10 485 model units at 1 cm voxels). Points further out are not mapped (counted as dropped).
_KEY_BITS = 21
_KEY_OFFSET = 1 << (_KEY_BITS - 1)
_KEY_MASK = (1 << _KEY_BITS) - 1
# Per-observation fusion weight = its confidence, clamped: the model's confidence is 1 + exp(x) and
# can overflow; a cap keeps weighted sums finite in float32 over hours.
_MAX_WEIGHT = 1.0e3
_MAX_WEIGHT_SUM = 1.0e7


def _as_tensor(
    x: TensorLike, device: Optional[torch.device] = None, dtype: Optional[torch.dtype] = None
) -> torch.Tensor:
    """numpy or torch -> torch on ``device`` (None: where it is; numpy: CPU), without a copy when possible."""
    t = torch.from_numpy(np.ascontiguousarray(x)) if isinstance(x, np.ndarray) else x
    return t.to(device=device if device is not None else t.device, dtype=dtype if dtype is not None else t.dtype)


# ---------------------------------------------------------------------------------------------
# unprojection
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PointBatch:
    """Points of one frame (or of the map), all tensors on one device, row ``i`` = one point."""

    xyz: torch.Tensor  # [N, 3] float32, world frame
    rgb: torch.Tensor  # [N, 3] uint8, from the model input image (grey 128 when none was given)
    confidence: torch.Tensor  # [N] float32, the depth head's confidence (>= 1 for the official head)
    pixel_uv: Optional[torch.Tensor] = None  # [N, 2] int64 (u, v) source pixel at the depth map's size

    def __len__(self) -> int:
        return int(self.xyz.shape[0])

    def to(self, device: Union[str, torch.device]) -> "PointBatch":
        """The same points on ``device``."""
        uv = None if self.pixel_uv is None else self.pixel_uv.to(device)
        return PointBatch(self.xyz.to(device), self.rgb.to(device), self.confidence.to(device), uv)

    def numpy(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(xyz [N, 3] float32, rgb [N, 3] uint8, confidence [N] float32) on the CPU."""
        return self.xyz.cpu().numpy(), self.rgb.cpu().numpy(), self.confidence.cpu().numpy()

    @staticmethod
    def from_records(records: np.ndarray) -> "PointBatch":
        """CPU PointBatch from ``point_records`` output [N, 5] (what the node already copied to the host)."""
        rec = np.asarray(records, dtype=np.float32).reshape(-1, 5)
        return PointBatch(torch.from_numpy(np.ascontiguousarray(rec[:, :3])), torch.from_numpy(unpack_rgb(rec[:, 3])),
                          torch.from_numpy(np.ascontiguousarray(rec[:, 4])), None)

    @staticmethod
    def empty(device: Union[str, torch.device] = "cpu") -> "PointBatch":
        return PointBatch(torch.zeros(0, 3, device=device), torch.zeros(0, 3, dtype=torch.uint8, device=device),
                          torch.zeros(0, device=device), torch.zeros(0, 2, dtype=torch.int64, device=device))


def is_finite_camera(intrinsics: TensorLike, c2w: TensorLike) -> bool:
    """True when K has finite, positive focal lengths and a finite principal point, and c2w is finite.

    A frame that fails this produces no reconstruction output at all (its points would all be
    non-finite or mirrored).
    """
    k = np.asarray(intrinsics.cpu() if isinstance(intrinsics, torch.Tensor) else intrinsics, dtype=np.float64)
    m = np.asarray(c2w.cpu() if isinstance(c2w, torch.Tensor) else c2w, dtype=np.float64)
    return bool(np.all(np.isfinite(k)) and np.all(np.isfinite(m)) and k[0, 0] > 0 and k[1, 1] > 0)


class _Staging:
    """A reusable pinned host buffer per CUDA device: every frame's host inputs go to the GPU in ONE
    asynchronous copy (and its records come back in one), instead of one pageable copy per array -
    on a virtualised GPU host each such copy costs a fraction of a millisecond."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._buffers: dict = {}  # (device, direction) -> (pinned float32 tensor, event of its last copy)

    def buffer(self, device: torch.device, direction: str, numel: int) -> torch.Tensor:
        key = (device, direction)
        buf, event = self._buffers.get(key, (None, None))
        if event is not None:
            event.synchronize()  # the previous copy out of / into it is finished
        if buf is None or buf.numel() < numel:
            buf = torch.empty(max(numel, 1 << 16), dtype=torch.float32, pin_memory=True)
        self._buffers[key] = (buf, None)
        return buf[:numel]

    def copied(self, device: torch.device, direction: str) -> None:
        """Record that a copy using the buffer was queued (the next user waits for it)."""
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(device))
        buf, _ = self._buffers[(device, direction)]
        self._buffers[(device, direction)] = (buf, event)

    def upload(self, parts: dict, device: torch.device) -> dict:
        """{name: host float32 array} -> {name: tensor on ``device``} (same shapes), one copy."""
        if device.type != "cuda":
            return {k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32)) for k, v in parts.items()}
        total = sum(int(v.size) for v in parts.values())
        with self._lock:
            host = self.buffer(device, "h2d", total)
            flat = host.numpy()
            offsets, off = {}, 0
            for k, v in parts.items():
                flat[off:off + v.size].reshape(v.shape)[...] = v  # strided source -> packed, one pass
                offsets[k] = (off, v.shape)
                off += v.size
            dev = host.to(device, non_blocking=True)  # [total]
            self.copied(device, "h2d")
        return {k: dev[o:o + int(np.prod(shape))].view(shape) for k, (o, shape) in offsets.items()}

    def download(self, t: torch.Tensor) -> np.ndarray:
        """A float32 device tensor -> a fresh host array (through the pinned buffer on CUDA)."""
        if t.device.type != "cuda":
            return t.detach().contiguous().numpy()  # callers pass fresh tensors: no copy needed
        with self._lock:
            host = self.buffer(t.device, "d2h", t.numel())
            host.copy_(t.reshape(-1), non_blocking=True)
            self.copied(t.device, "d2h")
            self._buffers[(t.device, "d2h")][1].synchronize()
            return host.numpy().reshape(t.shape).copy()


_STAGING = _Staging()


def unproject_depth(
    depth: TensorLike,
    intrinsics: TensorLike,
    c2w: TensorLike,
    *,
    confidence: Optional[TensorLike] = None,
    image: Optional[TensorLike] = None,
    stride: int = 1,
    min_confidence: float = 0.0,
    max_points: Optional[int] = None,
    device: Optional[Union[str, torch.device]] = None,
) -> PointBatch:
    """World points of the pixels ``(u, v) = (i*stride, j*stride)`` of one depth map (module docstring).

    ``depth`` [H, W] and ``confidence`` [H, W] at the model input size, ``intrinsics`` [3, 3] for that
    size, ``c2w`` [4, 4] (or [3, 4]); ``image`` [3, H, W] float in [0, 1] (the model input, RGB) gives
    the colours. Runs in float32 on ``device`` (default: the depth tensor's device; numpy -> CPU).

    Kept: depth finite and > 0, confidence not NaN and >= ``min_confidence`` (+inf, an overflow of
    the head's ``1 + exp``, is kept and stored as the largest float32), and a finite world point.
    Striding happens on the host, and the strided host inputs plus the pose travel to a CUDA device
    in one copy, so only ``H*W/stride**2`` values per map move. ``max_points`` bounds the result by
    keeping evenly spaced points of the valid ones (deterministic, keeps the spatial spread).
    """
    if stride < 1:
        raise ValueError(f"stride must be >= 1, got {stride}")
    if device is None:
        device = depth.device if isinstance(depth, torch.Tensor) else torch.device("cpu")
    device = concrete_device(device)
    h_full, w_full = int(depth.shape[-2]), int(depth.shape[-1])
    k = np.asarray(intrinsics.cpu() if isinstance(intrinsics, torch.Tensor) else intrinsics, dtype=np.float64)
    m = np.asarray(c2w.cpu() if isinstance(c2w, torch.Tensor) else c2w, dtype=np.float64)
    fx, fy, cx, cy = float(k[0, 0]), float(k[1, 1]), float(k[0, 2]), float(k[1, 2])

    host: dict = {"pose": np.concatenate([m[:3, :3].reshape(-1), m[:3, 3]]).astype(np.float32)}  # [12]
    on_device: dict = {}
    for name, x in (("depth", depth), ("conf", confidence), ("image", image)):
        if x is None:
            continue
        xs = x[..., ::stride, ::stride]  # a view: nothing is copied yet
        if isinstance(xs, torch.Tensor) and xs.device == device:
            on_device[name] = xs.to(torch.float32)
        else:
            host[name] = xs.detach().cpu().numpy() if isinstance(xs, torch.Tensor) else np.asarray(xs)
    on_device.update(_STAGING.upload(host, device))
    d = on_device["depth"].reshape(-1)  # [h*w]
    h, w = on_device["depth"].shape[-2:]
    rot = on_device["pose"][:9].view(3, 3)  # [3, 3]
    trans = on_device["pose"][9:]  # [3]

    cols = torch.arange(0, w_full, stride, device=device, dtype=torch.float32)  # [w] u
    rows = torch.arange(0, h_full, stride, device=device, dtype=torch.float32)  # [h] v
    x_n = (cols - cx) / fx  # [w] normalised image x of each column
    y_n = (rows - cy) / fy  # [h]
    ray = torch.stack(  # [h, w, 3] (x/z, y/z, 1) per pixel
        [x_n.expand(h, w), y_n[:, None].expand(h, w), torch.ones(h, w, device=device)], dim=-1
    ).reshape(-1, 3)  # [h*w, 3]
    cam = ray * d[:, None]  # [h*w, 3] camera-frame points, z = depth
    world = torch.addmm(trans, cam, rot.T)  # [h*w, 3] = R X_cam + t

    valid = torch.isfinite(d) & (d > 0) & torch.isfinite(world).all(dim=-1)  # [h*w]
    if "conf" in on_device:
        conf = on_device["conf"].reshape(-1)  # [h*w]
        conf = torch.nan_to_num(conf, nan=float("-inf"), posinf=float(torch.finfo(torch.float32).max))
        valid &= conf >= float(min_confidence)
    else:
        conf = torch.ones_like(d)  # [h*w]
    idx = torch.nonzero(valid, as_tuple=False).reshape(-1)  # [N] flat indices into the strided grid (syncs)
    if max_points is not None and idx.numel() > max_points:
        pick = torch.linspace(0, idx.numel() - 1, int(max_points), device=device).round().long()  # [max_points]
        idx = idx[pick]

    if "image" in on_device:
        img = on_device["image"]  # [3, h, w]
        if img.shape != (3, h, w):
            raise ValueError(f"image must be [3, {h_full}, {w_full}] like the depth map, got {tuple(image.shape)}")
        rgb = (img.reshape(3, -1)[:, idx].T.clamp(0.0, 1.0) * 255.0).round().to(torch.uint8)  # [N, 3]
    else:
        rgb = torch.full((idx.numel(), 3), 128, dtype=torch.uint8, device=device)  # [N, 3]
    uv = torch.stack([(idx % w) * stride, torch.div(idx, w, rounding_mode="floor") * stride], dim=-1)  # [N, 2]
    return PointBatch(xyz=world[idx].contiguous(), rgb=rgb.contiguous(), confidence=conf[idx].contiguous(),
                      pixel_uv=uv)


def pack_rgb(rgb: torch.Tensor) -> torch.Tensor:
    """[N, 3] uint8 -> [N] float32 whose bits are ``0x00RRGGBB`` (PCL's / RViz's packed ``rgb``).

    The top byte stays 0, so the float is never NaN or infinite (an alpha byte of 0xFF would make
    many colours NaN); RViz's RGB8 transformer reads the low 24 bits.
    """
    c = rgb.to(torch.int32)  # [N, 3]
    bits = (c[:, 0] << 16) | (c[:, 1] << 8) | c[:, 2]  # [N] int32
    return bits.view(torch.float32)


def unpack_rgb(packed: np.ndarray) -> np.ndarray:
    """Inverse of ``pack_rgb`` for numpy float32 [N] -> uint8 [N, 3]."""
    bits = np.ascontiguousarray(packed, dtype=np.float32).view(np.uint32)
    return np.stack([(bits >> 16) & 0xFF, (bits >> 8) & 0xFF, bits & 0xFF], axis=-1).astype(np.uint8)


def point_records(points: PointBatch) -> np.ndarray:
    """[N, 5] float32 on the CPU: x, y, z, packed rgb, confidence - the PointCloud2 layout, one copy.

    Assembled on the points' device, so a GPU batch crosses to the host once (20 bytes per point).
    """
    rec = torch.cat([points.xyz, pack_rgb(points.rgb)[:, None], points.confidence[:, None]], dim=1)  # [N, 5]
    return _STAGING.download(rec)


# ---------------------------------------------------------------------------------------------
# voxel map
# ---------------------------------------------------------------------------------------------
class VoxelMap:
    """Session map: one fused point per voxel, at most ``max_points`` voxels, vectorised in torch.

    Each voxel (cube of edge ``voxel_size`` in world units, index ``floor(p / voxel_size)``) holds the
    confidence-weighted mean position and colour of every point that fell into it, the highest
    confidence it was seen with, and the sequence number of the last ``add`` that touched it.

    ``add`` only queues a batch; ``flush`` (called by ``points``/``__len__``, and by ``add`` itself
    when the queue holds more than ``max_points`` points) merges the queue with one sort over
    map + queue. When the merged map exceeds ``max_points`` the voxels seen longest ago go first and,
    among voxels last seen in the same ``add``, the least confident first. So memory is bounded by
    about twice ``max_points`` points whatever the run length, and a long run keeps its most recent
    surroundings. Batching the merges lets the node merge at its map rate instead of per frame.
    """

    def __init__(self, voxel_size: float, max_points: int, device: Union[str, torch.device] = "cpu"):
        if not (voxel_size > 0 and math.isfinite(voxel_size)):
            raise ValueError(f"voxel_size must be a positive number, got {voxel_size}")
        if max_points < 1:
            raise ValueError(f"max_points must be >= 1, got {max_points}")
        self.voxel_size = float(voxel_size)
        self.max_points = int(max_points)
        self.device = torch.device(device)
        self.dropped_out_of_range = 0  # points too far out for the key packing
        self.evicted = 0  # voxels dropped to stay within max_points
        self._seq = 0
        self._pending: list[tuple[torch.Tensor, ...]] = []
        self._pending_points = 0
        self.reset()

    def reset(self) -> None:
        """Forget everything (a new session: a new world frame)."""
        dev = self.device
        self._keys = torch.zeros(0, dtype=torch.int64, device=dev)  # [M]
        self._xyz = torch.zeros(0, 3, device=dev)  # [M, 3] weighted mean position
        self._rgb = torch.zeros(0, 3, device=dev)  # [M, 3] weighted mean colour, 0..255
        self._weight = torch.zeros(0, device=dev)  # [M] sum of weights (capped)
        self._conf = torch.zeros(0, device=dev)  # [M] highest confidence
        self._seen = torch.zeros(0, dtype=torch.int64, device=dev)  # [M] last add() sequence number
        self._pending = []
        self._pending_points = 0
        self._seq = 0
        self.dropped_out_of_range = 0
        self.evicted = 0

    def configure(self, voxel_size: float, max_points: int) -> bool:
        """Apply new settings; a new voxel size empties the map (voxels do not convert). True if emptied."""
        if voxel_size <= 0 or max_points < 1:
            raise ValueError(f"voxel_size must be > 0 and max_points >= 1 (got {voxel_size}, {max_points})")
        emptied = float(voxel_size) != self.voxel_size
        self.voxel_size = float(voxel_size)
        self.max_points = int(max_points)
        if emptied:
            self.reset()
        return emptied

    def _keys_of(self, xyz: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Voxel keys [N] int64 of points [N, 3] and the mask [N] of points inside the packable range."""
        ijk = torch.floor(xyz.double() / self.voxel_size)  # [N, 3] float64: exact for |index| < 2**52
        inside = (ijk.abs() < _KEY_OFFSET).all(dim=-1) & torch.isfinite(ijk).all(dim=-1)  # [N]
        ijk = torch.where(inside[:, None], ijk, torch.zeros_like(ijk)).long() + _KEY_OFFSET  # [N, 3] >= 0
        keys = (ijk[:, 0] << (2 * _KEY_BITS)) | (ijk[:, 1] << _KEY_BITS) | ijk[:, 2]  # [N]
        return keys, inside

    def add(self, points: PointBatch) -> None:
        """Queue one frame's points (any device; moved to the map's). Non-finite points are ignored."""
        self._seq += 1
        if len(points) == 0:
            return
        xyz = points.xyz.to(self.device, torch.float32)  # [N, 3]
        conf = points.confidence.to(self.device, torch.float32)  # [N]
        ok = torch.isfinite(xyz).all(dim=-1) & ~torch.isnan(conf)  # [N]
        keys, inside = self._keys_of(xyz)
        self.dropped_out_of_range += int((ok & ~inside).sum())
        ok &= inside
        if not bool(ok.all()):
            keys, xyz, conf = keys[ok], xyz[ok], conf[ok]
            rgb = points.rgb.to(self.device)[ok]
        else:
            rgb = points.rgb.to(self.device)
        weight = conf.clamp(1e-6, _MAX_WEIGHT)  # [N]
        seen = torch.full_like(keys, self._seq)  # [N]
        finite_conf = conf.clamp(max=float(torch.finfo(torch.float32).max))  # [N]
        self._pending.append((keys, xyz, rgb.float(), weight, finite_conf, seen))
        self._pending_points += int(keys.numel())
        if self._pending_points > self.max_points:
            self.flush()

    def flush(self) -> None:
        """Merge the queued batches into the map (one ``unique`` over map + queue), then evict."""
        if not self._pending:
            return
        keys = torch.cat([self._keys] + [p[0] for p in self._pending])  # [A]
        xyz = torch.cat([self._xyz] + [p[1] for p in self._pending])  # [A, 3]
        rgb = torch.cat([self._rgb] + [p[2] for p in self._pending])  # [A, 3]
        weight = torch.cat([self._weight] + [p[3] for p in self._pending])  # [A]
        conf = torch.cat([self._conf] + [p[4] for p in self._pending])  # [A]
        seen = torch.cat([self._seen] + [p[5] for p in self._pending])  # [A]
        self._pending, self._pending_points = [], 0

        ukeys, inv = torch.unique(keys, sorted=True, return_inverse=True)  # [M'], [A]
        m = ukeys.numel()
        wsum = torch.zeros(m, device=self.device).index_add_(0, inv, weight)  # [M']
        xyz_m = torch.zeros(m, 3, device=self.device).index_add_(0, inv, xyz * weight[:, None]) / wsum[:, None]
        rgb_m = torch.zeros(m, 3, device=self.device).index_add_(0, inv, rgb * weight[:, None]) / wsum[:, None]
        conf_m = torch.full((m,), float("-inf"), device=self.device).scatter_reduce_(0, inv, conf, "amax")  # [M']
        seen_m = torch.zeros(m, dtype=torch.int64, device=self.device).scatter_reduce_(0, inv, seen, "amax")
        wsum = wsum.clamp(max=_MAX_WEIGHT_SUM)

        if m > self.max_points:
            # ascending by (last seen, confidence): the first m - max_points go
            by_conf = torch.argsort(conf_m, stable=True)  # [M']
            order = by_conf[torch.argsort(seen_m[by_conf], stable=True)]  # [M']
            keep = torch.sort(order[m - self.max_points:]).values  # [max_points], key order kept
            self.evicted += m - self.max_points
            ukeys, xyz_m, rgb_m, wsum, conf_m, seen_m = (
                ukeys[keep], xyz_m[keep], rgb_m[keep], wsum[keep], conf_m[keep], seen_m[keep])
        # clone: drop references to the larger merge buffers, so memory stays at the map's size
        self._keys, self._xyz, self._rgb = ukeys.clone(), xyz_m.clone(), rgb_m.clone()
        self._weight, self._conf, self._seen = wsum.clone(), conf_m.clone(), seen_m.clone()

    def __len__(self) -> int:
        self.flush()
        return int(self._keys.numel())

    @property
    def pending_points(self) -> int:
        return self._pending_points

    def nbytes(self) -> int:
        """Bytes held by the map's and the queue's tensors (storage, not views)."""
        tensors = [self._keys, self._xyz, self._rgb, self._weight, self._conf, self._seen]
        tensors += [t for p in self._pending for t in p]
        return sum(t.untyped_storage().nbytes() for t in tensors)

    def points(self) -> PointBatch:
        """The map (after a flush) as a PointBatch on the map's device, in voxel-key order."""
        self.flush()
        rgb = self._rgb.round().clamp(0, 255).to(torch.uint8)  # [M, 3]
        return PointBatch(self._xyz.clone(), rgb, self._conf.clone(), None)

    def voxel_indices(self) -> torch.Tensor:
        """[M, 3] int64 voxel indices ``floor(p / voxel_size)`` of the map's voxels (tests, tools)."""
        self.flush()
        k = self._keys
        ijk = torch.stack([(k >> (2 * _KEY_BITS)) & _KEY_MASK, (k >> _KEY_BITS) & _KEY_MASK, k & _KEY_MASK], -1)
        return ijk - _KEY_OFFSET

    def last_seen(self) -> torch.Tensor:
        """[M] int64: the ``add`` sequence number (1-based) that last touched each voxel."""
        self.flush()
        return self._seen.clone()


# ---------------------------------------------------------------------------------------------
# files
# ---------------------------------------------------------------------------------------------
def _to_numpy(a: TensorLike) -> np.ndarray:
    """A host NumPy view or copy of a tensor or array (the file writers take either)."""
    return a.detach().cpu().numpy() if isinstance(a, torch.Tensor) else np.asarray(a)


PLY_VERTEX_DTYPE = np.dtype([("x", "<f4"), ("y", "<f4"), ("z", "<f4"), ("red", "u1"), ("green", "u1"),
                             ("blue", "u1"), ("confidence", "<f4")])  # 19 bytes, packed


def write_ply(path: PathLike, xyz: TensorLike, rgb: Optional[TensorLike] = None,
              confidence: Optional[TensorLike] = None, comment: str = "") -> int:
    """Binary little-endian PLY of points ``xyz`` [N, 3] with ``rgb`` [N, 3] uint8 and ``confidence`` [N].

    Vertex properties: ``float x, y, z`` (world frame, model units), ``uchar red, green, blue``,
    ``float confidence`` (Open3D, MeshLab and CloudCompare read the first six and keep or ignore
    the last). Written atomically (temporary file + rename). Returns the number of points.
    """
    p = _to_numpy(xyz).reshape(-1, 3)
    n = p.shape[0]
    rec = np.zeros(n, dtype=PLY_VERTEX_DTYPE)
    rec["x"], rec["y"], rec["z"] = p[:, 0], p[:, 1], p[:, 2]
    c = np.full((n, 3), 128, np.uint8) if rgb is None else _to_numpy(rgb).reshape(-1, 3).astype(np.uint8)
    rec["red"], rec["green"], rec["blue"] = c[:, 0], c[:, 1], c[:, 2]
    rec["confidence"] = 1.0 if confidence is None else _to_numpy(confidence).reshape(-1)
    lines = ["ply", "format binary_little_endian 1.0"]
    lines += [f"comment {line}" for line in (comment.splitlines() if comment else [])]
    lines += [f"element vertex {n}", "property float x", "property float y", "property float z",
              "property uchar red", "property uchar green", "property uchar blue", "property float confidence",
              "end_header"]
    atomic_write_bytes(path, "\n".join(lines).encode("ascii") + b"\n", rec.tobytes(), parents=True)
    return n


def write_colmap_text(
    directory: PathLike,
    c2w: np.ndarray,
    intrinsics: np.ndarray,
    image_hw: tuple[int, int],
    image_names: Sequence[str],
    xyz: Optional[TensorLike] = None,
    rgb: Optional[TensorLike] = None,
) -> None:
    """COLMAP's text model: ``cameras.txt``, ``images.txt``, ``points3D.txt`` in ``directory``.

    * One ``PINHOLE`` camera per image (the model estimates intrinsics per frame), size ``W H`` =
      the model input size. COLMAP puts the centre of the top-left pixel at (0.5, 0.5) (the node and
      OpenCV at (0, 0)), so the principal point is written as ``cx + 0.5, cy + 0.5``; focal lengths
      are unchanged.
    * ``images.txt``: ``IMAGE_ID QW QX QY QZ TX TY TZ CAMERA_ID NAME`` with the world-to-camera
      rotation (Hamilton, scalar first) and translation, i.e. the inverse of ``c2w``, then an empty
      2D-point line (no feature tracks).
    * ``points3D.txt``: ``POINT3D_ID X Y Z R G B ERROR`` with ERROR 0 and empty tracks (the points
      come from depth, not from triangulation).
    IDs start at 1. World = the session's world frame, model units. Each file is written atomically.
    """
    directory = Path(directory)
    c2w = np.asarray(c2w, dtype=np.float64).reshape(-1, 4, 4)
    k = np.asarray(intrinsics, dtype=np.float64).reshape(-1, 3, 3)
    if not (c2w.shape[0] == k.shape[0] == len(image_names)):
        raise ValueError(
            f"need one pose, intrinsics and name per image: {c2w.shape[0]}, {k.shape[0]}, {len(image_names)}"
        )
    h, w = int(image_hw[0]), int(image_hw[1])
    cams = ["# Camera list with one line of data per camera:", "#   CAMERA_ID, MODEL, WIDTH, HEIGHT, PARAMS[]",
            f"# Number of cameras: {len(k)}"]
    for i, ki in enumerate(k, 1):
        cams.append(f"{i} PINHOLE {w} {h} {ki[0, 0]:.17g} {ki[1, 1]:.17g} {ki[0, 2] + 0.5:.17g} {ki[1, 2] + 0.5:.17g}")
    w2c = se3_inverse(c2w)  # [S, 4, 4]
    q = quaternion_xyzw_from_matrix(w2c[:, :3, :3])  # [S, 4] x y z w
    imgs = ["# Image list with two lines of data per image:",
            "#   IMAGE_ID, QW, QX, QY, QZ, TX, TY, TZ, CAMERA_ID, NAME", "#   POINTS2D[] as (X, Y, POINT3D_ID)",
            f"# Number of images: {len(k)}, mean observations per image: 0"]
    for i, (qi, ti, name) in enumerate(zip(q, w2c[:, :3, 3], image_names), 1):
        if any(ch.isspace() for ch in name):
            raise ValueError(f"COLMAP image names cannot contain white space: {name!r}")
        vals = " ".join(f"{v:.17g}" for v in (qi[3], qi[0], qi[1], qi[2], *ti))
        imgs += [f"{i} {vals} {i} {name}", ""]
    p = np.zeros((0, 3)) if xyz is None else _to_numpy(xyz).reshape(-1, 3)
    c = np.full((p.shape[0], 3), 128, np.uint8) if rgb is None else _to_numpy(rgb).reshape(-1, 3).astype(np.uint8)
    pts = ["# 3D point list with one line of data per point:",
           "#   POINT3D_ID, X, Y, Z, R, G, B, ERROR, TRACK[] as (IMAGE_ID, POINT2D_IDX)",
           f"# Number of points: {p.shape[0]}, mean track length: 0"]
    pts += [
        f"{i} {x:.9g} {y:.9g} {z:.9g} {r} {g} {b} 0"
        for i, ((x, y, z), (r, g, b)) in enumerate(zip(p.tolist(), c.tolist()), 1)
    ]
    for name, lines in (("cameras.txt", cams), ("images.txt", imgs), ("points3D.txt", pts)):
        atomic_write_bytes(directory / name, "\n".join(lines).encode("utf-8") + b"\n", parents=True)


__all__ = [
    "PLY_VERTEX_DTYPE",
    "PointBatch",
    "VoxelMap",
    "is_finite_camera",
    "pack_rgb",
    "point_records",
    "unpack_rgb",
    "unproject_depth",
    "write_colmap_text",
    "write_ply",
]
