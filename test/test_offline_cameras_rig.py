"""Several cameras of a robot's recording in one world: ``lingbot_map_offline --bag --topic A --topic B
--base-frame`` gives what the two-camera node publishes for the same bag.

The bag is written here: two cameras at their own rates (10 and 14 frames per second, not synchronised),
static mounts ``base_link -> <cam>_link -> <cam>_optical`` (different extrinsics, the rear one turned
around) on ``/tf_static``, and a moving ``odom -> base_link`` on ``/tf`` at every image stamp. It is run

* offline: ``lingbot_map_offline --bag --topic /front/image --topic /rear/image --base-frame base_link
  --odom-frame odom --primary-camera rear`` (the bag's TF in a node-less tree, each camera through the
  node's ``RobotFrames``, then the node's ``core.rig.Rig``);
* through ROS: a real ``lingbot_map_node`` with ``cameras: [front, rear]`` on loopback, the bag replayed
  into it message by message in stamp order (transforms before the image at a stamp), each image only
  after the node accounted for the previous one on ``~/<name>/frame_status``, so the node takes every
  frame in a tick of its own and keeps up with both cameras;

and each camera's ``~/<name>/pose`` and the body's ``~/pose`` equal the offline files to 1e-6 at every
stamp, over the same set of frames: every frame of both cameras, but the rear camera's first frames,
withheld by both while the rear camera's unit is taken from the body's travel (``scale_source: model``).
The rear camera is the primary: the front camera creates the world and drives until the rear camera's
first placed frame takes the drive (one hand-over, carried as an offset), so the anchoring, the unit
and the hand-over all enter the comparison. The rear camera is the faster one, so some of the
offline tool's batched ticks hold a rear frame before a front one: their results must be placed in
the bag's order (the node's, frame by frame), not in the order of the cameras' names, or the rear
camera's unit (taken while the front camera drives) differs. ``camera_timeout`` is the maximum so the node's wall clock
never stalls a camera on a loaded host; the offline stall rule (stamp gaps) then never triggers either.
"""
from __future__ import annotations

import math
import os
import time

import numpy as np
import pytest
import yaml

rclpy = pytest.importorskip("rclpy")
pytest.importorskip("lingbot_map_ros.msg")
pytest.importorskip("rosbags")
pytestmark = [pytest.mark.ros, pytest.mark.slow]

from rclpy.context import Context  # noqa: E402
from rclpy.duration import Duration  # noqa: E402
from rclpy.qos import QoSDurabilityPolicy, QoSProfile, QoSReliabilityPolicy  # noqa: E402
from rclpy.serialization import deserialize_message  # noqa: E402
from replay_node import bag_transform, frames  # noqa: E402
from sensor_msgs.msg import Image  # noqa: E402
from tf2_msgs.msg import TFMessage  # noqa: E402

from lingbot_map_ros.core.geometry import (  # noqa: E402
    R_OPTICAL_BODY,
    quaternion_to_matrix,
    se3,
)
from lingbot_map_ros.tools import offline  # noqa: E402
from lingbot_map_ros.tools.bag_io import (  # noqa: E402
    bag_typestore,
    image_fields,
    iter_robot_messages,
    message_cdr,
    write_robot_bag,
)
from lingbot_map_ros.tools.node_client import Listener, NodeProcess  # noqa: E402

NS = "/lingbot_map"
WORLD, BASE, ODOM = "map", "base_link", "odom"
STAMP0 = 1_700_000_000 * 10**9
FRONT = [STAMP0 + i * 100_000_000 for i in range(10)]  # 10 Hz
REAR = [STAMP0 + 150_000_000 + i * 71_428_571 for i in range(12)]  # 14 Hz from 150 ms, not synchronised
MIN_TRAVEL = 0.05  # m: the rear camera's unit locks after a few frames (the body moves ~0.036 m per rear frame)
# the same model, stream and robot settings on both sides (the node's parameters; the tool's options)
SETTINGS = dict(model_preset="tiny", device="cpu", dtype="float32", attention_backend="sdpa", scale_frames=2,
                sliding_window=3, keyframe_interval=2, camera_iterations=2, seed=11, world_frame=WORLD,
                base_frame=BASE, odom_frame=ODOM, scale_min_travel=MIN_TRAVEL, camera_timeout=60.0)
NODE_PARAMS = dict(SETTINGS, cameras=["front", "rear"], primary_camera="rear", qos_reliability="reliable",
                   tf_timeout=5.0, transform_publish_period=0.0, publish_tf=True)
OPTIONS = [f"--{k.replace('_', '-')}={v}" for k, v in SETTINGS.items()]
PROCESSED, BUFFERED = 0, 4


def _yaw(deg: float) -> np.ndarray:
    a = math.radians(deg)
    return np.array([[math.cos(a), -math.sin(a), 0], [math.sin(a), math.cos(a), 0], [0, 0, 1]])


MOUNTS = {  # base_link -> <name>_link, <name>_link -> <name>_optical (REP 103)
    "front": (se3(_yaw(-4.0), [0.22, -0.03, 0.45]), se3(R_OPTICAL_BODY.T, [0.0, 0.012, 0.0])),
    "rear": (se3(_yaw(176.0), [-0.28, 0.02, 0.31]), se3(R_OPTICAL_BODY.T, [0.0, -0.025, 0.01])),
}


def odom_at(ns: int) -> np.ndarray:
    s = (ns - STAMP0) * 1e-9
    return se3(_yaw(5.0 * s), [0.5 * s, 0.08 * s, 0.0])


def pose_matrix(pose) -> np.ndarray:
    p, o = pose.position, pose.orientation
    return se3(quaternion_to_matrix([o.x, o.y, o.z, o.w]), [p.x, p.y, p.z])


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rig_bag")
    store = bag_typestore()
    tf_type, image_type = "tf2_msgs/msg/TFMessage", "sensor_msgs/msg/Image"
    statics = [bag_transform(store, BASE, f"{n}_link", link, 0) for n, (link, _) in MOUNTS.items()]
    statics += [bag_transform(store, f"{n}_link", f"{n}_optical", optical, 0) for n, (_, optical) in MOUNTS.items()]
    items = [("/tf_static", STAMP0 - 1, store.types[tf_type](transforms=statics))]
    for name, stamps, seed in (("front", FRONT, 1), ("rear", REAR, 2)):
        for rgb, ns in zip(frames(len(stamps), seed), stamps):
            sec, nanosec = divmod(ns, 10**9)
            header = store.types["std_msgs/msg/Header"](
                stamp=store.types["builtin_interfaces/msg/Time"](sec=sec, nanosec=nanosec), frame_id=f"{name}_optical")
            items += [("/tf", ns, store.types[tf_type](transforms=[bag_transform(store, ODOM, BASE, odom_at(ns), ns)])),
                      (f"/{name}/image", ns + 1, store.types[image_type](header=header, **image_fields(rgb, "rgb8")))]
    items.sort(key=lambda item: item[1])
    bag = write_robot_bag(tmp / "rig", {"/front/image": image_type, "/rear/image": image_type, "/tf": tf_type,
                                        "/tf_static": tf_type}, items)
    return {"bag": bag, "tmp": tmp}


@pytest.fixture(scope="module")
def offline_run(recording):
    out, tum = recording["tmp"] / "rig.npz", recording["tmp"] / "rig.tum"
    assert offline.main(["--bag", str(recording["bag"]), "--topic", "/front/image", "--topic", "/rear/image",
                         "--primary-camera", "rear", "--out", str(out), "--tum", str(tum), "--quiet", *OPTIONS]) == 0
    return {"body": np.load(out), "front": np.load(recording["tmp"] / "rig.front.npz"),
            "rear": np.load(recording["tmp"] / "rig.rear.npz"), "tmp": recording["tmp"]}


def _replay(bag, cams: dict[str, Listener], player, tf_pub, static_pub, timeout: float = 60.0) -> None:
    """The bag in stamp order: transforms as they come, each image after the previous one's status."""
    kinds = {"/tf_static": "tf_static", "/tf": "tf", "/front/image": "image", "/rear/image": "image"}
    first_image = True
    for kind, topic, msgtype, msg, raw, ns in iter_robot_messages(bag, kinds):
        cdr = message_cdr(msg, msgtype, raw)
        if kind == "tf_static":
            static_pub.publish(deserialize_message(cdr, TFMessage))
        elif kind == "tf":
            tf_pub.publish(deserialize_message(cdr, TFMessage))
        else:
            name = topic.split("/")[1]
            if first_image:  # the node may not have matched these publishers yet: the first frame's transforms
                # must be in its buffer (else the world starts at a later frame); later ones come in time
                for pub in (static_pub, tf_pub):
                    assert pub.wait_for_all_acked(Duration(seconds=15)), "the node never acknowledged the transforms"
                first_image = False
            cams[name].pub.publish(deserialize_message(cdr, Image))
            assert cams[name].wait_for(lambda rx: ns in rx.status, timeout), f"no status for {name} {ns}"


@pytest.fixture(scope="module")
def node_run(recording, tmp_path_factory, new_domain_id):
    tmp = tmp_path_factory.mktemp("rig_node")
    domain = new_domain_id()
    params = tmp / "params.yaml"
    params.write_text(yaml.safe_dump({"/**": {"ros__parameters": NODE_PARAMS}}))
    node = NodeProcess(["--params-file", str(params)], echo=False, env=dict(os.environ, ROS_DOMAIN_ID=str(domain)),
                       log_path=str(tmp / "node.log"))
    ctx = Context()
    rclpy.init(context=ctx, domain_id=domain)
    cams = {n: Listener(f"{NS}/{n}", f"/{n}/image", context=ctx, name=f"bag_{n}") for n in MOUNTS}
    body = Listener(NS, "/unused/image", context=ctx, name="bag_body")
    player = rclpy.create_node("bag_player", context=ctx)
    reliable = QoSProfile(depth=100, reliability=QoSReliabilityPolicy.RELIABLE)
    tf_pub = player.create_publisher(TFMessage, "/tf", reliable)
    static_pub = player.create_publisher(TFMessage, "/tf_static", QoSProfile(
        depth=1, reliability=QoSReliabilityPolicy.RELIABLE, durability=QoSDurabilityPolicy.TRANSIENT_LOCAL))
    try:
        assert node.wait_ready(120), f"node did not start: {node.why_not_ready()}\n{node.output()[-3000:]}"
        for lst in cams.values():
            assert lst.wait_connected(30), f"no connection to the node\n{node.output()[-3000:]}"

        def node_listens(topic: str) -> bool:
            return any(i.node_namespace.rstrip("/") + "/" + i.node_name == NS
                       for i in player.get_subscriptions_info_by_topic(topic))

        deadline = time.monotonic() + 30
        while not (node_listens("/tf") and node_listens("/tf_static") and tf_pub.get_subscription_count()
                   and body.node.count_publishers(f"{NS}/pose")):
            assert time.monotonic() < deadline, "the node's TF listener never matched"
            time.sleep(0.05)
        time.sleep(0.5)  # let the node's side of discovery match the player's publishers too
        _replay(recording["bag"], cams, player, tf_pub, static_pub)
        for name, stamps in (("front", FRONT), ("rear", REAR)):
            lst = cams[name]
            assert lst.wait_for(lambda rx: all(lst.final_status(s) is not None for s in stamps), 60), name
        time.sleep(0.5)  # a pose of a withheld frame would have come by now
        with body.lock:
            bodies = {s: pose_matrix(m.pose) for s, m in body.rx.poses.items()}
        result = {"body": bodies, "log": node.output}
        for name, lst in cams.items():
            with lst.lock:
                result[name] = {s: pose_matrix(m.pose) for s, m in lst.rx.poses.items()}
                result[f"{name}_status"] = {s: [m for m in ms if m.status != BUFFERED]
                                            for s, ms in lst.rx.status.items()}
        yield result
    finally:
        for lst in (*cams.values(), body):
            lst.close()
        player.destroy_node()
        rclpy.shutdown(context=ctx)
        rc = node.stop()
        assert rc == 0, f"exit {rc}:\n{node.output()[-3000:]}"


def _placed(run: dict, name: str) -> dict[int, np.ndarray]:
    r = run[name]
    stamps = r["stamp_ns"]
    return {int(s): p for s, p, ok in zip(stamps, r["world_pose"], r["placed"]) if ok}


def test_offline_places_every_camera_in_one_world(offline_run):
    front, rear = _placed(offline_run, "front"), _placed(offline_run, "rear")
    assert list(front) == FRONT  # the front camera creates the world: every frame placed
    first = REAR.index(min(rear))  # the rear one: every frame from the one its unit locked at
    assert 1 <= first <= 4 and list(rear) == REAR[first:], first
    body = offline_run["body"]
    stamps = [int(s) for s in body["stamp_ns"]]
    drivers = [str(c) for c in body["camera"]]
    # the front camera drives until the rear (primary) camera's first placed frame, then the rear one
    first_rear = drivers.index("rear")
    assert set(drivers[:first_rear]) == {"front"} and set(drivers[first_rear:]) == {"rear"}
    assert stamps[first_rear:] == REAR[first:]
    for name, placed in (("front", front), ("rear", rear)):
        raw = offline_run[name]
        own = dict(zip(raw["stamp_ns"].tolist(), raw["c2w"]))
        # one rigid anchor (and for the rear camera one unit) takes its own world into the one world
        anchor = placed[min(placed)] @ np.linalg.inv(own[min(placed)])
        assert not np.allclose(anchor, np.eye(4), atol=1e-3)
    # the body at the front camera's frames is its camera pose through the front mount
    x_front = MOUNTS["front"][0] @ MOUNTS["front"][1]
    for s, p in zip(stamps[:first_rear], body["pose"][:first_rear]):
        np.testing.assert_allclose(p @ x_front, front[s], atol=1e-9)


def test_offline_equals_the_node_for_the_same_bag(offline_run, node_run):
    for name, stamps in (("front", FRONT), ("rear", REAR)):
        statuses = node_run[f"{name}_status"]
        for s in stamps:  # every frame reached the node and ended once, processed
            assert [m.status for m in statuses.get(s, [])] == [PROCESSED], (name, s, statuses.get(s))
        want, got = _placed(offline_run, name), node_run[name]
        assert set(got) == set(want), (name, sorted(got), sorted(want))  # the same frames withheld
        for s in stamps:
            if s not in want:
                assert "unit from the primary camera" in statuses[s][0].reason, statuses[s][0].reason
                continue
            np.testing.assert_allclose(got[s], want[s], atol=1e-6, err_msg=f"{name} {s}")
    body = offline_run["body"]
    want = dict(zip((int(s) for s in body["stamp_ns"]), body["pose"]))
    assert set(node_run["body"]) == set(want)
    for s, pose in want.items():
        np.testing.assert_allclose(node_run["body"][s], pose, atol=1e-6, err_msg=f"body {s}")
    assert "hand-over: rear drives: the primary camera is back" in node_run["log"]()
