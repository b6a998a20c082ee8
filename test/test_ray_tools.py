"""The many-items tools without a cluster: ``lingbot_map_batch`` run serially (each folder equals
``lingbot_map_offline``'s result, a bad recording fails alone with one line and leaves no folder, a
second run keeps what is done), command-line mistakes in one line before any work, ``--ray`` where
Ray is missing, and the arithmetic of the progress line across workers."""
from __future__ import annotations

import contextlib
import io
import sys
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
from benchmark_layouts import image, write_tum

from lingbot_map_ros.tools import batch, benchmark, offline
from lingbot_map_ros.tools import progress as progress_module
from lingbot_map_ros.tools.progress import PoolProgress

TINY = ["--model-preset", "tiny", "--scale-frames", "2", "--sliding-window", "3", "--camera-iterations", "1",
        "--device", "cpu"]


def call(main, *args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


def write_video(path: Path, n: int = 5, seed: int = 0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 10, (148, 8))
    for i in range(n):
        writer.write(np.ascontiguousarray(image(seed + i, (8, 148))[:, :, ::-1]))
    writer.release()
    return path


def test_batch_serial_equals_offline_fails_a_bad_recording_alone_and_resumes(tmp_path):
    recs = tmp_path / "recs"
    good = write_video(recs / "good.avi")
    (recs / "broken.mp4").write_bytes(b"\x00" * 64)  # a video suffix, no video inside
    assert offline.main(["--video", str(good), "--out", str(tmp_path / "ref.npz"), "--tum", str(tmp_path / "ref.tum"),
                         "--quiet", *TINY]) == 0
    out = tmp_path / "out"
    code, _, err = call(batch.main, str(recs), "--out", str(out), "--", *TINY)
    assert code == 1, err
    assert (out / "good" / "traj.tum").read_bytes() == (tmp_path / "ref.tum").read_bytes()
    with np.load(out / "good" / "result.npz") as got, np.load(tmp_path / "ref.npz") as want:
        for key in want.files:
            if key != "latency_ms":
                assert np.array_equal(got[key], want[key]), key
    errors = [ln for ln in err.splitlines() if "error:" in ln]
    assert len(errors) == 1 and "broken:" in errors[0] and str(recs / "broken.mp4") in errors[0], err
    assert sorted(p.name for p in out.iterdir()) == ["good"]  # nothing of the broken one, no temporary folder
    assert "1 of 2 recordings done" in err and "failed: broken" in err
    before = (out / "good" / "traj.tum").stat().st_mtime_ns
    code, _, err = call(batch.main, str(recs), "--out", str(out), "--", *TINY)
    assert code == 1 and "good: done before, kept" in err
    assert (out / "good" / "traj.tum").stat().st_mtime_ns == before


def test_batch_command_line_mistakes_are_one_line_before_any_work(tmp_path):
    recs = tmp_path / "recs"
    write_video(recs / "a.avi")
    write_video(recs / "sub" / "a.mp4")
    (tmp_path / "empty").mkdir()
    for args, needle in (
        ([str(tmp_path / "empty")], "not a recording"),
        ([str(recs / "a.avi"), str(recs / "sub" / "a.mp4")], "would both write a/"),
        ([str(recs / "a.avi"), "--", "--tum", "x.tum"], "--tum: lingbot_map_batch sets it per recording"),
        ([str(recs / "a.avi"), "--", "--sliding-window", "-3"], "options for lingbot_map_offline:"),
        (["--ray", str(recs / "a.avi")], "--ray took the recording"),
        ([], "no recording given"),
    ):
        code, _, err = call(batch.main, "--out", str(tmp_path / "out"), *args)
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and needle in lines[0], (args, err)
        assert not (tmp_path / "out").exists()


def test_ray_missing_is_one_line_and_the_serial_path_needs_no_ray(tmp_path, monkeypatch):
    write_tum(tmp_path / "tum", "rgbd_dataset_freiburg1_xyz", n=4)
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError, as where it is not installed
    code, _, err = call(benchmark.main, "--dataset", "tum", str(tmp_path / "tum"), "--out", str(tmp_path / "o"),
                        *TINY, "--quiet", "--ray")
    assert code == 2 and err.strip() == ("lingbot_map_benchmark: error: --ray needs Ray: pip install "
                                         "'lingbot_map_ros[ray]' (tested: ray 2.60.0)")
    code, table, err = call(benchmark.main, "--dataset", "tum", str(tmp_path / "tum"), "--out", str(tmp_path / "o"),
                            *TINY, "--quiet")
    assert code == 0 and "| rgbd_dataset_freiburg1_xyz | 4 | 4 |" in table, err


def test_an_address_without_a_cluster_is_one_line_at_once(tmp_path):
    pytest.importorskip("ray")
    write_tum(tmp_path / "tum", "rgbd_dataset_freiburg1_xyz", n=4)
    start = time.monotonic()
    code, _, err = call(benchmark.main, "--dataset", "tum", str(tmp_path / "tum"), "--out", str(tmp_path / "o"),
                        *TINY, "--quiet", "--ray", "127.0.0.1:1")  # nothing listens there
    assert code == 2 and err.strip() == ("lingbot_map_benchmark: error: --ray 127.0.0.1:1: no Ray cluster there "
                                         "(Connection refused); start one with 'ray start --head' and give the "
                                         "address it prints")
    assert time.monotonic() - start < 30  # not ray.init's minutes of retries


def test_pool_progress_counts_every_worker_and_estimates_what_is_left(monkeypatch):
    bar = PoolProgress(4, "x --ray", unit="sequences", enabled=False)
    now = bar._bar._start + 10.0  # 10 s into the run, on a clock that stands still (a loaded host stays exact)
    monkeypatch.setattr(progress_module.time, "monotonic", lambda: now)
    assert bar.eta() is None  # nothing known yet
    board = {"a": {"frames": 100, "done": 100, "running": False}, "b": {"frames": 200, "done": 50, "running": True}}
    bar.update_from(board, workers=2)
    bar.finished("a", 100)
    # 150 frames in 10 s; left: 150 of b, and 2 not started of the mean known length (150) each
    assert bar.frames_done == 150 and bar.rate() == pytest.approx(15.0, rel=1e-3)
    assert bar.eta() == pytest.approx((150 + 2 * 150) / 15.0, rel=1e-3)
    line = bar.line()
    assert line.startswith("[x --ray] 1/4 sequences done, 2 workers, 150 frames at 15.00 frames/s in total, ETA 0:30")
    bar.finished("c", 40)  # an item no worker reported (a recording): its frames count when it ends
    assert bar.frames_done == 190
