"""The split backend's Triton prefix kernel (``core/cache/triton_prefix.py``) on the CPU, in Triton's
interpreter, against float64: alone (query tiles and key blocks with ragged ends, several runs of a
poisoned storage, one, three and more parts than keys) and as the split backend's one call per step
over a random stream (window filling, full window, eviction, specials). The GPU side (bf16/fp16, the
compiled kernel, CUDA graphs) is in test_gpu.py.

The interpreter is chosen when Triton is imported, so the check runs in a child process with
``TRITON_INTERPRET=1`` (``triton_interpreter_check.py``)."""
from __future__ import annotations

import pytest
from interpreter_child import run_interpreted

pytest.importorskip("triton")  # scripts/setup_env.sh installs it; a robot without Triton runs cuDNN's prefix


def test_triton_prefix_kernel_matches_float64_in_the_interpreter() -> None:
    report = run_interpreted("triton_interpreter_check.py")
    kernel = report["kernel"]
    for name, err in kernel.items():  # fp32 arithmetic in the interpreter
        assert err < 2e-6, (name, err, kernel)
    # every step of each stream matched float64 inside the drive; the kernel read both prefix shapes
    for key, modes in report["modes"].items():
        assert {"filling", "full"} <= set(modes), (key, modes)
    # pages 0-2 join, 4 stands alone, 7 joins 8 (the partial last visible page, 3 slots, ends the run)
    assert report["runs"] == [[0, 30], [40, 10], [70, 13]], report["runs"]
