"""bench/first_pose.py on the CPU with the tiny preset: the checkpoint it writes holds the seeded model under
the official key names, the timed run loads that file (not random weights) and its row says so, and the
dry run its docstring shows still runs.

Why: the start-up measurement is quoted against a robot's boot, which reads a checkpoint file; a run that
silently drew random weights instead, or a file with other values or names, would time something else.
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from lingbot_map_ros.core.config import model_config
from lingbot_map_ros.core.model.checkpoint import build_model

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "bench" / "first_pose.py"
SMALL = ["--device", "cpu", "--preset", "tiny", "--height", "42", "--width", "56", "--scale-frames", "2",
         "--sliding-window", "4"]


def run_script(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, LINGBOT_MAP_CACHE_DIR=str(tmp_path / "kernel_cache"))
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120,
                          env=env, cwd=REPO)


def written_checkpoint(tmp_path: Path, dtype: str | None = None) -> Path:
    path = tmp_path / "ckpt" / f"tiny_{dtype or 'default'}.safetensors"
    done = run_script(["--write-checkpoint", str(path), "--preset", "tiny", "--device", "cpu",
                       *(["--dtype", dtype] if dtype else [])], tmp_path)
    assert done.returncode == 0, done.stderr
    assert str(path) in done.stdout
    assert not [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")]  # no temporary left behind
    return path


def row_of(json_path: Path) -> dict:
    (row,) = json.loads(json_path.read_text())["rows"]
    return row


@pytest.mark.parametrize("dtype, torch_dtype", [(None, torch.float32), ("bfloat16", torch.bfloat16)])
def test_the_written_checkpoint_is_the_seeded_model_under_its_own_key_names(tmp_path, dtype, torch_dtype):
    path = written_checkpoint(tmp_path, dtype)
    stored = load_file(str(path))
    reference, _ = build_model(model_config("tiny"), seed=0, dtype=torch.float32)  # the same draw, in-process
    expected = reference.state_dict()
    assert sorted(stored) == sorted(expected)
    for name, value in expected.items():
        assert stored[name].dtype == torch_dtype, name
        torch.testing.assert_close(stored[name], value.to(torch_dtype), rtol=0, atol=0, msg=name)


def test_the_timed_run_loads_the_checkpoint_file_and_its_row_says_so(tmp_path):
    path = written_checkpoint(tmp_path)
    out = tmp_path / "row.json"
    done = run_script([*SMALL, "--checkpoint", str(path), "--json", str(out)], tmp_path)
    assert done.returncode == 0, done.stderr
    row = row_of(out)
    size_gb = f"{path.stat().st_size / 1e9:.2f}"
    assert row["weights"] == f"checkpoint file ({size_gb} GB, safetensors)"
    # the load report of the run: every tensor of the file, from that file (not the random-weights path)
    assert f"{path}: {len(load_file(str(path)))} tensors loaded" in done.stderr
    assert "NO CHECKPOINT" not in done.stderr
    assert row["model_load_s"] >= 0 and row["seconds"] >= row["import_s"] + row["model_load_s"]


def test_a_checkpoint_of_another_preset_is_refused_in_one_line(tmp_path):
    path = written_checkpoint(tmp_path)
    done = run_script([*SMALL[:2], "--preset", "full", "--checkpoint", str(path)], tmp_path)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    assert "wrong model_preset" in done.stderr.strip().splitlines()[-1]


def test_the_docstring_dry_run_draws_random_weights_and_its_row_says_so(tmp_path):
    (line,) = [ln.strip() for ln in SCRIPT.read_text().splitlines()
               if ln.strip().startswith("python3 bench/first_pose.py --device cpu")]
    args = shlex.split(line.split("#")[0])[2:]
    out = tmp_path / "row.json"
    done = run_script([*args, "--json", str(out)], tmp_path)
    assert done.returncode == 0, done.stderr
    assert row_of(out)["weights"] == "random (drawn in process)"
    assert "NO CHECKPOINT" in done.stderr
