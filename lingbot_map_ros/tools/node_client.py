"""Talking to a running ``lingbot_map_node`` from Python: the public pieces the demo, the tools and the
tests share.

* ``prepare_ros_env``: loopback-only discovery, a domain id and a log folder, before rclpy loads;
* ``NodeProcess``: the node in a child process, its output kept, its failure line recognised;
* ``SyntheticCamera`` / ``image_message`` / ``compressed_message``: frames a real camera would send;
* ``Listener``: a separate rclpy node that publishes images and records everything the node sends
  back (poses, odometry, path, /tf, cache statistics, frame statuses, diagnostics), with waits;
* ``format_diagnostics``: a /diagnostics message as the demo prints it.
"""
from __future__ import annotations

import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

NODE_NAME = "lingbot_map"
DEMO_TOPIC = "/lingbot_demo/camera/image"
DEMO_CAMERA_FRAME = "demo_camera_optical"


# ------------------------------------------------------------------------------------ environment


def prepare_ros_env(domain_id: Optional[int] = None) -> dict:
    """Loopback-only DDS discovery, a domain id and a log folder; call BEFORE importing rclpy."""
    os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
    if domain_id is not None:
        os.environ["ROS_DOMAIN_ID"] = str(domain_id)
    elif not os.environ.get("ROS_DOMAIN_ID"):
        os.environ["ROS_DOMAIN_ID"] = str(1 + os.getpid() % 100)  # 1..100: never above 101
    if not os.environ.get("ROS_LOG_DIR"):
        os.environ["ROS_LOG_DIR"] = tempfile.mkdtemp(prefix="lingbot_ros_log_")
    return dict(os.environ)


# ------------------------------------------------------------------------------------ the node process


def write_params_file(path: str, params: dict, node_name: str = NODE_NAME) -> str:
    """A ROS 2 parameter file (``--params-file``) for ``node_name`` holding ``params``."""
    lines = [f"{node_name}:", "  ros__parameters:"]
    for key, value in params.items():
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, str):
            text = '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
        else:
            text = repr(value)
        lines.append(f"    {key}: {text}")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def node_command() -> list[str]:
    """How to start ``lingbot_map_node``: its console script next to this Python, else ``-m``.

    ``-P`` keeps the working directory off ``sys.path`` (the node imports the installed package).
    """
    script = os.path.join(os.path.dirname(sys.executable), "lingbot_map_node")
    if os.path.isfile(script) and os.access(script, os.X_OK):
        return [script]
    return [sys.executable, "-P", "-m", "lingbot_map_ros.ros.node"]


FAILURE_MARKERS = ("configure failed:", "cannot start:")  # what the node prints when it cannot serve
EXIT_MARKER = "cannot start:"  # of those, the one after which the node exits by itself (code 2)
SELF_EXIT_WAIT_S = 15.0  # how long ``stop`` lets a node that said it exits do so before signalling it


def failure_reason(line: str) -> Optional[str]:
    """The reason in a node output line that says it failed to start/configure, else None.

    The managed node stays alive after a failed configure (waiting for ``ros2 lifecycle set``), so
    the demo cannot wait for it to exit: it reads this line (``[lingbot_map] configure failed: ...``
    on stdout, or the same text in the ROS log line) and stops the node by its PID.
    """
    for marker in FAILURE_MARKERS:
        at = line.find(marker)
        if at >= 0:
            return line[at:].strip()
    return None


class NodeProcess:
    """``lingbot_map_node`` in a child process; its output is echoed with a prefix and kept."""

    def __init__(self, ros_args: list[str], *, echo: bool = True, prefix: str = "[node] ",
                 env: Optional[dict] = None, log_path: Optional[str] = None, command: Optional[list[str]] = None):
        """``command``: how to start the node (default ``node_command()``), e.g. a wrapper script."""
        cmd = [*(command or node_command()), "--ros-args", *ros_args]
        self.lines: list[str] = []
        self.ready = threading.Event()
        self.failure: Optional[str] = None  # the node's own reason when it cannot start or configure
        self._echo, self._prefix = echo, prefix
        self._log = open(log_path, "w") if log_path else None
        self.proc = subprocess.Popen(
            cmd, env=dict(env or os.environ, PYTHONUNBUFFERED="1"), stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, bufsize=1,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            self.lines.append(line)
            if self._log:
                self._log.write(line + "\n")
                self._log.flush()
            if self._echo:
                # echoed before a waiter is woken, in one write with its newline: print() writes the
                # text and the newline separately, and the waiter's own line landed between the two
                sys.stdout.write(self._prefix + line + "\n")
                sys.stdout.flush()
            if "ready:" in line:
                self.ready.set()
            reason = failure_reason(line)
            if reason and self.failure is None:
                self.failure = reason
                self.ready.set()  # stop waiting at once: the node told us why it will never be ready
        self.ready.set()  # process ended: do not wait forever

    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_ready(self, timeout: float) -> bool:
        """True once the node says ``ready:``; False at once when it fails (``failure``) or exits."""
        return self.ready.wait(timeout) and self.failure is None and self.proc.poll() is None

    def why_not_ready(self) -> str:
        """The node's reason (its ``configure failed:`` / ``cannot start:`` line, or its last output)."""
        if self.failure:
            return self.failure
        if self.proc.poll() is not None:
            tail = [line for line in self.lines if line.strip()][-3:]
            return f"the node exited with code {self.proc.returncode}" + (": " + " | ".join(tail) if tail else "")
        return "the node did not report ready in time (see its log above)"

    @property
    def exits_by_itself(self) -> bool:
        """The node said it cannot start: it is on its way out (exit code 2) and needs no signal."""
        return self.failure is not None and self.failure.startswith(EXIT_MARKER)

    def stop(self, sig: int = 2, timeout: float = 30.0) -> int:
        """Send SIGINT (default) or SIGTERM and wait; returns the exit code (kills after ``timeout``).

        A node that said it cannot start is let exit on its own first: a signal that lands while its
        interpreter is already shutting down turns its exit code 2 into -2, or into a KeyboardInterrupt
        traceback from an atexit handler, depending on the moment (a race the caller must not see)."""
        if self.exits_by_itself:
            try:
                self.proc.wait(SELF_EXIT_WAIT_S)
            except subprocess.TimeoutExpired:
                pass
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._reader.join(5)
        if self._log:
            self._log.close()
            self._log = None
        return self.proc.returncode


# ------------------------------------------------------------------------------------ synthetic camera


def procedural_texture(size: int = 1024, seed: int = 0) -> np.ndarray:
    """A colourful, multi-scale RGB texture (uint8 [size, size, 3]) with shapes for visual features."""
    import cv2

    rng = np.random.default_rng(seed)
    tex = np.zeros((size, size, 3), np.float32)
    for cells, weight in ((4, 0.45), (16, 0.3), (64, 0.17), (256, 0.08)):
        noise = rng.random((cells, cells, 3), dtype=np.float32)
        tex += weight * cv2.resize(noise, (size, size), interpolation=cv2.INTER_CUBIC)
    tex = np.clip(tex * 255.0, 0, 255).astype(np.uint8)
    for _ in range(60):  # blobs and boxes: corners and edges at many scales
        color = tuple(int(c) for c in rng.integers(0, 256, 3))
        x, y = (int(v) for v in rng.integers(0, size, 2))
        r = int(rng.integers(size // 80, size // 12))
        if rng.random() < 0.5:
            cv2.circle(tex, (x, y), r, color, -1, lineType=cv2.LINE_AA)
        else:
            cv2.rectangle(tex, (x - r, y - r // 2), (x + r, y + r // 2), color, -1)
    step = size // 16
    tex[::step, :, :] = 255 - tex[::step, :, :]  # a faint grid
    tex[:, ::step, :] = 255 - tex[:, ::step, :]
    return tex


class SyntheticCamera:
    """A pinhole camera flying over a textured plane; frame ``i`` is an exact homography warp.

    The plane is the world z = 0 square [-1, 1]^2 m; the camera is ~1.2 m above it, looking down
    with a slight tilt, moving along a smooth Lissajous curve while slowly turning, so consecutive
    frames overlap by far more than half.
    """

    def __init__(self, width: int = 320, height: int = 240, seed: int = 0, texture_size: int = 1024,
                 period_frames: int = 120):
        self.width, self.height = int(width), int(height)
        self.texture = procedural_texture(texture_size, seed)
        f = 0.8 * self.width
        self.K = np.array([[f, 0, self.width / 2], [0, f, self.height / 2], [0, 0, 1]], np.float64)
        s = texture_size
        # texture pixel (u, v) -> plane point (X, Y): the texture covers [-1, 1]^2
        self._tex_to_plane = np.array([[2.0 / s, 0, -1.0], [0, 2.0 / s, -1.0], [0, 0, 1]], np.float64)
        self.period = float(period_frames)

    def pose(self, i: int) -> np.ndarray:
        """Camera-to-world [4, 4] (OpenCV optical axes) of frame ``i``."""
        a = 2 * math.pi * i / self.period
        centre = np.array([0.35 * math.sin(a), 0.25 * math.sin(2 * a), 1.2 + 0.1 * math.cos(a)])
        yaw = 0.6 * math.sin(a)
        tilt = math.radians(12.0)
        x = np.array([math.cos(yaw), math.sin(yaw), 0.0])
        z = np.array([0.0, 0.0, -1.0])
        y = np.cross(z, x)
        r_wc = np.stack([x, y, z], axis=1)
        ct, st = math.cos(tilt), math.sin(tilt)  # tilt about the camera x axis
        r_wc = r_wc @ np.array([[1, 0, 0], [0, ct, -st], [0, st, ct]])
        m = np.eye(4)
        m[:3, :3], m[:3, 3] = r_wc, centre
        return m

    def render(self, i: int) -> np.ndarray:
        """RGB uint8 [height, width, 3] of frame ``i``."""
        import cv2

        c2w = self.pose(i)
        r_cw = c2w[:3, :3].T
        t_cw = -r_cw @ c2w[:3, 3]
        plane_to_img = self.K @ np.column_stack([r_cw[:, 0], r_cw[:, 1], t_cw])
        h = plane_to_img @ self._tex_to_plane
        return cv2.warpPerspective(self.texture, h, (self.width, self.height), flags=cv2.INTER_LINEAR,
                                   borderMode=cv2.BORDER_REFLECT)


def image_message(rgb: np.ndarray, stamp_ns: int, frame_id: str, encoding: str = "rgb8"):
    """sensor_msgs/Image from an RGB uint8 array (``tobytes``: the fast path)."""
    from sensor_msgs.msg import Image

    if encoding == "bgr8":
        rgb = rgb[..., ::-1]
    msg = Image(height=int(rgb.shape[0]), width=int(rgb.shape[1]), encoding=encoding, is_bigendian=0,
                step=int(rgb.shape[1]) * 3)
    msg.header.stamp.sec, msg.header.stamp.nanosec = divmod(int(stamp_ns), 10**9)
    msg.header.frame_id = frame_id
    msg.data = np.ascontiguousarray(rgb).tobytes()
    return msg


def compressed_message(rgb: np.ndarray, stamp_ns: int, frame_id: str, fmt: str = "jpeg"):
    """sensor_msgs/CompressedImage (jpeg or png) from an RGB uint8 array."""
    import cv2
    from sensor_msgs.msg import CompressedImage

    ok, buf = cv2.imencode(".jpg" if fmt == "jpeg" else ".png", np.ascontiguousarray(rgb[..., ::-1]))
    if not ok:
        raise RuntimeError("encoding failed")
    msg = CompressedImage(format=f"rgb8; {fmt} compressed bgr8")
    msg.header.stamp.sec, msg.header.stamp.nanosec = divmod(int(stamp_ns), 10**9)
    msg.header.frame_id = frame_id
    msg.data = buf.tobytes()
    return msg


# ------------------------------------------------------------------------------------ listener


def stamp_ns(stamp) -> int:
    return int(stamp.sec) * 10**9 + int(stamp.nanosec)


@dataclass
class Received:
    """Everything the listener got from the node, keyed by image stamp (ns) where it has one."""

    poses: dict = field(default_factory=dict)
    odoms: dict = field(default_factory=dict)
    stats: dict = field(default_factory=dict)
    status: dict = field(default_factory=dict)  # stamp -> list of FrameStatus (BUFFERED, then final)
    status_log: list = field(default_factory=list)
    paths: list = field(default_factory=list)
    tf: list = field(default_factory=list)
    diagnostics: list = field(default_factory=list)
    depth: list = field(default_factory=list)
    arrival: dict = field(default_factory=dict)  # (topic, stamp) -> perf_counter at arrival


BUFFERED_STATUS = 4  # FrameStatus.BUFFERED: the only status that is not final


def status_names() -> dict[int, str]:
    """FrameStatus code -> the name of its constant in lower case (6 -> ``dropped_inactive``).

    Read from the generated message class, so every status the message defines is named (a
    hand-written table here once missed three of them and printed bare numbers)."""
    from lingbot_map_ros.msg import FrameStatus

    return {value: name.lower() for name in dir(FrameStatus)
            if name.isupper() and isinstance(value := getattr(FrameStatus, name), int)}


def status_summary(counts: dict[int, int]) -> str:
    """``{0: 3, 6: 2}`` -> ``"3 processed, 2 dropped_inactive"`` (codes in order)."""
    names = status_names()
    return ", ".join(f"{n} {names.get(code, f'status {code}')}" for code, n in sorted(counts.items()))


def wait_matched(publishers, timeout: float, settle: float = 0.3) -> bool:
    """True once every publisher has matched a subscriber (a message sent before is lost: volatile
    durability), then ``settle`` s more so the subscriber's side has matched the publisher too; False
    after ``timeout`` s without."""
    deadline = time.monotonic() + timeout
    while any(p.get_subscription_count() == 0 for p in publishers):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    time.sleep(settle)
    return True


class Listener:
    """A separate rclpy node that talks to ``lingbot_map`` over real topics and services.

    Runs its own executor thread; every callback stores what arrived (thread-safe under ``lock``)
    and wakes ``wait_for``.
    """

    def __init__(self, node_ns: str = "/" + NODE_NAME, image_topic: str = DEMO_TOPIC, *, compressed: bool = False,
                 context=None, name: str = "lingbot_demo_camera", on_pose=None, on_diagnostics=None,
                 on_stats=None, depth: bool = False):
        import rclpy
        from diagnostic_msgs.msg import DiagnosticArray
        from geometry_msgs.msg import PoseStamped
        from nav_msgs.msg import Odometry, Path
        from rclpy.executors import SingleThreadedExecutor
        from rclpy.qos import QoSProfile, QoSReliabilityPolicy
        from sensor_msgs.msg import CompressedImage, Image
        from tf2_msgs.msg import TFMessage

        from lingbot_map_ros.msg import CacheStats, FrameStatus

        self.ns = node_ns.rstrip("/")
        self.node = rclpy.create_node(name, context=context)
        self.lock = threading.Condition()
        self.rx = Received()
        self._on_pose, self._on_diag, self._on_stats = on_pose, on_diagnostics, on_stats
        reliable = QoSProfile(depth=50, reliability=QoSReliabilityPolicy.RELIABLE)
        self.image_topic = image_topic + ("/compressed" if compressed else "")
        self.pub = self.node.create_publisher(CompressedImage if compressed else Image, self.image_topic,
                                              QoSProfile(depth=10, reliability=QoSReliabilityPolicy.RELIABLE))
        n = self.node
        n.create_subscription(PoseStamped, f"{self.ns}/pose", self._pose, reliable)
        n.create_subscription(Odometry, f"{self.ns}/odom", self._keyed("odoms"), reliable)
        n.create_subscription(CacheStats, f"{self.ns}/cache_stats", self._stats, reliable)
        n.create_subscription(FrameStatus, f"{self.ns}/frame_status", self._status, QoSProfile(depth=100))
        n.create_subscription(Path, f"{self.ns}/path", self._append("paths"), reliable)
        n.create_subscription(TFMessage, "/tf", self._append("tf"), QoSProfile(depth=100))
        n.create_subscription(DiagnosticArray, "/diagnostics", self._diag, reliable)
        self._depth_sub = (n.create_subscription(Image, f"{self.ns}/depth", self._append("depth"), reliable)
                           if depth else None)
        self.executor = SingleThreadedExecutor(context=context)
        self.executor.add_node(self.node)
        self._thread = threading.Thread(target=self._spin, daemon=True)
        self._thread.start()

    def _spin(self) -> None:
        try:
            self.executor.spin()
        except Exception:  # context shut down
            pass

    def _store(self, attr: str, key, msg) -> None:
        now = time.perf_counter()
        with self.lock:
            getattr(self.rx, attr)[key] = msg
            self.rx.arrival[(attr, key)] = now
            self.lock.notify_all()

    def _keyed(self, attr: str):
        return lambda msg: self._store(attr, stamp_ns(msg.header.stamp), msg)

    def _append(self, attr: str):
        def cb(msg):
            with self.lock:
                getattr(self.rx, attr).append(msg)
                self.lock.notify_all()
        return cb

    def _pose(self, msg) -> None:
        self._store("poses", stamp_ns(msg.header.stamp), msg)
        if self._on_pose:
            self._on_pose(msg)

    def _stats(self, msg) -> None:
        self._store("stats", stamp_ns(msg.header.stamp), msg)
        if self._on_stats:
            self._on_stats(msg)

    def _status(self, msg) -> None:
        with self.lock:
            self.rx.status.setdefault(stamp_ns(msg.header.stamp), []).append(msg)
            self.rx.status_log.append(msg)
            self.lock.notify_all()

    def _diag(self, msg) -> None:
        with self.lock:
            self.rx.diagnostics.append(msg)
            self.lock.notify_all()
        if self._on_diag:
            self._on_diag(msg)

    def wait_for(self, predicate, timeout: float) -> bool:
        """Wait until ``predicate(rx)`` is true (checked under the lock)."""
        deadline = time.monotonic() + timeout
        with self.lock:
            while not predicate(self.rx):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.lock.wait(min(left, 0.2))
        return True

    def final_status(self, stamp: int):
        """The status that settles a frame (None while buffered or not yet seen)."""
        for s in self.rx.status.get(stamp, []):
            if s.status != BUFFERED_STATUS:
                return s
        return None

    def wait_connected(self, timeout: float = 15.0) -> bool:
        """The node subscribes to our images and publishes the status topic we listen to (and, when we read
        its depth, our depth subscription is matched: that publisher is on the node's second participant).
        ``ns`` may be a camera's (``/lingbot_map/front``), which has no path: the path is not waited for."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if (self.pub.get_subscription_count() > 0
                    and self.node.count_publishers(f"{self.ns}/frame_status") > 0
                    and self.node.count_publishers(f"{self.ns}/pose") > 0
                    and (self._depth_sub is None or self._depth_sub.get_publisher_count() > 0)):
                time.sleep(0.3)  # let the other side match us too
                return True
            time.sleep(0.05)
        return False

    def call(self, srv_type, name: str, request, timeout: float = 30.0):
        """Call a service and wait for its response (None on timeout)."""
        client = self.node.create_client(srv_type, name)
        try:
            if not client.wait_for_service(timeout_sec=min(timeout, 15.0)):
                return None
            future = client.call_async(request)
            done = threading.Event()
            future.add_done_callback(lambda _f: done.set())
            if not done.wait(timeout):
                return None
            return future.result()
        finally:
            self.node.destroy_client(client)

    def close(self) -> None:
        """Stop the executor and wait for its thread before the node goes (a spinning thread over a
        destroyed node or context is what ends a process in a C++ abort)."""
        self.executor.shutdown(timeout_sec=2.0)
        self._thread.join(timeout=5.0)
        self.node.destroy_node()


# ------------------------------------------------------------------------------------ printing


_LEVELS = {0: "OK", 1: "WARN", 2: "ERROR", 3: "STALE"}


def format_diagnostics(msg) -> str:
    lines = []
    for s in msg.status:
        level = s.level if isinstance(s.level, int) else int.from_bytes(s.level, "little")
        kv = {v.key: v.value for v in s.values}
        keys = {
            "lingbot_map: input": ("rate_hz", "frames_received", "frames_rejected"),
            "lingbot_map: inference": ("latency_median_ms", "latency_p90_ms", "frames_processed",
                                       "frames_dropped_queue", "session_id"),
            "lingbot_map: kv cache": ("frames_stored", "window_frames", "frames_evicted", "free_pages",
                                      "special_pages", "visible_keys"),
            "lingbot_map: backend": ("backend", "dtype", "device", "model_preset"),
        }.get(s.name, ())
        extra = " ".join(f"{k}={kv[k]}" for k in keys if k in kv)
        lines.append(f"  [{_LEVELS.get(level, level):5s}] {s.name}: {s.message}  ({extra})")
    return "\n".join(lines)


def _level(s) -> int:
    return s.level if isinstance(s.level, int) else int.from_bytes(s.level, "little")
