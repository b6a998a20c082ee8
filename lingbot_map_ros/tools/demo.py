"""``lingbot_map_demo``: the node on a synthetic camera stream over loopback, end to end.

It starts ``lingbot_map_node`` in a child process, plays a textured plane seen by a smoothly moving
camera (consecutive frames overlap) into its ``image`` topic, prints every pose and the cache
statistics as they come back, prints the node's ``/diagnostics``, and exits 0 once every frame it
sent is accounted for (processed, dropped or rejected: each has a ``~/frame_status``).

Without ``--checkpoint`` the node runs the ``tiny`` preset with random weights: the whole pipeline
(topics, KV cache, eviction, diagnostics) is real, the poses are not meaningful.

It uses only the public client pieces of ``tools/node_client.py`` (node process, synthetic
camera, listener), which ``node_overhead`` and the tests use too.
"""
from __future__ import annotations

import argparse
import os
import signal
import tempfile
import threading
import time

import numpy as np

from .cli import OneLineParser, UsageError, one_line, output_path
from .common import add_session_options, check_session_args
from .node_client import (
    DEMO_CAMERA_FRAME,
    DEMO_TOPIC,
    NODE_NAME,
    Listener,
    NodeProcess,
    SyntheticCamera,
    compressed_message,
    format_diagnostics,
    image_message,
    prepare_ros_env,
    stamp_ns,
    write_params_file,
)

DEMO_SESSION_OPTIONS = ("checkpoint", "model_preset", "device", "dtype", "attention_backend", "seed", "scale_frames",
                        "sliding_window", "keyframe_interval", "camera_iterations")



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
        cache={
            "scale": np.array([st.scale_pages for _, st in got]),
            "window": np.array([st.window_pages for _, st in got]),
            "free": np.array([st.free_pages for _, st in got]),
            "special": np.array([st.special_pages for _, st in got]),
        },
        session=np.array([st.session_id for _, st in got]),
    )
    drawn = plot_run(path, series, title=f"lingbot_map_demo: {len(got)} frames")
    print(f"[demo] figure ({len(got)} frames) -> {path}", flush=True)
    return drawn


class CameraClock:
    """The demo camera's shutter: the stamp of each frame is the wall time it was taken.

    At ``rate`` > 0 frames are due at ``t0 + i / rate`` (an absolute schedule: no drift from the time
    spent rendering and publishing), so consecutive stamps are ``1 / rate`` apart as a real camera's
    would be (a frame taken late is stamped when it is taken, and the schedule moves on from there);
    at 0 a frame is taken when the node has settled the previous one. Stamps are whole
    milliseconds (easy to read in the pose lines) and strictly increasing.
    """

    def __init__(self, rate: float, now_ns=time.time_ns, sleep=time.sleep) -> None:
        self.period_ns = round(1e9 / rate) if rate > 0 else 0
        self._now_ns, self._sleep = now_ns, sleep
        self._t0: int | None = None
        self._count = 0
        self._last = -1

    def next_stamp(self) -> int:
        now = self._now_ns()
        if self._t0 is None:
            self._t0 = now
        stamp = now
        if self.period_ns:
            due = self._t0 + self._count * self.period_ns
            if due > now:
                self._sleep((due - now) / 1e9)
                stamp = due
            elif now - due >= self.period_ns:  # fell behind (a slow render): go on from now, no burst
                self._t0 = now - self._count * self.period_ns
        self._count += 1
        stamp = max(stamp // 10**6 * 10**6, self._last + 10**6)
        self._last = stamp
        return stamp


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
            # The line is printed under the lock: a caller that finds the stamp taken returns only
            # once it is on the screen, so the summary can never overtake the last pose line.
            with print_lock:
                pose = listener.rx.poses.get(stamp) if listener else None
                st = listener.rx.stats.get(stamp) if listener else None
                if pose is None or st is None or stamp in pending_print:
                    return
                pending_print[stamp] = True
                print_pose(stamp, pose, st)

        def print_pose(stamp: int, pose, st) -> None:
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
        stamps = []
        make = compressed_message if args.compressed else image_message
        clock = CameraClock(args.rate)
        for i in range(args.frames):
            image = camera.render(i)
            stamp = clock.next_stamp()  # sleeps until the frame is due at --rate; stamped when taken
            stamps.append(stamp)
            listener.pub.publish(make(image, stamp, DEMO_CAMERA_FRAME))
            if args.rate <= 0 and not listener.wait_for(lambda rx, s=stamp: s in rx.status,
                                                        max(1.0, deadline - time.monotonic())):
                break
            if time.monotonic() > deadline:
                break
        all_done = listener.wait_for(
            lambda rx: all(listener.final_status(s) is not None for s in stamps), max(1.0, deadline - time.monotonic())
        )
        # a processed frame's pose and statistics travel on their own topics: wait for both of every
        # processed frame, so that its line comes before the summary
        listener.wait_for(lambda rx: all(s in rx.poses and s in rx.stats for s in stamps
                                         if (f := listener.final_status(s)) is not None and f.status == 0), 5.0)
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
