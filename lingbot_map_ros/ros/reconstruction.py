"""Reconstruction outputs of the node: depth confidence, camera info, frame points and the session map.

Two layers, as in ``messages.py``:

* pure builders (arguments in, message out): ``camera_info``, ``confidence_image``,
  ``point_cloud2`` - the ROS layout conventions live here and are checked without a node;
* ``ReconstructionPublisher``, owned by the node: its publishers, the ``~/save_map`` service and the
  map timer. The node calls ``publish`` on its inference thread after the pose of the frame is out,
  so the pose path never waits for points, and ``reset`` when a new session (new world frame) starts.

Geometry conventions: ``core/reconstruction.py`` (optical frame x right / y down / z forward, pixel
centres at integer coordinates, depth = z). The CameraInfo published for a frame holds exactly the
intrinsics its points were unprojected with, so ``depth_image_proc`` reproduces ``~/points``.
"""
from __future__ import annotations

import array
import collections
import math
import os
import sys
import threading
import time
from typing import Callable, Optional, Union

import numpy as np
import torch
from builtin_interfaces.msg import Time as TimeMsg
from rclpy.qos import QoSDurabilityPolicy, QoSProfile, QoSReliabilityPolicy
from sensor_msgs.msg import CameraInfo, Image, PointCloud2, PointField
from std_msgs.msg import Header
from std_srvs.srv import Trigger

from ..core.geometry import intrinsics_for_camera
from ..core.reconstruction import PointBatch, VoxelMap, is_finite_camera, point_records, unproject_depth, write_ply
from ..core.results import FrameResult
from .large_outputs import destroy_large_publisher, large_publisher
from .node_settings import NodeSettings, SettingsSource
from .outbox import deferred, undeferred

# x, y, z, rgb (packed 0x00RRGGBB in a float32), confidence: five little-endian float32 = 20 bytes
POINT_FIELD_NAMES = ("x", "y", "z", "rgb", "confidence")
POINT_STEP = 4 * len(POINT_FIELD_NAMES)
MAX_POINTS_PER_FRAME = 1 << 20  # bound of ~/points (stride 1 at 518x518 is 268 324)
MAP_TICK_S = 0.1  # the map timer's tick; the map is published every map_period s (changeable live)


# ---------------------------------------------------------------------------------------------
# builders
# ---------------------------------------------------------------------------------------------
def point_fields() -> list[PointField]:
    """The five FLOAT32 fields of ``~/points`` and ``~/map_points`` at offsets 0, 4, 8, 12, 16."""
    return [PointField(name=n, offset=4 * i, datatype=PointField.FLOAT32, count=1)
            for i, n in enumerate(POINT_FIELD_NAMES)]


def point_cloud2(records: np.ndarray, stamp: TimeMsg, frame_id: str) -> PointCloud2:
    """[N, 5] float32 records (``core.reconstruction.point_records``) -> an unordered PointCloud2.

    height 1, width N, point_step 20, row_step 20 N, ``is_dense`` true (the records hold only finite
    points: callers filter first), byte order = this machine's (little-endian on x86/ARM robots).
    """
    rec = np.ascontiguousarray(records, dtype=np.float32).reshape(-1, len(POINT_FIELD_NAMES))
    if not np.all(np.isfinite(rec)):
        raise ValueError("point records must be finite (filter before building the message)")
    msg = PointCloud2()
    msg.header.stamp = stamp
    msg.header.frame_id = frame_id
    msg.height = 1
    msg.width = int(rec.shape[0])
    msg.fields = point_fields()
    msg.is_bigendian = sys.byteorder == "big"
    msg.point_step = POINT_STEP
    msg.row_step = POINT_STEP * msg.width
    msg.is_dense = True
    data = array.array("B")
    if rec.size:
        data.frombytes(memoryview(rec).cast("B"))  # one memcpy, no per-byte checks
    msg.data = data
    return msg


def camera_info(intrinsics: np.ndarray, image_hw: tuple[int, int], stamp: TimeMsg, frame_id: str) -> CameraInfo:
    """A pinhole CameraInfo for an ``image_hw`` (H, W) image with intrinsics ``K`` [3, 3].

    No distortion (``plumb_bob`` with five zeros), R = identity, P = [K | 0]: the model's camera is
    an ideal pinhole at the model input size, the size of ``~/depth``.
    """
    k = np.asarray(intrinsics, dtype=np.float64).reshape(3, 3)
    msg = CameraInfo()
    msg.header.stamp = stamp
    msg.header.frame_id = frame_id
    msg.height, msg.width = int(image_hw[0]), int(image_hw[1])
    msg.distortion_model = "plumb_bob"
    msg.d = [0.0] * 5
    msg.k = [float(v) for v in k.reshape(9)]
    msg.r = [1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0]
    p = np.zeros((3, 4))
    p[:, :3] = k
    msg.p = [float(v) for v in p.reshape(12)]
    return msg


def confidence_image(confidence: np.ndarray, stamp: TimeMsg, frame_id: str) -> Image:
    """[H, W] depth confidence as a 32FC1 Image; non-finite values become finite (never NaN/inf on a
    topic): NaN -> 0 (no confidence), +inf -> the largest float32."""
    c = np.nan_to_num(np.asarray(confidence, dtype=np.float32), nan=0.0, posinf=np.finfo(np.float32).max,
                      neginf=0.0)
    c = np.ascontiguousarray(c)
    img = Image(height=int(c.shape[0]), width=int(c.shape[1]), encoding="32FC1",
                is_bigendian=int(sys.byteorder == "big"), step=int(c.shape[1]) * 4)
    img.header.stamp = stamp
    img.header.frame_id = frame_id
    data = array.array("B")
    if c.size:
        data.frombytes(memoryview(c).cast("B"))
    img.data = data
    return img


def published_intrinsics(result: FrameResult) -> np.ndarray:
    """The frame's intrinsics at the depth-map (model input) size as published: the raw K with its focal
    lengths clamped to a sane FoV (``geometry.intrinsics_for_camera``: the head's ReLU'd FoV can be 0
    or >= 180 deg). Points are unprojected with exactly this K."""
    h, w = int(result.image_hw[0]), int(result.image_hw[1])
    return intrinsics_for_camera(result.intrinsics, (w, h), (h, w), 0)


# ---------------------------------------------------------------------------------------------
# the publisher the node owns
# ---------------------------------------------------------------------------------------------
class ReconstructionPublisher:
    """``~/depth_confidence``, ``~/camera_info``, ``~/points``, ``~/map_points`` and ``~/save_map``.

    ``settings`` holds the node's current settings (read once on every frame, tick and call, so every
    parameter applies from the next frame). ``device`` (a device or a callable returning one) is
    where the per-pixel work runs: the model's device; default: the model image's. ``map_device``
    where the voxel map lives (default CPU, so its merges never queue kernels between the model's on
    the GPU).

    Threads: ``publish`` and ``reset`` run on the node's inference thread and only append to a queue
    (a short lock, never the map merge); the map timer and ``~/save_map`` run on the executor, drain
    the queue in order (a reset in the queue empties the map at the right place) and merge. The queue
    is merged whenever it holds a quarter of ``map_max_points`` or a publication is due, and is hard-
    bounded at twice ``map_max_points`` points (oldest frames dropped, counted) should the executor
    stall, so memory stays bounded on runs of hours.
    """

    def __init__(self, node, settings: SettingsSource,
                 device: Union[None, str, torch.device, Callable[[], Optional[torch.device]]] = None,
                 map_device: Union[str, torch.device] = "cpu", prefix: str = "~/",
                 map_into: Optional["ReconstructionPublisher"] = None):
        """``prefix``: where the per-frame outputs go (``~/<camera>/`` for one of several cameras);
        ``map_into``: the publisher whose map this one's points join (several cameras, one map): then
        this one has no map, ``~/save_map`` or timer of its own."""
        self._node = node
        self._map_into = map_into
        self._settings = settings
        # a callable follows the model when the node rebuilds it on another device
        self._device = device if callable(device) else (lambda d=device: d)
        self.map_device = torch.device(map_device)
        values = settings.current
        self._qlock = threading.Lock()  # the queue below (inference thread <-> executor)
        self._queue: collections.deque = collections.deque()  # ("points", session, PointBatch, stamp) | ("reset",)
        self._queued_points = 0
        self._map_lock = threading.Lock()  # the map and its bookkeeping (executor side only)
        self._map = VoxelMap(values.map_voxel_size, values.map_max_points, device=map_device)
        self._map_stamp: Optional[TimeMsg] = None
        self._map_session: Optional[int] = None
        self._map_dirty = False
        self._last_map_pub = -math.inf
        self.skipped_frames = 0  # frames whose pose or intrinsics were not finite
        self.dropped_map_frames = 0  # frames dropped from a stalled map queue
        reliable10 = QoSProfile(depth=10, reliability=QoSReliabilityPolicy.RELIABLE)
        big = QoSProfile(depth=2, reliability=QoSReliabilityPolicy.RELIABLE)
        # latched: RViz (or a recorder) started later still gets the last map at once
        latched = QoSProfile(depth=1, reliability=QoSReliabilityPolicy.RELIABLE,
                             durability=QoSDurabilityPolicy.TRANSIENT_LOCAL)
        # images and clouds from the node's second participant (large_outputs: they would delay its poses and TF)
        # sent on the node's outbox thread (outbox.py): a cloud's send is milliseconds
        self._conf_pub = deferred(node, large_publisher(node, Image, prefix + "depth_confidence", reliable10))
        self._info_pub = deferred(node, node.create_publisher(CameraInfo, prefix + "camera_info", reliable10))
        self._points_pub = deferred(node, large_publisher(node, PointCloud2, prefix + "points", big))
        self._map_pub = self._save_srv = self._timer = None
        if map_into is None:
            self._map_pub = deferred(node, large_publisher(node, PointCloud2, "~/map_points", latched))
            self._save_srv = node.create_service(Trigger, "~/save_map", self._on_save_map)
            self._timer = node.create_timer(MAP_TICK_S, self._on_tick)

    # ------------------------------------------------------------------ inference thread
    def publish(self, result: FrameResult, model_image: Optional[torch.Tensor], header: Header,
                camera_frame: str, world_frame: str) -> None:
        """Per-frame outputs of ``result`` (after its pose is published). ``model_image`` [3, H, W] in
        [0, 1] (the tensor the model saw) colours the points; None gives grey points.

        Nothing at all is published for a frame without depth or with a non-finite pose/intrinsics.
        ``~/points`` is only built while someone subscribes to it.
        """
        if result.depth is None:
            return
        values = self._settings.current
        want_depth, want_points, want_map = values.publish_depth, values.publish_points, values.publish_map
        if not (want_depth or want_points or want_map):
            return
        k = published_intrinsics(result)
        if not is_finite_camera(k, result.c2w):
            self.skipped_frames += 1
            self._node.get_logger().warning(
                f"frame {result.frame_index}: non-finite pose or intrinsics; no depth_confidence/camera_info/points",
                throttle_duration_sec=5.0)
            return
        stamp = header.stamp
        hw = (int(result.depth.shape[0]), int(result.depth.shape[1]))
        if want_depth:
            if result.depth_conf is not None:
                self._conf_pub.publish(confidence_image(result.depth_conf, stamp, camera_frame))
            self._info_pub.publish(camera_info(k, hw, stamp, camera_frame))
        send_points = want_points and self._points_pub.get_subscription_count() > 0
        if not (send_points or want_map):
            return
        device = self._device() or (model_image.device if model_image is not None else torch.device("cpu"))
        points = unproject_depth(
            result.depth, k, result.c2w, confidence=result.depth_conf, image=model_image,
            stride=values.points_stride, min_confidence=values.points_min_confidence,
            max_points=MAX_POINTS_PER_FRAME, device=device,
        )
        records = point_records(points)  # [N, 5] on the host: the one copy off the device
        if send_points:
            self._points_pub.publish(point_cloud2(records, stamp, world_frame))
        if want_map:  # the map is fed from the host copy (no second transfer)
            self._enqueue(("points", int(result.session_id), PointBatch.from_records(records), stamp), len(records),
                          values.map_max_points)

    def reset(self) -> None:
        """A new session started: its world frame is new, so the map starts empty (in queue order)."""
        self._enqueue(("reset",), 0, 0)

    def _enqueue(self, item: tuple, n: int, max_points: int) -> None:
        if self._map_into is not None:
            self._map_into._enqueue(item, n, max_points)
            return
        with self._qlock:
            self._queue.append(item)
            self._queued_points += n
            while self._queued_points > 2 * max_points > 0:
                # the oldest frame's points go (never a reset, never the newest frame)
                idx = next((i for i, it in enumerate(self._queue) if it[0] == "points"), None)
                if idx is None or idx == len(self._queue) - 1:
                    break
                self._queued_points -= len(self._queue[idx][2])
                del self._queue[idx]
                self.dropped_map_frames += 1

    # ------------------------------------------------------------------ executor thread
    def _drain_locked(self, values: NodeSettings) -> None:
        """Move every queued item into the map (map lock held)."""
        with self._qlock:
            items, self._queue = list(self._queue), collections.deque()
            self._queued_points = 0
        if self._map.configure(values.map_voxel_size, values.map_max_points):
            self._node.get_logger().info(f"map_voxel_size is now {values.map_voxel_size}: map emptied")
            self._map_dirty = True
        for item in items:
            if item[0] == "reset" or (self._map_session is not None and item[1] != self._map_session):
                self._map.reset()  # a new session: a new world frame
                self._map_session, self._map_stamp = None, None
                self._map_dirty = True
            if item[0] == "points":
                _, session, points, stamp = item
                self._map.add(points)
                self._map_session, self._map_stamp = session, stamp
                self._map_dirty = True

    def _on_tick(self) -> None:
        try:
            self._tick()
        except Exception as exc:  # noqa: BLE001 - the map must never take the node (and its poses) down
            self._node.get_logger().error(f"map update failed: {type(exc).__name__}: {exc}",
                                          throttle_duration_sec=5.0)

    def _tick(self) -> None:
        values = self._settings.current
        now = time.monotonic()
        due = values.publish_map and now - self._last_map_pub >= values.map_period
        with self._qlock:
            big_queue = self._queued_points * 4 >= values.map_max_points
            has_items = bool(self._queue)
        if not (due or (big_queue and has_items)):
            return
        with self._map_lock:
            self._drain_locked(values)
            self._map.flush()
            if not (due and self._map_dirty):
                return
            points = self._map.points()
            stamp = self._map_stamp
            self._map_dirty = False
        self._last_map_pub = now
        if stamp is None:
            stamp = self._node.get_clock().now().to_msg()
        self._map_pub.publish(point_cloud2(point_records(points), stamp, values.world_frame))

    def _on_save_map(self, request, response):
        """``~/save_map`` (std_srvs/Trigger): write the voxel map to ``map_path`` as binary PLY, atomically.

        The map is built only while ``publish_map`` is true. An empty map is never written (it would
        replace a good file with nothing): the call fails and says why (``publish_map`` is false, or
        no frame of this session has been merged yet). A map that stopped growing because
        ``publish_map`` was turned off is written, and the message says so."""
        values = self._settings.current
        path = os.path.abspath(os.path.expanduser(values.map_path))
        building = values.publish_map
        try:
            with self._map_lock:
                self._drain_locked(values)
                xyz, rgb, conf = self._map.points().numpy()
                session = self._map_session
            if len(xyz) == 0:
                response.success = False
                response.message = (f"nothing written to {path}: " + (
                    "the map is empty because it is built only while publish_map is true, and it is false "
                    "(ros2 param set <node> publish_map true, then call again after some frames)" if not building
                    else "the map is empty: no frame of this session has been merged into it yet"))
                return response
            n = write_ply(path, xyz, rgb, conf,
                          comment=f"lingbot_map_ros voxel map (session {session}, frame {values.world_frame}, "
                                  f"voxel {values.map_voxel_size})")
        except Exception as exc:  # noqa: BLE001 - answer with the reason; never raise into the executor
            response.success = False
            response.message = f"cannot write {path}: {type(exc).__name__}: {exc}"
            return response
        response.success = True
        response.message = f"wrote {n} map points to {path}" + (
            "" if building else " (publish_map is false: the map is not being updated)")
        self._node.get_logger().info(response.message)
        return response

    # ------------------------------------------------------------------ lifecycle
    def map_size(self) -> int:
        """Voxels in the map now (drains and merges the queue)."""
        with self._map_lock:
            self._drain_locked(self._settings.current)
            return len(self._map)

    def destroy(self) -> None:
        """Remove the publishers, the service and the timer (lifecycle cleanup / shutdown)."""
        node = self._node
        if self._timer is not None:
            node.destroy_timer(self._timer)
            node.destroy_service(self._save_srv)
        node.destroy_publisher(undeferred(self._info_pub))
        for pub in (self._conf_pub, self._points_pub, self._map_pub):
            if pub is not None:
                destroy_large_publisher(node, undeferred(pub))


__all__ = [
    "MAX_POINTS_PER_FRAME",
    "POINT_FIELD_NAMES",
    "POINT_STEP",
    "ReconstructionPublisher",
    "camera_info",
    "confidence_image",
    "point_cloud2",
    "point_fields",
    "published_intrinsics",
]
