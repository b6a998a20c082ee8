"""``lingbot_map_bench --cameras N`` on the CPU with the tiny preset: the rows it prints, and the
batched run's poses against the same streams pushed one after another (the tool's own check)."""
from __future__ import annotations

import json
import re

import pytest

from lingbot_map_ros.tools.bench import main as bench_main

ARGS = ["--device", "cpu", "--frames", "7", "--height", "28", "--width", "42", "--scale-frames", "2",
        "--sliding-window", "2", "--camera-iterations", "1", "--heads", "camera"]


def _pose_difference(out: str) -> float:
    return float(re.search(r"batched vs one after another \(same frames\): ([0-9.e+-]+)", out).group(1))


def test_cameras_prints_batched_and_sequential_rows(capsys, tmp_path):
    assert bench_main(["--cameras", "3", *ARGS, "--json", str(tmp_path / "part.json")]) == 0
    out = capsys.readouterr().out
    rows = json.loads((tmp_path / "part.json").read_text())["rows"]
    assert [(r["table"], r["streams"], r["mode"]) for r in rows] == [
        ("streams", 1, "one stream (reference)"), ("streams", 3, "batched"), ("streams", 3, "one after another")]
    assert rows[1]["predicted_gb"] > 0 and rows[1]["fps_total"] > 0
    for row in ("| one stream (reference) | 1 |", "| batched | 3 |", "| one after another | 3 |"):
        assert row in out, out
    assert "batched step of 3 / one stream's step" in out
    assert "batched path: eager (no CUDA graphs" in out and rows[1]["path"] == "eager"  # the CPU has no graphs
    assert _pose_difference(out) < 1e-5


def test_cameras_is_refused_out_of_range(capsys):
    with pytest.raises(SystemExit):
        bench_main(["--cameras", "9", *ARGS])
    assert "--cameras must be in 1..8" in capsys.readouterr().err


@pytest.mark.slow
def test_cameras_with_processes(capsys):
    assert bench_main(["--cameras", "2", "--processes", *ARGS]) == 0
    out = capsys.readouterr().out
    assert re.search(r"\| 2 processes \| 2 \| [0-9.]+ \|", out), out
