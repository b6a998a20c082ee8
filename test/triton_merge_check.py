"""Run by test_triton_merge.py in a child process with ``TRITON_INTERPRET=1`` (Triton reads it when the
kernel module is imported): the tail-merge kernel (``core/cache/triton_merge.py``), on the CPU, against
float64 and against the PyTorch merge it stands for (``merge.merge_into`` without the kernel).

Prints one JSON object: per case the kernel's and the PyTorch merge's worst relative error against float64,
the largest difference between the two, and whether the rows around the written ones were left alone."""
from __future__ import annotations

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import triton_interpreter  # noqa: E402,F401  (first: the interpreter, mended)

from lingbot_map_ros.core.cache.merge import merge_into, merge_partials  # noqa: E402
from lingbot_map_ros.core.cache.triton_merge import merge_parts_into  # noqa: E402


def case(parts_count: int, rows: int, heads: int, dtype: torch.dtype, lse_transposed: bool, seed: int) -> dict:
    """``parts_count`` parts of a ``rows``-row tail x ``heads`` heads x d 64, part 1 empty (lse -inf, zeros,
    as a tail warpgroup that saw no key block writes it), merged into rows 5.. of a poisoned 40-row output."""
    gen = torch.Generator().manual_seed(seed)
    d, start, total = 64, 5, 40
    parts = torch.randn(parts_count, rows, heads, d, generator=gen).to(dtype)  # [G, R, H, D]
    if lse_transposed:  # [G, R, H] storage read as [G, H, R]: strides the kernel must follow
        lse = (torch.randn(parts_count, rows, heads, generator=gen) * 3).transpose(1, 2)
    else:
        lse = torch.randn(parts_count, heads, rows, generator=gen) * 3  # [G, H, R]
    parts[1] = 0
    lse[1] = float("-inf")
    weights = torch.softmax(lse.double(), dim=0)  # [G, H, R]
    reference = torch.einsum("ghr,grhd->rhd", weights, parts.double())  # [R, H, D]
    results = {}
    for way in ("kernel", "torch"):
        out = torch.full((total, heads, d), 1e4, dtype=dtype)  # [T, H, D], poisoned
        view = out[start:start + rows]
        if way == "kernel":
            merge_parts_into(view, parts, lse)
        else:
            merge_into(view, parts, lse, merge_partials)  # on the CPU: the PyTorch merge and a copy
        untouched = bool((out[:start] == 1e4).all() and (out[start + rows:] == 1e4).all())
        error = ((view.double() - reference).norm() / reference.norm()).item()
        results[way] = (view.clone(), error, untouched)
    kernel, torch_way = results["kernel"], results["torch"]
    return {"kernel_err": kernel[1], "torch_err": torch_way[1], "untouched": kernel[2] and torch_way[2],
            "kernel_vs_torch": (kernel[0].double() - torch_way[0].double()).abs().max().item()}


def main() -> None:
    report = {
        "G8_R18_fp32": case(8, 18, 3, torch.float32, False, 0),  # the 24 global blocks' tail at 518x392
        "G8_R17_fp32_strided_lse": case(8, 17, 2, torch.float32, True, 1),  # the DINO encoder's 1,041 tokens
        "G3_R5_fp32": case(3, 5, 2, torch.float32, False, 2),  # a part count that is not a power of two
        "G8_R18_fp16": case(8, 18, 2, torch.float16, False, 3),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
