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
    [row] = json.loads((tmp_path / "part.json").read_text())["rows"]
    assert (row["table"], row["streams"], row["processes_fps"]) == ("streams", 3, None)
    assert row["predicted_gb"] > 0 and row["fps_total"] > 0 and row["one_stream_ms"] > 0
    printed = re.search(r"\| batched \| 3 \| ([0-9.]+) \|", out)
    assert printed and abs(float(printed.group(1)) - row["ms_per_step"]) < 0.006
    assert row["sequential_fps"] == float(re.search(r"\| one after another \| 3 \| [0-9.]+ \| [0-9.]+ \| ([0-9.]+)",
                                                      out).group(1))
    # a part of a run of record: bench/record.py and the performance tables take it as it is
    import importlib.util
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(repo / "scripts"))
    spec = importlib.util.spec_from_file_location("perf_tables", repo / "scripts" / "perf_tables.py")
    perf = importlib.util.module_from_spec(spec)
    sys.modules["perf_tables"] = perf
    spec.loader.exec_module(perf)
    doc = json.loads((tmp_path / "part.json").read_text())
    run = perf.parse_run("2030-01-02-streams.json", {**doc, "date": "2030-01-02", "commit": "abc1234"})
    assert "| 3 | 42×28 | 2 | camera only |" in perf.render_readme_streams([run])
    for printed_row in ("| one stream (reference) | 1 |", "| batched | 3 |", "| one after another | 3 |"):
        assert printed_row in out, out
    assert "batched step of 3 / one stream's step" in out
    assert "batched path: eager (no CUDA graphs" in out and row["path"] == "eager"  # the CPU has no graphs
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
