"""The camera head's trunk GEMVs (one fp32 token, width 2048): cuBLAS (F.linear) against ``core/model/gemv.py``
per tile choice (GPU only). Prints µs per call and TB/s of weight traffic per shape and tile.

    python3 scripts/gemv_bench.py
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from lingbot_map_ros.core.model.gemv import linear_residual, norm_linear

# (name, out, in, fused kind): the trunk block's four linears
SHAPES = [("qkv (LN before)", 6144, 2048, "norm"), ("proj (+ residual)", 2048, 2048, "residual"),
          ("fc1 (LN before, GELU)", 8192, 2048, "gelu"), ("fc2 (+ residual)", 2048, 8192, "residual")]
TILES = [(0, 256, 4), (4, 256, 4), (8, 256, 4), (16, 256, 4), (32, 128, 4), (8, 512, 4), (16, 512, 8), (8, 1024, 8),
         (4, 1024, 4), (2, 2048, 4)]


def main() -> None:
    from triton.testing import do_bench

    print("| linear | tile (rows, chunk, warps; 0: default) | µs | TB/s |\n|---|---|---|---|")
    for name, n, k, kind in SHAPES:
        x = torch.randn(1, 1, k, device="cuda")
        w, b = torch.randn(n, k, device="cuda") / k**0.5, torch.randn(n, device="cuda")
        ln = (torch.randn(k, device="cuda"), torch.randn(k, device="cuda"))
        gamma, res = torch.randn(n, device="cuda"), torch.randn(1, 1, n, device="cuda")
        gb = n * k * 4 / 1e9
        us = do_bench(lambda: F.linear(x, w, b), warmup=20, rep=100, return_mode="median") * 1e3
        print(f"| {name} | cuBLAS F.linear (no LN, no epilogue) | {us:.1f} | {gb / us * 1e3:.2f} |")
        for bn, bk, warps in TILES:
            tiles = dict(block_n=bn, block_k=bk, num_warps=warps)
            if kind == "residual":
                fn = lambda t=tiles: linear_residual(x, w, b, gamma, res, **t)  # noqa: E731
            else:
                fn = lambda t=tiles: norm_linear(x, ln, 1e-5, w, b, gelu=kind == "gelu", **t)  # noqa: E731
            try:
                us = do_bench(fn, warmup=20, rep=100, return_mode="median") * 1e3
                print(f"| {name} | {bn}, {bk}, {warps} | {us:.1f} | {gb / us * 1e3:.2f} |")
            except Exception as exc:  # a tile that does not compile is reported, not fatal
                print(f"| {name} | {bn}, {bk}, {warps} | failed: {type(exc).__name__} | |")


if __name__ == "__main__":
    main()
