"""Node overhead: what the ROS layer adds to the model, per frame (message in -> pose out).

    python -m lingbot_map_ros.tools.node_overhead [--frames 40] [--width 640 --height 480] [--rate 0]

Starts ``lingbot_map_node`` (tiny preset, CPU, reliable QoS) in a child process on loopback and
sends synthetic frames: by default one at a time (the next when the previous pose is back, so
nothing queues), with ``--rate HZ`` at a fixed rate like a camera (the node then drops what it
cannot take, and preprocessing overlaps the model). Per processed frame after the scale frames it
measures:

* end to end: ``publish()`` of the image in this process -> arrival of its ``~/pose`` here;
* session: the model time the node reports for that frame (``~/cache_stats`` ``latency_ms``);
* end to end minus session: everything that is not the model - DDS transport of the image and the
  pose both ways, conversion, preprocessing, hand-offs, session bookkeeping, publishing, wake-ups;
* node (self-measured): conversion + preprocessing + publishing as the node times them
  (``node_overhead_ms``).

From the node's /diagnostics it adds the medians of its parts, among them the inference thread's
own time per frame besides the model (what limits the node's rate together with the model: the
preprocessing runs on a thread of its own, overlapped with the model).

``--robot odometry`` or ``--robot depth`` runs the node as on a robot: this process plays the robot's
TF (a static ``base_link -> camera_link -> optical`` and ``odom -> base_link`` at each image stamp,
plus a registered 32FC1 depth image for ``depth``) and the node runs with ``base_frame``,
``odom_frame`` and that ``scale_source``. The table then has rows for what the TF lookups and the
scale cost the inference thread per frame (target <= 0.5 ms), as the node measures it: wall time,
and the thread's own CPU time (the verdict), which other threads and processes do not inflate.

``--cameras N`` runs the several-camera mode on an emulated rig of N cameras and prints the node's own
time per camera per frame instead (``overhead_cameras.py``: TF, anchoring, hand-over, publishing; target
<= 0.5 ms).

Prints a table (median / p90 / max in ms) and whether the targets (<= 5 ms, <= 0.5 ms) are met.
"""
from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time

from .cli import OneLineParser
from .common import add_session_options, check_session_args

TARGET_MS = 5.0
OVERHEAD_OPTIONS = ("checkpoint", "model_preset", "device", "scale_frames", "sliding_window", "fast_resize")
OVERHEAD_DEFAULTS = {"model_preset": "tiny", "device": "cpu", "scale_frames": 2, "sliding_window": 8}
ROBOT_TARGET_MS = 0.5  # TF lookups + scale on the inference thread, per frame
PART_KEYS = ("convert", "handoff", "preprocess", "ready_wait", "publish", "session_bookkeeping",
             "inference_thread_minus_model", "in_node_minus_model")


def _pct(values, q):
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(q * len(s) + 0.5)) - 1))]


class _Robot:
    """The robot's side for ``--robot``: static camera mount, odometry at each image stamp, depth.

    As on a robot, where the camera driver, the odometry and the depth camera are separate processes, the
    transforms and the depth go out from participants of their own, not from the one that sends the colour
    images: from one participant the images (over 512 kB) would delay the transforms by up to the
    middleware's heartbeat, 3 s (``ros/large_outputs.py``), and frames would end NO_TRANSFORM."""

    def __init__(self, listener, camera_frame: str, size: tuple[int, int], with_depth: bool, mounts=None):
        """``mounts``: ``[(link, optical frame, xyz, quaternion xyzw of base_link -> link)]`` of several
        cameras (``--cameras``); default the one camera 0.2 m ahead of the body looking forward."""
        import numpy as np
        import tf2_ros
        from geometry_msgs.msg import TransformStamped
        from rclpy.qos import QoSProfile, QoSReliabilityPolicy
        from sensor_msgs.msg import Image

        from ..ros.large_outputs import participant_node

        self._np, self._tf_type, self._image_type = np, TransformStamped, Image
        domain = listener.node.context.get_domain_id()
        names = ("lingbot_overhead_robot_tf", "lingbot_overhead_depth_camera")[:2 if with_depth else 1]
        self._participants = [participant_node(name, domain) for name in names]  # [(node, context)]
        node = self._participants[0][0]
        self._moving = tf2_ros.TransformBroadcaster(node)
        self._static = tf2_ros.StaticTransformBroadcaster(node)  # kept: it owns the latched publisher
        mounts = mounts or [("camera_link", camera_frame, (0.2, 0.0, 0.45), (0, 0, 0, 1))]
        self._static.sendTransform([t for link, optical, xyz, q in mounts
                                    for t in (self._tf("base_link", link, xyz, q, 0),
                                              self._tf(link, optical, (0, 0, 0), (-0.5, 0.5, -0.5, 0.5), 0))])
        self._depth_pub = self._participants[-1][0].create_publisher(
            Image, "/lingbot_overhead/depth", QoSProfile(depth=10, reliability=QoSReliabilityPolicy.RELIABLE)) \
            if with_depth else None
        w, h = size
        self._depth = np.full((h, w), 2.0, np.float32).tobytes()  # a wall 2 m away, registered to the colour
        self._size = size
        self._camera_frame = camera_frame

    def _tf(self, parent, child, xyz, q, stamp):
        t = self._tf_type()
        t.header.frame_id, t.child_frame_id = parent, child
        t.header.stamp.sec, t.header.stamp.nanosec = divmod(int(stamp), 10**9)
        t.transform.translation.x, t.transform.translation.y, t.transform.translation.z = (float(v) for v in xyz)
        r = t.transform.rotation
        r.x, r.y, r.z, r.w = (float(v) for v in q)  # an int here reaches tf2 as NaN
        return t

    def wait_matched(self, timeout: float = 30.0) -> bool:
        """The node subscribes to the mounts (latched /tf_static: only the node reads it) and the depth."""
        from .node_client import wait_matched

        pubs = [self._static.pub_tf] + ([self._depth_pub] if self._depth_pub is not None else [])
        # settle: the node's side matches too, and its TF listener hears the static mounts
        return wait_matched(pubs, timeout, settle=0.5)

    def close(self) -> None:
        from ..ros.large_outputs import close_participant

        for node, context in self._participants:
            close_participant(node, context)

    def before(self, i: int, stamp: int) -> None:
        """What the robot sends for frame ``i`` before its image: odometry (moving 2 cm per frame), depth."""
        self._moving.sendTransform(self._tf("odom", "base_link", (0.02 * i, 0.0, 0.0), (0, 0, 0, 1), stamp))
        if self._depth_pub is not None:
            w, h = self._size
            msg = self._image_type(height=h, width=w, encoding="32FC1", is_bigendian=0, step=4 * w, data=self._depth)
            msg.header.stamp.sec, msg.header.stamp.nanosec = divmod(int(stamp), 10**9)
            msg.header.frame_id = self._camera_frame
            self._depth_pub.publish(msg)


def _outcome_in(listener, rx, stamp: int) -> bool:
    """The frame's outputs are all here: its pose and stats, or its stats and a PROCESSED status that
    says the pose was withheld (a metric scale still estimating), or another final status."""
    final = listener.final_status(stamp)
    if stamp in rx.poses and stamp in rx.stats:
        return True
    return final is not None and (final.status != 0 or (bool(final.reason) and stamp in rx.stats))


def _send(args, listener, images, image_message, camera_frame, robot=None) -> list[tuple[int, float]]:
    """Publish ``args.frames`` frames; (stamp, perf_counter at publish) of each."""
    base = time.time_ns()
    deadline = time.monotonic() + args.timeout
    sent = []
    period = 1.0 / args.rate if args.rate > 0 else 0.0
    t_next = time.perf_counter()
    for i in range(args.frames):
        stamp = base + i * 33_000_000
        msg = image_message(images[i % len(images)], stamp, camera_frame)
        if robot is not None:
            robot.before(i, stamp)
        if period:
            time.sleep(max(0.0, t_next - time.perf_counter()))
            t_next += period
        t_send = time.perf_counter()
        listener.pub.publish(msg)
        sent.append((stamp, t_send))
        if not period:  # one at a time: wait for this frame's outcome before the next
            if i >= args.scale_frames - 1:
                listener.wait_for(lambda rx, s=stamp: _outcome_in(listener, rx, s),
                                  max(1.0, deadline - time.monotonic()))
            else:
                listener.wait_for(lambda rx, s=stamp: s in rx.status, max(1.0, deadline - time.monotonic()))
        if time.monotonic() > deadline:
            break
    if period:  # the newest frame is never the one replaced: once it is out, everything is
        last = sent[-1][0]
        listener.wait_for(lambda rx: listener.final_status(last) is not None and last in rx.stats,
                          max(1.0, deadline - time.monotonic()))
    return sent


def main(argv=None) -> int:
    p = OneLineParser(prog="node_overhead", description=__doc__.split("\n\n")[0])
    p.add_argument("--frames", type=int, default=40, help="frames to send")
    p.add_argument("--width", type=int, default=640, help="image width (rgb8)")
    p.add_argument("--height", type=int, default=480, help="image height")
    p.add_argument("--rate", type=float, default=0.0,
                   help="send at this many Hz like a camera (0: one at a time, each after the previous pose)")
    p.add_argument("--robot", choices=("none", "odometry", "depth"), default="none",
                   help="run on an emulated robot: base_frame, odom_frame and this scale_source (TF + scale row)")
    p.add_argument("--cameras", type=int, default=0, help="the several-camera mode with this many emulated "
                   "cameras (2..8) on a rig this tool plays (base_frame, odom_frame): a table of the node's own time "
                   "per camera per frame (TF, anchoring, hand-over, publishing; target <= 0.5 ms); 0: one camera")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds for the whole run")
    p.add_argument("--domain-id", type=int, default=None, help="ROS_DOMAIN_ID (default: env or derived)")
    # the node parameters it sets: names, types, ranges and help from the settings table; its own
    # defaults (a small CPU run) where they differ from the node's
    add_session_options(p, names=OVERHEAD_OPTIONS, overrides=OVERHEAD_DEFAULTS, with_depth=False)
    args = p.parse_args(argv)
    check_session_args(p, args)
    if args.frames < args.scale_frames + 1:
        p.error(f"--frames must exceed --scale-frames ({args.scale_frames}): scale frames are not measured")
    if args.rate < 0:
        p.error("--rate must be >= 0")
    if args.cameras:
        from ..core.settings import MAX_CAMERAS

        if not 2 <= args.cameras <= MAX_CAMERAS:
            p.error(f"--cameras must be 0 or 2..{MAX_CAMERAS} (got {args.cameras})")
        if args.robot != "none" or args.rate > 0:
            p.error("--cameras runs its own rig, one frame of every camera at a time: without --robot and --rate")
        from .overhead_cameras import run_cameras

        return run_cameras(args, {
            **{name: getattr(args, name) for name in OVERHEAD_OPTIONS},
            "checkpoint": os.path.abspath(args.checkpoint) if args.checkpoint else ""})

    from .node_client import (
        DEMO_CAMERA_FRAME,
        DEMO_TOPIC,
        Listener,
        NodeProcess,
        SyntheticCamera,
        image_message,
        prepare_ros_env,
        write_params_file,
    )

    prepare_ros_env(args.domain_id)  # before rclpy
    import rclpy

    tmp = tempfile.mkdtemp(prefix="lingbot_overhead_")
    params = write_params_file(os.path.join(tmp, "params.yaml"), {
        **{name: getattr(args, name) for name in OVERHEAD_OPTIONS},
        "checkpoint": os.path.abspath(args.checkpoint) if args.checkpoint else "",
        "qos_reliability": "reliable", "publish_tf": True,
        **({"base_frame": "base_link", "odom_frame": "odom", "scale_source": args.robot, "scale_min_travel": 0.1}
           if args.robot != "none" else {}),
    })
    node = NodeProcess(["--params-file", params, "-r", f"image:={DEMO_TOPIC}", "-r", "depth:=/lingbot_overhead/depth"],
                       echo=False)
    rclpy.init()
    listener = Listener(name="lingbot_overhead_probe")
    rows = []
    robot = None
    breakdown = {}
    robot_cost = {}
    outcomes: dict[int, int] = {}
    pose_times: list[float] = []  # arrival of the measured frames' poses
    try:
        if not node.wait_ready(180) or not listener.wait_connected(30):
            print("node did not start:\n" + node.output(), file=sys.stderr)
            return 1
        camera = SyntheticCamera(args.width, args.height)
        images = [camera.render(i) for i in range(min(args.frames, 16))]  # rendering is not measured
        robot = _Robot(listener, DEMO_CAMERA_FRAME, (args.width, args.height), args.robot == "depth") \
            if args.robot != "none" else None
        if robot is not None and not robot.wait_matched():
            print("the node did not subscribe to the robot's transforms or depth", file=sys.stderr)
            return 1
        sent = _send(args, listener, images, image_message, DEMO_CAMERA_FRAME, robot)
        with listener.lock:
            for stamp, t_send in sent:
                final = listener.final_status(stamp)
                if final is not None:
                    outcomes[final.status] = outcomes.get(final.status, 0) + 1
                st = listener.rx.stats.get(stamp)
                t_pose = listener.rx.arrival.get(("poses", stamp))
                if st is None or t_pose is None or st.is_scale_frame:
                    continue  # scale frames share one joint call: no per-frame session time
                e2e = (t_pose - t_send) * 1e3
                rows.append((e2e, st.latency_ms, e2e - st.latency_ms, st.node_overhead_ms))
                pose_times.append(t_pose)
        listener.wait_for(lambda rx: len(rx.diagnostics) > 0, 3.0)
        time.sleep(1.2)  # one more diagnostics period: the breakdown covers every frame
        if listener.rx.diagnostics:
            for status in listener.rx.diagnostics[-1].status:
                if status.name == "lingbot_map: inference":
                    breakdown = {kv.key: kv.value for kv in status.values}
                if status.name in ("lingbot_map: tf", "lingbot_map: scale"):
                    robot_cost.update({kv.key: kv.value for kv in status.values})
    finally:
        if robot is not None:
            robot.close()
        listener.close()
        rclpy.try_shutdown()
        node.stop()
    if not rows:
        print(f"no frames measured: final statuses {outcomes}; tf/scale: "
              f"{ {k: robot_cost.get(k) for k in ('state', 'problem', 'published_edge', 'last_missing_reason')} }",
              file=sys.stderr)
        return 1
    span = max(pose_times) - min(pose_times)
    _report(args, rows, breakdown, outcomes, (len(pose_times) - 1) / span if span > 0 else float("nan"), robot_cost)
    return 0


def _report(args, rows, breakdown: dict, outcomes: dict, rate: float, robot_cost: dict) -> None:
    cols = list(zip(*rows))
    names = ["message in -> pose out (end to end)", "session (model) time", "end to end minus session",
             "node self-measured (convert+preprocess+publish)"]
    mode = f"at {args.rate:g} Hz" if args.rate > 0 else "one at a time"
    print(f"\nnode overhead, {args.width}x{args.height} rgb8, preset {args.model_preset} on {args.device}, "
          f"{len(rows)} frames after {args.scale_frames} scale frames, sent {mode}, reliable QoS, loopback")
    print(f"| {'ms per frame':48s} | median |    p90 |    max |")
    print(f"|{'-' * 50}|-------:|-------:|-------:|")
    for name, col in zip(names, cols):
        print(f"| {name:48s} | {statistics.median(col):6.2f} | {_pct(col, 0.9):6.2f} | {max(col):6.2f} |")
    if args.robot != "none" and "tf_scale_median_ms" in robot_cost:
        for kind, label in (("", "wall"), ("cpu_", "thread CPU")):
            cost = [float(robot_cost[f"tf_scale_{kind}{k}_ms"]) for k in ("median", "p90", "max")]
            name = f"TF lookups + {args.robot} scale ({label})"
            print(f"| {name:48s} | {cost[0]:6.3f} | {cost[1]:6.3f} | {cost[2]:6.3f} |")
    parts = {k: breakdown.get(f"{k}_median_ms") for k in PART_KEYS if f"{k}_median_ms" in breakdown}
    if parts:
        print("node-side medians (ms, /diagnostics): " + ", ".join(f"{k} {v}" for k, v in parts.items()))
    model = statistics.median(cols[1])
    own = parts.get("inference_thread_minus_model")
    if own not in (None, "nan"):
        own_ms = float(own)
        print(f"inference thread per frame: model {model:.2f} ms + node {own_ms:.2f} ms -> at most "
              f"{1000.0 / (model + own_ms):.1f} frames/s; preprocessing ({parts.get('preprocess', '?')} ms) runs on "
              f"its own thread ({breakdown.get('preprocess_overlapped_frames', '?')} frames preprocessed while the "
              "model ran the previous one)")
    if args.rate > 0:
        from .node_client import status_summary

        summary = status_summary(outcomes)
        print(f"sent at {args.rate:g} Hz: {summary}; poses out at {rate:.2f} per second after the scale frames")
    if args.robot != "none" and "tf_scale_median_ms" in robot_cost:
        cost = float(robot_cost["tf_scale_cpu_median_ms"])
        print(f"TF lookups + scale on the inference thread, median {cost:.3f} ms of its CPU time "
              f"({float(robot_cost['tf_scale_median_ms']):.3f} ms wall, which includes waiting for the GIL and "
              "the cores): "
              f"{'meets' if cost <= ROBOT_TARGET_MS else 'MISSES'} the <= {ROBOT_TARGET_MS} ms target (scale "
              f"{robot_cost.get('state', '?')} at {robot_cost.get('value', '?')}, published edge "
              f"{robot_cost.get('published_edge', '?')})")
    med = statistics.median(cols[2])
    verdict = "meets" if med <= TARGET_MS else "MISSES"
    print(f"\nend to end minus session, median {med:.2f} ms: {verdict} the <= {TARGET_MS:.0f} ms target "
          f"(node's own part {statistics.median(cols[3]):.2f} ms; the rest is DDS transport of the "
          f"{args.width * args.height * 3 / 1e6:.1f} MB image and the pose, plus executor wake-ups"
          + ("; at a fixed rate it includes the wait for the model to finish the previous frame)" if args.rate > 0
             else ")"))


if __name__ == "__main__":
    raise SystemExit(main())
