"""Child process of test_step_kernels.py: compile the Gluon runs kernels for sm_90a on a machine without
a GPU (Triton's own ptxas, a stand-in for the CUDA driver that only names the target) and print a JSON
report: per kernel its registers, spills, ``setmaxnreg`` values and the instructions it must contain.
The stand-in driver is global state, hence its own process."""
from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.driver import CudaDriver
from triton.runtime import driver


class _TargetOnly(CudaDriver):
    """Enough of a CUDA driver for ``warmup`` to compile: the target, a device and stream index."""

    def __init__(self) -> None:  # no CUDA library to load
        self.utils = None

    def get_current_target(self) -> GPUTarget:
        return GPUTarget("cuda", 90, 32)

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device=None) -> int:
        return 0

    def get_active_torch_device(self) -> torch.device:
        return torch.device("cpu")


def _ptxas_report(ptx: str) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(ptx)
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    done = subprocess.run([ptxas, "-v", "--gpu-name=sm_90a", f.name, "-o", os.devnull], capture_output=True,
                          text=True, check=True)
    os.unlink(f.name)
    registers = int(re.search(r"Used (\d+) registers", done.stderr).group(1))
    spills = [int(n) for n in re.findall(r"(\d+) bytes spill", done.stderr)]
    return {"registers": registers, "spill_bytes": sum(spills)}


def main() -> None:
    driver.set_active(_TargetOnly())
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from lingbot_map_ros.core.cache import gluon_runs as g
    from lingbot_map_ros.core.cache.triton_prefix import MAX_RUNS

    t, h, d, n = 1005, 16, 64, 4096
    q = torch.empty(t, h * d, dtype=torch.bfloat16)  # [T, H*D], never read: shapes for the descriptors
    k = torch.empty(n, h * d, dtype=torch.bfloat16)  # [N, H*D]
    q_desc = TensorDescriptor(q, [t, h * d], [h * d, 1], [g.BLOCK_M, d],
                              gl.NVMMASharedLayout.get_default_for([g.BLOCK_M, d], gl.bfloat16))
    k_desc = TensorDescriptor(k, [n, h * d], [h * d, 1], [g.BLOCK_N, d],
                              gl.NVMMASharedLayout.get_default_for([g.BLOCK_N, d], gl.bfloat16))
    out = torch.empty(1, t, h, d, dtype=torch.bfloat16)  # [P, T, H, D]
    lse = torch.empty(1, h, t)  # [P, H, T]
    runs = torch.zeros(MAX_RUNS, 2, dtype=torch.int32)  # the table the split backend passes
    args = (q_desc, k_desc, k_desc, out, lse, runs, t, 0.18, out.stride(0), out.stride(1), out.stride(2))
    shape = dict(HEAD_DIM=d, BM=g.BLOCK_M, BN=g.BLOCK_N, NUM_RUNS=runs.shape[0], grid=(1,))
    report = {}
    single = g._runs_attention.warmup(*args, **shape, STAGES=g.STAGES, WARPS=g.NUM_WARPS, num_warps=g.NUM_WARPS)
    launch = dict(STAGES=g.PAIR_STAGES, CONSUMER_REGS=g.CONSUMER_REGS, PRODUCER_REGS=g.PRODUCER_REGS, num_warps=4,
                  maxnreg=168)
    tail_out = torch.empty(8, 18, h, d, dtype=torch.bfloat16)  # [G, tail, H, D]
    tail_lse = torch.empty(8, h, 18)  # [G, H, tail]
    tail_args = (tail_out, tail_lse, 18, tail_out.stride(0), tail_out.stride(1), tail_out.stride(2))
    pairs = g._pair_attention.warmup(*args, out, lse, 0, 0, 0, 0, **shape, TAIL=False, **launch)
    fused = g._pair_attention.warmup(*args, *tail_args, **shape, TAIL=True, STAGES=g.PAIR_STAGES,
                                     **g._pair_launch(tail_warpgroup=True))
    for name, kernel in (("single", single), ("pairs", pairs), ("pairs_tail", fused)):
        ptx = kernel.asm["ptx"]
        report[name] = {
            **_ptxas_report(ptx),
            "setmaxnreg": sorted({int(v) for v in re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", ptx)}),
            "wgmma": len(re.findall(r"wgmma\.mma_async", ptx)),
            "tma_loads": len(re.findall(r"cp\.async\.bulk\.tensor", ptx)),
            "shared_bytes": kernel.metadata.shared,
        }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
