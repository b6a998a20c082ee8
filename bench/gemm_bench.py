"""The transformer blocks' four linears at one frame's token count: do odd row counts lose a wave? (GPU only)

A 640x480 camera gives 1,042 tokens a frame (1,041 in the DINO encoder): 8 x 128 rows and 18 more. A GEMM
tiled 128 rows high then needs a ninth row of tiles, mostly empty, and where the eight rows of tiles filled
one wave of SMs the ninth starts a second. This script times each linear (bf16, bias, as ``F.linear`` runs
it under autocast) per row count, three ways:

* ``cublas``: ``F.linear`` as the compiled blocks call it today (Inductor hands dense GEMMs to cuBLAS);
* ``split``: the rows cut at the last multiple of 128, two ``F.linear`` calls (the tail's is tiny);
* ``autotune``: ``torch.compile(mode="max-autotune-no-cudagraphs")`` of the same linear, which benchmarks
  Triton templates beside cuBLAS and keeps the fastest (``--autotune-rows`` picks the row counts: it compiles
  for tens of seconds per shape).

Timed as the frame step runs them: ``CALLS`` calls back to back inside one CUDA graph, each with its own
weights (the model's blocks never share weights, so L2 never holds the next call's), the replay timed with
CUDA events; µs per call is the median replay over ``CALLS``. TFLOP/s from 2·M·N·K.

    python3 bench/gemm_bench.py [--rows 783,1005,1024,1042,2010,2084] [--autotune-rows 1005,1042] [--json F]
"""
from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
from graph_timing import graphed_us  # bench/ is the script folder: python3 bench/gemm_bench.py

# (name, out, in): the ViT-L blocks' linears (DINO encoder and aggregator alike, width 1024, MLP 4096)
SHAPES = [("qkv", 3072, 1024), ("proj", 1024, 1024), ("fc1", 4096, 1024), ("fc2", 1024, 4096)]
CALLS = 8  # calls per graph, each over its own weights
TILE_ROWS = 128
BLOCKS = 72  # 24 DINO + 24 frame + 24 global blocks run these four linears once per frame


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.linear(x, w, b)  # [M, N]


def split_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The whole 128-row tiles and the rest in two calls (the rest's call is skipped when there is none)."""
    whole = x.shape[0] // TILE_ROWS * TILE_ROWS
    if whole in (0, x.shape[0]):
        return F.linear(x, w, b)
    return torch.cat([F.linear(x[:whole], w, b), F.linear(x[whole:], w, b)])  # [M, N]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="783,1005,1024,1041,1042,2010,2084", help="row counts (tokens of a step)")
    parser.add_argument("--autotune-rows", default="1005,1042", help="row counts also timed max-autotuned ('' none)")
    parser.add_argument("--json", default="", help="write the rows here")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch._dynamo.config.cache_size_limit = 64  # one specialisation per shape and row count
    autotune_rows = {int(r) for r in args.autotune_rows.split(",") if r}
    compiled = torch.compile(linear, mode="max-autotune-no-cudagraphs", dynamic=False)
    rows = []
    print("| linear | rows | way | µs | TFLOP/s |\n|---|---|---|---|---|", flush=True)
    for m in (int(r) for r in args.rows.split(",")):
        for name, n, k in SHAPES:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)  # [M, K]
            weights = [(torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5,
                        torch.randn(n, device="cuda", dtype=torch.bfloat16)) for _ in range(CALLS)]
            ways = {"cublas": linear, "split": split_linear}
            if m in autotune_rows:
                ways["autotune"] = compiled
            for way, fn in ways.items():
                us = graphed_us([lambda w=w, b=b, fn=fn: fn(x, w, b) for w, b in weights])
                tflops = 2 * m * n * k / us / 1e6
                rows.append({"table": "gemm", "linear": name, "rows": m, "out": n, "in": k, "way": way,
                             "us": round(us, 2), "tflops": round(tflops, 1)})
                print(f"| {name} {k}->{n} | {m} | {way} | {us:.1f} | {tflops:.0f} |", flush=True)
    print("\n| rows | way | µs per block (4 linears) | ms per frame (72 blocks) |\n|---|---|---|---|")
    for m in sorted({r["rows"] for r in rows}):
        for way in ("cublas", "split", "autotune"):
            mine = [r["us"] for r in rows if r["rows"] == m and r["way"] == way]
            if len(mine) == len(SHAPES):
                print(f"| {m} | {way} | {sum(mine):.1f} | {sum(mine) * BLOCKS / 1e3:.2f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
