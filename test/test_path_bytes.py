"""~/path from bytes (ros/messages.py): each pose serialized once, a Path put together from the pieces.

The reference is the middleware itself: rclpy's serialize_message of the whole Path (the length) and
deserialize_message of the joined bytes (the same message as the one built field by field).
"""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("rclpy")
from builtin_interfaces.msg import Time as TimeMsg  # noqa: E402
from nav_msgs.msg import Path  # noqa: E402
from rclpy.serialization import deserialize_message, serialize_message  # noqa: E402
from std_msgs.msg import Header  # noqa: E402

from lingbot_map_ros.core.geometry import quaternion_to_matrix, se3  # noqa: E402
from lingbot_map_ros.ros import messages as rosmsg  # noqa: E402


def poses(rng, count: int, frame: str):
    out = []
    for i in range(count):
        q = rng.normal(size=4)
        m = se3(quaternion_to_matrix(q / np.linalg.norm(q)), rng.normal(size=3) * 10)
        out.append(rosmsg.pose_stamped(m, TimeMsg(sec=1_700_000_000 + i, nanosec=int(rng.integers(10**9))), frame))
    return out


@pytest.mark.parametrize("frame", ["m", "map", "world", "odom_world", "a_world_frame_of_some_length"])
def test_joined_bytes_are_the_path(frame):
    assert rosmsg.path_bytes_agree()  # this middleware's pieces join (else the node sends Path messages)
    rng = np.random.default_rng(len(frame))
    all_poses = poses(rng, 40, frame)
    for header_frame in (frame, "w", "world_frame"):
        header = Header(stamp=all_poses[-1].header.stamp, frame_id=header_frame)
        for count in (1, 2, 3, 17, 40):
            joined = rosmsg.path_bytes(header, all_poses[0], [rosmsg.pose_bytes(p) for p in all_poses[1:count]])
            whole = rosmsg.path_message(header, all_poses[:count])
            assert len(joined) == len(serialize_message(whole))
            back = deserialize_message(joined, Path)
            assert back == whole
            assert [p.pose.position.x for p in back.poses] == [p.pose.position.x for p in all_poses[:count]]


def test_the_first_pose_is_aligned_by_its_header():
    """The check can fail: the first pose's bytes as a message of its own (8-byte aligned from the start)
    are not its bytes after a header whose frame id leaves the sequence at another alignment."""
    rng = np.random.default_rng(3)
    first, second = poses(rng, 2, "world")
    misaligned = []
    for header_frame in ("w", "wo", "wor", "worl", "world", "world_"):
        header = Header(stamp=first.header.stamp, frame_id=header_frame)
        good = rosmsg.path_bytes(header, first, [rosmsg.pose_bytes(second)])
        empty = serialize_message(Path(header=header))
        naive = (empty[:-4] + (2).to_bytes(4, "little") + rosmsg.pose_bytes(first) + rosmsg.pose_bytes(second))
        assert deserialize_message(good, Path) == rosmsg.path_message(header, [first, second])
        try:
            misaligned.append(deserialize_message(naive, Path) != rosmsg.path_message(header, [first, second]))
        except Exception:  # noqa: BLE001 - a misaligned buffer may not even read back
            misaligned.append(True)
    assert any(misaligned) and not all(misaligned)  # some header lengths align the first pose, some do not
