"""docs/performance.md and the README's performance table are what the run files say.

* Both are exactly what ``scripts/perf_tables.py`` renders from ``docs/perf/runs/*.json`` now: a number
  changed in a run file, or a cell edited by hand in either document, fails here.
* Every run file is a valid run of record, and every measured row shows up in docs/performance.md
  (checked by looking for its numbers, independently of the renderer's layout).
* On a small synthetic run: a row appears in its section, a changed row shows in the check's diff, a
  table without rows gets no section, and a malformed file is refused with the reason.
"""
from __future__ import annotations

import copy
import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


sys.path.insert(0, str(REPO / "scripts"))
perf = _load("perf_tables")
PERFORMANCE_TEXT = (REPO / "docs" / "performance.md").read_text(encoding="utf-8")
README_TEXT = (REPO / "README.md").read_text(encoding="utf-8")
RUNS = perf.load_runs()


def test_performance_md_and_the_readme_table_are_what_the_runs_say():
    problems = perf.problems(RUNS, PERFORMANCE_TEXT, README_TEXT)
    assert not problems, ("docs/performance.md or README.md disagrees with docs/perf/runs/; run "
                          "`.venv/bin/python scripts/perf_tables.py`:\n" + "\n".join(problems))


def test_the_run_files_are_named_and_dated_runs():
    files = sorted(p.name for p in perf.RUNS_DIR.glob("*.json"))
    assert files and [r.file for r in sorted(RUNS, key=lambda r: r.file)] == files
    for run in RUNS:
        assert run.file.startswith(run.date + "-")


def _cells(row: dict) -> list[str]:
    """The numbers of a row as the page prints them (two decimals for ms and GB, whole µs)."""
    fields = {"latency": ("median_ms", "p90_ms"), "long_run": ("median_ms", "p90_ms", "peak_gb"),
              "attention": ("us_per_layer",), "memory": ("measured_gb",), "first_pose": ("seconds",),
              "streams": ("ms_per_step",), "step_profile": ("one_stream_ms", "batched_ms")}[row["table"]]
    digits = {"us_per_layer": 0, "seconds": 1}
    return [f"{row[f]:,.{digits.get(f, 2)}f}" for f in fields]


def test_every_measured_row_is_on_the_page():
    """Each row's numbers appear together on one table line of docs/performance.md, with its run."""
    lines = [line for line in PERFORMANCE_TEXT.splitlines() if line.startswith("| ")]
    for run in RUNS:
        for row in run.rows:
            cells = _cells(row)
            shown = [re.compile(rf"(?<![\d.,]){re.escape(c)}(?![\d])") for c in cells]
            assert any(all(p.search(line) for p in shown) and run.commit in line
                       for line in lines), f"{run.file}: no line of docs/performance.md shows {row}"


def test_the_readme_section_is_short_and_has_one_table():
    section = README_TEXT[README_TEXT.index("## Performance\n"):]
    section = section[:section.index("\n## ", 1)].rstrip("\n").splitlines()
    assert len(section) <= 15, len(section)
    tables = [i for i, line in enumerate(section) if line.startswith("| ---")]
    assert len(tables) == 1


# ------------------------------------------------------------------------------------ a synthetic run

LATENCY = {"table": "latency", "geometry": "518x378", "heads": "depth+camera", "path": "default", "window": 64,
           "scale_frames": 8, "camera_iterations": 4, "streams": 1, "load": "idle", "median_ms": 12.34,
           "p90_ms": 13.45, "peak_gb": 9.87, "frames": 208}
SETUP = {"gpu": "Test GPU", "host_cpus": 4, "torch": "2.0", "cuda": "12.0", "driver": "1.0",
         "official_commit": None, "notes": "synthetic"}


def write_run(folder: Path, rows: list[dict], name: str = "2030-01-02-synthetic", commit: str = "abc1234") -> Path:
    path = folder / f"{name}.json"
    path.write_text(json.dumps({"run": name[11:], "date": name[:10], "commit": commit, "setup": SETUP,
                                "rows": rows}), encoding="utf-8")
    return path


def sections(text: str) -> dict[str, str]:
    parts = re.split(r"^## ", text, flags=re.M)
    return {p.splitlines()[0]: p for p in parts[1:]}


def test_a_row_appears_in_its_section(tmp_path):
    write_run(tmp_path, [LATENCY])
    text = perf.render_performance(perf.load_runs(tmp_path))
    found = sections(text)
    assert "| 518×378 | depth + camera | ours, the default path | 12.34 | 13.45 | 81.0 | 9.87 |  | Test | " \
           "2030-01-02 `abc1234` |" in found["Latency"]  # the GPU's short name: times compare within one GPU
    assert "Test GPU" in found["Set-up of record"]
    # no rows, no section
    assert not {"Memory", "Attention per layer", "Long run and host load", "Time to first pose",
                "Several streams"} & set(found)
    readme = perf.render_readme(perf.load_runs(tmp_path))
    assert "| 12.34 | 13.45 | 81.0 | 9.87 | Test | 2030-01-02 `abc1234` |" in readme  # it names the GPU too


def test_the_recorded_fps_and_attention_path_are_shown(tmp_path):
    write_run(tmp_path, [dict(LATENCY, fps=80.5, attention="sdpa:split+graph+compiled")])
    runs = perf.load_runs(tmp_path)
    assert "| ours, the default path (`sdpa:split+graph+compiled`) | 12.34 | 13.45 | 80.5 |" in \
        sections(perf.render_performance(runs))["Latency"]
    assert "| ours, the default path | depth + camera | 12.34 | 13.45 | 80.5 |" in perf.render_readme(runs)


def test_a_changed_row_shows_in_the_check(tmp_path):
    write_run(tmp_path, [LATENCY])
    runs = perf.load_runs(tmp_path)
    page, readme_region = perf.render_performance(runs), perf.render_readme(runs)
    cost = perf.render_readme_streams(runs)
    readme = (f"# x\n\n<!-- generated: performance -->\n{readme_region}<!-- end: performance -->\n"
              f"<!-- generated: cameras-cost -->\n{cost}<!-- end: cameras-cost -->\n")
    assert perf.problems(runs, page, readme) == []
    changed = dict(LATENCY, median_ms=11.11)
    write_run(tmp_path, [changed])
    problems = perf.problems(perf.load_runs(tmp_path), page, readme)
    assert len(problems) == 2
    assert "docs/performance.md is stale" in problems[0]
    assert "-| 518×378 | depth + camera | ours, the default path | 12.34" in problems[0]
    assert "+| 518×378 | depth + camera | ours, the default path | 11.11" in problems[0]
    assert "'performance' is stale" in problems[1] and "11.11" in problems[1]


def test_a_row_at_other_settings_says_which(tmp_path):
    write_run(tmp_path, [LATENCY, dict(LATENCY, window=16, streams=2, median_ms=9.5)])
    latency = sections(perf.render_performance(perf.load_runs(tmp_path)))["Latency"]
    assert "| settings |" in latency
    assert re.search(r"\| window 16, streams 2 \| 9\.50 \|", latency)
    assert re.search(r"\| ours, the default path \|  \| 12\.34 \|", latency)
    assert "9.50" not in perf.render_readme(perf.load_runs(tmp_path))  # the README shows the reference only


def test_the_official_ratio_comes_from_the_same_run_only(tmp_path):
    official = dict(LATENCY, path="official", median_ms=24.68, p90_ms=25.0, peak_gb=12.0)
    write_run(tmp_path, [LATENCY, official])
    write_run(tmp_path, [dict(LATENCY, median_ms=10.0)], name="2030-01-03-later", commit="def5678")
    runs = perf.load_runs(tmp_path)
    latency = sections(perf.render_performance(runs))["Latency"]
    assert re.search(r"\| 12\.34 \|.*\| 2\.00× \| Test \| 2030-01-02 `abc1234` \|", latency)
    assert re.search(r"\| 10\.00 \|.*\|  \| Test \| 2030-01-03 `def5678` \|", latency)  # no official in that run
    readme = perf.render_readme(runs)  # the pair of the newest run that has both
    assert "12.34" in readme and "24.68" in readme and "10.00" not in readme


def test_host_load_and_long_run_rows(tmp_path):
    loaded = dict(LATENCY, load="host load", median_ms=12.96, p90_ms=14.0, peak_gb=None)
    long_run = {"table": "long_run", "geometry": "518x378", "heads": "camera", "frames": 1000, "median_ms": 11.5,
                "p90_ms": 12.5, "growth_mb": 0.0, "peak_gb": 8.5}
    switched = dict(long_run, geometry="518x392", window_switches=3)
    write_run(tmp_path, [LATENCY, loaded, long_run, switched])
    part = sections(perf.render_performance(perf.load_runs(tmp_path)))["Long run and host load"]
    assert "| 12.34 (13.45) | 12.96 (14.00) | +5.0 % |" in part
    assert "| 518×378 | camera only | 1,000 |  | 11.50 | 12.50 | 8.50 | +0 |" in part
    assert "| 518×392 | camera only | 1,000 | 3 | 11.50 | 12.50 | 8.50 | +0 |" in part


def test_a_streams_row_with_a_footprint_is_also_a_memory_row(tmp_path):
    """Several streams' peak beside the group's footprint, in the one memory table."""
    row = {"table": "streams", "geometry": "518x378", "window": 64, "heads": "depth+camera", "streams": 2,
           "ms_per_step": 47.03, "one_stream_ms": 24.85, "fps_total": 42.5, "sequential_fps": 40.2,
           "processes_fps": 39.2, "peak_gb": 20.96, "predicted_gb": 21.42}
    write_run(tmp_path, [row, dict(row, streams=4, peak_gb=None)])
    found = sections(perf.render_performance(perf.load_runs(tmp_path)))
    assert "| 518×378 | 64 | depth + camera | 2 | 21.42 | 20.96 | +2.2 % |" in found["Memory"]
    assert "| 4 |" not in found["Memory"]  # no peak measured: no memory row


@pytest.mark.parametrize("row, section, shown", [
    ({"table": "memory", "geometry": "392x294", "window": 32, "heads": "camera", "streams": 1, "predicted_gb": 5.95,
      "measured_gb": 5.97}, "Memory", "| 392×294 | 32 | camera only | 1 | 5.95 | 5.97 | -0.3 % |"),
    ({"table": "memory", "geometry": "224x168", "window": 11, "heads": "depth+camera", "streams": 1,
      "predicted_gb": None, "measured_gb": 3.72, "budget_gb": 4}, "Memory",
     "| 4 | 224×168 | 11 | depth + camera | 3.72 |"),
    ({"table": "attention", "kernel": "k", "window_state": "filling", "geometry": "518x378", "us_per_layer": 353,
      "tflops": 480, "keys": 41208}, "Attention per layer", "| 518×378 | filling | 41,208 | k | 353 | 480 |"),
    ({"table": "first_pose", "caches": "cold", "seconds": 41.5, "model_load_s": 6.25, "compile_s": 30.0,
      "capture_s": 1.25}, "Time to first pose",
     "| cold | 41.5 |  | 6.2 | random (drawn in process) | 30.0 | 1.2 | Test |"),
    ({"table": "first_pose", "caches": "warm", "seconds": 9.5, "model_load_s": 2.25, "compile_s": 4.0,
      "capture_s": 0.25, "weights": "checkpoint file (4.63 GB, safetensors)"}, "Time to first pose",
     "| warm | 9.5 |  | 2.2 | checkpoint file (4.63 GB, safetensors) | 4.0 | 0.2 | Test |"),
    ({"table": "streams", "geometry": "518x378", "window": 64, "heads": "camera", "streams": 4, "ms_per_step": 61.5,
      "one_stream_ms": 23.9, "fps_total": 65.0, "sequential_fps": 41.8, "processes_fps": None},
     "Several streams", "| 518×378 | 64 | camera only | 4 | 61.50 | 23.90 | 65.0 | 41.8 |  |"),
    ({"table": "streams", "geometry": "518x378", "window": 64, "heads": "depth+camera", "streams": 2,
      "ms_per_step": 48.95, "one_stream_ms": 26.1, "fps_total": 40.9, "sequential_fps": 38.3, "processes_fps": 36.2,
      "sm_mhz": 1695, "power_w": 697, "clock_limits": "power cap", "one_stream_sm_mhz": 1830,
      "one_stream_power_w": 690, "processes_power_w": 688}, "Several streams",
     "| 518×378 | 64 | depth + camera | 2 | 48.95 | 26.10 | 40.9 | 38.3 | 36.2 | 1830 / 1695 (697 W, power cap) "
     "| 18.0 / 17.1 / 19.0 |"),
    ({"table": "step_profile", "geometry": "518x378", "window": 16, "heads": "depth+camera", "streams": 2,
      "category": "gemm", "one_stream_ms": 5.0, "batched_ms": 8.0}, "Where a batched step's time goes",
     "| 518×378 | 16 | depth + camera | 2 | gemm | 5.00 | 8.00 | 1.60× |"),
])
def test_each_table_gets_its_section(tmp_path, row, section, shown):
    write_run(tmp_path, [row])
    found = sections(perf.render_performance(perf.load_runs(tmp_path)))
    assert shown in found[section], found[section]
    assert set(found) == {"Set-up of record", "How to reproduce", section, "What the columns mean", "On a robot"}


@pytest.mark.parametrize("change, reason", [
    (lambda d: d["rows"][0].pop("median_ms"), "'median_ms' is missing"),
    (lambda d: d["rows"][0].update(heads="depth"), "'heads' is 'depth'"),
    (lambda d: d["rows"][0].update(table="speed"), "'table' must be one of"),
    (lambda d: d["rows"][0].update(frames=20.5), "'frames' is 20.5, not int"),
    (lambda d: d.update(commit="HEAD"), "is not a git hash"),
    (lambda d: d.update(date="2030-01-03"), "does not start with the run's date"),
    (lambda d: d["setup"].pop("gpu"), "setup: 'gpu' is missing"),
    (lambda d: d.update(rows=[]), "no rows"),
])
def test_a_malformed_run_file_is_refused(tmp_path, change, reason):
    data = {"run": "synthetic", "date": "2030-01-02", "commit": "abc1234", "setup": copy.deepcopy(SETUP),
            "rows": [dict(LATENCY)]}
    change(data)
    (tmp_path / "2030-01-02-synthetic.json").write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(perf.RunFileError, match=re.escape(reason)):
        perf.load_runs(tmp_path)


def test_a_badly_named_file_is_refused(tmp_path):
    write_run(tmp_path, [LATENCY], name="2030-01-02-Synthetic Run")
    with pytest.raises(perf.RunFileError, match="is named"):
        perf.load_runs(tmp_path)


def _record_tool():
    spec = importlib.util.spec_from_file_location("bench_record", REPO / "bench" / "record.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_record_merges_parts_into_a_run_file_the_tables_accept(tmp_path):
    record = _record_tool()
    first = {"table": "first_pose", "caches": "warm", "seconds": 11.5, "model_load_s": 3.0, "compile_s": 4.0,
             "capture_s": 0.5}
    (tmp_path / "a.json").write_text(json.dumps({"setup": SETUP, "rows": [first]}))
    (tmp_path / "b.json").write_text(json.dumps({"rows": [LATENCY]}))
    out = tmp_path / "runs" / "2030-01-02-merged.json"
    out.parent.mkdir()
    assert record.main([str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--run", "merged",
                        "--commit", "abc1234", "--date", "2030-01-02", "--out", str(out)]) == 0
    (run,) = perf.load_runs(out.parent)
    assert run.setup == SETUP and [r["table"] for r in run.rows] == ["first_pose", "latency"]


def test_record_takes_every_table_the_performance_reference_has():
    """A part's rows pass bench/record.py exactly when scripts/perf_tables.py has their table."""
    assert set(_record_tool().TABLES) == set(perf.FIELDS)


def test_record_refuses_parts_without_a_set_up(tmp_path, capsys):
    record = _record_tool()
    (tmp_path / "a.json").write_text(json.dumps({"rows": [LATENCY]}))
    out = tmp_path / "2030-01-02-merged.json"
    assert record.main([str(tmp_path / "a.json"), "--run", "merged", "--commit", "abc1234",
                        "--date", "2030-01-02", "--out", str(out)]) == 2
    assert "no part carries a set-up" in capsys.readouterr().err and not out.exists()


def test_the_readme_cost_per_camera_count_is_the_streams_rows(tmp_path):
    """Each ``streams`` row becomes a README row with its step beside one camera's; without one the
    region says that nothing is measured (and how to measure it)."""
    write_run(tmp_path, [LATENCY])
    assert "No run of record has measured several cameras" in perf.render_readme_streams(perf.load_runs(tmp_path))
    row = {"table": "streams", "geometry": "518x378", "window": 16, "heads": "depth+camera", "streams": 2,
           "ms_per_step": 30.0, "one_stream_ms": 20.0, "fps_total": 66.7, "sequential_fps": 50.0,
           "processes_fps": 45.5}
    write_run(tmp_path, [LATENCY, row])
    text = perf.render_readme_streams(perf.load_runs(tmp_path))
    assert "| 2 | 518×378 | 16 | depth + camera | 30.00 | 1.50× | 66.7 | 50.0 | 45.5 | Test |" in text, text
    # a run on another GPU is named as such: its ratios are read beside its own rows, not the first run's
    write_run(tmp_path, [dict(row, ms_per_step=33.0)], name="2030-01-03-other-gpu")
    other = json.loads((tmp_path / "2030-01-03-other-gpu.json").read_text())
    other["setup"] = dict(other["setup"], gpu="NVIDIA H100 80GB HBM3")
    (tmp_path / "2030-01-03-other-gpu.json").write_text(json.dumps(other))
    text = perf.render_readme_streams(perf.load_runs(tmp_path))
    assert "| 2 | 518×378 | 16 | depth + camera | 33.00 | 1.65× | 66.7 | 50.0 | 45.5 | H100 |" in text, text
    assert "| 30.00 | 1.50× |" in text  # the first GPU's row stays beside it


def test_the_readme_cost_keeps_one_run_per_configuration_and_gpu(tmp_path):
    """Runs of one configuration on one GPU give one README row: of the runs with the most columns (the
    processes), the newest; other configurations keep their own rows."""
    row = {"table": "streams", "geometry": "518x378", "window": 64, "heads": "depth+camera", "streams": 2,
           "ms_per_step": 47.0, "one_stream_ms": 25.0, "fps_total": 42.0, "sequential_fps": 39.0,
           "processes_fps": 37.0}
    four = dict(row, window=16, streams=4, ms_per_step=50.0, one_stream_ms=15.0, processes_fps=None)
    write_run(tmp_path, [row, four], name="2030-01-01-a")
    write_run(tmp_path, [dict(row, ms_per_step=48.0, processes_fps=None), dict(four, ms_per_step=49.0)],
              name="2030-01-02-b")  # newer, without the processes for two cameras
    text = perf.render_readme_streams(perf.load_runs(tmp_path))
    lines = [line for line in text.splitlines() if line.startswith("| 2 |") or line.startswith("| 4 |")]
    assert len(lines) == 2, text
    assert "| 47.00 | 1.88× | 42.0 | 39.0 | 37.0 |" in text and "48.00" not in text  # the complete row
    assert "| 49.00 |" in text and "| 50.00 |" not in text  # the same columns: the newest
    write_run(tmp_path, [dict(row, ms_per_step=46.0)], name="2030-01-03-c")  # newer and complete
    text = perf.render_readme_streams(perf.load_runs(tmp_path))
    assert "| 46.00 |" in text and "| 47.00 |" not in text


def test_a_step_profile_totals_its_categories_per_run_and_configuration(tmp_path):
    """One total per (run, input, window, heads, streams), summed over that group's categories only."""
    def row(window, category, one, many):
        return {"table": "step_profile", "geometry": "518x378", "window": window, "heads": "depth+camera",
                "streams": 2, "category": category, "one_stream_ms": one, "batched_ms": many}

    write_run(tmp_path, [row(16, "attention", 6.0, 12.0), row(16, "gemm", 5.0, 8.0), row(64, "attention", 15.0, 30.0)])
    text = sections(perf.render_performance(perf.load_runs(tmp_path)))["Where a batched step's time goes"]
    assert "| 518×378 | 16 | depth + camera | 2 | total | 11.00 | 20.00 | 1.82× |" in text
    assert "| 518×378 | 64 | depth + camera | 2 | total | 15.00 | 30.00 | 2.00× |" in text
