"""ROS messages built from what the streaming session returns: arguments in, message out.

The node decides what to publish and when (frame ids, counters, throttling, locks); this module only
says how a pose, a depth map or a ``FrameResult`` looks as a ROS message, so those conventions
(REP 103/105 fields, the 32FC1 depth layout, the CacheStats field mapping) live in one place and can
be checked without a running node.
"""
from __future__ import annotations

import functools
import random
import struct
import threading
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


# Per-frame messages as bytes. A publish of a message makes rclpy convert it into its C form (type checks
# per field, a C struct per nested message), after Python built it field by field with checks of its own;
# a publish of bytes skips both. The strings of these messages (frame ids, a reason) and their sequence
# lengths rarely change, so the middleware serializes one message per such key once; where each numeric
# field lands in those bytes is found by serializing it with values drawn at random (``_offset_of``), and each
# frame writes its numbers there (``struct``). ``FieldLayout.of`` checks the result once against the
# middleware's own serialization (read back as the same message), else the caller publishes messages.
_FIELD_FORMATS = {"double": "d", "float": "f", "int8": "b", "uint8": "B", "octet": "B", "char": "B",
                  "boolean": "?", "int16": "h", "uint16": "H", "int32": "i", "uint32": "I", "int64": "q",
                  "uint64": "Q"}
_PROBE_MIN, _PROBE_MAX = 4, 64  # values written into a field to place it: at least, at most
_PROBE_RANDOM = random.Random()  # a fresh seed per process: no earlier probe's values to repeat


def _field_type(msg_type, path: str) -> str:
    """The IDL type name of the numeric field ``path`` ("pose.position.x", "pose_enc[3]") of ``msg_type``."""
    kind = ""
    for part in path.split("."):
        name = part.split("[")[0]
        kind = msg_type.get_fields_and_field_types()[name]
        if "[" in part:  # an element: "double[9]", "sequence<double>", "sequence<double, 9>"
            kind = kind.split("[")[0] if "[" in kind else kind[len("sequence<"):].split(",")[0].rstrip(">")
        if "/" in kind:
            package, _, type_name = kind.partition("/")
            msg_type = getattr(__import__(f"{package}.msg", fromlist=[type_name]), type_name)
    return kind


def _container(msg, path: str) -> tuple[object, object]:
    """(object, attribute name or index) that holds the field ``path`` of ``msg``."""
    *parents, last = path.split(".")
    for part in parents:
        name, _, index = part.partition("[")
        msg = getattr(msg, name)[int(index[:-1])] if index else getattr(msg, name)
    name, _, index = last.partition("[")
    return (getattr(msg, name), int(index[:-1])) if index else (msg, name)


def set_field(msg, path: str, value) -> None:
    """``msg.<path> = value`` for a dotted path with element indices ("pose_enc[3]")."""
    holder, key = _container(msg, path)
    if isinstance(key, int):
        holder[key] = value
    else:
        setattr(holder, key, value)


def get_field(msg, path: str):
    holder, key = _container(msg, path)
    return holder[key] if isinstance(key, int) else getattr(holder, key)


class FieldLayout:
    """The serialized bytes of one message with its numeric ``fields`` written per send (``pack``)."""

    def __init__(self, template: bytes, runs: list[tuple[int, struct.Struct, int, int]], size: int):
        self._template = template
        self._runs = runs  # (offset, Struct of consecutive fields, first field, end field)
        self.size = size

    @classmethod
    def of(cls, example, fields: Sequence[str]) -> Optional["FieldLayout"]:
        """The layout of ``example``'s type with ``example``'s strings and sequence lengths, its ``fields``
        written by ``pack``; None where the middleware's serialization cannot be patched this way."""
        try:
            return cls._build(example, fields)
        except Exception:  # noqa: BLE001 - a middleware or field this cannot handle: the caller sends messages
            return None

    @classmethod
    def _build(cls, example, fields: Sequence[str]) -> Optional["FieldLayout"]:
        msg_type = type(example)
        probe = deserialize_message(serialize_message(example), msg_type)  # a copy, the example untouched
        template = serialize_message(probe)
        order = "<" if template[1] & 1 else ">"  # CDR_LE / CDR_BE (the representation id's low bit)
        slots = []
        for path in fields:
            fmt = _FIELD_FORMATS[_field_type(msg_type, path)]
            width = struct.calcsize(fmt)
            original = get_field(probe, path)
            offset = cls._offset_of(probe, path, fmt, order, len(template))
            set_field(probe, path, original)
            if offset is None:
                return None
            slots.append((offset, fmt, width))
        runs = []  # consecutive fields in one Struct each
        for i, (offset, fmt, width) in enumerate(slots):
            last = runs[-1] if runs else None
            if last is not None and last[0] + last[3] == offset and last[2] == i:
                runs[-1] = (last[0], last[1] + fmt, i + 1, last[3] + width)
            else:
                runs.append((offset, fmt, i + 1, width))
        layout = cls(template, [(off, struct.Struct(order + fmt), end - len(fmt), end) for off, fmt, end, _ in runs],
                     len(fields))
        check = deserialize_message(serialize_message(example), msg_type)
        values = []
        for k, path in enumerate(fields):  # distinct values in every field's range
            fmt = _FIELD_FORMATS[_field_type(msg_type, path)]
            value = bool(k % 2) if fmt == "?" else (k + 1.25 if fmt in "df" else k + 1)
            set_field(check, path, value)
            values.append(value)
        packed = layout.pack(values)
        if len(packed) != len(template) or deserialize_message(packed, msg_type) != check:
            return None
        return layout

    @staticmethod
    def _offset_of(probe, path: str, fmt: str, order: str, size: int) -> Optional[int]:
        """Where the field ``path`` of ``probe`` sits in its bytes: the one place that holds every value written
        into the field, each serialized in turn; None where no place or several do.

        The middleware leaves the alignment padding between fields unwritten, so those bytes hold whatever the
        buffer held before, often an earlier serialization's, probes of other keys included. Fixed probe values
        can therefore show up in padding as well; values drawn at random per probe (every byte of a number in
        0x10..0x7f: finite as a float, in range as a signed integer) cannot follow along, and more values are
        written while more than one place still holds them all."""
        width = struct.calcsize(fmt)
        candidates: Optional[list[int]] = None
        for round_ in range(_PROBE_MAX):
            if fmt == "?":
                raw = bytes([round_ % 2 if round_ < 2 else _PROBE_RANDOM.getrandbits(1)])  # both values first
            else:
                raw = bytes(_PROBE_RANDOM.randrange(0x10, 0x80) for _ in range(width))
            set_field(probe, path, struct.unpack(order + fmt, raw)[0])
            wire = serialize_message(probe)
            if len(wire) != size:
                return None
            places = range(ENCAPSULATION, size - width + 1) if candidates is None else candidates
            candidates = [p for p in places if wire[p:p + width] == raw]
            if not candidates:
                return None
            if len(candidates) == 1 and round_ + 1 >= _PROBE_MIN:
                return candidates[0]
        return None

    def pack(self, values: Sequence) -> bytes:
        """The serialized message with ``values`` (one per field, in the order of ``fields``)."""
        buf = bytearray(self._template)
        for offset, packer, start, end in self._runs:
            packer.pack_into(buf, offset, *values[start:end])
        return bytes(buf)


class Packed:
    """``FieldLayout``s of one message kind by key (the strings and lengths they fix), built on first use
    from ``example(key)``; a key without a layout gives messages (``example`` with the values set)."""

    def __init__(self, example, fields: Sequence[str], keep: int = 16):
        self._example = example
        self.fields = tuple(fields)
        self._keep = keep
        self._layouts: dict = {}
        self._lock = threading.Lock()  # the inference threads and the executor thread share a kind

    def layout(self, key) -> Optional[FieldLayout]:
        try:
            return self._layouts[key]
        except KeyError:
            pass
        layout = FieldLayout.of(self._example(key), self.fields)
        with self._lock:
            if len(self._layouts) >= self._keep:
                self._layouts.pop(next(iter(self._layouts)))
            self._layouts[key] = layout
        return layout

    def encode(self, key, values: Sequence):
        """What to publish: the bytes of the message of ``key`` with ``values``, or that message."""
        layout = self.layout(key)
        if layout is not None:
            return layout.pack(values)
        return self.message(key, values)

    def message(self, key, values: Sequence):
        """The message of ``key`` with ``values``, built field by field (what ``encode``'s bytes carry)."""
        msg = self._example(key)
        for path, value in zip(self.fields, values):
            set_field(msg, path, value)
        return msg


STAMP_FIELDS = ("header.stamp.sec", "header.stamp.nanosec")
POSE_FIELDS = (*STAMP_FIELDS, "pose.position.x", "pose.position.y", "pose.position.z", "pose.orientation.x",
               "pose.orientation.y", "pose.orientation.z", "pose.orientation.w")


def pose_values(c2w: np.ndarray, stamp: TimeMsg) -> tuple:
    """``pose_stamped``'s numbers in ``POSE_FIELDS`` order: (sec, nanosec, x, y, z, qx, qy, qz, qw)."""
    m = np.asarray(c2w, dtype=np.float64)
    q = quaternion_xyzw_from_matrix(m[:3, :3])
    return (stamp.sec, stamp.nanosec, float(m[0, 3]), float(m[1, 3]), float(m[2, 3]),
            float(q[0]), float(q[1]), float(q[2]), float(q[3]))


POSES = Packed(lambda world_frame: PoseStamped(header=Header(frame_id=world_frame)), POSE_FIELDS)


def pose_encoded(c2w: np.ndarray, stamp: TimeMsg, world_frame: str):
    """``pose_stamped(c2w, stamp, world_frame)`` for ``publish``: its bytes (or the message)."""
    return POSES.encode(world_frame, pose_values(c2w, stamp))


ODOMETRY_FIELDS = (*STAMP_FIELDS, *(f"pose.{f}" for f in POSE_FIELDS[2:]),
                   *(f"twist.twist.{part}.{axis}" for part in ("linear", "angular") for axis in "xyz"))


def _odometry_example(key) -> Odometry:
    world_frame, child_frame, pose_covariance, twist_covariance = key
    return odometry(PoseStamped(header=Header(frame_id=world_frame)), child_frame, None, pose_covariance,
                    twist_covariance)


ODOMETRIES = Packed(_odometry_example, ODOMETRY_FIELDS)
_NO_TWIST = (0.0,) * 6


def odometry_encoded(pose: tuple, world_frame: str, child_frame: str,
                     twist: Optional[tuple[np.ndarray, np.ndarray]] = None,
                     pose_covariance: Optional[Sequence[float]] = None,
                     twist_covariance: Optional[Sequence[float]] = None):
    """``odometry`` of the pose with ``pose_values`` ``pose`` in ``world_frame``, for ``publish``."""
    # the covariances are part of the key as given (the node passes the same cached tuples every frame)
    key = (world_frame, child_frame, None if pose_covariance is None else tuple(pose_covariance),
           None if twist_covariance is None else tuple(twist_covariance))
    moving = _NO_TWIST if twist is None else (*(float(v) for v in twist[0]), *(float(v) for v in twist[1]))
    return ODOMETRIES.encode(key, (*pose, *moving))


STATUS_FIELDS = (*STAMP_FIELDS, "status", "session_id", "frame_index", *(f"pose_enc[{i}]" for i in range(9)))
STATUSES = Packed(lambda key: FrameStatus(header=Header(frame_id=key[0]), reason=key[1]), STATUS_FIELDS)


def processed_status_encoded(result: FrameResult, header: Header, session_id: int, note: str = ""):
    """``processed_status`` for ``publish``: its bytes (or the message)."""
    pose_enc = np.asarray(result.pose_enc, dtype=np.float64).reshape(9)
    return STATUSES.encode((header.frame_id, note), (header.stamp.sec, header.stamp.nanosec, FrameStatus.PROCESSED,
                                                     session_id, int(result.frame_index), *pose_enc.tolist()))


STATS_FIELDS = (*STAMP_FIELDS, "frames_received", "frames_processed", "frames_dropped", "frames_rejected",
                "frames_pending", "frame_index", "session_id", "is_keyframe", "is_scale_frame", "frames_stored",
                "scale_frames", "window_frames", "frames_evicted", "page_size", "patch_pages_total", "scale_pages",
                "window_pages", "free_pages", "special_pages", "special_pages_capacity", "special_tokens",
                "rope_frame_index", "max_frame_num", "visible_keys", "camera_cache_frames", "latency_ms",
                "node_overhead_ms")
STATS = Packed(lambda key: CacheStats(header=Header(frame_id=key[0]), backend=key[1], dtype=key[2]), STATS_FIELDS)


def cache_stats_encoded(result: FrameResult, stamp: TimeMsg, world_frame: str, session_id: int, counts: FrameCounts,
                        overhead_ms: float, info: SessionInfo):
    """``cache_stats`` for ``publish``: its bytes (or the message)."""
    s = result.cache
    return STATS.encode((world_frame, info.backend, info.dtype), (
        stamp.sec, stamp.nanosec, int(counts.received), int(counts.processed), int(counts.dropped),
        int(counts.rejected), int(counts.pending), int(result.frame_index), session_id, bool(result.is_keyframe),
        bool(result.is_scale_frame), int(s.frames_stored), int(s.scale_frames), int(s.window_frames),
        int(s.frames_evicted), int(s.page_size), int(s.patch_pages_total), int(s.scale_pages), int(s.window_pages),
        int(s.free_pages), int(s.special_pages), int(s.special_pages_capacity), int(s.special_tokens),
        int(result.rope_frame_index), int(s.max_frame_num), int(s.visible_keys), int(s.camera_cache_frames),
        float(result.latency_ms), float(overhead_ms)))


def transform_values(matrix: np.ndarray) -> tuple:
    """``transform_stamped``'s numbers of ``matrix`` [4, 4]: (x, y, z, qx, qy, qz, qw)."""
    m = np.asarray(matrix, dtype=np.float64)
    q = quaternion_xyzw_from_matrix(m[:3, :3])
    return float(m[0, 3]), float(m[1, 3]), float(m[2, 3]), float(q[0]), float(q[1]), float(q[2]), float(q[3])


def transform_stamped_of(values: tuple, stamp: TimeMsg, parent: str, child: str) -> TransformStamped:
    """``parent -> child`` with ``transform_values`` ``values`` at ``stamp``."""
    tf = TransformStamped()
    tf.header.stamp = stamp
    tf.header.frame_id = parent
    tf.child_frame_id = child
    t, r = tf.transform.translation, tf.transform.rotation
    t.x, t.y, t.z, r.x, r.y, r.z, r.w = values
    return tf


TRANSFORM_FIELDS = (*STAMP_FIELDS, *(f"transform.translation.{a}" for a in "xyz"),
                    *(f"transform.rotation.{a}" for a in "xyzw"))


def _tf_example(key) -> TFMessage:
    parent, child, count = key
    return TFMessage(transforms=[TransformStamped(header=Header(frame_id=parent), child_frame_id=child)
                                 for _ in range(count)])


TF_MESSAGES = {count: Packed(_tf_example, tuple(f"transforms[{i}].{f}" for i in range(count) for f in TRANSFORM_FIELDS))
               for count in (1, 2)}  # a camera pose or a correction at its image stamp; a correction sent ahead too


def tf_encoded(values: tuple, stamps: Sequence[TimeMsg], parent: str, child: str):
    """One /tf message of ``parent -> child`` with ``transform_values`` ``values`` at each of ``stamps``, for
    ``publish``: its bytes (or the message); the same as ``TFMessage(transforms=[transform_stamped_of(...)])``."""
    packed = TF_MESSAGES.get(len(stamps))
    if packed is None:
        return TFMessage(transforms=[transform_stamped_of(values, s, parent, child) for s in stamps])
    return packed.encode((parent, child, len(stamps)),
                         [v for s in stamps for v in (s.sec, s.nanosec, *values)])


def _path_head_example(key) -> Path:
    header_frame, first_frame = key
    return Path(header=Header(frame_id=header_frame), poses=[PoseStamped(header=Header(frame_id=first_frame))])


PATH_HEADS = Packed(_path_head_example, (*STAMP_FIELDS, *(f"poses[0].{f}" for f in POSE_FIELDS)))


@functools.lru_cache(maxsize=16)
def _path_count_offset(header_frame: str) -> int:
    """Where a Path's pose count sits in its bytes with a header of ``header_frame`` (right after the header)."""
    return len(serialize_message(Path(header=Header(frame_id=header_frame)))) - 4


def path_bytes_of(stamp: TimeMsg, header_frame: str, first: tuple[str, tuple], later: Sequence[bytes]) -> bytes:
    """``path_bytes`` of the header (``stamp``, ``header_frame``) with the first pose given as (its frame id, its
    ``pose_values``): the header and that pose are written into a template too, not serialized per send."""
    layout = PATH_HEADS.layout((header_frame, first[0]))
    if layout is None:
        return path_bytes(Header(stamp=stamp, frame_id=header_frame), pose_from_row(first[1], first[0]), later)
    head = layout.pack((stamp.sec, stamp.nanosec, *first[1]))
    count = _path_count_offset(header_frame)
    order = "<" if head[1] & 1 else ">"  # CDR_LE / CDR_BE (the representation id's low bit)
    return b"".join((head[:count], struct.pack(order + "I", 1 + len(later)), head[count + 4:], *later))
