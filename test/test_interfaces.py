"""The node's real ROS graph equals the interfaces table (``lingbot_map_ros/ros/interfaces.py``), from
which the README's topic, service and TF tables are generated.

The real node runs in a child process; a probe node in this process reads the graph the way
``ros2 node info`` does (publishers, subscriptions and services by node, and each endpoint's
reliability and durability) and compares it, in both directions, with the table:

* unconfigured (``autostart: false``): only the rows that exist in every state;
* after configure + activate (through the node's own ``~/change_state``): every row for the settings
  in use, with its QoS;
* a second node with a namespace, a remapped and compressed image input and reliable QoS: the rows'
  names resolve as the table says, and the subscription follows ``qos_reliability``;
* its ``/tf`` edges for streamed frames are the TF table's (parent, child) with the settings in use.

The rows marked ``large`` (depth images, point clouds) must be published by the node's second participant
``<node>_large_outputs`` and by nothing else; every other row by the node itself.
"""
from __future__ import annotations

import os
import time

import pytest

rclpy = pytest.importorskip("rclpy")
pytest.importorskip("lingbot_map_ros.msg")
pytestmark = [pytest.mark.ros, pytest.mark.slow]  # starts node processes

from rclpy.context import Context  # noqa: E402
from rclpy.executors import SingleThreadedExecutor  # noqa: E402
from rclpy.qos import QoSDurabilityPolicy, QoSReliabilityPolicy  # noqa: E402

from lingbot_map_ros.core.settings import defaults  # noqa: E402
from lingbot_map_ros.ros.interfaces import (  # noqa: E402
    ENDPOINTS,
    LIFECYCLE,
    NODE_NAME,
    STANDARD,
    TF_EDGES,
    Endpoint,
    resolve,
)
from lingbot_map_ros.ros.large_outputs import SUFFIX  # noqa: E402
from lingbot_map_ros.tools.node_client import Listener, NodeProcess, SyntheticCamera, image_message  # noqa: E402

TINY = ["-p", "model_preset:=tiny", "-p", "device:=cpu", "-p", "scale_frames:=2", "-p", "sliding_window:=3",
        "-p", "camera_iterations:=2"]
QOS_OF = {  # a row's QoS key -> (reliability, durability) the endpoint must show
    "reliable": (QoSReliabilityPolicy.RELIABLE, QoSDurabilityPolicy.VOLATILE),
    "latched": (QoSReliabilityPolicy.RELIABLE, QoSDurabilityPolicy.TRANSIENT_LOCAL),
}
LARGE = "publisher (large_outputs)"  # a publisher of the node's second participant, in the graph sets


class Probe:
    """A node in this process that reads another node's part of the ROS graph."""

    def __init__(self, domain: int):
        self.ctx = Context()
        rclpy.init(context=self.ctx, domain_id=domain)
        self.node = rclpy.create_node("lingbot_interfaces_probe", context=self.ctx)

    def graph(self, name: str, ns: str) -> set[tuple[str, str, str]]:
        """{(kind, absolute name, type)} of node ``ns/name``."""
        n = self.node
        rows = {("publisher", t, ty) for t, tys in n.get_publisher_names_and_types_by_node(name, ns) for ty in tys}
        rows |= {("subscription", t, ty) for t, tys in n.get_subscriber_names_and_types_by_node(name, ns)
                 for ty in tys}
        rows |= {("service", s, ty) for s, tys in n.get_service_names_and_types_by_node(name, ns) for ty in tys}
        # the second participant's publishers, besides the one every rclpy node has
        rows |= {(LARGE, t, ty) for t, tys in n.get_publisher_names_and_types_by_node(name + SUFFIX, ns)
                 for ty in tys if t != "/parameter_events"}
        return rows

    def wait_graph(self, name: str, ns: str, expected: set, timeout: float = 60.0) -> set:
        """The graph once it equals ``expected`` (discovery is gradual), else the last one seen."""
        deadline = time.monotonic() + timeout
        seen: set = set()
        while time.monotonic() < deadline:
            try:
                seen = self.graph(name, ns)
            except Exception:  # the node not discovered yet (NodeNameNonExistentError)
                seen = set()
            if seen == expected:
                return seen
            time.sleep(0.2)
        return seen

    def qos(self, kind: str, topic: str, node_name: str) -> tuple:
        infos = (self.node.get_publishers_info_by_topic(topic) if kind == "publisher"
                 else self.node.get_subscriptions_info_by_topic(topic))
        mine = [i.qos_profile for i in infos if i.node_name == node_name]
        assert len(mine) == 1, (kind, topic, [i.node_name for i in infos])
        return mine[0].reliability, mine[0].durability

    def change_state(self, name: str, transition_id: int) -> bool:
        from lifecycle_msgs.srv import ChangeState

        client = self.node.create_client(ChangeState, f"{name}/change_state")
        try:
            assert client.wait_for_service(timeout_sec=30), f"no {name}/change_state"
            request = ChangeState.Request()
            request.transition.id = transition_id
            future = client.call_async(request)
            executor = SingleThreadedExecutor(context=self.ctx)
            rclpy.spin_until_future_complete(self.node, future, executor=executor, timeout_sec=120)
            executor.shutdown()
            return bool(future.result() and future.result().success)
        finally:
            self.node.destroy_client(client)

    def close(self) -> None:
        self.node.destroy_node()
        rclpy.shutdown(context=self.ctx)


def graph_kind(row: Endpoint) -> str:
    return LARGE if row.large else row.kind


def publisher_of(row: Endpoint) -> str:
    return NODE_NAME + SUFFIX if row.large else NODE_NAME


def expected_graph(values: dict, rows, namespace: str = "/", remaps=None, configured: bool = True) -> set:
    return {(graph_kind(r), resolve(r.name, namespace, NODE_NAME, remaps), r.type) for r in rows
            if r.exists_with(values) and (configured or not r.configured_only)}


def check_qos(probe: Probe, rows: tuple[Endpoint, ...], values: dict, namespace: str, remaps) -> None:
    for r in rows:
        if r.kind == "service" or not r.exists_with(values):
            continue
        want = QOS_OF.get(r.qos)
        if r.qos == "qos_reliability":
            want = (QoSReliabilityPolicy.RELIABLE if values["qos_reliability"] == "reliable"
                    else QoSReliabilityPolicy.BEST_EFFORT, QoSDurabilityPolicy.VOLATILE)
        assert want is not None, f"{r.name}: unknown QoS key {r.qos!r}"
        got = probe.qos(r.kind, resolve(r.name, namespace, NODE_NAME, remaps), publisher_of(r))
        assert got == want, f"{r.kind} {r.name}: QoS {got} in the node, {want} in the table"


def diff(got: set, want: set) -> str:
    return (f"in the node, not in the table: {sorted(got - want)}\n"
            f"in the table, not in the node: {sorted(want - got)}")


@pytest.fixture
def probe(ros_domain_id):
    p = Probe(ros_domain_id)
    yield p
    p.close()


def start_node(args: list[str], domain: int, tmp_path) -> NodeProcess:
    env = dict(os.environ, ROS_DOMAIN_ID=str(domain))
    return NodeProcess([*TINY, *args], echo=False, env=env, log_path=str(tmp_path / "node.log"))


def test_graph_equals_the_table_unconfigured_and_active(probe, ros_domain_id, tmp_path):
    values = defaults()
    node = start_node(["-p", "autostart:=false"], ros_domain_id, tmp_path)
    try:
        every_state = ENDPOINTS + LIFECYCLE + STANDARD
        want = expected_graph(values, every_state, configured=False)
        got = probe.wait_graph(NODE_NAME, "/", want)
        assert got == want, "unconfigured:\n" + diff(got, want)
        assert probe.change_state(f"/{NODE_NAME}", 1), node.output()[-3000:]  # configure
        assert probe.change_state(f"/{NODE_NAME}", 3), node.output()[-3000:]  # activate
        want = expected_graph(values, every_state)
        got = probe.wait_graph(NODE_NAME, "/", want)
        assert got == want, "active:\n" + diff(got, want)
        check_qos(probe, ENDPOINTS + LIFECYCLE, values, "/", None)
    finally:
        assert node.stop() == 0, node.output()[-3000:]


def test_names_resolve_as_the_table_says_and_tf_edges(probe, ros_domain_id, tmp_path):
    values = dict(defaults(), image_transport="compressed", qos_reliability="reliable", world_frame="w_probe")
    namespace, remaps = "/robot7", {"image": "/robot7/cam/color"}
    node = start_node(["-r", "__ns:=/robot7", "-r", "image:=/robot7/cam/color",
                       "-p", "image_transport:=compressed", "-p", "qos_reliability:=reliable",
                       "-p", "world_frame:=w_probe"], ros_domain_id, tmp_path)
    try:
        assert node.wait_ready(120), node.output()[-3000:]
        want = expected_graph(values, ENDPOINTS + LIFECYCLE + STANDARD, namespace, remaps)
        got = probe.wait_graph(NODE_NAME, namespace, want)
        assert got == want, diff(got, want)
        assert ("subscription", "/robot7/cam/color/compressed", "sensor_msgs/msg/CompressedImage") in got
        check_qos(probe, ENDPOINTS, values, namespace, remaps)
    finally:
        assert node.stop() == 0, node.output()[-3000:]


def test_tf_edges_are_the_tables(ros_domain_id, tmp_path):
    """Frames streamed to the node come back on /tf as the TF table's edges, with and without
    ``camera_frame``."""
    for camera_frame in ("", "cam_from_param"):
        values = dict(defaults(), world_frame="w_tf", camera_frame=camera_frame)
        args = ["-r", "image:=/tf_test/image", "-p", "world_frame:=w_tf", "-p", "qos_reliability:=reliable"]
        if camera_frame:
            args += ["-p", f"camera_frame:={camera_frame}"]
        node = start_node(args, ros_domain_id, tmp_path)
        ctx = Context()
        rclpy.init(context=ctx, domain_id=ros_domain_id)
        listener = Listener(f"/{NODE_NAME}", "/tf_test/image", context=ctx, name="lingbot_tf_probe")
        try:
            assert node.wait_ready(120), node.output()[-3000:]
            assert listener.wait_connected(30)
            camera = SyntheticCamera(64, 48)
            deadline, i = time.monotonic() + 90, 0
            # frames until transforms come back, each sent once the node has accounted for the one before
            # (its frame_status) or after a second without one: frames sent before the node has matched this
            # publisher (discovery is not symmetric) are lost, as they would be from any camera
            while time.monotonic() < deadline and sum(len(m.transforms) for m in listener.rx.tf) < 3:
                stamp = 1_700_000_000 * 10**9 + i * 10**8
                listener.pub.publish(image_message(camera.render(i), stamp, "header_cam"))
                listener.wait_for(lambda rx: stamp in rx.status, 1.0)
                i += 1
            assert sum(len(m.transforms) for m in listener.rx.tf) >= 3, (node.output()[-3000:], listener.rx.status_log)
            with listener.lock:
                edges = {(t.header.frame_id, t.child_frame_id) for m in listener.rx.tf for t in m.transforms}
            want = {(values[e.parent], values[e.child] or "header_cam") for e in TF_EDGES if e.exists_with(values)}
            assert edges == want, (edges, want)
        finally:
            listener.close()
            rclpy.shutdown(context=ctx)
            assert node.stop() == 0, node.output()[-3000:]


def test_per_camera_rows_expand_to_each_camera():
    values = dict(defaults(), cameras=["front", "rear"], base_frame="base_link")
    pose = next(e for e in ENDPOINTS if e.name == "~/<name>/pose")
    assert pose.names_with(values) == ["~/front/pose", "~/rear/pose"]
    assert pose.names_with(defaults()) == [] and not pose.exists_with(defaults())
    image = next(e for e in ENDPOINTS if e.name == "image")
    assert image.names_with(defaults()) == ["image"] and image.names_with(values) == []


def test_graph_with_two_cameras_equals_the_table(probe, ros_domain_id, tmp_path):
    """The several-camera mode: the per-camera rows once per camera, the single camera's inputs gone."""
    values = dict(defaults(), cameras=["front", "rear"], base_frame="base_link")
    node = start_node(["-p", "cameras:=[front,rear]", "-p", "base_frame:=base_link"], ros_domain_id, tmp_path)
    try:
        assert node.wait_ready(120), node.output()[-3000:]
        want = {(graph_kind(r), resolve(name, "/", NODE_NAME), r.type) for r in ENDPOINTS + LIFECYCLE + STANDARD
                for name in r.names_with(values)}
        got = probe.wait_graph(NODE_NAME, "/", want)
        assert got == want, diff(got, want)
        for r in ENDPOINTS:
            if r.per_camera and r.kind != "service" and r.exists_with(values):
                for name in r.names_with(values):
                    want_qos = (QoSReliabilityPolicy.BEST_EFFORT, QoSDurabilityPolicy.VOLATILE) \
                        if r.qos == "qos_reliability" else QOS_OF[r.qos]
                    got_qos = probe.qos(r.kind, resolve(name, "/", NODE_NAME), publisher_of(r))
                    assert got_qos == want_qos, (name, got_qos, want_qos)
    finally:
        assert node.stop() == 0, node.output()[-3000:]
