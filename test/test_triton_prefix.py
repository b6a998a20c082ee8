"""The split backend's Triton prefix kernel (``core/cache/triton_prefix.py``) on the CPU, in Triton's
interpreter, against float64: alone (query tiles and key blocks with ragged ends, several runs of a
poisoned storage, one, three and more parts than keys) and as the split backend's one call per step
over a random stream (window filling, full window, eviction, specials), or its calls of a plan that
cuts the frame's rows (``runs_plan.py``: whole tiles in one part, the tail in key ranges). The GPU side (bf16/fp16, the
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
    # the cut plan's steps ran as its two calls only: 8 rows written in place, 5 rows in three parts
    # (the scale frames' joint call has other row counts and stays one call)
    by_rows: dict[int, set] = {}
    for rows, parts, into_out in report["ragged_calls"]:
        by_rows.setdefault(rows, set()).add((parts, into_out))
    assert by_rows.get(8) == {(1, True)} and by_rows.get(5) == {(3, False)} and 13 not in by_rows, by_rows
    # pages 0-2 join, 4 stands alone, 7 joins 8 (the partial last visible page, 3 slots, ends the run)
    assert report["runs"] == [[0, 30], [40, 10], [70, 13]], report["runs"]
