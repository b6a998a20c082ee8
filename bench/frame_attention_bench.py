"""One frame's own attention (the DINO and frame blocks: T queries against the same T keys, 16 heads, d 64)
per SDPA backend and token count (GPU only).

The 48 such calls a frame makes go through ``F.scaled_dot_product_attention``'s own choice of kernel (cuDNN on
Hopper). cuDNN's kernel tiles 128 queries a program: 1,005 tokens (518x378) are 8 tiles x 16 heads = 128
programs, one wave on 132 SMs; 1,042 tokens (518x392) are 9 x 16 = 144, two waves. This script times the
call per backend (cuDNN, FlashAttention-2, memory-efficient) and per token count, in the model's token-major
layout (``[N, T, H, D]`` transposed to ``[N, H, T, D]`` views), inside one CUDA graph, and gives the largest
difference of each backend's output from cuDNN's (bf16 rounding is ~4e-3 of the values).

    python3 bench/frame_attention_bench.py [--tokens 783,1005,1041,1042] [--frames 1,2] [--json F]
"""
from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
from graph_timing import graphed_us  # bench/ is the script folder: python3 bench/frame_attention_bench.py
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}
CALLS = 16  # calls per graph
HEADS, HEAD_DIM = 16, 64


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="783,1005,1041,1042", help="tokens per frame, comma-separated")
    parser.add_argument("--frames", default="1,2", help="frames per call (a batched step's streams)")
    parser.add_argument("--json", default="", help="write the rows here")
    args = parser.parse_args()
    torch.manual_seed(0)
    rows = []
    print("| tokens | frames | backend | µs | max diff from cuDNN |\n|---|---|---|---|---|", flush=True)
    for n in (int(f) for f in args.frames.split(",")):
        for t in (int(x) for x in args.tokens.split(",")):
            qkv = torch.randn(n, t, 3, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)  # [N, T, 3, H, D]
            q, k, v = (x.transpose(1, 2) for x in qkv.unbind(2))  # [N, H, T, D] views, as sdpa_tokens passes them
            reference = None
            for name, backend in BACKENDS.items():
                def call(backend=backend) -> torch.Tensor:
                    with sdpa_kernel([backend]):
                        return F.scaled_dot_product_attention(q, k, v)  # [N, H, T, D]
                try:
                    out = call()
                except RuntimeError as error:  # a backend that refuses this shape or GPU
                    print(f"| {t} | {n} | {name} | refused: {str(error)[:80]} | |", flush=True)
                    continue
                reference = out if reference is None else reference
                diff = (out.float() - reference.float()).abs().max().item()
                us = graphed_us([call] * CALLS)
                rows.append({"table": "frame_attention", "tokens": t, "frames": n, "backend": name,
                             "us": round(us, 2), "max_diff_from_cudnn": diff})
                print(f"| {t} | {n} | {name} | {us:.1f} | {diff:.2e} |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
