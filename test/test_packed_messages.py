"""The per-frame messages as bytes (ros/messages.py ``FieldLayout``, ``Packed``): a template serialized once per
key (frame ids, a reason), its numbers written in place per frame.

The reference is the middleware itself: the message built field by field the usual way (``pose_stamped``,
``odometry``, ``processed_status``, ``cache_stats``, ``transform_stamped``), its length as rclpy serializes it,
and rclpy's deserialize_message of the bytes, which must read back as that same message.
"""
from __future__ import annotations

import dataclasses
import struct

import numpy as np
import pytest

pytest.importorskip("rclpy")
from builtin_interfaces.msg import Time as TimeMsg  # noqa: E402
from geometry_msgs.msg import PoseStamped  # noqa: E402
from nav_msgs.msg import Odometry  # noqa: E402
from rclpy.serialization import deserialize_message, serialize_message  # noqa: E402
from std_msgs.msg import Header  # noqa: E402

from lingbot_map_ros.core.geometry import quaternion_to_matrix, se3  # noqa: E402
from lingbot_map_ros.msg import CacheStats, FrameStatus  # noqa: E402
from lingbot_map_ros.ros import messages as rosmsg  # noqa: E402

FRAMES = ["m", "map", "odom", "world", "cam1_optical", "a_world_frame_of_some_length"]  # every alignment


def random_pose(rng):
    q = rng.normal(size=4)
    return se3(quaternion_to_matrix(q / np.linalg.norm(q)), rng.normal(size=3) * 10)


def random_stamp(rng) -> TimeMsg:
    return TimeMsg(sec=int(rng.integers(1, 2**31 - 1)), nanosec=int(rng.integers(10**9)))


def same_message(encoded, reference) -> None:
    assert isinstance(encoded, bytes)  # this middleware's serialization can be patched: bytes go out
    wire = serialize_message(reference)
    assert len(encoded) == len(wire)
    # what a subscriber reads (a float32 field holds the float32 of the value on both sides)
    assert deserialize_message(encoded, type(reference)) == deserialize_message(wire, type(reference))


@pytest.mark.parametrize("frame", FRAMES)
def test_pose_and_odometry_bytes_are_the_messages(frame):
    rng = np.random.default_rng(len(frame))
    for _ in range(5):
        matrix, stamp = random_pose(rng), random_stamp(rng)
        pose = rosmsg.pose_stamped(matrix, stamp, frame)
        same_message(rosmsg.pose_encoded(matrix, stamp, frame), pose)
        row = rosmsg.pose_values(matrix, stamp)
        assert list(row) == rosmsg.pose_row(pose)
        cov = list(rng.uniform(0, 1, 36))
        twist = (rng.normal(size=3), rng.normal(size=3))
        for child in ("b", "base_link", frame + "_child"):
            for moving, covariances in ((None, (None, None)), (twist, (cov, None)), (twist, (None, cov))):
                reference = rosmsg.odometry(pose, child, moving, *covariances)
                same_message(rosmsg.odometry_encoded(row, frame, child, moving, *covariances), reference)


@dataclasses.dataclass
class _Cache:
    frames_stored: int
    scale_frames: int
    window_frames: int
    frames_evicted: int
    page_size: int
    patch_pages_total: int
    scale_pages: int
    window_pages: int
    free_pages: int
    special_pages: int
    special_pages_capacity: int
    special_tokens: int
    max_frame_num: int
    visible_keys: int
    camera_cache_frames: int


@dataclasses.dataclass
class _Result:
    pose_enc: np.ndarray
    frame_index: int
    rope_frame_index: int
    is_keyframe: bool
    is_scale_frame: bool
    latency_ms: float
    cache: _Cache


@dataclasses.dataclass
class _Info:
    backend: str
    dtype: str


def random_result(rng) -> _Result:
    cache = _Cache(*(int(v) for v in rng.integers(0, 2**31, 15)))
    return _Result(pose_enc=rng.normal(size=9).astype(np.float32), frame_index=int(rng.integers(2**40)),
                   rope_frame_index=int(rng.integers(2**31)), is_keyframe=bool(rng.integers(2)),
                   is_scale_frame=bool(rng.integers(2)), latency_ms=float(rng.uniform(0, 100)), cache=cache)


@pytest.mark.parametrize("frame", FRAMES)
def test_status_and_statistics_bytes_are_the_messages(frame):
    rng = np.random.default_rng(7 + len(frame))
    for backend, dtype in (("sdpa", "float32"), ("flash_attn", "bf16"), ("x", "")):
        for _ in range(4):
            result, stamp = random_result(rng), random_stamp(rng)
            header = Header(stamp=stamp, frame_id=frame)
            session_id = int(rng.integers(2**32))
            same_message(rosmsg.processed_status_encoded(result, header, session_id),
                         rosmsg.processed_status(result, header, session_id))
            counts = rosmsg.FrameCounts(*(int(v) for v in rng.integers(0, 2**62, 5)))
            overhead = float(rng.uniform(0, 10))
            info = _Info(backend, dtype)
            same_message(rosmsg.cache_stats_encoded(result, stamp, frame, session_id, counts, overhead, info),
                         rosmsg.cache_stats(result, stamp, frame, session_id, counts, overhead, info))


def test_tf_values_make_the_transform():
    """``transform_stamped_of`` of the numbers the echo check keeps is the same message as ``transform_stamped``
    of the matrix."""
    rng = np.random.default_rng(5)
    for parent, child in (("map", "odom"), ("w", "base_link")):
        matrix, stamp = random_pose(rng), random_stamp(rng)
        made = rosmsg.transform_stamped_of(rosmsg.transform_values(matrix), stamp, parent, child)
        assert made == rosmsg.transform_stamped(matrix, stamp, parent, child)


@pytest.mark.parametrize("parent", FRAMES)
@pytest.mark.parametrize("child", ["o", "odom", "base_link", "front_camera_optical"])
def test_tf_bytes_are_the_message(parent, child):
    """/tf goes out as bytes (``tf_encoded``): one transform at the image stamp, or two (a correction sent
    ahead too), each the message built field by field (``transform_stamped``) at every frame-id alignment;
    three stamps, which has no template, give that message itself."""
    from tf2_msgs.msg import TFMessage

    rng = np.random.default_rng(len(parent) * 7 + len(child))
    for count in (1, 2, 3):
        matrix = random_pose(rng)
        stamps = [random_stamp(rng) for _ in range(count)]
        encoded = rosmsg.tf_encoded(rosmsg.transform_values(matrix), stamps, parent, child)
        reference = TFMessage(transforms=[rosmsg.transform_stamped(matrix, s, parent, child) for s in stamps])
        if count == 3:
            assert encoded == reference
        else:
            same_message(encoded, reference)


def test_a_numeric_field_lands_where_the_strings_before_it_put_it():
    """The check can fail: a field's place depends on the frame id's length, so bytes patched at the offsets of
    one key's template do not read back as the message of another's."""
    layouts = {frame: rosmsg.POSES.layout(frame) for frame in ("m", "map_frame")}
    assert all(layout is not None for layout in layouts.values())
    values = rosmsg.pose_values(random_pose(np.random.default_rng(1)), TimeMsg(sec=5, nanosec=6))
    wrong = bytearray(layouts["map_frame"].pack(values))
    right = layouts["m"].pack(values)
    wrong[:len(right)] = right[:len(right)]  # the short key's offsets over the long key's bytes
    reference = rosmsg.pose_stamped(np.eye(4), TimeMsg(sec=5, nanosec=6), "map_frame")
    rosmsg.set_field(reference, "pose.position.x", values[2])
    try:
        read = deserialize_message(bytes(wrong), PoseStamped)
    except Exception:  # noqa: BLE001 - a garbled buffer may not even read back
        read = None
    assert read != rosmsg.POSES.message("map_frame", values)
    same_message(layouts["map_frame"].pack(values), rosmsg.POSES.message("map_frame", values))


def test_padding_that_holds_an_earlier_probes_values_does_not_hide_a_field(monkeypatch):
    """The middleware leaves alignment padding unwritten: it holds what the buffer held before, at times the
    values an earlier probe wrote. Padding that repeats fixed probe values (0x11.., 0x22..) in step with the field
    made a fixed-value search find two places for a stamp and give no layout; a search with values drawn per
    probe still finds each field, and the bytes read back as the message."""
    from tf2_msgs.msg import TFMessage

    # CDR of a TFMessage with one transform, frame ids "world" and "front_camera_optical": the child's string
    # ends at byte 49 of the data, seven bytes of padding align the translation to 56
    pad = slice(rosmsg.ENCAPSULATION + 49, rosmsg.ENCAPSULATION + 56)
    genuine = rosmsg.serialize_message

    def stale_padding(msg):
        wire = bytearray(genuine(msg))
        for fill in (b"\x11", b"\x22"):
            if fill * 4 in wire[:pad.start]:  # what an earlier probe with fixed values left in this buffer
                wire[pad] = fill * 7
        return bytes(wire)

    monkeypatch.setattr(rosmsg, "serialize_message", stale_padding)
    example = rosmsg._tf_example(("world", "front_camera_optical", 1))
    stamp_sec = rosmsg.TF_MESSAGES[1].fields[0]
    for fill in (b"\x11", b"\x22"):  # the adversary works: a fixed value shows up in two places
        probe = deserialize_message(genuine(example), TFMessage)
        rosmsg.set_field(probe, stamp_sec, struct.unpack("<i", fill * 4)[0])
        assert stale_padding(probe).count(fill * 4) >= 2
    layout = rosmsg.FieldLayout.of(example, rosmsg.TF_MESSAGES[1].fields)
    assert layout is not None
    rng = np.random.default_rng(3)
    for _ in range(5):
        matrix, stamp = random_pose(rng), random_stamp(rng)
        values = [stamp.sec, stamp.nanosec, *rosmsg.transform_values(matrix)]
        reference = TFMessage(transforms=[rosmsg.transform_stamped(matrix, stamp, "world", "front_camera_optical")])
        same_message(layout.pack(values), reference)


def test_a_key_without_a_layout_publishes_the_message(monkeypatch):
    """Where the middleware's bytes cannot be patched, ``encode`` gives the message built field by field."""
    packed = rosmsg.Packed(lambda frame: PoseStamped(header=Header(frame_id=frame)), rosmsg.POSE_FIELDS)
    monkeypatch.setattr(rosmsg.FieldLayout, "of", classmethod(lambda cls, example, fields: None))
    matrix, stamp = random_pose(np.random.default_rng(2)), TimeMsg(sec=9, nanosec=10)
    encoded = packed.encode("map", rosmsg.pose_values(matrix, stamp))
    assert isinstance(encoded, PoseStamped) and encoded == rosmsg.pose_stamped(matrix, stamp, "map")


def test_a_layout_refuses_a_field_it_cannot_place():
    """A field whose probe values cannot be told apart in the bytes (a string) gives no layout: messages go out."""
    assert rosmsg.FieldLayout.of(Odometry(), ("child_frame_id",)) is None
    assert rosmsg.FieldLayout.of(CacheStats(), ("frames_received", "backend")) is None
    assert rosmsg.FieldLayout.of(FrameStatus(), ("status", "pose_enc[3]")) is not None


def test_every_field_of_a_layout_moves_its_own_bytes():
    """Each field written alone changes exactly its own bytes (no two fields share an offset)."""
    layout = rosmsg.STATS.layout(("map", "sdpa", "float32"))
    base = [0] * layout.size
    zero = layout.pack(base)
    changed = set()
    for i in range(layout.size):
        values = list(base)
        values[i] = True if i in (9, 10) else 3  # is_keyframe, is_scale_frame are booleans
        diff = {k for k, (a, b) in enumerate(zip(zero, layout.pack(values))) if a != b}
        assert diff and not diff & changed
        changed |= diff
    assert struct.calcsize("<d") == 8


@pytest.mark.parametrize("header_frame", ["w", "map", "world", "a_world_frame_of_some_length"])
def test_path_from_a_template_is_the_path(header_frame):
    """~/path with its header and first pose written into a template (``path_bytes_of``) is the Path of those
    poses, at every alignment of the first pose and of the later ones."""
    rng = np.random.default_rng(len(header_frame))
    for first_frame in ("m", header_frame, "odom_frame"):
        made = [(random_pose(rng), random_stamp(rng), f) for f in (first_frame, header_frame, "o", header_frame)]
        poses = [rosmsg.pose_stamped(*m) for m in made]
        stamp = random_stamp(rng)
        for count in (1, 2, 4):
            later = [rosmsg.pose_encoded(*m)[rosmsg.ENCAPSULATION:] for m in made[1:count]]
            first = (first_frame, rosmsg.pose_values(made[0][0], made[0][1]))
            joined = rosmsg.path_bytes_of(stamp, header_frame, first, later)
            same_message(joined, rosmsg.path_message(Header(stamp=stamp, frame_id=header_frame), poses[:count]))


def test_both_builds_of_the_path_are_one_message():
    """~/path as the node sends it where the middleware's bytes can be joined (``path_bytes_of``) and where they
    cannot (``outputs._path_message_of`` from the kept (frame id, pose values) pairs): the same Path."""
    from lingbot_map_ros.ros.outputs import _path_message_of

    rng = np.random.default_rng(7)
    made = [(random_pose(rng), random_stamp(rng), f) for f in ("map", "map", "odom", "map")]
    pairs = [(f, rosmsg.pose_values(pose, stamp)) for pose, stamp, f in made]
    stamp = random_stamp(rng)
    later = [rosmsg.pose_encoded(*m)[rosmsg.ENCAPSULATION:] for m in made[1:]]
    built = _path_message_of(stamp, "map", pairs)
    assert len(built.poses) == len(made) and built.header.frame_id == "map"
    same_message(rosmsg.path_bytes_of(stamp, "map", pairs[0], later), built)
