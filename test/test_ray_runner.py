"""``--ray``: the benchmark and many recordings on a Ray cluster, against the serial runs.

One cluster for the module (``ray.cluster_utils.Cluster``: a head without resources for work and
two worker nodes with one logical GPU each, under a temporary ``RAY_TMPDIR``), stopped by Ray's own
shutdown at the end, with a check that none of its processes is left. Sequences are synthetic, in
two dataset layouts (TUM RGB-D and 7-Scenes), run with the tiny random model on the CPU.

The references are independent runs of the serial tools (the benchmark's loop, ``lingbot_map_offline``
per recording): per-sequence metrics, the printed tables and ``summary.json`` must be equal, apart
from the wall-clock numbers (``seconds``, ``fps``) that no two runs share.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
from benchmark_layouts import image, write_7scenes, write_tum

pytestmark = pytest.mark.slow  # a Ray cluster of three nodes, tool processes
ray = pytest.importorskip("ray", reason="Ray is the optional extra of --ray (scripts/setup_env.sh installs it)")

from lingbot_map_ros.tools import batch, benchmark, offline  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TINY = ["--model-preset", "tiny", "--scale-frames", "2", "--sliding-window", "3", "--camera-iterations", "1",
        "--device", "cpu"]
TIMINGS = ("seconds", "fps")
NUMBERS = ("frames", "evaluated", "ate", "rpe_trans", "rpe_rot", "ate_max", "sim3_scale", "auc")


@pytest.fixture(scope="module")
def cluster():
    """A head and two worker nodes (1 CPU, 1 logical GPU each); the test process is the driver."""
    from ray.cluster_utils import Cluster

    tmp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths live under it
    saved = {k: os.environ.get(k) for k in ("RAY_TMPDIR", "PYTHONPATH", "OMP_NUM_THREADS")}
    os.environ["RAY_TMPDIR"] = tmp
    # the workers import the sources, and this module (its runner for the retry test)
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "test"), *filter(None, [saved["PYTHONPATH"]])])
    os.environ["OMP_NUM_THREADS"] = "1"
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    workers = [c.add_node(num_cpus=1, num_gpus=1) for _ in range(2)]
    try:
        ray.init(address=c.address, logging_level="WARNING")
        yield c, workers
    finally:
        ray.shutdown()
        c.shutdown()
        left = _processes_under(tmp)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(tmp, ignore_errors=True)
        assert not left, f"Ray processes left running: {left}"


def _processes_under(tmp: str) -> list[str]:
    """Processes whose command line names the cluster's temporary folder (raylet, gcs_server, workers)."""
    import psutil

    deadline = time.monotonic() + 10
    while True:
        left = []
        for p in psutil.process_iter(["pid", "cmdline"]):
            with contextlib.suppress(psutil.Error):
                if p.info["cmdline"] and any(tmp in a for a in p.info["cmdline"]) and p.status() != "zombie":
                    left.append(f"{p.info['pid']}: {' '.join(p.info['cmdline'])[:120]}")
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Two TUM RGB-D sequences, one with a corrupt image, and two 7-Scenes sequences (stride 5: 3 frames)."""
    root = tmp_path_factory.mktemp("ray_data")
    write_tum(root / "tum", "rgbd_dataset_freiburg1_xyz", n=6, seed=0)
    write_tum(root / "tum", "rgbd_dataset_freiburg1_desk", n=5, seed=1)
    bad = write_tum(root / "tum", "rgbd_dataset_freiburg1_room", n=5, seed=2)
    bad.images[2].write_bytes(b"not a png")
    write_7scenes(root / "7scenes", n=15)
    return root


def datasets(root: Path) -> list[str]:
    return ["--dataset", "tum", str(root / "tum"), "--dataset", "7scenes", str(root / "7scenes")]


def run_benchmark(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = benchmark.main(list(args))
    return code, out.getvalue(), err.getvalue()


def without_timings(table: str) -> str:
    """The printed tables with the fps column (the last) blanked: wall clock, different in every run."""
    return "\n".join(re.sub(r"\| [0-9.]+ \|$", "| (fps) |", ln) for ln in table.splitlines())


def metrics_of(out: Path) -> dict[str, dict]:
    found = {}
    for path in sorted(out.glob("*/**/metrics.json")):
        m = json.loads(path.read_text())
        found[str(path.relative_to(out))] = {k: v for k, v in m.items() if k not in TIMINGS}
    return found


def summary_of(out: Path) -> dict:
    doc = json.loads((out / "summary.json").read_text())
    for d in doc["datasets"]:
        for s in d["sequences"]:
            for k in TIMINGS:
                s.pop(k, None)
    return doc


@pytest.fixture(scope="module")
def serial(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("serial") / "out"
    code, stdout, stderr = run_benchmark(*datasets(data), "--out", str(out), *TINY, "--quiet")
    assert code == 1, stderr  # the corrupt sequence
    return out, stdout, stderr


def test_ray_gives_the_serial_runs_metrics_table_and_json(cluster, data, serial, tmp_path):
    c, _ = cluster
    s_out, s_table, s_err = serial
    out = tmp_path / "out"
    code, table, err = run_benchmark(*datasets(data), "--out", str(out), *TINY, "--ray", c.address)
    assert code == 1, err
    assert len(metrics_of(s_out)) == 4 and metrics_of(out) == metrics_of(s_out)
    for folder in (out / "tum").iterdir():  # the trajectories themselves, byte for byte
        for name in ("traj.tum", "gt.tum"):
            assert (folder / name).read_bytes() == (s_out / "tum" / folder.name / name).read_bytes()
    assert without_timings(table) == without_timings(s_table)
    assert summary_of(out) == summary_of(s_out)
    # the corrupt sequence: one line, in the table and on stderr, the same as the serial run's
    reason = next(ln for ln in table.splitlines() if ln.startswith("| rgbd_dataset_freiburg1_room | failed: "))
    assert "not a png" in reason or "cannot use the image" in reason
    assert "Traceback" not in err and err.count("rgbd_dataset_freiburg1_room: ") == 1
    # progress across the workers: sequences done of the total, frames/s of all, ETA or elapsed time
    totals = [ln for ln in err.splitlines() if ln.startswith("[lingbot_map_benchmark --ray] ") and " done, " in ln]
    assert totals[-1].startswith("[lingbot_map_benchmark --ray] 5/5 sequences done, ")
    assert re.search(r"\d+ frames at [0-9.]+ frames/s in total", totals[-1]), totals
    # each worker's start-up and the sequences it ran: every sequence once, the model built once each
    workers = json.loads((out / "ray_workers.json").read_text())["workers"]
    assert len(workers) == 2 and all(w["model_seconds"] > 0 and w["ready_seconds"] > 0 for w in workers)
    assert sorted(i["item"] for w in workers for i in w["items"]) == sorted(
        f"{d}/{n}" for d, n in [("tum", "rgbd_dataset_freiburg1_xyz"), ("tum", "rgbd_dataset_freiburg1_desk"),
                                ("tum", "rgbd_dataset_freiburg1_room"), ("7scenes", "chess/seq-03"),
                                ("7scenes", "chess/seq-05")])


def test_an_interrupted_ray_run_resumes_without_repeating_finished_sequences(cluster, data, serial, tmp_path):
    c, _ = cluster
    s_out, s_table, _ = serial
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([str(BIN / "lingbot_map_benchmark"), *datasets(data), "--out", str(out), *TINY,
                             "--ray", c.address], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stderr:
            if re.match(r"\[lingbot_map_benchmark\] \[\d/5\] \S+: ATE", line):  # the first one done
                proc.send_signal(signal.SIGTERM)
                break
        rest = proc.stderr.read()
        assert proc.wait(timeout=120) == 130, rest
    finally:
        proc.kill()
    assert "the same command again resumes" in rest
    finished = {p: p.stat().st_mtime_ns for p in out.glob("*/**/metrics.json")}
    assert 1 <= len(finished) < 4, rest
    code, table, err = run_benchmark(*datasets(data), "--out", str(out), *TINY, "--ray", c.address)
    assert code == 1, err
    assert err.count("done before") == len(finished)
    assert {p: p.stat().st_mtime_ns for p in finished} == finished  # kept, not run again
    assert metrics_of(out) == metrics_of(s_out)
    assert without_timings(table) == without_timings(s_table)


# ------------------------------------------------------------------------------------ many recordings
def write_recordings(root: Path) -> Path:
    """A video, an image folder and a rosbag2 recording, each of 5 tiny frames."""
    from lingbot_map_ros.tools.bag_io import write_image_bag

    recs = root / "recordings"
    recs.mkdir()
    writer = cv2.VideoWriter(str(recs / "drive.avi"), cv2.VideoWriter_fourcc(*"MJPG"), 10, (148, 8))
    for i in range(5):
        writer.write(np.ascontiguousarray(image(10 + i, (8, 148))[:, :, ::-1]))
    writer.release()
    (recs / "walk").mkdir()
    for i in range(5):
        assert cv2.imwrite(str(recs / "walk" / f"{1700000000.0 + 0.1 * i:.6f}.png"), image(20 + i, (4, 148)))
    write_image_bag(recs / "loop", [image(30 + i, (4, 148)) for i in range(5)], [1.7e9 + 0.1 * i for i in range(5)])
    return recs


def test_three_recordings_through_the_cluster_equal_serial_offline_runs(cluster, tmp_path):
    c, _ = cluster
    recs = write_recordings(tmp_path)
    ref = tmp_path / "ref"
    ref.mkdir()
    for kind, name, path in (("video", "drive", recs / "drive.avi"), ("images", "walk", recs / "walk"),
                             ("bag", "loop", recs / "loop")):
        assert offline.main([f"--{kind}", str(path), "--out", str(ref / f"{name}.npz"), "--tum",
                             str(ref / f"{name}.tum"), "--ply", str(ref / f"{name}.ply"), "--quiet", *TINY]) == 0
    out = tmp_path / "out"
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = batch.main([str(recs), "--out", str(out), "--ply", "--ray", c.address, "--", *TINY])
    assert code == 0, err.getvalue()
    assert sorted(p.name for p in out.iterdir()) == ["drive", "loop", "walk"]  # nothing half-written beside them
    for name in ("drive", "loop", "walk"):
        folder = out / name
        assert (folder / "traj.tum").read_bytes() == (ref / f"{name}.tum").read_bytes()
        assert (folder / "map.ply").read_bytes() == (ref / f"{name}.ply").read_bytes()
        with np.load(folder / "result.npz") as got, np.load(ref / f"{name}.npz") as want:
            assert sorted(got.files) == sorted(want.files)
            for key in want.files:
                if key != "latency_ms":  # wall clock
                    assert np.array_equal(got[key], want[key]), (name, key)


# ------------------------------------------------------------------------------------ faults
class RaisesOnBad:
    """A runner whose item "bad" raises on every worker (an out-of-memory error, say); the others pass."""

    def run(self, key: str, progress=None) -> str:
        if key == "bad":
            raise RuntimeError("CUDA out of memory (a stand-in)")
        return key.upper()


def test_an_item_that_keeps_failing_gets_its_reason_after_the_retries(cluster):
    import argparse

    from lingbot_map_ros.tools.ray_runner import ItemFailed, run_pool

    c, _ = cluster
    args = argparse.Namespace(ray=c.address, ray_workers=2, ray_gpus=1.0, ray_cpus=1.0, ray_retries=1)
    done, retried = [], []
    results = run_pool(ray, args, RaisesOnBad, [(k, (k,)) for k in ("a", "bad", "b", "c")], board_name="retry-test",
                       on_done=lambda i, r, report: done.append(i),
                       on_retry=lambda key, reason, attempt: retried.append((key, attempt)))
    assert results[0] == "A" and results[2] == "B" and results[3] == "C"
    assert isinstance(results[1], ItemFailed) and results[1].attempts == 2
    assert results[1].reason == "failed on 2 workers; last: RuntimeError: CUDA out of memory (a stand-in)"
    assert retried == [("bad", 1)] and sorted(done) == [0, 1, 2, 3]


# ------------------------------------------------------------------------------------ (last: it removes a node)
def test_a_worker_node_lost_mid_sequence_is_retried_elsewhere(cluster, data, serial, tmp_path):
    """The node running a long sequence is removed after its first frames: the sequence runs again on
    the other node and the table is complete; the short sequences give the serial run's numbers."""
    c, workers = cluster
    s_out, _, _ = serial
    root = tmp_path / "data"
    shutil.copytree(data / "tum", root / "tum")
    write_tum(root / "tum", "rgbd_dataset_freiburg1_long", n=90, seed=3)
    out = tmp_path / "out"
    board_name = f"benchmark:{out.resolve()}"
    seen: dict = {}

    def remove_the_node_of_the_long_sequence() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and "removed" not in seen:
            with contextlib.suppress(Exception):
                board = ray.get_actor(board_name, namespace="lingbot_map_ros")
                entry = ray.get(board.snapshot.remote()).get("tum/rgbd_dataset_freiburg1_long")
                if entry and entry["running"] and entry["done"] >= 1:
                    node = next(n for n in workers if n.node_id == entry["node"])
                    c.remove_node(node)
                    seen.update(removed=entry["node"], done_then=entry["done"])
            time.sleep(0.05)

    watcher = threading.Thread(target=remove_the_node_of_the_long_sequence, daemon=True)
    watcher.start()
    code, table, err = run_benchmark("--dataset", "tum", str(root / "tum"), "--out", str(out), *TINY,
                                     "--ray", c.address, "--ray-retries", "1")
    watcher.join(timeout=5)
    assert "removed" in seen and seen["done_then"] < 90, seen
    assert code == 1, err  # the corrupt sequence only
    assert "tum/rgbd_dataset_freiburg1_long: its worker died" in err and "attempt 2 of 2" in err
    assert "## TUM RGB-D (--dataset tum): 3 of 4 sequences" in table
    long = json.loads((out / "tum" / "rgbd_dataset_freiburg1_long" / "metrics.json").read_text())
    assert long["frames"] == long["evaluated"] == 90
    for name in ("rgbd_dataset_freiburg1_xyz", "rgbd_dataset_freiburg1_desk"):
        got, want = (metrics_of(o)[f"tum/{name}/metrics.json"] for o in (out, s_out))
        assert {k: got[k] for k in NUMBERS} == {k: want[k] for k in NUMBERS}
