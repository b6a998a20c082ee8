"""The camera head's split-key decode (``core/cache/camera_decode.py``) on the CPU, in Triton's
interpreter, against float64 (``camera_decode_check.py`` in a child process: the interpreter is
chosen when Triton is imported). The compiled kernel inside the CUDA graph is checked in test_gpu.py."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lingbot_map_ros.core.cache import CameraKVCache

pytest.importorskip("triton")  # scripts/setup_env.sh installs it; without it the graph step keeps masked SDPA


def test_camera_decode_matches_float64_in_the_interpreter() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    script = Path(__file__).with_name("camera_decode_check.py")
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600,
                          cwd=Path(__file__).parents[1])
    assert done.returncode == 0, done.stderr[-3000:]
    errors = json.loads(done.stdout.strip().splitlines()[-1])["errors"]
    assert len(errors) == 9 + 1, errors
    for name, err in errors.items():  # fp32 arithmetic against float64
        assert err < 1e-5, (name, err)


def test_triton_decode_is_refused_outside_fp32() -> None:
    with pytest.raises(ValueError, match="fp32"):
        CameraKVCache(1, 1, 2, 8, 4, torch.bfloat16, "cpu", static=True, decode_kernel="triton")
    with pytest.raises(ValueError, match="decode_kernel"):
        CameraKVCache(1, 1, 2, 8, 4, torch.float32, "cpu", static=True, decode_kernel="flash")
