"""The camera head's trunk GEMVs (one fp32 token, width 2048): cuBLAS (F.linear) against ``core/model/gemv.py``
per tile choice (GPU only). Prints µs per call and TB/s of weight traffic per shape and tile.

``--tokens 2,4``: the several camera tokens of a batched step (one per stream) in one call, beside cuBLAS
over the same tokens and beside one single-token call per token.

Timed as the frame step runs them: ``CALLS`` calls back to back inside one CUDA graph (no host launch in
the figure), each reading its own copy of the weights (so L2, 50 MB, never holds the next one), the
graph replayed and timed with CUDA events; µs per call is the median replay over ``CALLS``.

    python3 bench/gemv_bench.py [--tokens 1,2,4] [--default-tiles]
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from graph_timing import graphed_us  # bench/ is the script folder: python3 bench/gemv_bench.py

from lingbot_map_ros.core.model.gemv import linear_residual, norm_linear

# (name, out, in, fused kind): the trunk block's four linears
SHAPES = [("qkv (LN before)", 6144, 2048, "norm"), ("proj (+ residual)", 2048, 2048, "residual"),
          ("fc1 (LN before, GELU)", 8192, 2048, "gelu"), ("fc2 (+ residual)", 2048, 8192, "residual")]
TILES = [(0, 256, 4), (4, 256, 4), (8, 256, 4), (16, 256, 4), (32, 128, 4), (8, 512, 4), (16, 512, 8), (8, 1024, 8),
         (4, 1024, 4), (2, 2048, 4), (4, 512, 4), (4, 256, 2), (8, 256, 8), (2, 1024, 4)]
CALLS = 8  # calls per graph, each over its own weight copy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="1", help="token counts, comma-separated (a batched step's streams)")
    parser.add_argument("--default-tiles", action="store_true", help="only the shipped tile (gemv._tile)")
    args = parser.parse_args()
    tiles = [(0, 0, 4)] if args.default_tiles else TILES
    print("| linear | tokens | tile (rows, chunk, warps; 0: default) | µs | TB/s |\n|---|---|---|---|---|")
    for m in (int(t) for t in args.tokens.split(",")):
        for name, n, k, kind in SHAPES:
            x = torch.randn(1, m, k, device="cuda")  # [1, M, K]: one token per stream
            weights = [torch.randn(n, k, device="cuda") / k**0.5 for _ in range(CALLS)]
            b = torch.randn(n, device="cuda")
            ln = (torch.randn(k, device="cuda"), torch.randn(k, device="cuda"))
            gamma, res = torch.randn(n, device="cuda"), torch.randn(1, m, n, device="cuda")
            gb = n * k * 4 / 1e9

            def row(label: str, us: float) -> None:
                print(f"| {name} | {m} | {label} | {us:.1f} | {gb / us * 1e3:.2f} |")

            row("cuBLAS F.linear (no LN, no epilogue)", graphed_us([lambda w=w: F.linear(x, w, b) for w in weights]))
            for bn, bk, warps in tiles:
                t = dict(block_n=bn, block_k=bk, num_warps=warps)
                if kind == "residual":
                    def one(w, xs=x, r=res, t=t):
                        return linear_residual(xs, w, b, gamma, r, **t)
                else:
                    def one(w, xs=x, r=res, t=t):
                        return norm_linear(xs, ln, 1e-5, w, b, gelu=kind == "gelu", **t)
                try:
                    row(f"{bn}, {bk}, {warps}", graphed_us([lambda w=w: one(w) for w in weights]))
                    if m > 1 and (bn, bk) == (0, 0):  # what one call per token would take
                        singles = [(x[:, i:i + 1].contiguous(), res[:, i:i + 1].contiguous()) for i in range(m)]
                        row(f"{m} one-token calls", graphed_us(
                            [lambda w=w: [one(w, xs, r) for xs, r in singles] for w in weights]))
                except Exception as exc:  # a tile that does not compile is reported, not fatal
                    print(f"| {name} | {m} | {bn}, {bk}, {warps} | failed: {type(exc).__name__} | |")


if __name__ == "__main__":
    main()
