"""The camera head's trunk GEMVs (one fp32 token, width 2048): cuBLAS (F.linear) against ``core/model/gemv.py``
per tile choice (GPU only). Prints µs per call and TB/s of weight traffic per shape and tile.

Timed as the frame step runs them: ``CALLS`` calls back to back inside one CUDA graph (no host launch in
the figure), each reading its own copy of the weights (so L2, 50 MB, never holds the next one), the
graph replayed and timed with CUDA events; µs per call is the median replay over ``CALLS``.

    python3 bench/gemv_bench.py
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from lingbot_map_ros.core.model.gemv import linear_residual, norm_linear

# (name, out, in, fused kind): the trunk block's four linears
SHAPES = [("qkv (LN before)", 6144, 2048, "norm"), ("proj (+ residual)", 2048, 2048, "residual"),
          ("fc1 (LN before, GELU)", 8192, 2048, "gelu"), ("fc2 (+ residual)", 2048, 8192, "residual")]
TILES = [(0, 256, 4), (4, 256, 4), (8, 256, 4), (16, 256, 4), (32, 128, 4), (8, 512, 4), (16, 512, 8), (8, 1024, 8),
         (4, 1024, 4), (2, 2048, 4), (4, 512, 4), (4, 256, 2), (8, 256, 8), (2, 1024, 4)]
CALLS = 8  # calls per graph, each over its own weight copy


def graphed_us(calls: list) -> float:
    """Median µs per call of ``calls`` (closures) captured back to back into one CUDA graph."""
    for fn in calls:  # compile / warm up outside the capture
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn in calls:
            fn()
    times = []
    for _ in range(25):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(calls))
    return sorted(times)[len(times) // 2]


def main() -> None:
    print("| linear | tile (rows, chunk, warps; 0: default) | µs | TB/s |\n|---|---|---|---|")
    for name, n, k, kind in SHAPES:
        x = torch.randn(1, 1, k, device="cuda")
        weights = [torch.randn(n, k, device="cuda") / k**0.5 for _ in range(CALLS)]
        b = torch.randn(n, device="cuda")
        ln = (torch.randn(k, device="cuda"), torch.randn(k, device="cuda"))
        gamma, res = torch.randn(n, device="cuda"), torch.randn(1, 1, n, device="cuda")
        gb = n * k * 4 / 1e9
        us = graphed_us([lambda w=w: F.linear(x, w, b) for w in weights])
        print(f"| {name} | cuBLAS F.linear (no LN, no epilogue) | {us:.1f} | {gb / us * 1e3:.2f} |")
        for bn, bk, warps in TILES:
            tiles = dict(block_n=bn, block_k=bk, num_warps=warps)
            if kind == "residual":
                calls = [lambda w=w, t=tiles: linear_residual(x, w, b, gamma, res, **t) for w in weights]
            else:
                calls = [lambda w=w, t=tiles: norm_linear(x, ln, 1e-5, w, b, gelu=kind == "gelu", **t) for w in weights]
            try:
                us = graphed_us(calls)
                print(f"| {name} | {bn}, {bk}, {warps} | {us:.1f} | {gb / us * 1e3:.2f} |")
            except Exception as exc:  # a tile that does not compile is reported, not fatal
                print(f"| {name} | {bn}, {bk}, {warps} | failed: {type(exc).__name__} | |")


if __name__ == "__main__":
    main()
