"""``python -m lingbot_map_ros.tools.bench_points``: what ``publish_points`` / ``publish_map`` cost per frame.

Times the node's per-frame reconstruction path on one device, on the inputs it gets in the node
(depth and confidence as CPU float32 ``[H, W]`` from the session, the model image ``[3, H, W]`` on
the CPU, float64 pose and intrinsics):

* ``unproject``  - stride, move to the device, unproject, filter, colours (``unproject_depth``);
* ``records``    - x y z rgb conf assembled on the device and copied to the host (``point_records``);
* ``message``    - the ``sensor_msgs/PointCloud2`` built from them (``point_cloud2``);
* ``points total`` - the three together = what ``publish_points`` adds to a frame (before DDS);
* ``map add``    - queueing the frame for the voxel map from the host records (inference thread);
* ``map merge``  - one merge of ``--merge-every`` queued frames into a full map (map timer thread),
  reported per merge.

The model does not run: its cost does not depend on what the head outputs, only on the size, the
stride and the fraction of valid pixels (all valid here: the worst case). CUDA timings synchronise
the device around each step. Prints a table (median / p90 ms over ``--frames`` frames).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
import torch


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def run(device: str, height: int, width: int, strides: list[int], frames: int, map_max_points: int,
        voxel: float, merge_every: int, with_message: bool = True) -> list[tuple]:
    from ..core.reconstruction import PointBatch, VoxelMap, point_records, unproject_depth

    if with_message:
        from builtin_interfaces.msg import Time

        from ..ros.reconstruction import point_cloud2
    dev = torch.device(device)
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    rng = np.random.default_rng(0)
    k = np.array([[width / 2 / np.tan(0.6), 0, width / 2], [0, width / 2 / np.tan(0.6), height / 2], [0, 0, 1.0]])
    rows = []
    for stride in strides:
        times: dict[str, list[float]] = {"unproject": [], "records": [], "message": [], "points total": [],
                                         "map add": [], "map merge": []}
        vmap = VoxelMap(voxel, map_max_points, device="cpu")
        n_points = 0
        for i in range(frames + 3):  # 3 warm-up frames
            depth = rng.uniform(0.5, 5.0, (height, width)).astype(np.float32)
            conf = (1 + rng.exponential(2.0, (height, width))).astype(np.float32)
            image = torch.rand(3, height, width)
            c2w = np.eye(4)
            c2w[:3, 3] = [0.05 * i, 0.0, 0.02 * i]  # a moving camera: the map keeps growing
            sync()
            t0 = time.perf_counter()
            pts = unproject_depth(depth, k, c2w, confidence=conf, image=image, stride=stride,
                                  min_confidence=1.0, device=dev)
            sync()
            t1 = time.perf_counter()
            rec = point_records(pts)
            t2 = time.perf_counter()
            if with_message:
                point_cloud2(rec, Time(sec=i), "lingbot_world")
            t3 = time.perf_counter()
            vmap.add(PointBatch.from_records(rec))  # as the node: the map is fed from the host records
            t4 = time.perf_counter()
            merge_ms = None
            if (i + 1) % merge_every == 0:
                t5 = time.perf_counter()
                vmap.flush()
                merge_ms = (time.perf_counter() - t5) * 1e3
            if i < 3:
                continue
            n_points = len(pts)
            for key, val in (("unproject", t1 - t0), ("records", t2 - t1), ("message", t3 - t2),
                             ("points total", t3 - t0), ("map add", t4 - t3)):
                times[key].append(val * 1e3)
            if merge_ms is not None:
                times["map merge"].append(merge_ms)
        for key, xs in times.items():
            if xs:
                rows.append((stride, n_points, key, statistics.median(xs), _pct(xs, 0.9), len(xs)))
        rows.append((stride, n_points, f"map size after {frames} frames", float(len(vmap)), float("nan"), 0))
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench_points", description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (where the per-pixel work runs)")
    p.add_argument("--height", type=int, default=378)
    p.add_argument("--width", type=int, default=518)
    p.add_argument("--strides", default="4", help="comma-separated, e.g. 1,2,4,8")
    p.add_argument("--frames", type=int, default=50)
    p.add_argument("--map-max-points", type=int, default=500_000)
    p.add_argument("--map-voxel-size", type=float, default=0.01)
    p.add_argument("--merge-every", type=int, default=10, help="frames queued per map merge (10 Hz x 1 s)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    strides = [int(s) for s in args.strides.split(",") if s]
    try:  # the message step needs the ROS Python messages (absent on a bare GPU box: then skipped)
        import sensor_msgs.msg  # noqa: F401

        with_message = True
    except ImportError:
        with_message = False
        print("# sensor_msgs not importable: the PointCloud2 step is skipped (message = 0)")
    rows = run(args.device, args.height, args.width, strides, args.frames, args.map_max_points,
               args.map_voxel_size, args.merge_every, with_message=with_message)
    dev = torch.cuda.get_device_name(torch.device(args.device)) if args.device.startswith("cuda") else "cpu"
    print(f"# reconstruction cost per frame, {args.width}x{args.height}, device {args.device} ({dev}), "
          f"torch threads {torch.get_num_threads()}, map {args.map_max_points} voxels of {args.map_voxel_size}")
    print("| stride | points/frame | step | median ms | p90 ms | samples |")
    print("| --- | --- | --- | --- | --- | --- |")
    for stride, n, key, med, p90, cnt in rows:
        if key.startswith("map size"):
            print(f"| {stride} | {n} | {key} | {int(med)} voxels | | |")
        else:
            print(f"| {stride} | {n} | {key} | {med:.3f} | {p90:.3f} | {cnt} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
