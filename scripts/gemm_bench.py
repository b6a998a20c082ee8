"""cuBLAS time of the frame step's GEMMs, one frame of the full preset at 518x378 (GPU only).

The fused blocks' linears at the shapes one frame gives them (1004 DINO tokens, 1005 aggregator
tokens, C = 1024): ``qkv``, ``proj``, ``fc1``, ``fc2``, bf16 with bias, as ``F.linear`` runs them
(cuBLAS through ATen). Inductor's max-autotune log of the same shapes gives the best Triton
template; the two side by side say what autotuned GEMMs could save per frame (docs/benchmarks.md).

    python3 scripts/gemm_bench.py
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

# (name, tokens, in, out, calls per frame): 24 DINO blocks, 24 frame + 24 global aggregator blocks
SHAPES = [
    ("dino qkv", 1004, 1024, 3072, 24), ("dino proj", 1004, 1024, 1024, 24),
    ("dino fc1", 1004, 1024, 4096, 24), ("dino fc2", 1004, 4096, 1024, 24),
    ("agg qkv", 1005, 1024, 3072, 48), ("agg proj", 1005, 1024, 1024, 48),
    ("agg fc1", 1005, 1024, 4096, 48), ("agg fc2", 1005, 4096, 1024, 48),
]


def main() -> None:
    from triton.testing import do_bench

    rows = []
    total = 0.0
    for name, m, k, n, calls in SHAPES:
        sets = [(torch.randn(m, k, device="cuda", dtype=torch.bfloat16),
                 torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02,
                 torch.randn(n, device="cuda", dtype=torch.bfloat16)) for _ in range(4)]  # rotating inputs
        state = {"i": 0}

        def step():
            x, w, b = sets[state["i"] % len(sets)]
            state["i"] += 1
            return F.linear(x, w, b)

        ms = do_bench(step, warmup=50, rep=200, return_mode="median")
        tflops = 2 * m * k * n / (ms * 1e-3) / 1e12
        total += ms * calls
        rows.append(f"| {name} | {m}x{k} @ {k}x{n} | {ms * 1e3:.1f} | {tflops:.0f} | {calls} |")
    print(f"cuBLAS (F.linear, bf16 + bias) on {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("| GEMM | shape | us (median) | TFLOP/s | calls per frame |")
    print("|---|---|---|---|---|")
    print("\n".join(rows))
    print(f"| all | | {total:.2f} ms per frame | | |")


if __name__ == "__main__":
    main()
