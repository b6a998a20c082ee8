"""FrameTree (ros/transforms.py), fed directly as its listener would be: parents, the node's own edges,
lookups at a stamp (NoTransform naming the link), and the reuse of static chains until a link changes.
The reference is tf2 itself (a separate Buffer given the same transforms) and the matrices sent.
"""
from __future__ import annotations

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy")
tf2_ros = pytest.importorskip("tf2_ros")
from builtin_interfaces.msg import Time as TimeMsg  # noqa: E402
from rclpy.context import Context  # noqa: E402
from rclpy.time import Time  # noqa: E402

from lingbot_map_ros.core.geometry import quaternion_to_matrix, se3  # noqa: E402
from lingbot_map_ros.ros.messages import transform_stamped  # noqa: E402
from lingbot_map_ros.ros.transforms import FrameTree, NoTransform  # noqa: E402


@pytest.fixture
def tree(ros_domain_id):
    ctx = Context()
    rclpy.init(context=ctx, domain_id=ros_domain_id)
    node = rclpy.create_node("frame_tree_test", context=ctx)
    try:
        yield FrameTree(node)
    finally:
        node.destroy_node()
        rclpy.shutdown(context=ctx)


def random_pose(rng):
    q = rng.normal(size=4)
    return se3(quaternion_to_matrix(q / np.linalg.norm(q)), rng.normal(size=3))


def stamp(ns: int) -> TimeMsg:
    sec, nsec = divmod(ns, 10**9)
    return TimeMsg(sec=sec, nanosec=nsec)


def test_lookups_parents_own_edges_and_the_static_cache(tree):
    rng = np.random.default_rng(4)
    mount, optical = random_pose(rng), random_pose(rng)
    tree.take([transform_stamped(mount, stamp(0), "base_link", "camera_link"),
               transform_stamped(optical, stamp(0), "camera_link", "cam_optical")], static=True)
    t0 = 1_700_000_000 * 10**9
    odoms = [random_pose(rng) for _ in range(3)]
    for i, m in enumerate(odoms):
        tree.take([transform_stamped(m, stamp(t0 + i * 10**8), "odom", "base_link")], static=False)

    reference = tf2_ros.Buffer()  # tf2 itself, given the same transforms
    reference.set_transform_static(transform_stamped(mount, stamp(0), "base_link", "camera_link"), "t")
    reference.set_transform_static(transform_stamped(optical, stamp(0), "camera_link", "cam_optical"), "t")

    ext = tree.lookup("base_link", "cam_optical", stamp(t0), 0.0)
    np.testing.assert_allclose(ext, mount @ optical, atol=1e-12)
    t = reference.lookup_transform_core("base_link", "cam_optical", Time())
    np.testing.assert_allclose(ext[:3, 3], [t.transform.translation.x, t.transform.translation.y,
                                            t.transform.translation.z], atol=1e-12)
    assert tree.lookup("base_link", "cam_optical", stamp(t0 + 1), 0.0) is ext  # a static chain: reused
    np.testing.assert_allclose(tree.lookup("odom", "base_link", stamp(t0 + 10**8), 0.0), odoms[1], atol=1e-12)
    mid = tree.lookup("odom", "base_link", stamp(t0 + 5 * 10**7), 0.0)  # interpolated by tf2 between 0 and 1
    np.testing.assert_allclose(mid[:3, 3], (odoms[0][:3, 3] + odoms[1][:3, 3]) / 2, atol=1e-9)
    with pytest.raises(NoTransform) as e:
        tree.lookup("odom", "base_link", stamp(t0 + 10**9), 0.05)  # after the last odometry
    assert e.value.link == "odom -> base_link" and "waited 0.05 s" in str(e.value)
    with pytest.raises(NoTransform):
        tree.lookup("map", "base_link", stamp(t0), 0.0)

    # a changed mount is seen at once
    moved = random_pose(rng)
    tree.take([transform_stamped(moved, stamp(0), "base_link", "camera_link")], static=True)
    np.testing.assert_allclose(tree.lookup("base_link", "cam_optical", stamp(t0), 0.0), moved @ optical, atol=1e-12)

    # parents as the TF tree has them; the node's own edge stays out of its Buffer and its record
    assert tree.parent_of("cam_optical") == "camera_link" and tree.parent_of("base_link") == "odom"
    assert tree.parent_of("map") is None
    tree.claim("map", "odom")
    tree.take([transform_stamped(np.eye(4), stamp(t0), "map", "odom")], static=False)
    assert tree.parent_of("odom") is None
    assert not tree.buffer.can_transform_core("map", "odom", Time())[0]
    tree.take([transform_stamped(np.eye(4), stamp(t0), "other_map", "odom")], static=False)
    assert tree.parent_of("odom") == "other_map"  # someone else's parent for it: the one-parent check sees it
