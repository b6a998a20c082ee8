"""``lingbot_map_demo``: the node on a synthetic camera stream over loopback, end to end.

It starts ``lingbot_map_node`` in a child process, plays a textured plane seen by a smoothly moving
camera (consecutive frames overlap) into its ``image`` topic, prints every pose and the cache
statistics as they come back, prints the node's ``/diagnostics``, and exits 0 once every frame it
sent is accounted for (processed, dropped or rejected: each has a ``~/frame_status``).

Without ``--checkpoint`` the node runs the ``tiny`` preset with random weights: the whole pipeline
(topics, KV cache, eviction, diagnostics) is real, the poses are not meaningful.

The helpers here (environment, node process, synthetic camera, listener) are reused by
``node_overhead`` and the tests.
"""
from __future__ import annotations

import argparse
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from .cli import OneLineParser, UsageError, one_line, output_path
from .common import add_session_options, check_session_args

NODE_NAME = "lingbot_map"
DEMO_TOPIC = "/lingbot_demo/camera/image"
DEMO_CAMERA_FRAME = "demo_camera_optical"
DEMO_SESSION_OPTIONS = ("checkpoint", "model_preset", "device", "dtype", "attention_backend", "seed", "scale_frames",
                        "sliding_window", "keyframe_interval", "camera_iterations")


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
            if "ready:" in line:
                self.ready.set()
            reason = failure_reason(line)
            if reason and self.failure is None:
                self.failure = reason
                self.ready.set()  # stop waiting at once: the node told us why it will never be ready
            if self._echo:
                print(self._prefix + line, flush=True)
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

    def stop(self, sig: int = 2, timeout: float = 30.0) -> int:
        """Send SIGINT (default) or SIGTERM and wait; returns the exit code (kills after ``timeout``)."""
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
        from lingbot_map_ros.msg import CacheStats, FrameStatus
        from nav_msgs.msg import Odometry, Path
        from rclpy.executors import SingleThreadedExecutor
        from rclpy.qos import QoSProfile, QoSReliabilityPolicy
        from sensor_msgs.msg import CompressedImage, Image
        from tf2_msgs.msg import TFMessage

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
        if depth:
            n.create_subscription(Image, f"{self.ns}/depth", self._append("depth"), reliable)
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
        """The node subscribes to our images and publishes the status topic we listen to."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if (self.pub.get_subscription_count() > 0
                    and self.node.count_publishers(f"{self.ns}/frame_status") > 0
                    and self.node.count_publishers(f"{self.ns}/pose") > 0):
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


# ------------------------------------------------------------------------------------ main


def parse_args(argv=None) -> argparse.Namespace:
    p = OneLineParser(
        prog="lingbot_map_demo",
        description="Run lingbot_map_node on a synthetic camera over loopback; print poses and cache diagnostics.",
    )
    p.add_argument("--frames", type=int, default=40, help="frames to send (40: eviction happens)")
    p.add_argument("--width", type=int, default=320, help="image width in pixels")
    p.add_argument("--height", type=int, default=240, help="image height in pixels")
    # a short window by default, so that eviction happens within the demo's 40 frames
    add_session_options(p, names=DEMO_SESSION_OPTIONS, overrides={"scale_frames": 4, "sliding_window": 8},
                        with_depth=False)
    p.add_argument("--rate", type=float, default=0.0,
                   help="camera rate in Hz; 0 (default) = send the next frame when the node has taken the last")
    p.add_argument("--compressed", action="store_true", help="send JPEG sensor_msgs/CompressedImage")
    p.add_argument("--tum", default="", help="also ask the node to save its trajectory (TUM) here")
    p.add_argument("--plot", default="", help="write a figure (.png/.pdf/.svg): trajectory top view, latency per "
                   "frame, KV-cache pages over frames")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds for the whole run")
    p.add_argument("--quiet-node", action="store_true", help="do not echo the node's log")
    p.add_argument("--domain-id", type=int, default=None, help="ROS_DOMAIN_ID (0..101; default: env or derived)")
    args = p.parse_args(argv)
    check_session_args(p, args)
    try:
        if args.frames < 1 or args.width < 8 or args.height < 8:
            raise UsageError("--frames must be >= 1 and --width/--height >= 8")
        if args.tum:
            output_path(args.tum, "--tum", (".tum", ".txt"))
        if args.plot:
            from .plotting import PLOT_SUFFIXES, available

            output_path(args.plot, "--plot", PLOT_SUFFIXES)
            if available():
                raise UsageError(f"--plot {args.plot}: {available()}")
    except UsageError as exc:
        p.error(str(exc))
    return args


def _plot_demo(path: str, listener: "Listener", stamps: list[int]) -> dict:
    """The demo's figure from what came back over the topics (poses and cache statistics)."""
    from .plotting import RunSeries, plot_run

    with listener.lock:
        got = [(listener.rx.poses[s], listener.rx.stats[s]) for s in stamps
               if s in listener.rx.poses and s in listener.rx.stats]
    series = RunSeries(
        frame=np.arange(len(got)),
        position=np.array([[p.pose.position.x, p.pose.position.y, p.pose.position.z] for p, _ in got]).reshape(-1, 3),
        latency_ms=np.array([st.latency_ms for _, st in got], dtype=np.float64),
        cache={"scale": np.array([st.scale_pages for _, st in got]), "window": np.array([st.window_pages for _, st in got]),
               "free": np.array([st.free_pages for _, st in got]), "special": np.array([st.special_pages for _, st in got])},
        session=np.array([st.session_id for _, st in got]),
    )
    drawn = plot_run(path, series, title=f"lingbot_map_demo: {len(got)} frames")
    print(f"[demo] figure ({len(got)} frames) -> {path}", flush=True)
    return drawn


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv=None) -> int:
    args = parse_args(argv)
    prepare_ros_env(args.domain_id)  # before rclpy is imported anywhere
    import rclpy
    import rclpy.signals
    from std_srvs.srv import Trigger

    if not args.checkpoint:
        bar = "!" * 78
        print(f"{bar}\n!! NO CHECKPOINT: the node runs the 'tiny' preset with RANDOM WEIGHTS.\n"
              f"!! Topics, KV cache, eviction and diagnostics are real; the POSES ARE NOT MEANINGFUL.\n"
              f"!! Pass --checkpoint /path/to/lingbot-map.pt for real poses.\n{bar}", flush=True)
    print(f"[demo] ROS_DOMAIN_ID={os.environ['ROS_DOMAIN_ID']} ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST "
          f"ROS_LOG_DIR={os.environ['ROS_LOG_DIR']}", flush=True)

    tmp = tempfile.mkdtemp(prefix="lingbot_demo_")
    params = {
        **{name: getattr(args, name) for name in DEMO_SESSION_OPTIONS},
        "checkpoint": os.path.abspath(args.checkpoint) if args.checkpoint else "",
        "qos_reliability": "reliable", "image_transport": "compressed" if args.compressed else "raw",
        "trajectory_path": os.path.abspath(args.tum) if args.tum else os.path.join(tmp, "trajectory.tum"),
        "diagnostics_period": 1.0,
    }
    params_file = write_params_file(os.path.join(tmp, "demo_params.yaml"), params)
    t_start = time.monotonic()
    node = NodeProcess(["--params-file", params_file, "-r", f"image:={DEMO_TOPIC}"], echo=not args.quiet_node)
    # Our own signal handling: SIGINT/SIGTERM end the demo (and stop the node) from any wait.
    rclpy.init(signal_handler_options=rclpy.signals.SignalHandlerOptions.NO)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    listener = None
    rc = 1
    try:
        camera = SyntheticCamera(args.width, args.height, seed=args.seed)
        pending_print: dict = {}
        print_lock = threading.Lock()
        counters = {"evicted_max": 0, "diag_warn_cache": 0}

        def maybe_print(stamp: int) -> None:
            with print_lock:
                pose = listener.rx.poses.get(stamp) if listener else None
                st = listener.rx.stats.get(stamp) if listener else None
                if pose is None or st is None or stamp in pending_print:
                    return
                pending_print[stamp] = True
            p, q = pose.pose.position, pose.pose.orientation
            counters["evicted_max"] = max(counters["evicted_max"], st.frames_evicted)
            kind = "scale" if st.is_scale_frame else ("key" if st.is_keyframe else "non-key")
            print(f"[pose] #{st.frame_index:3d} s{st.session_id} t={stamp / 1e9:.3f} {pose.header.frame_id}: "
                  f"p=({p.x:+.3f},{p.y:+.3f},{p.z:+.3f}) q=({q.x:+.3f},{q.y:+.3f},{q.z:+.3f},{q.w:+.3f}) "
                  f"{kind:7s} | cache stored={st.frames_stored} scale={st.scale_frames} window={st.window_frames} "
                  f"evicted={st.frames_evicted} free_pages={st.free_pages}/{st.patch_pages_total} "
                  f"special_pages={st.special_pages}/{st.special_pages_capacity} rope={st.rope_frame_index} "
                  f"keys={st.visible_keys} | {st.latency_ms:.0f} ms model, {st.node_overhead_ms:.1f} ms node",
                  flush=True)

        def on_diag(msg) -> None:
            if not any(s.name.startswith("lingbot_map") for s in msg.status):
                return
            print("[diagnostics]\n" + format_diagnostics(msg), flush=True)

        listener = Listener(compressed=args.compressed, on_pose=lambda m: maybe_print(stamp_ns(m.header.stamp)),
                            on_stats=lambda m: maybe_print(stamp_ns(m.header.stamp)), on_diagnostics=on_diag)
        if not node.wait_ready(max(30.0, args.timeout / 2)):
            # the node's own reason, at once; the node (alive but unconfigured) is stopped by its PID below
            print(f"[demo] FAILED: the node cannot run: {one_line(node.why_not_ready(), 600)}", flush=True)
            return 1
        if not listener.wait_connected(30.0):
            print("[demo] FAILED: could not connect to the node over loopback", flush=True)
            return 1
        print(f"[demo] node ready after {time.monotonic() - t_start:.1f} s; sending {args.frames} frames "
              f"{args.width}x{args.height} {'(JPEG) ' if args.compressed else ''}"
              f"{'at %.1f Hz' % args.rate if args.rate > 0 else 'as fast as the node takes them'}", flush=True)

        deadline = t_start + args.timeout
        base_ns = time.time_ns() // 10**6 * 10**6
        stamps = []
        make = compressed_message if args.compressed else image_message
        for i in range(args.frames):
            stamp = base_ns + i * 100_000_000  # a 10 Hz camera clock
            stamps.append(stamp)
            t_send = time.monotonic()
            listener.pub.publish(make(camera.render(i), stamp, DEMO_CAMERA_FRAME))
            if args.rate > 0:
                time.sleep(max(0.0, 1.0 / args.rate - (time.monotonic() - t_send)))
            elif not listener.wait_for(lambda rx, s=stamp: s in rx.status, max(1.0, deadline - time.monotonic())):
                break
            if time.monotonic() > deadline:
                break
        all_done = listener.wait_for(
            lambda rx: all(listener.final_status(s) is not None for s in stamps), max(1.0, deadline - time.monotonic())
        )
        listener.wait_for(lambda rx: all(s in rx.stats for s in rx.poses), 3.0)
        for s in stamps:
            maybe_print(s)
        with listener.lock:
            finals = [listener.final_status(s) for s in stamps]
        processed = sum(1 for f in finals if f is not None and f.status == 0)
        other = sum(1 for f in finals if f is not None and f.status != 0)
        missing = sum(1 for f in finals if f is None)
        if args.tum:
            resp = listener.call(Trigger, f"/{NODE_NAME}/save_trajectory", Trigger.Request())
            print(f"[demo] save_trajectory: {resp.message if resp else 'no answer'}", flush=True)
        listener.wait_for(lambda rx: len(rx.diagnostics) > 0, 3.0)
        print(f"[demo] sent {len(stamps)} frames: {processed} processed, {other} dropped/rejected, "
              f"{missing} unaccounted; eviction observed: {'yes' if counters['evicted_max'] else 'no'} "
              f"(max evicted {counters['evicted_max']}); {time.monotonic() - t_start:.1f} s", flush=True)
        if args.plot:
            _plot_demo(args.plot, listener, stamps)
        if args.checkpoint == "":
            print("[demo] reminder: random weights - the poses above are NOT meaningful", flush=True)
        rc = 0 if all_done and len(stamps) == args.frames and processed > 0 else 1
        if rc:
            print("[demo] FAILED: timed out before every frame was accounted for", flush=True)
    except KeyboardInterrupt:
        print("[demo] interrupted", flush=True)
        rc = 130
    finally:
        if listener is not None:
            listener.close()
        rclpy.try_shutdown()
        node_rc = node.stop()
        print(f"[demo] node exited with code {node_rc}", flush=True)
        if rc == 0 and node_rc != 0:
            rc = 1
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
