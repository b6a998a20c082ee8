"""The node as a localizer nav2 can use, over real ROS 2 on loopback.

* A nav2-like consumer: a ``tf2_ros.Buffer`` in a second node looks up ``map -> base_link`` at "now"
  every 50 ms (waiting up to 0.25 s, as a costmap's transform tolerance does) while frames come at
  1 Hz and then stop for 3 s. With ``transform_publish_period`` 0.05 and ``transform_tolerance`` 0.5
  (the correction re-sent, stamped ahead) no lookup fails; with the period 0 (the correction only at
  the image stamps) lookups fail with an extrapolation error.
* ``~/odom`` carries the configured covariance diagonals (the default: unknown).
* Two nodes publishing ``map -> odom``: each says ERROR in ``/diagnostics`` naming the other.

The robot (static mount, odometry at 20 Hz stamped now) is ``test_robot.Robot``.
"""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy")
pytest.importorskip("lingbot_map_ros.msg")
tf2_ros = pytest.importorskip("tf2_ros")
pytestmark = [pytest.mark.ros, pytest.mark.slow]

from rclpy.duration import Duration  # noqa: E402
from test_robot import BASE, ODOM, OPTICAL, TOPIC, WORLD, Robot, start_node, stop_node  # noqa: E402

from lingbot_map_ros.core.geometry import se3  # noqa: E402
from lingbot_map_ros.core.settings import covariance_matrix  # noqa: E402
from lingbot_map_ros.tools.node_client import Listener, NodeProcess, image_message  # noqa: E402

POSE_DIAGONAL = [0.01, 0.02, 0.03, 0.004, 0.005, 0.006]
TWIST_DIAGONAL = [0.1, 0.2, 0.3, 0.04, 0.05, 0.06]
FRAMES = 4  # at 1 Hz; the first two are the scale frames (placed together when the second arrives)
STOP_S = 3.0  # no frames for this long after the last one is placed
LOOKUP_PERIOD = 0.05
LOOKUP_WAIT = 0.25


class Odometry:
    """The robot's odometry: ``odom -> base_link`` at 20 Hz, stamped now, moving slowly along x."""

    def __init__(self, robot: Robot):
        self._robot = robot
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        t0 = time.monotonic()
        while not self._stop.wait(0.05):
            now = self._robot.node.get_clock().now().nanoseconds
            self._robot.publish_odom(now, se3(np.eye(3), [0.05 * (time.monotonic() - t0), 0.0, 0.0]))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)


def consume(robot: Robot, node: NodeProcess, lookups: dict) -> tuple[list[int], list[int]]:
    """Frames at 1 Hz (stamped now) while the consumer looks up ``map -> base_link`` at now every 50 ms,
    from the first placed correction until STOP_S after the last frame is placed. ``lookups`` counts
    'ok' and the exceptions' type names; returns the frames' stamps and those of the frames placed."""
    clock = robot.node.get_clock()
    stamps: list[int] = []
    t_start = time.monotonic()
    deadline = t_start + 120.0
    counting = False
    last_placed = None
    while time.monotonic() < deadline:
        t = time.monotonic()
        if len(stamps) < FRAMES and t - t_start >= len(stamps):  # 1 Hz
            stamps.append(clock.now().nanoseconds)
            robot.listener.pub.publish(image_message(robot.camera.render(len(stamps) - 1), stamps[-1], OPTICAL))
        if not counting:
            counting = robot.buffer.can_transform(WORLD, ODOM, rclpy.time.Time())  # the first correction is here
        if counting:
            try:
                robot.buffer.lookup_transform(WORLD, BASE, clock.now(), Duration(seconds=LOOKUP_WAIT))
                lookups["ok"] = lookups.get("ok", 0) + 1
            except tf2_ros.TransformException as exc:
                lookups[type(exc).__name__] = lookups.get(type(exc).__name__, 0) + 1
        if last_placed is None and len(stamps) == FRAMES and robot.listener.final_status(stamps[-1]) is not None:
            last_placed = time.monotonic()
        if last_placed is not None and time.monotonic() - last_placed >= STOP_S:
            break
        time.sleep(max(0.0, LOOKUP_PERIOD - (time.monotonic() - t)))
    assert last_placed is not None, f"the frames were not all processed:\n{node.output()[-3000:]}"
    with robot.listener.lock:
        finals = {s: robot.listener.final_status(s) for s in stamps}
    summary = {s: (f.status, f.reason) if f is not None else None for s, f in finals.items()}
    # every frame settled; the consumer's test needs corrections, not every frame placed (a loaded host's
    # odometry may come after tf_timeout: that frame ends NO_TRANSFORM and the correction stays)
    placed = [s for s, f in finals.items() if f is not None and f.status == 0 and not f.reason]
    assert all(f is not None for f in finals.values()) and len(placed) >= 2, summary
    return stamps, placed  # every frame's stamp; those of the frames with a pose (each has its ~/odom)


def run_consumer(tmp_path, domain: int, name: str, **params) -> tuple[dict, dict]:
    robot = Robot(domain)
    node = None
    odometry = Odometry(robot)
    try:
        robot.publish_static()
        node = start_node(tmp_path, domain, name, base_frame=BASE, odom_frame=ODOM, tf_timeout=0.5, **params)
        assert robot.listener.wait_connected(30), "no connection to the node"
        lookups: dict = {}
        stamps, placed = consume(robot, node, lookups)
        lst = robot.listener
        assert lst.wait_for(lambda rx: all(s in rx.odoms for s in placed if s != stamps[0]), 10), "no ~/odom"
        with lst.lock:
            odoms = {s: lst.rx.odoms[s] for s in stamps if s in lst.rx.odoms}
        return lookups, odoms
    finally:
        odometry.close()
        robot.close()
        if node is not None:
            stop_node(node)


def test_a_nav2_consumer_never_extrapolates_with_the_correction_re_sent(tmp_path, ros_domain_id):
    lookups, odoms = run_consumer(tmp_path, ros_domain_id, "repeat", transform_publish_period=0.05,
                                  transform_tolerance=0.5, pose_covariance_diagonal=POSE_DIAGONAL,
                                  twist_covariance_diagonal=TWIST_DIAGONAL)
    failures = {k: v for k, v in lookups.items() if k != "ok"}
    assert not failures and lookups.get("ok", 0) >= 40, lookups  # >= 2 s of frames + 3 s without, every 50 ms
    for odom in odoms.values():
        np.testing.assert_array_equal(np.asarray(odom.pose.covariance), covariance_matrix(POSE_DIAGONAL))
        np.testing.assert_array_equal(np.asarray(odom.twist.covariance), covariance_matrix(TWIST_DIAGONAL))
        assert odom.pose.covariance[14] == POSE_DIAGONAL[2] and odom.twist.covariance[35] == TWIST_DIAGONAL[5]


def test_without_the_re_send_a_nav2_consumer_extrapolates(tmp_path, ros_domain_id):
    lookups, odoms = run_consumer(tmp_path, ros_domain_id, "placed_only", transform_publish_period=0.0)
    # STOP_S without frames, a lookup every 50 ms (each waiting LOOKUP_WAIT): at least 8 of them fail
    assert lookups.get("ExtrapolationException", 0) >= 8, lookups
    for odom in odoms.values():  # the default covariance: unknown
        assert odom.pose.covariance[0] == -1.0 and not any(odom.pose.covariance[1:])
        assert odom.twist.covariance[0] == -1.0 and not any(odom.twist.covariance[1:])


def test_two_nodes_publishing_map_to_odom_both_say_error_naming_the_other(tmp_path, ros_domain_id):
    robot = Robot(ros_domain_id)
    odometry = Odometry(robot)
    nodes: dict[str, NodeProcess] = {}
    listener_a = listener_b = None
    try:
        robot.publish_static()
        for ns in ("a", "b"):
            nodes[ns] = start_node(tmp_path, ros_domain_id, f"node_{ns}", base_frame=BASE, odom_frame=ODOM,
                                   tf_timeout=0.5, transform_publish_period=0.05,
                                   extra_args=["-r", f"__ns:=/{ns}"])
        # listener_a publishes the images on TOPIC (both nodes subscribe to it) and hears /diagnostics
        listener_a = Listener("/a/lingbot_map", TOPIC, context=robot.ctx, name="nav2_test_a")
        listener_b = Listener("/b/lingbot_map", TOPIC, context=robot.ctx, name="nav2_test_b")
        names = {"a": "/a/lingbot_map", "b": "/b/lingbot_map"}

        def both_error(rx) -> bool:
            seen = {}
            for array in rx.diagnostics[-20:]:
                for status in array.status:
                    if status.name == "lingbot_map: tf" and status.hardware_id in names.values():
                        seen[status.hardware_id] = status
            return all(_level(seen.get(names[ns])) == 2 for ns in names) and all(
                f"another node publishes {WORLD} -> {ODOM} too: {names[other]}" in seen[names[ns]].message
                for ns, other in (("a", "b"), ("b", "a")))

        wait = listener_a
        assert wait.wait_connected(30) and listener_b.wait_connected(30), "no connection to the nodes"
        clock = robot.node.get_clock()
        stamps = []
        for i in range(3):
            stamps.append(clock.now().nanoseconds)
            wait.pub.publish(image_message(robot.camera.render(i), stamps[-1], OPTICAL))
            time.sleep(0.3)
        for listener in (listener_a, listener_b):
            assert listener.wait_for(lambda rx: all(listener.final_status(s) is not None for s in stamps), 60), \
                "no final status"
        assert wait.wait_for(both_error, 20), _last_tf(wait.rx)
        for ns in names:  # the log line reaches the test by the node's stdout, which may trail its /diagnostics
            deadline = time.monotonic() + 10
            while "another node publishes" not in nodes[ns].output() and time.monotonic() < deadline:
                time.sleep(0.1)
            lines = [line for line in nodes[ns].output().splitlines() if "another node publishes" in line]
            assert len(lines) == 1, lines  # logged once
    finally:
        odometry.close()
        for listener in (listener_a, listener_b):
            if listener is not None:
                listener.close()
        robot.close()
        for node in nodes.values():
            stop_node(node)


def _level(status) -> int:
    if status is None:
        return -1
    return status.level if isinstance(status.level, int) else int.from_bytes(status.level, "little")


def _last_tf(rx) -> str:
    out = {}
    for array in rx.diagnostics[-20:]:
        for status in array.status:
            if status.name == "lingbot_map: tf":
                out[status.hardware_id] = (_level(status), status.message)
    return str(out)

