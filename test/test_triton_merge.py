"""The merge of a ragged tail's attention parts by our Triton kernel (``core/cache/triton_merge.py``) on the
CPU, in Triton's interpreter: against float64 and against the PyTorch merge it replaces, writing only its
rows of the output (a view), with an empty part (log-sum-exp -inf), strided log-sum-exps and a part count
that is not a power of two. The GPU side (bf16, the node's shapes, CUDA graphs) is in test_gpu.py.

The interpreter is chosen when Triton is imported, so the check runs in a child process with
``TRITON_INTERPRET=1`` (``triton_merge_check.py``)."""
from __future__ import annotations

import pytest
from interpreter_child import run_interpreted

pytest.importorskip("triton")  # scripts/setup_env.sh installs it; without Triton the PyTorch merge runs


def test_tail_merge_kernel_matches_float64_and_the_pytorch_merge_in_the_interpreter() -> None:
    report = run_interpreted("triton_merge_check.py")
    assert set(report) == {"G8_R18_fp32", "G8_R17_fp32_strided_lse", "G3_R5_fp32", "G8_R18_fp16"}, report
    for name, result in report.items():
        half = name.endswith("fp16")
        assert result["untouched"], (name, result)  # only the view's rows were written
        assert result["kernel_err"] < (1e-3 if half else 1e-6), (name, result)
        # one rounding to the output's dtype, like the PyTorch merge's copy: at most an ulp apart
        assert result["kernel_vs_torch"] < (4e-3 if half else 1e-5), (name, result)
        assert result["kernel_err"] <= 1.5 * result["torch_err"] + (1e-4 if half else 1e-7), (name, result)
