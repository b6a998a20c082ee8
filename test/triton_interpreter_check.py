"""Run by test_triton_prefix.py in a child process with ``TRITON_INTERPRET=1`` (Triton reads it when
the kernel module is imported): the Triton prefix kernel, on the CPU, against float64.

Prints one JSON object: the worst errors of the kernel alone and the modes the split backend went
through with the kernel reading its unmasked regions (its outputs are checked inside the drive)."""
from __future__ import annotations

import json
import math
import os
import sys

import torch

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
import triton.runtime.interpreter as interpreter  # noqa: E402

_patch_lang_tensor = interpreter._patch_lang_tensor


def _patch_with_numpy_2_4(tensor, scope) -> None:
    """Triton 3.6's interpreter turns a scalar into an int with ``int(array)``, which NumPy >= 2.4
    refuses for a one-element 1-d array (a runtime loop bound); index its single element instead."""
    _patch_lang_tensor(tensor, scope)
    scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))


interpreter._patch_lang_tensor = _patch_with_numpy_2_4
sys.path.insert(0, os.path.dirname(__file__))

from test_paged_attention import drive_one_frame_backend  # noqa: E402

from lingbot_map_ros.core.cache import PagedKVCache  # noqa: E402
from lingbot_map_ros.core.cache.split_backend import SplitPrefixBackend  # noqa: E402
from lingbot_map_ros.core.cache.triton_prefix import prefix_attention  # noqa: E402
from lingbot_map_ros.core.config import SPECIAL_TOKENS_PER_FRAME  # noqa: E402


def kernel_errors() -> dict[str, float]:
    """37 queries (not a multiple of the 16-query tile) x 2 heads x d 64 over 450 keys, as 1 and 3
    ranges (150 keys: four whole 32-key blocks and one masked block each), each checked in float64."""
    gen = torch.Generator().manual_seed(0)
    t, n, h, d = 37, 450, 2, 64
    q, k, v = (torch.randn(x, h, d, generator=gen) for x in (t, n, n))  # [T|N, H, D]
    errors: dict[str, float] = {}
    for ranges in (1, 3):
        for fma in (False, True):
            out, lse = prefix_attention(q, k, v, key_ranges=ranges, exp2_on_fma=fma, block_m=16, block_n=32,
                                        num_stages=2)  # [S, T, H, D], [S, H, T]
            per = n // ranges
            out_err = lse_err = 0.0
            for r in range(ranges):
                scores = torch.einsum("thd,nhd->htn", q.double(), k[r * per:(r + 1) * per].double()) / math.sqrt(d)
                ref = torch.einsum("htn,nhd->thd", scores.softmax(-1), v[r * per:(r + 1) * per].double())
                out_err = max(out_err, ((out[r].double() - ref).norm() / ref.norm()).item())
                lse_err = max(lse_err, (lse[r].double() - scores.logsumexp(-1)).abs().max().item())
            errors[f"ranges{ranges}{'_fma' if fma else ''}_out"] = out_err
            errors[f"ranges{ranges}{'_fma' if fma else ''}_lse"] = lse_err
    return errors


def split_backend_modes(prefix_kernel: str, kv_splits: int) -> list[str]:
    """A random stream through a PagedKVCache whose split backend reads its unmasked regions with the
    Triton kernel; ``drive_one_frame_backend`` compares every step with float64 attention."""
    page, heads, dim, scale, window, steps = 7, 2, 16, 2, 3, 14
    cache = PagedKVCache(2, heads, dim, page, scale, window, max_frame_num=64, dtype=torch.float32, device="cpu",
                         num_patch_pages=scale + window + 1, special_pages=-(-SPECIAL_TOKENS_PER_FRAME
                                                                              * (scale + steps + 1) // page),
                         allocation="lowest")
    split = SplitPrefixBackend(page_size=page, num_patch_pages=cache.table.num_patch_pages,
                               num_pages=cache.table.num_pages, num_heads=heads, head_dim=dim, dtype=torch.float32,
                               device="cpu", kernel="cpu", kv_splits=kv_splits, prefix_kernel=prefix_kernel)
    seen = drive_one_frame_backend(cache, split, page_size=page, dtype=torch.float32, scale=scale, window=window,
                                   steps=steps, seed=3, keyframe_share=0.6, heads=heads, head_dim=dim)
    return [mode for _, mode in seen]


if __name__ == "__main__":
    print(json.dumps({"kernel": kernel_errors(),
                      "modes": {f"{kernel}/{splits}": split_backend_modes(kernel, splits)
                                for kernel, splits in (("triton", 1), ("triton", 5), ("triton_fma", 1))}}))
