"""The graph step's small Triton kernels on the CPU, in Triton's interpreter (``step_kernels_check.py``
in a child process: the interpreter is chosen when Triton is imported): the camera head's split-key
decode against float64, the K/V write against ``index_copy_`` and inside a paged cache's stream,
q/k-norm + RoPE and the camera head's fused GEMVs against float64. The compiled kernels inside the CUDA
graph are checked in test_gpu.py."""
from __future__ import annotations

import pytest
import torch
from interpreter_child import run_interpreted

from lingbot_map_ros.core.cache import CameraKVCache

pytest.importorskip("triton")  # scripts/setup_env.sh installs it; without it the graph step keeps masked SDPA


def test_step_kernels_match_their_references_in_the_interpreter() -> None:
    report = run_interpreted("step_kernels_check.py")
    errors = report["errors"]
    assert len(errors) == 9 + 1, errors
    for name, err in errors.items():  # fp32 arithmetic against float64
        assert err < 1e-5, (name, err)
    # the K/V write matched index_copy_ bit for bit (asserted in the child) and fed 12 one-frame steps
    assert report["kv_write"] == {"kv write stream steps": 12.0}, report
    # q/k-norm + RoPE: both rotations, q and k, fp32 against float64 and bf16 within one ulp (the
    # interpreter truncates its casts; test_gpu.py holds the compiled kernel to round-to-nearest)
    qk = report["qk_rope"]
    assert len(qk) == 8, qk
    for name, err in qk.items():
        assert err < 1e-6 if name.endswith("fp32") else err <= 0.0, (name, err)
    # the camera head's fused GEMVs (LN before, GELU or LayerScale + residual after) against float64, for one
    # token and for the several of a batched step (each equal to itself run alone)
    gemv = report["gemv"]
    assert len(gemv) == 9 + 3 * 3, gemv  # one token in three shapes; 2, 3 and 4 tokens (a batched step's)
    for name, err in gemv.items():
        assert err < 1e-5, (name, err)


def test_triton_decode_is_refused_outside_fp32() -> None:
    with pytest.raises(ValueError, match="fp32"):
        CameraKVCache(1, 1, 2, 8, 4, torch.bfloat16, "cpu", static=True, decode_kernel="triton")
    with pytest.raises(ValueError, match="decode_kernel"):
        CameraKVCache(1, 1, 2, 8, 4, torch.float32, "cpu", static=True, decode_kernel="flash")


def test_the_warp_specialised_runs_kernel_runs_where_its_programs_fit_one_wave() -> None:
    """The Gluon kernel's layout by shape (``use_pairs``): two warpgroups of 64 queries a program, one
    program per SM, so pairs only where ceil(T / 128) x heads x parts fits the SMs; the default
    518 x 378 frame (1005 queries, 16 heads) on an H200 (132 SMs) does, 518 x 392 (1042) does not."""
    pytest.importorskip("triton.experimental.gluon")
    from lingbot_map_ros.core.cache.gluon_runs import use_pairs

    assert use_pairs(1005, 16, 1, 132)
    assert not use_pairs(1042, 16, 1, 132)  # 9 x 16 = 144 programs: two waves
    assert not use_pairs(1005, 16, 2, 132)  # two parts: 256 programs
    assert use_pairs(1024, 16, 1, 128) and not use_pairs(1025, 16, 1, 128)  # the boundary
    assert use_pairs(150, 2, 3, 12) and not use_pairs(150, 2, 3, 11)  # 2 blocks x 2 heads x 3 parts


def test_the_gluon_runs_kernels_compile_for_hopper_without_spills() -> None:
    """Both Gluon kernels compile for sm_90a here, without a GPU (Triton's ptxas): the one-warpgroup
    kernel in at most 255 registers (two programs per SM: 2 x 128 threads) and the warp-specialised one
    with its register split (the consumers at CONSUMER_REGS, the producer at PRODUCER_REGS), neither
    spilling, both with wgmma and TMA loads, and the pair kernel's stages within one SM's shared memory;
    the warp-specialised kernel carrying a ragged tail (``TAIL``: a third warpgroup, four sharing the register
    file) without spills, within one SM's shared memory.
    CI has no GPU: this is where a kernel edit that no longer builds, or spills, shows first."""
    pytest.importorskip("triton.experimental.gluon")
    import subprocess
    import sys
    from pathlib import Path

    from lingbot_map_ros.core.cache import gluon_runs

    script = Path(__file__).with_name("gluon_compile_check.py")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600,
                          cwd=Path(__file__).parents[1])
    assert done.returncode == 0, done.stderr[-3000:]
    import json

    report = json.loads(done.stdout.strip().splitlines()[-1])
    single, pairs, fused = report["single"], report["pairs"], report["pairs_tail"]
    assert single["spill_bytes"] == 0 and pairs["spill_bytes"] == 0, report
    # the tail's own warpgroup: four warpgroups within the register file, nothing spilled, its wgmma beside the pair's
    assert fused["spill_bytes"] == 0 and fused["wgmma"] > pairs["wgmma"], report
    assert {gluon_runs.TAIL_WG_CONSUMER_REGS, gluon_runs.TAIL_WG_REGS, gluon_runs.PRODUCER_REGS} <= set(
        fused["setmaxnreg"]), report
    assert 2 * gluon_runs.TAIL_WG_CONSUMER_REGS + gluon_runs.TAIL_WG_REGS + gluon_runs.PRODUCER_REGS <= 512, report
    assert pairs["shared_bytes"] < fused["shared_bytes"] <= 227 * 1024, report  # + the tail's query tile
    assert single["registers"] <= 255 and not single["setmaxnreg"], report
    assert {gluon_runs.CONSUMER_REGS, gluon_runs.PRODUCER_REGS} <= set(pairs["setmaxnreg"]), report
    assert single["wgmma"] > 0 and pairs["wgmma"] > 0 and single["tma_loads"] > 0 and pairs["tma_loads"] > 0, report
    assert pairs["shared_bytes"] <= 227 * 1024, report
