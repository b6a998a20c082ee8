"""The split backend's Triton prefix kernel (``core/cache/triton_prefix.py``) on the CPU, in Triton's
interpreter, against float64: alone (query tiles and key blocks with ragged ends, one and three key
ranges, the FMA-pipe exponentials) and as the reader of the split backend's unmasked regions over a
random stream (window filling, full window, eviction, specials). The GPU side (bf16/fp16, the
compiled kernel, CUDA graphs) is in test_gpu.py.

The interpreter is chosen when Triton is imported, so the check runs in a child process with
``TRITON_INTERPRET=1`` (``triton_interpreter_check.py``)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")  # scripts/setup_env.sh installs it; a robot without Triton runs cuDNN's prefix


def test_triton_prefix_kernel_matches_float64_in_the_interpreter() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    script = Path(__file__).with_name("triton_interpreter_check.py")
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600,
                          cwd=Path(__file__).parents[1])
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    kernel = report["kernel"]
    for name, err in kernel.items():  # fp32 arithmetic; the FMA-pipe exponentials are good to 7.7e-5
        limit = (1e-4 if name.endswith("_out") else 5e-5) if "_fma" in name else 2e-6
        assert err < limit, (name, err, kernel)
    # every step of each stream matched float64 inside the drive; the kernel read both prefix shapes
    for key, modes in report["modes"].items():
        assert {"filling", "full"} <= set(modes), (key, modes)
