"""ROS messages built from what the streaming session returns: arguments in, message out.

The node decides what to publish and when (frame ids, counters, throttling, locks); this module only
says how a pose, a depth map or a ``FrameResult`` looks as a ROS message, so those conventions
(REP 103/105 fields, the 32FC1 depth layout, the CacheStats field mapping) live in one place and can
be checked without a running node.
"""
from __future__ import annotations

import functools
import struct
from typing import TYPE_CHECKING, NamedTuple, Optional, Sequence

import numpy as np
from builtin_interfaces.msg import Time as TimeMsg
from geometry_msgs.msg import PoseStamped, TransformStamped
from nav_msgs.msg import Odometry, Path
from rclpy.serialization import deserialize_message, serialize_message
from sensor_msgs.msg import Image
from std_msgs.msg import Header
from tf2_msgs.msg import TFMessage

from lingbot_map_ros.msg import CacheStats, FrameStatus

from ..core.geometry import quaternion_xyzw_from_matrix
from ..core.results import FrameResult

if TYPE_CHECKING:
    from ..core.results import SessionInfo


class FrameCounts(NamedTuple):
    """The node's frame counters as CacheStats reports them (taken together under the node's lock)."""

    received: int
    processed: int
    dropped: int  # every final status but PROCESSED
    rejected: int
    pending: int  # received, no final status yet (received == processed + dropped + pending)


def pose_row(pose: PoseStamped) -> list:
    """A pose as plain data for a saved session: [sec, nanosec, x, y, z, qx, qy, qz, qw] (exact)."""
    p, o = pose.pose.position, pose.pose.orientation
    return [int(pose.header.stamp.sec), int(pose.header.stamp.nanosec), p.x, p.y, p.z, o.x, o.y, o.z, o.w]


def pose_from_row(row: list, world_frame: str) -> PoseStamped:
    """``pose_row`` back into a message in ``world_frame``."""
    pose = PoseStamped()
    pose.header.stamp = TimeMsg(sec=int(row[0]), nanosec=int(row[1]))
    pose.header.frame_id = world_frame
    p, o = pose.pose.position, pose.pose.orientation
    p.x, p.y, p.z, o.x, o.y, o.z, o.w = (float(v) for v in row[2:9])
    return pose


def pose_stamped(c2w: np.ndarray, stamp: TimeMsg, world_frame: str) -> PoseStamped:
    """The camera pose (a 4x4 camera-to-world matrix) in ``world_frame`` at ``stamp``."""
    m = np.asarray(c2w, dtype=np.float64)
    pose = PoseStamped()
    pose.header.stamp = stamp
    pose.header.frame_id = world_frame
    p = pose.pose.position
    p.x, p.y, p.z = float(m[0, 3]), float(m[1, 3]), float(m[2, 3])
    o = pose.pose.orientation
    o.x, o.y, o.z, o.w = (float(v) for v in quaternion_xyzw_from_matrix(m[:3, :3]))
    return pose


def odometry(pose: PoseStamped, child_frame: str,
             twist: Optional[tuple[np.ndarray, np.ndarray]] = None,
             pose_covariance: Optional[Sequence[float]] = None,
             twist_covariance: Optional[Sequence[float]] = None) -> Odometry:
    """``pose`` as Odometry of ``child_frame``; ``twist`` = (linear, angular) [3] each, in the child
    frame (REP 105), when the node can give one (consecutive metric poses).

    The model gives no covariance estimate: the covariances are the user's (36 row-major values,
    ``settings.covariance_matrix`` of the ``*_covariance_diagonal`` parameters); None marks one unknown
    (-1 in the first element, the rest 0), so that no filter fuses it with a confidence it does not have.
    """
    odom = Odometry()
    odom.header = pose.header
    odom.child_frame_id = child_frame
    odom.pose.pose = pose.pose
    if pose_covariance is None:
        odom.pose.covariance[0] = -1.0
    else:
        odom.pose.covariance = [float(v) for v in pose_covariance]
    if twist_covariance is None:
        odom.twist.covariance[0] = -1.0
    else:
        odom.twist.covariance = [float(v) for v in twist_covariance]
    if twist is not None:
        lin, ang = twist
        odom.twist.twist.linear.x, odom.twist.twist.linear.y, odom.twist.twist.linear.z = (float(v) for v in lin)
        odom.twist.twist.angular.x, odom.twist.twist.angular.y, odom.twist.twist.angular.z = (float(v) for v in ang)
    return odom


def path_message(header: Header, poses: Sequence[PoseStamped]) -> Path:
    """The session's trajectory so far as a Path."""
    msg = Path()
    msg.header = header
    msg.poses = list(poses)
    return msg


# ~/path as bytes. rclpy converts every field of every pose of a Path on each publish (about 2.5 us a
# pose: a 1000-pose path costs milliseconds per frame); the serialized form of a pose never changes, so
# each pose is serialized once, when it is appended, and a Path is put together from those bytes. The
# middleware's own serializer makes every piece; ``path_bytes_agree`` checks once per process that the
# pieces joined are what it makes of the whole Path: as long and read back as the same message (its padding
# bytes are left uninitialised), else the node sends Path messages.
ENCAPSULATION = 4  # bytes before the CDR data (representation id and options)


def pose_bytes(pose: PoseStamped) -> bytes:
    """``pose``'s CDR as the second or a later element of a Path's ``poses``: such an element starts at an
    8-byte boundary (the one before it ends with a float64), as a message of its own does."""
    return serialize_message(pose)[ENCAPSULATION:]


def path_bytes(header: Header, first: PoseStamped, later: Sequence[bytes]) -> bytes:
    """The serialized Path of ``header`` and the poses ``first`` then ``later`` (``pose_bytes`` each), for
    ``Publisher.publish``. The first pose is serialized in place (its alignment depends on the header)."""
    empty = serialize_message(Path(header=header))  # [..., uint32 count = 0]
    head = serialize_message(Path(header=header, poses=[first]))
    count = len(empty) - 4
    order = "<" if head[1] & 1 else ">"  # CDR_LE / CDR_BE (the representation id's low bit)
    return b"".join((head[:count], struct.pack(order + "I", 1 + len(later)), head[count + 4:], *later))


@functools.lru_cache(maxsize=1)
def path_bytes_agree() -> bool:
    """Whether ``path_bytes`` gives what the middleware serializes for a whole Path, as long and read back
    as the same Path (checked once: headers and poses with frame ids of several lengths, so every
    alignment of the first pose and of the later ones is covered)."""
    poses = []
    for k, frame in enumerate(("map", "world", "w", "odom_frame", "a_longer_world_frame")):
        m = np.eye(4)
        m[:3, 3] = (k + 0.25, -k * 0.5, 1.0 / (k + 3))
        poses.append(pose_stamped(m, TimeMsg(sec=1700000000 + k, nanosec=123456789 * k % 10**9), frame))
    for frame in ("m", "map", "world", "abcdefg"):
        header = Header(stamp=TimeMsg(sec=7, nanosec=9), frame_id=frame)
        for n in range(1, len(poses) + 1):
            try:
                joined = path_bytes(header, poses[0], [pose_bytes(p) for p in poses[1:n]])
            except Exception:  # noqa: BLE001 - a middleware without serialize_message: send messages
                return False
            whole = path_message(header, poses[:n])
            if len(joined) != len(serialize_message(whole)) or deserialize_message(joined, Path) != whole:
                return False
    return True


def tf_message(pose: PoseStamped, child_frame: str) -> TFMessage:
    """The /tf message for ``pose``: ``pose``'s frame -> ``child_frame``."""
    tf = TransformStamped()
    tf.header = pose.header
    tf.child_frame_id = child_frame
    t = tf.transform.translation
    t.x, t.y, t.z = pose.pose.position.x, pose.pose.position.y, pose.pose.position.z
    tf.transform.rotation = pose.pose.orientation
    return TFMessage(transforms=[tf])


def transform_stamped(matrix: np.ndarray, stamp: TimeMsg, parent: str, child: str) -> TransformStamped:
    """``parent -> child`` (the pose [4, 4] of ``child`` in ``parent``) at ``stamp``, for /tf."""
    m = np.asarray(matrix, dtype=np.float64)
    tf = TransformStamped()
    tf.header.stamp = stamp
    tf.header.frame_id = parent
    tf.child_frame_id = child
    t = tf.transform.translation
    t.x, t.y, t.z = float(m[0, 3]), float(m[1, 3]), float(m[2, 3])
    r = tf.transform.rotation
    r.x, r.y, r.z, r.w = (float(v) for v in quaternion_xyzw_from_matrix(m[:3, :3]))
    return tf


def depth_image(depth: np.ndarray, stamp: TimeMsg, frame_id: str) -> Image:
    """A [H, W] depth map (model input size) as a 32FC1 Image in ``frame_id``."""
    d = np.ascontiguousarray(depth, dtype=np.float32)
    img = Image(height=int(d.shape[0]), width=int(d.shape[1]), encoding="32FC1", is_bigendian=0,
                step=int(d.shape[1]) * 4)
    img.header.stamp = stamp
    img.header.frame_id = frame_id
    img.data = d.tobytes()
    return img


def frame_status(header: Header, status: int, reason: str, session_id: int) -> FrameStatus:
    """What happened to the image with ``header`` when it produced no pose (``reason`` says why)."""
    msg = FrameStatus()
    msg.header = header
    msg.status = status
    msg.reason = reason
    msg.session_id = session_id
    return msg


def processed_status(result: FrameResult, header: Header, session_id: int, note: str = "") -> FrameStatus:
    """The PROCESSED status of the image with ``header``, with the model's raw pose encoding (``note``:
    what was withheld, e.g. while a metric scale is estimated)."""
    msg = FrameStatus()
    msg.header = header
    msg.status = FrameStatus.PROCESSED
    msg.reason = note
    msg.session_id = session_id
    msg.frame_index = int(result.frame_index)
    msg.pose_enc = [float(v) for v in np.asarray(result.pose_enc, dtype=np.float64).reshape(9)]
    return msg


def cache_stats(result: FrameResult, stamp: TimeMsg, world_frame: str, session_id: int, counts: FrameCounts,
                overhead_ms: float, info: SessionInfo) -> CacheStats:
    """The per-frame KV-cache report: the result's cache snapshot, the node's counters and timings."""
    s = result.cache
    stats = CacheStats()
    stats.header.stamp = stamp
    stats.header.frame_id = world_frame
    stats.frames_received = int(counts.received)
    stats.frames_processed = int(counts.processed)
    stats.frames_dropped = int(counts.dropped)
    stats.frames_rejected = int(counts.rejected)
    stats.frames_pending = int(counts.pending)
    stats.frame_index = int(result.frame_index)
    stats.session_id = session_id
    stats.is_keyframe = bool(result.is_keyframe)
    stats.is_scale_frame = bool(result.is_scale_frame)
    stats.frames_stored = int(s.frames_stored)
    stats.scale_frames = int(s.scale_frames)
    stats.window_frames = int(s.window_frames)
    stats.frames_evicted = int(s.frames_evicted)
    stats.page_size = int(s.page_size)
    stats.patch_pages_total = int(s.patch_pages_total)
    stats.scale_pages = int(s.scale_pages)
    stats.window_pages = int(s.window_pages)
    stats.free_pages = int(s.free_pages)
    stats.special_pages = int(s.special_pages)
    stats.special_pages_capacity = int(s.special_pages_capacity)
    stats.special_tokens = int(s.special_tokens)
    stats.rope_frame_index = int(result.rope_frame_index)
    stats.max_frame_num = int(s.max_frame_num)
    stats.visible_keys = int(s.visible_keys)
    stats.camera_cache_frames = int(s.camera_cache_frames)
    stats.latency_ms = float(result.latency_ms)
    stats.node_overhead_ms = float(overhead_ms)
    stats.backend = info.backend
    stats.dtype = info.dtype
    return stats
