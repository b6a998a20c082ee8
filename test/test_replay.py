"""Recordings in, trajectories out: rosbag2 I/O, replay through the real node, evaluation.

The node tests start the installed ``lingbot_map_node`` console script (tiny preset) as a separate
process on loopback DDS, replay a bag into it with ``lingbot_map_replay --rate 0`` (paced by the
node's ``~/frame_status``, so no frame is dropped) and read the trajectory back through
``~/save_trajectory``. Images are 148x4 pixels: the node resizes to width 518, and this strip
becomes a 14x518 model input (37 patches), the cheapest input the real pipeline accepts.
"""
from __future__ import annotations

import os

os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"  # before anything imports rclpy

import re
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from replay_node import BIN, NodeProcess, RosClient, frames, node_params, replay, ros_env, stamps

from lingbot_map_ros.core.geometry import quaternion_to_matrix, se3
from lingbot_map_ros.core.trajectory import read_tum, write_tum
from lingbot_map_ros.tools.bag_io import BagError, image_topics, iter_bag_images, pick_image_topic, write_image_bag


# ------------------------------------------------------------------------------- bag_io
@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
@pytest.mark.parametrize("compressed", [False, True])
def test_bag_round_trip(tmp_path, storage, compressed):
    imgs, st = frames(5), stamps(5, 1700000000.123456789)
    bag = write_image_bag(tmp_path / "bag", imgs, st, storage=storage, compressed=compressed, encoding="bgr8")
    got = list(iter_bag_images(bag))
    assert len(got) == 5
    for (rgb, stamp), img, s in zip(got, imgs, st):
        assert rgb.dtype == np.uint8 and np.array_equal(rgb, img)  # PNG is lossless; bgr8 swapped back
        assert stamp == pytest.approx(s, abs=1e-6)


def test_bag_topic_choice(tmp_path):
    bag = write_image_bag(tmp_path / "one", frames(2), stamps(2, 5.0), topic="/a/image")
    assert pick_image_topic(bag) == ("/a/image", "sensor_msgs/msg/Image")
    with pytest.raises(BagError, match="no Image/CompressedImage topic '/b'"):
        list(iter_bag_images(bag, "/b"))
    with pytest.raises(BagError, match="no such bag"):
        list(iter_bag_images(tmp_path / "missing"))
    # two image topics: the reader refuses to guess
    from rosbags.rosbag2 import Reader, Writer
    from rosbags.typesys import Stores, get_typestore

    two = tmp_path / "two"
    store = get_typestore(Stores.ROS2_JAZZY)
    with Reader(bag) as reader, Writer(two, version=9) as writer:
        conns = {t: writer.add_connection(t, "sensor_msgs/msg/Image", typestore=store) for t in ("/left", "/right")}
        for _, t_ns, raw in reader.messages():
            for c in conns.values():
                writer.write(c, t_ns, raw)
    assert sorted(image_topics(two)) == ["/left", "/right"]
    with pytest.raises(BagError, match="several image topics"):
        pick_image_topic(two)
    assert len(list(iter_bag_images(two, "/right"))) == 2


@pytest.mark.slow
def test_offline_bag_gives_one_pose_per_frame(tmp_path):
    st = stamps(12, 100.0)
    bag = write_image_bag(tmp_path / "bag", frames(12), st, storage="sqlite3")
    out, tum = tmp_path / "x.npz", tmp_path / "y.tum"
    cmd = [str(BIN / "lingbot_map_offline"), "--bag", str(bag), "--out", str(out), "--tum", str(tum),
           "--model-preset", "tiny", "--scale-frames", "2", "--sliding-window", "3", "--quiet"]
    proc = subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    data = np.load(out)
    assert data["pose_enc"].shape == (12, 9) and data["c2w"].shape == (12, 4, 4)
    tum_stamps, _, _ = read_tum(tum)
    assert np.allclose(tum_stamps, st, atol=1e-6)


# ------------------------------------------------------------------------------- evaluation
def _trajectory(n: int) -> np.ndarray:
    t = np.linspace(0, 4, n)
    q = np.stack([0.1 * np.sin(t), 0.2 * np.cos(t), 0.05 * t, np.ones(n)], 1)
    return se3(quaternion_to_matrix(q), np.stack([np.sin(t), np.cos(2 * t), 0.3 * t], 1))


def test_evaluate_sim3(tmp_path, capsys):
    from lingbot_map_ros.tools import evaluate

    gt = _trajectory(60)
    st = np.arange(60) * 0.1
    # the estimate: the same motion seen in another frame with another scale, stamps jittered by 3 ms
    rot = quaternion_to_matrix([0.3, -0.2, 0.1, 0.9])
    est = gt.copy()
    est[:, :3, :3] = rot @ gt[:, :3, :3]
    est[:, :3, 3] = 0.37 * gt[:, :3, 3] @ rot.T + [1, 2, 3]
    write_tum(tmp_path / "gt.tum", st, gt)
    write_tum(tmp_path / "est.tum", st + 0.003, est)
    ev = evaluate.evaluate(str(tmp_path / "est.tum"), str(tmp_path / "gt.tum"))
    assert ev.matched == 60 and ev.ate_rmse < 1e-9 and ev.rpe_trans_rmse < 1e-9 and ev.rpe_rot_mean_deg < 1e-5
    assert ev.scale == pytest.approx(1 / 0.37)
    assert evaluate.evaluate(str(tmp_path / "est.tum"), str(tmp_path / "gt.tum"), align="se3").ate_rmse > 0.1
    assert evaluate.main([str(tmp_path / "est.tum"), str(tmp_path / "gt.tum"), "--delta", "2"]) == 0
    printed = capsys.readouterr().out
    assert "ATE RMSE" in printed and "RPE delta 2" in printed and "evo" in printed
    # stamps that do not associate: a clear error, exit 2
    write_tum(tmp_path / "far.tum", st + 50.0, est)
    assert evaluate.main([str(tmp_path / "far.tum"), str(tmp_path / "gt.tum")]) == 2
    assert "associated" in capsys.readouterr().err


# ------------------------------------------------------------------------------- status names
def test_status_summary_names_every_status_of_the_message():
    """The replay's summary once printed ``node statuses: 3 6`` (codes without names): every code of
    msg/FrameStatus.msg (read here from the file itself) must come out by its constant's name."""
    pytest.importorskip("lingbot_map_ros.msg")
    from lingbot_map_ros.tools.node_client import status_names, status_summary

    msg = (Path(__file__).resolve().parents[1] / "msg" / "FrameStatus.msg").read_text()
    constants = {int(v): k.lower() for k, v in re.findall(r"^uint8 ([A-Z_]+)=(\d+)", msg, re.M)}
    assert len(constants) >= 9 and status_names() == constants
    rng = np.random.default_rng(0)
    counts = {code: int(rng.integers(1, 50)) for code in constants}
    assert status_summary(counts) == ", ".join(f"{counts[c]} {constants[c]}" for c in sorted(constants))
    assert status_summary({0: 3, 6: 2}) == "3 processed, 2 dropped_inactive"
    assert status_summary({0: 1, 42: 2}) == "1 processed, 2 status 42"  # a code from a newer node
    assert status_summary({}) == ""


# ------------------------------------------------------------------------------- the real node
@pytest.mark.slow
@pytest.mark.ros
def test_replay_raw_bags_through_the_node(tmp_path, ros_domain_id):
    env = ros_env(tmp_path, ros_domain_id)
    bags = {
        "mcap": (write_image_bag(tmp_path / "mcap", frames(12, 1), stamps(12, 1000.0), storage="mcap",
                                 topic="/recorded/image"), stamps(12, 1000.0)),
        "sqlite3": (write_image_bag(tmp_path / "db3", frames(12, 2), stamps(12, 2000.0), storage="sqlite3",
                                    encoding="bgr8", topic="/recorded/image"), stamps(12, 2000.0)),
    }
    node = NodeProcess(env, tmp_path / "node.log", node_params(tmp_path), {"image": "/cam/image_raw"})
    client = None
    try:
        node.wait_ready()
        client = RosClient(ros_domain_id)
        for name, (bag, st) in bags.items():
            out = replay(env, bag, "--topic-out", "/cam/image_raw")
            assert out.returncode == 0, f"{name}: {out.stdout}\n{out.stderr}\n{node.log()}"
            assert "published 12 frames" in out.stdout
            answer = client.trigger("/lingbot_map/save_trajectory")
            assert answer.success, answer.message
            tum_stamps, pos, _ = read_tum(tmp_path / "traj.tum")
            assert np.allclose(tum_stamps, st, atol=1e-6), (name, tum_stamps)
            assert np.isfinite(pos).all()
            assert client.trigger("/lingbot_map/reset").success  # the next bag: a new trajectory
        # at the recorded rate (12 frames, 50 ms apart), with the statuses it saw summarised
        start = time.monotonic()
        out = replay(env, bags["mcap"][0], "--topic-out", "/cam/image_raw", "--drain", "60", rate="1.0")
        assert out.returncode == 0 and "published 12 frames" in out.stdout, out.stdout + out.stderr
        # the drain ends once every frame has its final status, not after its 60 s
        assert 11 * 0.05 < time.monotonic() - start < 50 and "processed" in out.stdout
        summary = [line for line in out.stdout.splitlines() if "node statuses:" in line][-1]
        assert re.search(r"node statuses: \d+ [a-z_]+(, \d+ [a-z_]+)*$", summary), summary  # names, not codes
        counts = {name: int(n) for n, name in re.findall(r"(\d+) ([a-z_]+)", summary.split("node statuses:")[1])}
        assert sum(n for name, n in counts.items() if name != "buffered") == 12, summary  # one final status each
    finally:
        if client is not None:
            client.close()
        node.stop()
    assert node.proc.returncode == 0, node.log()


@pytest.mark.slow
@pytest.mark.ros
def test_replay_compressed_bag_through_the_node(tmp_path, ros_domain_id):
    env = ros_env(tmp_path, ros_domain_id)
    st = stamps(12, 3000.0)
    bag = write_image_bag(tmp_path / "bag", frames(12, 3), st, storage="mcap", compressed=True,
                          topic="/cam/image_raw/compressed")
    node = NodeProcess(env, tmp_path / "node.log", node_params(tmp_path, image_transport="compressed"),
                       {"image": "/cam/image_raw"})
    client = None
    try:
        node.wait_ready()
        out = replay(env, bag)  # publishes on the bag's own topic
        assert out.returncode == 0, f"{out.stdout}\n{out.stderr}\n{node.log()}"
        client = RosClient(ros_domain_id)
        assert client.trigger("/lingbot_map/save_trajectory").success
        tum_stamps, _, _ = read_tum(tmp_path / "traj.tum")
        assert np.allclose(tum_stamps, st, atol=1e-6)
    finally:
        if client is not None:
            client.close()
        node.stop()


@pytest.mark.ros
@pytest.mark.slow
def test_node_soak_windows(tmp_path, ros_domain_id):
    """600 frames through the node with ~12-frame windows: all accounted for, alive, memory flat."""
    env = ros_env(tmp_path, ros_domain_id)
    warm = write_image_bag(tmp_path / "warm", frames(100, 4), stamps(100, 10.0), topic="/cam/image_raw")
    main = write_image_bag(tmp_path / "main", frames(500, 5), stamps(500, 100.0), topic="/cam/image_raw")
    params = node_params(tmp_path, max_stored_frames=12, overlap_frames=4, long_run_policy="window",
                          path_max_length=50)
    node = NodeProcess(env, tmp_path / "node.log", params, {"image": "/cam/image_raw"})
    client = None
    try:
        node.wait_ready()
        client = RosClient(ros_domain_id)
        client.watch_stats()
        out = replay(env, warm)
        assert out.returncode == 0, f"{out.stdout}\n{out.stderr}\n{node.log()}"
        rss0 = node.rss()
        start = time.monotonic()
        out = replay(env, main)
        assert out.returncode == 0, f"{out.stdout}\n{out.stderr}\n{node.log()}"
        seconds = time.monotonic() - start
        growth_mb = (node.rss() - rss0) / 2**20
        # the marker: the last frame's ~/cache_stats (published right after its status, which the replay waited
        # for) has counted every frame
        client.spin_until(lambda: client.stats is not None and client.stats.frames_received == 600, 30)
        assert node.proc.poll() is None, node.log()
        s = client.stats
        assert s is not None
        print(f"node soak: 500 frames in {seconds:.1f} s, RSS growth {growth_mb:.1f} MB, "
              f"received {s.frames_received} processed {s.frames_processed} dropped {s.frames_dropped}")
        assert s.frames_received == 600
        assert s.frames_processed + s.frames_dropped == 600
        assert s.frames_stored <= 12 and s.session_id == 0  # windows chain inside one world frame
        assert growth_mb < 50
        answer = client.trigger("/lingbot_map/save_trajectory")
        assert answer.success
        tum_stamps, pos, _ = read_tum(tmp_path / "traj.tum")
        assert len(tum_stamps) == s.frames_processed and np.isfinite(pos).all()
    finally:
        if client is not None:
            client.close()
        node.stop()
    assert node.proc.returncode == 0, node.log()


# ------------------------------------------------------------------------------- robot replay order
class _Publisher:
    def __init__(self, topic: str, events: list):
        self.topic, self.events = topic, events

    def publish(self, raw) -> None:
        self.events.append(("publish", self.topic))


class _ReplayerDouble:
    """``_Replayer`` without DDS: records publishes and delivery waits; the node acknowledges every image
    at once; ``late`` topics are never acknowledged by their subscribers."""

    def __init__(self, others: list[str], late: tuple = ()):
        self.events: list = []
        self.others = {t: _Publisher(t, self.events) for t in others}
        self.pub = _Publisher("image", self.events)
        self.acked: dict = {}
        self.sent_keys: set = set()
        self.late = late

    def wait_delivered(self, topics, timeout: float) -> list[str]:
        self.events.append(("delivered", tuple(topics)))
        return [t for t in topics if t in self.late]

    def wait_until(self, predicate, timeout: float) -> bool:
        for key in [k for k in self._stamps if k not in self.acked]:
            self.acked[key] = 0
        return predicate()

    def summary(self) -> str:
        return ""


class _Bar:
    def __init__(self):
        self.lines: list[str] = []

    def write(self, text: str) -> None:
        self.lines.append(text)

    def update(self, n: int, extra: str = "") -> None:
        pass


@pytest.mark.parametrize("late", [(), ("/tf",)])
def test_robot_replay_sends_the_first_image_only_after_its_transforms_and_depth_arrived(late):
    """A frame's transforms and depth go out before its image, and the first image waits until the
    subscribers have them (a node that matched the replay's /tf late got them seconds after the image,
    ended the frame NO_TRANSFORM, and its world started a frame later than the recording's); later frames
    do not wait (both sides are matched by then; an acknowledgement takes a heartbeat, ~3 s). A
    subscriber that never acknowledges delays the first image by ``--ack-timeout`` at most, said once."""
    import argparse

    from lingbot_map_ros.tools import replay as replay_tool
    from lingbot_map_ros.tools.bag_io import bag_typestore, image_fields, stamp_seconds

    store = bag_typestore()
    t = store.types
    depth_topic = "/cam/depth"

    def image(ns: int) -> bytes:
        header = t["std_msgs/msg/Header"](stamp=t["builtin_interfaces/msg/Time"](sec=ns // 10**9, nanosec=ns % 10**9),
                                          frame_id="cam")
        msg = t["sensor_msgs/msg/Image"](header=header, **image_fields(np.zeros((2, 3, 3), np.uint8)))
        return bytes(store.serialize_cdr(msg, "sensor_msgs/msg/Image"))

    stamps = [1_700_000_000 * 10**9 + i * 10**8 for i in range(3)]
    messages = [("tf_static", "/tf_static", "", b"", 0)]
    for s in stamps:
        messages += [("tf", "/tf", "", b"", s), ("depth", depth_topic, "", b"", s),
                     ("image", "image", "sensor_msgs/msg/Image", image(s), s)]
    rep = _ReplayerDouble(["/tf_static", "/tf", depth_topic], late=late)
    rep._stamps = [(s // 10**9, s % 10**9) for s in stamps]
    args = argparse.Namespace(max_frames=0, rate=0.0, ack_timeout=2.0, max_missing=3)
    bar = _Bar()
    sent, missing = replay_tool._publish_loop(rep, iter(messages), store, stamp_seconds, args, lambda m: None, bar,
                                              {})
    assert (sent, missing) == (3, 0) and rep.sent_keys == set(rep._stamps)
    frame = [("publish", "/tf"), ("publish", depth_topic), ("publish", "image")]
    first = [("publish", "/tf_static"), ("publish", "/tf"), ("publish", depth_topic),
             ("delivered", tuple(sorted(["/tf", "/tf_static", depth_topic]))), ("publish", "image")]
    assert rep.events == first + frame + frame
    said = [line for line in bar.lines if "not acknowledged by every subscriber" in line]
    assert len(said) == (1 if late else 0) and all("/tf" in line and "2 s" in line for line in said), bar.lines


def test_replay_waits_for_the_node_on_the_participant_that_sends_each_topic():
    """Each image topic goes out from a participant of its own, which discovers the node on its own: the
    replay node may see the node's depth subscription while the depth participant has not met it, and a
    depth image sent then is lost (the first keyframe without its depth: the scale locked a frame late).
    So the wait asks the sending participant's view and its publisher's matches, not the replay node's."""
    from types import SimpleNamespace

    from lingbot_map_ros.tools import replay as replay_tool

    def graph(*nodes: str):
        infos = [SimpleNamespace(node_namespace="/", node_name=n) for n in nodes]
        return SimpleNamespace(get_subscriptions_info_by_topic=lambda topic: list(infos))

    def publisher(matched: int):
        return SimpleNamespace(get_subscription_count=lambda: matched)

    depth, tf = "/cam/depth", "/tf"
    main = graph("lingbot_map", "tf_monitor")  # the replay node has discovered the node on both topics
    cases = [  # (depth participant's view, its publisher's matches) -> unmatched topics
        (graph(), 0, [depth]),
        (graph("tf_monitor"), 1, [depth]),  # someone else matched: not the node
        (graph("lingbot_map"), 0, [depth]),  # seen, not yet matched
        (graph("lingbot_map"), 1, []),
    ]
    for view, matched, expected in cases:
        rep = SimpleNamespace(node=main, senders={depth: view, tf: main},
                              others={depth: publisher(matched), tf: publisher(2)})
        assert replay_tool._unmatched(rep, [depth, tf], "lingbot_map") == expected, (view, matched)
    # /tf is sent by the replay node: its own view decides
    rep = SimpleNamespace(node=graph(), senders={tf: graph()}, others={tf: publisher(1)})
    assert replay_tool._unmatched(rep, [tf], "/lingbot_map") == [tf]
