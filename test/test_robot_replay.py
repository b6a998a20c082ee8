"""A robot replayed from a recording: the robot-mode acceptance of ``test_robot.py`` (the body pose, the
map -> odom correction, a depth scale within 1 %) from a rosbag2 the test writes (colour, registered
32FC1 depth = K x the model's depth, ``/tf_static`` for the camera mount, a moving ``odom -> base_link``
on ``/tf``), twice:

* offline, ``lingbot_map_offline --bag --depth-topic --base-frame --odom-frame --scale-source depth``
  (the bag's TF in a node-less ``FrameTree``, the node's ``RobotFrames``);
* through ROS, ``lingbot_map_replay --depth-topic`` (image, depth, /tf and /tf_static with their stamps,
  paced by the node's statuses) into ``lingbot_map_node`` in robot mode;

and both give the same numbers.
"""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy")
pytest.importorskip("lingbot_map_ros.msg")
pytest.importorskip("tf2_ros")
pytest.importorskip("rosbags")
pytestmark = [pytest.mark.ros, pytest.mark.slow]

from rclpy.context import Context  # noqa: E402
from replay_node import bag_transform  # noqa: E402
from test_robot import (  # noqa: E402
    DEPTH_TOPIC,
    T_BASE_LINK,
    T_LINK_OPTICAL,
    TOPIC,
    X_BASE_CAM,
    diag,
    pose_matrix,
    start_node,
    stop_node,
)

from lingbot_map_ros.core.geometry import quaternion_to_matrix, se3, se3_inverse  # noqa: E402
from lingbot_map_ros.msg import FrameStatus  # noqa: E402
from lingbot_map_ros.tools import offline  # noqa: E402
from lingbot_map_ros.tools.bag_io import bag_typestore, image_fields, write_image_bag, write_robot_bag  # noqa: E402
from lingbot_map_ros.tools.node_client import Listener, SyntheticCamera, stamp_ns  # noqa: E402

W, H = 518, 392  # the model input size: the depth grid is the sensor's
FRAMES = 9
K = 2.5
COLOUR, DEPTH = TOPIC, DEPTH_TOPIC  # what test_robot.start_node remaps the node's image and depth to
WORLD, BASE, LINK, OPTICAL, ODOM = "map", "base_link", "camera_link", "camera_color_optical_frame", "odom"
STAMP0 = 1_700_000_000 * 10**9
MODEL = ["--model-preset", "tiny", "--device", "cpu", "--scale-frames", "2", "--sliding-window", "3",
         "--camera-iterations", "2"]
# the replay sends the first image only once the node has acknowledged the transforms and depth before it
# (the node may match the replay late: seconds on a loaded host); tf_timeout 5 s covers a later message
# the middleware must resend (a heartbeat, ~3 s)
NODE_PARAMS = dict(base_frame=BASE, odom_frame=ODOM, scale_source="depth", transform_publish_period=0.0,
                   tf_timeout=5.0)


def _stamp(i: int) -> int:
    return STAMP0 + (i + 1) * 100_000_000


def _odom(i: int) -> np.ndarray:
    rng = np.random.default_rng(100 + i)
    q = rng.normal(size=4)
    return se3(quaternion_to_matrix(q / np.linalg.norm(q)), rng.normal(size=3))


def _image(store, fields: dict, ns: int, frame_id: str):
    t = store.types
    sec, nanosec = divmod(ns, 10**9)
    header = t["std_msgs/msg/Header"](stamp=t["builtin_interfaces/msg/Time"](sec=sec, nanosec=nanosec),
                                      frame_id=frame_id)
    return t["sensor_msgs/msg/Image"](header=header, **fields)


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    """The rosbag2 of a robot and the model's own depth of its frames (a reference offline run)."""
    tmp = tmp_path_factory.mktemp("robot_bag")
    camera = SyntheticCamera(W, H, seed=7)
    frames = [camera.render(i % 30) for i in range(FRAMES)]
    stamps = [_stamp(i) for i in range(FRAMES)]
    colour_only = write_image_bag(tmp / "colour", frames, [s * 1e-9 for s in stamps], topic=COLOUR,
                                  frame_id=OPTICAL)
    ref = tmp / "reference.npz"
    assert offline.main(["--bag", str(colour_only), "--out", str(ref), "--with-depth", "--quiet", *MODEL]) == 0
    reference = np.load(ref)
    assert reference["depth"].shape == (FRAMES, H, W)
    store = bag_typestore()
    tf_type, image_type = "tf2_msgs/msg/TFMessage", "sensor_msgs/msg/Image"
    items = [("/tf_static", stamps[0] - 1, store.types[tf_type](transforms=[
        bag_transform(store, BASE, LINK, T_BASE_LINK, 0), bag_transform(store, LINK, OPTICAL, T_LINK_OPTICAL, 0)]))]
    for i, s in enumerate(stamps):
        depth = (K * reference["depth"][i]).astype(np.float32)
        items += [(COLOUR, s, _image(store, image_fields(frames[i], "rgb8"), s, OPTICAL)),
                  (DEPTH, s + 1000, _image(store, image_fields(depth, "32FC1"), s, OPTICAL)),
                  ("/tf", s + 2000, store.types[tf_type](transforms=[bag_transform(store, ODOM, BASE, _odom(i), s)]))]
    bag = write_robot_bag(tmp / "robot", {COLOUR: image_type, DEPTH: image_type, "/tf": tf_type,
                                          "/tf_static": tf_type}, items)
    return {"bag": bag, "stamps": stamps, "reference": reference, "tmp": tmp}


def _expected_bodies(c2w: np.ndarray, scale: float) -> np.ndarray:
    """The node's body poses from the model's camera poses: metric, in the first body pose's world."""
    metric = c2w.copy()
    metric[:, :3, 3] *= scale
    world = metric[0] @ se3_inverse(X_BASE_CAM)  # the session's first body pose
    return np.stack([se3_inverse(world) @ m @ se3_inverse(X_BASE_CAM) for m in metric])


@pytest.fixture(scope="module")
def offline_run(recording):
    out = recording["tmp"] / "robot.npz"
    tum = recording["tmp"] / "robot.tum"
    assert offline.main(["--bag", str(recording["bag"]), "--topic", COLOUR, "--depth-topic", DEPTH,
                         "--base-frame", BASE, "--odom-frame", ODOM, "--world-frame", WORLD, "--scale-source", "depth",
                         "--out", str(out), "--tum", str(tum), "--quiet", *MODEL]) == 0
    return np.load(out)


def test_offline_robot_mode_from_the_bag(recording, offline_run):
    r = offline_run
    scale = float(r["scale"])
    assert str(r["scale_state"]) == "locked" and abs(scale - K) / K < 0.01, (scale, str(r["scale_state"]))
    placed = np.flatnonzero(r["robot_placed"])
    # nothing metric before the 5th keyframe ratio: frames 0-3 withheld, then every frame placed
    assert placed.tolist() == list(range(placed[0], FRAMES)) and 4 <= placed[0] <= 5, placed
    expected = _expected_bodies(recording["reference"]["c2w"], scale)
    for i in placed:
        np.testing.assert_allclose(r["robot_pose"][i], expected[i], atol=1e-6)
        # map -> odom, then the robot's odom -> base_link at that stamp, is the body pose
        np.testing.assert_allclose(r["robot_tf"][i] @ _odom(i), expected[i], atol=1e-6)
    assert np.isnan(r["robot_pose"][0]).all()


def test_replay_into_the_node_gives_the_same_numbers(recording, offline_run, tmp_path, ros_domain_id):
    ctx = Context()
    rclpy.init(context=ctx, domain_id=ros_domain_id)
    listener = Listener("/lingbot_map", "/unused_image", context=ctx, name="replay_robot_listener")
    node = None
    try:
        node = start_node(tmp_path, ros_domain_id, "replayed", **NODE_PARAMS)  # image:=COLOUR, depth:=DEPTH
        env = dict(os.environ, ROS_DOMAIN_ID=str(ros_domain_id))
        res = subprocess.run([sys.executable, "-m", "lingbot_map_ros.tools.replay", str(recording["bag"]),
                              "--topic", COLOUR, "--depth-topic", DEPTH, "--rate", "0", "--quiet"],
                             env=env, capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr + node.output()[-3000:]
        stamps = recording["stamps"]
        placed = [stamps[i] for i in np.flatnonzero(offline_run["robot_placed"])]

        def log() -> str:
            rx = listener.rx
            scales = [diag(d, "scale").get("state") for d in rx.diagnostics]
            return "\n".join(f"frame {stamps.index(stamp_ns(m.header.stamp))}: {m.status} {m.reason}"
                             for m in rx.status_log) + "\n/tf seen: " + str(sorted(
                (t.child_frame_id, (stamp_ns(t.header.stamp) - STAMP0) // 10**8) for m in rx.tf
                for t in m.transforms)) + f"\nposes of frames {sorted(stamps.index(s) for s in rx.poses)}, placed " \
                f"offline {[stamps.index(s) for s in placed]}\nscale states of {len(scales)} /diagnostics: {scales}" \
                + (f"\nlast scale status: {diag(rx.diagnostics[-1], 'scale')}" if rx.diagnostics else "") \
                + "\nthe node's log:\n" + node.output()[-4000:]

        def settled(rx) -> bool:
            """The markers: every frame's final status, the placed frames' poses and /tf edges (each topic has
            one ordered writer and the node handles frames in order: a pose of a withheld frame would have come
            before them), and a /diagnostics message after the lock."""
            edges = {(stamp_ns(t.header.stamp), t.child_frame_id) for m in rx.tf for t in m.transforms}
            return (all(listener.final_status(s) is not None for s in stamps) and all(s in rx.poses for s in placed)
                    and {(s, ODOM) for s in placed} <= edges and bool(rx.diagnostics)
                    and diag(rx.diagnostics[-1], "scale").get("state") == "locked")

        assert listener.wait_for(settled, 30), log()
        with listener.lock:
            finals = [listener.final_status(s) for s in stamps]
            poses = {s: pose_matrix(listener.rx.poses[s].pose) for s in listener.rx.poses}
            tfs = {(stamp_ns(t.header.stamp), t.child_frame_id): t for m in listener.rx.tf for t in m.transforms}
            scale = diag(listener.rx.diagnostics[-1], "scale")
        # offline every frame has its transforms: a frame without them here was replayed before the node had
        # them, and the session's world (its first body pose) would be a later frame's
        assert [f.status for f in finals] == [FrameStatus.PROCESSED] * FRAMES, log()
        assert set(poses) == set(placed)  # the same frames withheld as offline
        for i, s in enumerate(stamps):
            if s in poses:
                np.testing.assert_allclose(poses[s], offline_run["robot_pose"][i], atol=1e-6)
                t = tfs[(s, ODOM)]
                q, tr = t.transform.rotation, t.transform.translation
                map_odom = se3(quaternion_to_matrix([q.x, q.y, q.z, q.w]), [tr.x, tr.y, tr.z])
                np.testing.assert_allclose(map_odom, offline_run["robot_tf"][i], atol=1e-6)
        assert abs(float(scale["value"]) - float(offline_run["scale"])) < 1e-5, scale
    finally:
        listener.close()
        rclpy.shutdown(context=ctx)
        if node is not None:
            stop_node(node)
