"""``~/save_session`` and ``~/load_session`` do not stop the node's other callbacks: they are
coroutines in a callback group of their own that await a thread doing the work, on the node's own
executor (``make_executor``), so while a save writes gigabytes (here: a write held open by the test)
the image callbacks go on.

An rclpy node in this process carries the real ``NodeServices`` over stand-ins for the inference
thread; a client in another context calls the services while a publisher feeds the node's
subscription (in the node's default group, as the image intake is).
"""
from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

rclpy = pytest.importorskip("rclpy")

from rclpy.context import Context  # noqa: E402
from rclpy.executors import SingleThreadedExecutor  # noqa: E402
from std_msgs.msg import String  # noqa: E402
from std_srvs.srv import Trigger  # noqa: E402

from lingbot_map_ros.core.session_store import SaveReport, SessionCapture, SessionFileError  # noqa: E402
from lingbot_map_ros.core.settings import defaults  # noqa: E402
from lingbot_map_ros.ros.commands import CommandResult, LoadSession, SaveSession  # noqa: E402
from lingbot_map_ros.ros.node import make_executor  # noqa: E402
from lingbot_map_ros.ros.node_settings import LiveSettings, NodeSettings  # noqa: E402
from lingbot_map_ros.ros.node_state import NodeState  # noqa: E402
from lingbot_map_ros.ros.services import NodeServices  # noqa: E402


class HeldCapture(SessionCapture):
    """A capture whose write waits until the test lets it go (a slow disk)."""

    def __init__(self, release: threading.Event, started: threading.Event) -> None:
        super().__init__({}, [], 12, 5, 0.001)
        self.release, self.started = release, started

    def write(self, path: str) -> SaveReport:
        self.started.set()
        assert self.release.wait(30)
        return SaveReport(path, 12, 5, 1024, 0.5, 0.001)


@pytest.fixture
def contexts(ros_domain_id):
    made = []

    def make() -> Context:
        ctx = Context()
        rclpy.init(context=ctx, domain_id=ros_domain_id)
        made.append(ctx)
        return ctx

    yield make
    for ctx in made:
        rclpy.try_shutdown(context=ctx)


def test_a_slow_save_does_not_hold_up_the_image_callbacks(contexts, tmp_path):
    node_ctx, client_ctx = contexts(), contexts()
    node = rclpy.create_node("session_services_under_test", context=node_ctx)
    release, started = threading.Event(), threading.Event()
    received: list[float] = []
    node.create_subscription(String, "/session_services_test/images", lambda m: received.append(time.monotonic()), 10)
    settings = LiveSettings(NodeSettings.from_values(dict(defaults(), session_path=str(tmp_path / "s"))))

    def submit(command, wait):
        if isinstance(command, SaveSession):
            return CommandResult(True, "session copied", capture=HeldCapture(release, started))
        assert isinstance(command, LoadSession)
        return CommandResult(True, f"loaded {command.source}")

    def prepare_load(path):
        if path.endswith("bad"):
            raise SessionFileError(f"{path!r} is not a session (no such folder)")
        return f"<prepared {path}>"

    state = NodeState()
    state.enter("active")
    parts = SimpleNamespace(configured=True, submit=submit, prepare_load=prepare_load)  # ConfiguredParts' methods
    NodeServices(node, settings, state, parts, trajectory=SimpleNamespace(trajectory=lambda: ([], 0)))
    executor = make_executor(context=node_ctx)
    executor.add_node(node)
    spinner = threading.Thread(target=executor.spin, daemon=True)
    spinner.start()
    client_node = rclpy.create_node("session_services_client", context=client_ctx)
    pub = client_node.create_publisher(String, "/session_services_test/images", 10)
    save = client_node.create_client(Trigger, "/session_services_under_test/save_session")
    load = client_node.create_client(Trigger, "/session_services_under_test/load_session")
    client = SingleThreadedExecutor(context=client_ctx)
    client.add_node(client_node)
    try:
        assert save.wait_for_service(timeout_sec=20) and load.wait_for_service(timeout_sec=20)
        future = save.call_async(Trigger.Request())
        deadline = time.monotonic() + 20
        while not started.is_set() and time.monotonic() < deadline:
            client.spin_once(timeout_sec=0.05)
        assert started.is_set(), "the save never reached its write"
        before = len(received)
        for i in range(40):  # the write is held: the node's subscription must keep receiving
            pub.publish(String(data=str(i)))
            client.spin_once(timeout_sec=0.05)
            if len(received) >= before + 10:
                break
        assert len(received) >= before + 10, f"{len(received) - before} messages arrived during the save"
        assert not future.done()
        release.set()
        client.spin_until_future_complete(future, timeout_sec=20)
        assert future.result().success and "saved session" in future.result().message
        settings.update({"session_path": str(tmp_path / "bad")})
        refused = load.call_async(Trigger.Request())
        client.spin_until_future_complete(refused, timeout_sec=20)
        assert not refused.result().success and "is not a session" in refused.result().message
        settings.update({"session_path": str(tmp_path / "good")})
        loaded = load.call_async(Trigger.Request())
        client.spin_until_future_complete(loaded, timeout_sec=20)
        assert loaded.result().success and loaded.result().message == f"loaded <prepared {tmp_path / 'good'}>"
    finally:
        release.set()
        executor.shutdown(timeout_sec=5)
        client.shutdown(timeout_sec=5)
        node.destroy_node()
        client_node.destroy_node()
