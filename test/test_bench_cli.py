"""``lingbot_map_bench`` as a user meets it (CPU, tiny preset): refusals before any work in one line,
``--checkpoint`` really used, no steady-state figures from a run shorter than the window, the variant
syntax in ``--help``."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.slow  # every test runs the tool in a child process

BENCH = [sys.executable, "-m", "lingbot_map_ros.tools.bench"]
SMALL = ["--device", "cpu", "--height", "42", "--width", "56", "--scale-frames", "2", "--sliding-window", "3",
         "--camera-iterations", "1", "--heads", "camera"]


def _run(*args: str, timeout: float = 300):
    return subprocess.run([*BENCH, *args], capture_output=True, text=True, timeout=timeout)


def test_profile_without_cuda_and_a_missing_checkpoint_are_refused_before_the_run():
    refused = ((["--profile", "--device", "cpu"], "--profile"), (["--checkpoint", "/no/such.pt"], "/no/such.pt"))
    for args, needle in refused:
        out = _run(*args)
        lines = [line for line in out.stderr.splitlines() if line.strip()]
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
        assert needle in lines[-1] and lines[-1].startswith("lingbot_map_bench: error:"), out.stderr
        assert "| variant |" not in out.stdout  # no model was built, nothing ran


def test_checkpoint_is_used_and_short_runs_report_no_steady_state(tmp_path, tiny_model):
    _, model = tiny_model(4)
    ckpt = tmp_path / "tiny.pt"
    torch.save({"model": model.state_dict()}, ckpt)
    out = _run(*SMALL, "--checkpoint", str(ckpt), "--model-preset", "tiny", "--frames", "5")
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"weights: {ckpt}" in out.stderr
    assert "do not reach the steady state" in out.stderr
    row = [line for line in out.stdout.splitlines() if line.startswith("| auto = sdpa")][0].split("|")
    assert row[4].strip() == "-" and row[6].strip() == "-" and "run too short" in row[10], row
    long_run = _run(*SMALL, "--frames", "12")
    row = [line for line in long_run.stdout.splitlines() if line.startswith("| auto = sdpa")][0].split("|")
    assert float(row[4]) > 0 and "->" in row[10], row


def test_json_rows_match_the_table_and_warm_cache_names_its_folders(tmp_path):
    """``--json`` writes the run-of-record rows of the printed table (latency and memory, with the set-up);
    ``--warm-cache`` runs the default path and says where the kernel caches are (LINGBOT_MAP_CACHE_DIR)."""
    import json
    import os

    result = tmp_path / "run.json"
    out = _run(*SMALL, "--frames", "12", "--variants", "auto,sdpa+eager", "--json", str(result))
    assert out.returncode == 0, out.stderr[-3000:]
    table = {line.split("|")[1].strip().split(" = ")[0]: line.split("|") for line in out.stdout.splitlines()
             if line.startswith("| auto") or line.startswith("| sdpa+eager")}
    doc = json.loads(result.read_text())
    assert doc["run"] == "run" and doc["setup"]["torch"] == torch.__version__ and doc["setup"]["gpu"] == "CPU"
    latency = {r["path"]: r for r in doc["rows"] if r["table"] == "latency"}
    assert set(latency) == {"default", "sdpa+eager"}
    for name, path in (("auto", "default"), ("sdpa+eager", "sdpa+eager")):
        row = latency[path]
        assert (row["geometry"], row["heads"], row["window"], row["load"]) == ("56x42", "camera", 3, "idle")
        assert row["median_ms"] == pytest.approx(float(table[name][4]), abs=0.006)
        assert row["p90_ms"] == pytest.approx(float(table[name][5]), abs=0.006)
    memory = [r for r in doc["rows"] if r["table"] == "memory"]
    assert len(memory) == 1 and memory[0]["predicted_gb"] > 0 and memory[0]["measured_gb"] > 0
    env = {**os.environ, "LINGBOT_MAP_CACHE_DIR": str(tmp_path / "kernels")}
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    env.pop("TRITON_CACHE_DIR", None)
    warm = subprocess.run([*BENCH, *SMALL, "--warm-cache"], capture_output=True, text=True, timeout=300, env=env)
    assert warm.returncode == 0, warm.stderr[-3000:]
    assert f"TORCHINDUCTOR_CACHE_DIR={tmp_path / 'kernels' / 'inductor'}" in warm.stdout
    assert f"TRITON_CACHE_DIR={tmp_path / 'kernels' / 'triton'}" in warm.stdout


def test_help_documents_the_variant_syntax():
    out = _run("--help")
    assert out.returncode == 0 and "+graph" in out.stdout and "fa3" in out.stdout and "+compile" in out.stdout
    assert "portable" in out.stdout and "@smXY" in out.stdout and "--warm-cache" in out.stdout
