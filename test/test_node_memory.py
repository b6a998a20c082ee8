"""The memory budget through the real node's ROS parameters (child process, real topics; docs/memory.md).

* a budget the geometry cannot fit: configure fails and says what does not fit and by how much;
* ``fit_window:=true`` with a budget between the footprints of windows 2 and 3: the node starts,
  WARNs with the window it chose, and /diagnostics shows it (sliding_window 2, configured 3);
  a parameter change that would not fit (``fit_window:=false``, window 3 again) is refused with the
  numbers, one that fits (``sliding_window:=1``) is taken.

The budgets are computed here from ``core/footprint.py`` for the node's geometry (tiny, CPU, fp32,
the worst-case square input of image_width 518), so the test follows the model, not fixed numbers.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

rclpy = pytest.importorskip("rclpy")
pytest.importorskip("lingbot_map_ros.msg")
pytestmark = [pytest.mark.ros, pytest.mark.slow]  # starts node processes

import torch  # noqa: E402
from rclpy.context import Context  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from rclpy.parameter_client import AsyncParameterClient  # noqa: E402

from lingbot_map_ros.core.config import StreamConfig, model_config  # noqa: E402
from lingbot_map_ros.core.footprint import assumed_runtime, footprint  # noqa: E402
from lingbot_map_ros.tools.node_client import Listener, NodeProcess  # noqa: E402

NS = "/lingbot_map"
TOPIC = "/memory/camera/image"
BASE_ARGS = ["-p", "model_preset:=tiny", "-p", "device:=cpu", "-p", "scale_frames:=2", "-p", "sliding_window:=3",
             "-p", "camera_iterations:=1", "-p", "diagnostics_period:=0.2", "-r", f"image:={TOPIC}"]


def node_footprint_gb(window: int) -> float:
    stream = StreamConfig(scale_frames=2, sliding_window=window, camera_iterations=1)
    return footprint(model_config("tiny"), assumed_runtime("cpu", torch.float32), stream, 518, 518).total / 1e9


def start(tmp: Path, domain: int, extra: list[str]) -> NodeProcess:
    env = dict(os.environ, ROS_DOMAIN_ID=str(domain))
    return NodeProcess([*BASE_ARGS, *extra], echo=False, env=env, log_path=str(tmp / "node.log"))


def kv_cache_diag(listener: Listener) -> dict:
    for array in reversed(listener.rx.diagnostics):
        for s in array.status:
            if s.name == "lingbot_map: kv cache":
                return {"level": s.level, "message": s.message, **{kv.key: kv.value for kv in s.values}}
    return {}


def wait_future(future, timeout: float = 15.0):
    deadline = time.monotonic() + timeout
    while not future.done():
        assert time.monotonic() < deadline, "no answer"
        time.sleep(0.02)
    return future.result()


def test_budget_too_small_fails_configure_with_the_numbers(tmp_path, ros_domain_id):
    budget = 0.05
    assert node_footprint_gb(3) > budget
    node = start(tmp_path, ros_domain_id, ["-p", f"gpu_memory_budget:={budget}"])
    try:
        assert not node.wait_ready(120)
        assert node.failure is not None, node.output()[-3000:]
        assert "does not fit the memory budget" in node.failure, node.failure
        assert "memory budget is 0.05 GB" in node.failure, node.failure
        assert f"needs {node_footprint_gb(3):.2f} GB" in node.failure, node.failure
        assert "too much" in node.failure and "sliding_window 3" in node.failure, node.failure
    finally:
        node.stop()


def test_fit_window_picks_the_largest_window_and_refuses_changes_that_do_not_fit(tmp_path, ros_domain_id):
    two, three = node_footprint_gb(2), node_footprint_gb(3)
    budget = round((two + three) / 2, 4)
    assert two < budget < three
    node = start(tmp_path, ros_domain_id, ["-p", f"gpu_memory_budget:={budget}", "-p", "fit_window:=true"])
    ctx = Context()
    rclpy.init(context=ctx, domain_id=ros_domain_id)
    listener = Listener(NS, TOPIC, context=ctx, name="memory_test_client")
    try:
        assert node.wait_ready(120) and node.failure is None, node.output()[-3000:]
        assert "fit_window: sliding_window 2 instead of 3" in node.output()
        assert any("WARN" in line and "fit_window: sliding_window 2" in line for line in node.lines)
        assert listener.wait_for(lambda rx: kv_cache_diag(listener).get("sliding_window") == "2", 30), \
            kv_cache_diag(listener)
        d = kv_cache_diag(listener)
        assert d["sliding_window_fitted"] == "2" and d["sliding_window_configured"] == "3", d
        assert "sliding_window fitted to 2" in d["message"], d
        assert float(d["memory_predicted_gb"]) <= budget and float(d["memory_allocated_gb"]) > 0, d

        client = AsyncParameterClient(listener.node, NS)
        assert client.wait_for_services(30)
        refused = wait_future(client.set_parameters([Parameter("fit_window", value=False)])).results[0]
        assert not refused.successful
        assert f"needs {three:.2f} GB" in refused.reason and f"budget is {budget:.2f} GB" in refused.reason, \
            refused.reason
        taken = wait_future(client.set_parameters([Parameter("sliding_window", value=1)])).results[0]
        assert taken.successful, taken.reason
        assert listener.wait_for(lambda rx: kv_cache_diag(listener).get("sliding_window") == "1", 30), \
            kv_cache_diag(listener)
        assert kv_cache_diag(listener)["sliding_window_fitted"] == "-"
    finally:
        listener.close()
        node.stop()
        rclpy.shutdown(context=ctx)
