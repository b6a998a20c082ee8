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


def test_help_documents_the_variant_syntax():
    out = _run("--help")
    assert out.returncode == 0 and "+graph" in out.stdout and "fa3" in out.stdout and "+compile" in out.stdout
