"""The real node for the replay and tool tests: ``lingbot_map_node`` in a process of its own on loopback
DDS (``NodeProcess``), an rclpy client in the test's process (``RosClient``), ``lingbot_map_replay``
(``replay``), and the tiny frames and stamps they stream. Images are 148x4 pixels: the node resizes to
width 518, and this strip becomes a 14x518 model input (37 patches), the cheapest input it accepts."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

BIN = Path(sys.executable).parent  # the venv's console scripts
IMG_W, IMG_H = 148, 4


def frames(n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (IMG_H, IMG_W, 3), dtype=np.uint8) for _ in range(n)]


def stamps(n: int, start: float) -> list[float]:
    return [start + 0.05 * i for i in range(n)]


def ros_env(tmp_path: Path, domain: int) -> dict:
    return dict(
        os.environ,
        ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST",
        ROS_DOMAIN_ID=str(domain),
        ROS_LOG_DIR=str(tmp_path / "ros_log"),
        OMP_NUM_THREADS="1",  # tiny matrices: more threads only contend on a 2-core machine
        PYTHONUNBUFFERED="1",
    )


class NodeProcess:
    """``lingbot_map_node`` in its own process, stopped with SIGINT (clean DDS shutdown)."""

    def __init__(self, env: dict, log: Path, params: dict, remaps: dict) -> None:
        cmd = [str(BIN / "lingbot_map_node"), "--ros-args"]
        for k, v in params.items():
            cmd += ["-p", f"{k}:={v}"]
        for k, v in remaps.items():
            cmd += ["-r", f"{k}:={v}"]
        self.log_path = log
        self._log = open(log, "w")
        self.proc = subprocess.Popen(cmd, env=env, stdout=self._log, stderr=subprocess.STDOUT)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 90.0) -> None:
        end = time.monotonic() + timeout
        while "ready:" not in self.log():
            assert self.proc.poll() is None, f"node exited early:\n{self.log()}"
            assert time.monotonic() < end, f"node not ready after {timeout} s:\n{self.log()}"
            time.sleep(0.2)

    def rss(self) -> int:
        import psutil

        p = psutil.Process(self.proc.pid)
        return p.memory_info().rss + sum(c.memory_info().rss for c in p.children(recursive=True))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.terminate()
                self.proc.wait(timeout=10)
        self._log.close()


class RosClient:
    """An rclpy node in this test process, in its own context on the node's domain."""

    def __init__(self, domain: int) -> None:
        import rclpy
        from rclpy.context import Context
        from rclpy.executors import SingleThreadedExecutor

        self.rclpy = rclpy
        self.ctx = Context()
        rclpy.init(context=self.ctx, domain_id=domain)
        self.node = rclpy.create_node("lingbot_replay_test", context=self.ctx)
        self.executor = SingleThreadedExecutor(context=self.ctx)
        self.executor.add_node(self.node)
        self.stats = None

    def watch_stats(self, topic: str = "/lingbot_map/cache_stats") -> None:
        from rclpy.qos import QoSProfile, QoSReliabilityPolicy

        from lingbot_map_ros.msg import CacheStats

        def keep(msg):
            self.stats = msg

        self.node.create_subscription(CacheStats, topic, keep,
                                      QoSProfile(depth=10, reliability=QoSReliabilityPolicy.RELIABLE))

    def spin_until(self, predicate, timeout: float) -> bool:
        """Spin until ``predicate()`` holds (False after ``timeout`` s)."""
        end = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() >= end:
                return False
            self.executor.spin_once(timeout_sec=0.05)
        return True

    def trigger(self, service: str, timeout: float = 30.0):
        from std_srvs.srv import Trigger

        client = self.node.create_client(Trigger, service)
        assert client.wait_for_service(timeout_sec=timeout), f"{service} not available"
        future = client.call_async(Trigger.Request())
        self.executor.spin_until_future_complete(future, timeout_sec=timeout)
        assert future.done(), f"{service} did not answer"
        self.node.destroy_client(client)
        return future.result()

    def close(self) -> None:
        self.executor.shutdown()
        self.node.destroy_node()
        self.rclpy.shutdown(context=self.ctx)


def replay(env: dict, bag: Path, *extra: str, rate: str = "0", timeout: float = 300.0) -> subprocess.CompletedProcess:
    cmd = [str(BIN / "lingbot_map_replay"), str(bag), "--rate", rate, "--qos", "reliable", "--ack-timeout", "20",
           *extra]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def node_params(tmp_path: Path, **more) -> dict:
    return {"model_preset": "tiny", "qos_reliability": "reliable", "scale_frames": 2, "sliding_window": 3,
            "trajectory_path": str(tmp_path / "traj.tum"), "publish_tf": "false", **more}


def bag_transform(store, parent: str, child: str, m: np.ndarray, ns: int):
    """A ``TransformStamped`` of ``store``'s types (rosbags) for a bag's /tf: ``parent -> child`` is ``m``
    [4, 4] at ``ns``."""
    from lingbot_map_ros.core.geometry import quaternion_xyzw_from_matrix

    t = store.types
    sec, nanosec = divmod(ns, 10**9)
    q = quaternion_xyzw_from_matrix(m[:3, :3])
    return t["geometry_msgs/msg/TransformStamped"](
        header=t["std_msgs/msg/Header"](stamp=t["builtin_interfaces/msg/Time"](sec=sec, nanosec=nanosec),
                                        frame_id=parent),
        child_frame_id=child,
        transform=t["geometry_msgs/msg/Transform"](
            translation=t["geometry_msgs/msg/Vector3"](x=float(m[0, 3]), y=float(m[1, 3]), z=float(m[2, 3])),
            rotation=t["geometry_msgs/msg/Quaternion"](x=float(q[0]), y=float(q[1]), z=float(q[2]), w=float(q[3]))))
