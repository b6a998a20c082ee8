"""Run by test_step_kernels.py in a child process with ``TRITON_INTERPRET=1``: the graph step's small
Triton kernels on the CPU. The camera head's split-key decode (``core/cache/camera_decode.py``) against
float64, alone and inside a static ``CameraKVCache`` driven through random stored / unstored steps,
resets and loads; the K/V write (``core/cache/kv_write.py``) against ``index_copy_`` bit for bit, alone
and inside a ``PagedKVCache`` stream checked against float64 attention.

Prints one JSON object: the worst errors per case."""
from __future__ import annotations

import json
import math
import os
import random
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import triton_interpreter  # noqa: E402,F401  (first: the interpreter, mended)
from attention_reference import drive_one_frame_backend  # noqa: E402

from lingbot_map_ros.core.cache import CameraKVCache, PagedKVCache  # noqa: E402
from lingbot_map_ros.core.cache.camera_decode import decode_attention  # noqa: E402
from lingbot_map_ros.core.cache.dense_backend import MaskedDenseBackend  # noqa: E402
from lingbot_map_ros.core.cache.kv_write import write_rows  # noqa: E402
from lingbot_map_ros.core.cache.pool import SharedKVPool  # noqa: E402
from lingbot_map_ros.core.config import SPECIAL_TOKENS_PER_FRAME  # noqa: E402
from lingbot_map_ros.core.model.gemv import linear_residual, norm_linear  # noqa: E402
from lingbot_map_ros.core.model.qk_rope import qk_norm_rope  # noqa: E402
from lingbot_map_ros.core.model.rope import Rope2D, Rope3D, apply_rope_2d, apply_rope_3d  # noqa: E402


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q kᵀ/√D) v in float64: q [1, H, D], k/v [N, H, D] -> [1, H, D]."""
    logits = torch.einsum("shd,nhd->hsn", q.double(), k.double()) / math.sqrt(q.shape[-1])  # [H, 1, N]
    return torch.einsum("hsn,nhd->shd", logits.softmax(-1), v.double())


def relative(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref).norm() / ref.norm()).item()


def kernel_cases() -> dict[str, float]:
    """3 heads x d 16, capacity 77 (not a multiple of any part size); the slot at both ends, at part
    borders and inside; 1-key parts (77 parts: the merge loops over two chunks), 8 and 32; rows at and
    after the slot poisoned (they must never be read) and the slot row rewritten by the call."""
    gen = torch.Generator().manual_seed(1)
    h, d, capacity = 3, 16, 77
    errors: dict[str, float] = {}
    for block_keys, slots in ((1, (5, 76)), (8, (7, 8, 50)), (32, (0, 31, 32, 76))):
        for slot in slots:
            k_cache, v_cache = (torch.randn(capacity, h, d, generator=gen) * 3 for _ in range(2))  # [C, H, D]
            k_cache[slot:] = 1e4
            v_cache[slot:] = -1e4
            before_k, before_v = k_cache.clone(), v_cache.clone()
            qkv = torch.randn(1, 3, h, d, generator=gen) * 3  # [1, 3, H, D]: strided views, as the trunk's
            q, k_new, v_new = qkv.unbind(1)
            out = decode_attention(q, k_new, v_new, k_cache, v_cache, torch.tensor([slot]), block_keys=block_keys)
            ref = reference(q, torch.cat((before_k[:slot], k_new)), torch.cat((before_v[:slot], v_new)))
            errors[f"parts of {block_keys}, slot {slot}"] = relative(out, ref)
            # the slot row holds this frame's k and v; every other row is untouched
            expect_k, expect_v = before_k.clone(), before_v.clone()
            expect_k[slot], expect_v[slot] = k_new[0], v_new[0]
            assert torch.equal(k_cache, expect_k) and torch.equal(v_cache, expect_v), (block_keys, slot)
    return errors


def cache_cases() -> dict[str, float]:
    """A static cache with the Triton decode against float64 over the tokens the test keeps itself."""
    rng = random.Random(4)
    gen = torch.Generator().manual_seed(4)
    iterations, blocks, h, d, capacity = 2, 2, 2, 8, 10
    cache = CameraKVCache(iterations, blocks, h, d, capacity, torch.float32, "cpu", static=True,
                          decode_kernel="triton")
    mine = {key: torch.empty(0, 2, h, d) for key in ((i, b) for i in range(iterations) for b in range(blocks))}
    saved = None
    worst = 0.0
    steps = {"stored": 0, "unstored": 0, "reset": 0, "load": 0}
    for _ in range(40):
        action = rng.choice(["stored", "stored", "unstored", "reset", "save", "load"])
        if action == "reset" or (action in ("stored", "unstored") and cache.length + 1 > capacity - 1):
            cache.reset()
            mine = {key: value[:0] for key, value in mine.items()}
            steps["reset"] += 1
            continue
        if action == "save":
            saved = (cache.state_dict(), cache.stored_tensor(), {key: value.clone() for key, value in mine.items()})
            continue
        if action == "load":
            if saved is not None:
                cache.load_state(saved[0], saved[1])
                mine = {key: value.clone() for key, value in saved[2].items()}
                steps["load"] += 1
            continue
        cache.begin_step(1, store=action == "stored")
        for key in mine:
            q, k, v = (torch.randn(1, h, d, generator=gen) for _ in range(3))
            out = cache(key[0], key[1], q, k, v)
            kv = torch.cat((mine[key], torch.stack((k, v), 1)))  # [L + 1, 2, H, D]
            worst = max(worst, relative(out, reference(q, kv[:, 0], kv[:, 1])))
            if action == "stored":
                mine[key] = kv
        cache.end_step()
        steps[action] += 1
    assert all(count > 0 for count in steps.values()), steps
    return {"cache steps": worst}


def kv_write_cases() -> dict[str, float]:
    """The K/V write against ``index_copy_`` (the PyTorch path) bit for bit: 13 tokens x 3 heads x d 24 (a
    row of 72: not a power of two) from strided views into 50 poisoned slots; then a paged cache that
    writes with it, driven through phase 1, keyframes, non-keyframes and eviction, every one-frame step
    against float64 attention over the visible set (inside the drive)."""
    gen = torch.Generator().manual_seed(6)
    t, h, d, slots = 13, 3, 24, 50
    for dtype in (torch.float32, torch.bfloat16):
        qkv = torch.randn(t, 3, h, d, generator=gen).to(dtype)  # [T, 3, H, D]
        k, v = qkv[:, 1], qkv[:, 2]  # strided views, as the fused qkv's
        index = torch.randperm(slots, generator=gen)[:t]  # [T]
        flat = torch.full((2, slots, h, d), 1e4, dtype=dtype)
        expected = flat.clone()
        expected.index_copy_(1, index, torch.stack((k, v)))
        write_rows(k, v, index, flat)
        assert torch.equal(flat, expected), dtype
        # a stream's share of a pool (the several-stream page pool): planes a whole pool's plane apart
        pool = torch.full((2, 3 * slots, h, d), 1e4, dtype=dtype)
        untouched = pool.clone()
        share = pool[:, slots:2 * slots]  # [2, slots, H, D], not contiguous
        write_rows(k, v, index, share)
        assert torch.equal(share, expected), dtype
        assert torch.equal(pool[:, :slots], untouched[:, :slots]) and torch.equal(pool[:, 2 * slots:],
                                                                                 untouched[:, 2 * slots:]), dtype
    page_size, scale, window, steps = 7, 2, 3, 12
    special_pages = -(-SPECIAL_TOKENS_PER_FRAME * (scale + steps + 1) // page_size)
    shape = dict(max_frame_num=64, dtype=torch.float32, device="cpu", num_patch_pages=scale + window + 1,
                 special_pages=special_pages, write_kernel="triton")
    # the cache on the last of three shares of a pool (planes a pool apart), as a stream of a group holds it
    pages = PagedKVCache(2, 2, 8, page_size, scale, window, **shape).table.num_pages
    pool = SharedKVPool(num_shares=3, num_blocks=2, pages_per_share=pages, page_size=page_size, num_heads=2,
                        head_dim=8, dtype=torch.float32, device="cpu")
    pool.storage.fill_(1e4)
    others = [pool.share(name).clone() for name in ("a", "b")]
    cache = PagedKVCache(2, 2, 8, page_size, scale, window, **shape, storage=pool.share("c"))
    masked = MaskedDenseBackend(page_size=page_size, num_pages=cache.table.num_pages, num_heads=2, head_dim=8,
                                dtype=torch.float32, device="cpu", kernel="math")
    seen = drive_one_frame_backend(cache, masked, page_size=page_size, dtype=torch.float32, scale=scale,
                                   window=window, steps=steps, seed=3, keyframe_share=0.55, heads=2, head_dim=8)
    assert all(torch.equal(pool.share(name), before) for name, before in zip(("a", "b"), others)), \
        "a write into one stream's share changed another's"
    return {"kv write stream steps": float(len(seen))}


def qk_rope_cases() -> dict[str, float]:
    """q/k-norm + RoPE against float64 (LayerNorm, then the package's rotations) on the model's own
    tables: 2 frames of 11 tokens (6 specials + a 1 x 5 grid), 4 heads x d 16, both rotations. fp32
    input against float64; bf16 input against the eager path's fp32 result before its rounding: how far
    beyond one bf16 ulp of it plus fp32 noise of the terms the output lies (the interpreter's casts
    truncate, so one ulp; must be <= 0)."""
    gen = torch.Generator().manual_seed(9)
    n, h, d = 2, 4, 16
    tables = {
        "halves": (Rope2D(head_dim=d).tables(1, 5, "cpu", torch.float32), apply_rope_2d),
        "pairs": (Rope3D(head_dim=d, bands=(4, 6, 6)).tables(torch.tensor([3]), 1, 5, "cpu", torch.float32),
                  lambda x, c, s: apply_rope_3d(x.flatten(0, 1), c.repeat(n, 1, 1), s.repeat(n, 1, 1)).view_as(x)),
    }
    errors: dict[str, float] = {}
    for style, ((cos, sin), rotate) in tables.items():
        t = cos.shape[0]
        norms = [tuple(torch.randn(d, generator=gen) * s + o for s, o in ((0.3, 1.0), (0.2, 0.0))) for _ in range(2)]
        for dtype in (torch.float32, torch.bfloat16):
            qkv = (torch.randn(n, t, 3, h, d, generator=gen) * 2 + 0.5).to(dtype)  # [N, T, 3, H, D]
            q, k = qk_norm_rope(qkv, norms[0], norms[1], 1e-5, cos, sin, style)
            for name, out, x, (w, b) in (("q", q, qkv[:, :, 0], norms[0]), ("k", k, qkv[:, :, 1], norms[1])):
                if dtype == torch.float32:
                    y = torch.nn.functional.layer_norm(x.double(), (d,), w.double(), b.double(), 1e-5)
                    ref = rotate(y, cos.double(), sin.double())
                    errors[f"{style} {name} fp32"] = relative(out, ref)
                else:
                    y = torch.nn.functional.layer_norm(x.float(), (d,), w, b, 1e-5)  # what autocast runs
                    ref = rotate(y, cos, sin)  # fp32
                    ulp = torch.exp2(torch.floor(torch.log2(ref.abs().clamp_min(2.0 ** -100))) - 7)  # bf16: 8 bits
                    noise = 1e-6 * y.abs().amax(-1, keepdim=True)  # fp32 noise of the terms (a rotation may cancel)
                    errors[f"{style} {name} bf16 beyond"] = ((out.float() - ref).abs() - ulp - noise).max().item()
    return errors


def gemv_cases() -> dict[str, float]:
    """The camera head's fused GEMVs against float64: LN -> linear (-> exact GELU) and linear -> LayerScale
    + residual, for shapes with ragged row blocks and K not a multiple of the chunk, in both tiles of
    ``gemv._tile`` (N <= 2048: 2 rows x 1024 columns; wider: 16 rows x 256 columns)."""
    gen = torch.Generator().manual_seed(10)
    errors: dict[str, float] = {}
    for n, k in ((37, 300), (300, 600), (2053, 260)):  # K: not a power of two (the statistics load is masked)
        x = torch.randn(1, 1, k, generator=gen) * 2 + 0.5  # [1, 1, K]
        w = torch.randn(n, k, generator=gen) / k**0.5  # [N, K]
        b = torch.randn(n, generator=gen)
        ln = (torch.randn(k, generator=gen), torch.randn(k, generator=gen))
        gamma, res = torch.randn(n, generator=gen), torch.randn(1, 1, n, generator=gen)
        y = torch.nn.functional.layer_norm(x.double(), (k,), ln[0].double(), ln[1].double(), 1e-5)
        lin = y @ w.double().T + b.double()
        errors[f"norm_linear {n}x{k}"] = relative(norm_linear(x, ln, 1e-5, w, b), lin)
        errors[f"norm_linear gelu {n}x{k}"] = relative(norm_linear(x, ln, 1e-5, w, b, gelu=True),
                                                        torch.nn.functional.gelu(lin))
        ref = res.double() + gamma.double() * (x.double() @ w.double().T + b.double())
        errors[f"linear_residual {n}x{k}"] = relative(linear_residual(x, w, b, gamma, res), ref)
    for m, (n, k) in ((2, (37, 300)), (3, (2053, 260)), (4, (300, 600))):  # tokens of a batched step: 3 pads to 4
        x = torch.randn(1, m, k, generator=gen) * torch.arange(1, m + 1).view(1, m, 1) + 0.5  # [1, M, K]
        w = torch.randn(n, k, generator=gen) / k**0.5  # [N, K]
        b = torch.randn(n, generator=gen)
        ln = (torch.randn(k, generator=gen), torch.randn(k, generator=gen))
        gamma, res = torch.randn(n, generator=gen), torch.randn(1, m, n, generator=gen)
        y = torch.nn.functional.layer_norm(x.double(), (k,), ln[0].double(), ln[1].double(), 1e-5)  # per token
        lin = y @ w.double().T + b.double()  # [1, M, N]
        errors[f"{m} tokens norm_linear gelu {n}x{k}"] = relative(norm_linear(x, ln, 1e-5, w, b, gelu=True),
                                                                  torch.nn.functional.gelu(lin))
        ref = res.double() + gamma.double() * (x.double() @ w.double().T + b.double())
        errors[f"{m} tokens linear_residual {n}x{k}"] = relative(linear_residual(x, w, b, gamma, res), ref)
        alone = torch.cat([norm_linear(x[:, i:i + 1], ln, 1e-5, w, b) for i in range(m)], dim=1)
        errors[f"{m} tokens norm_linear vs one at a time {n}x{k}"] = relative(norm_linear(x, ln, 1e-5, w, b),
                                                                              alone.double())
    return errors


print(json.dumps({"errors": {**kernel_cases(), **cache_cases()}, "kv_write": kv_write_cases(),
                  "qk_rope": qk_rope_cases(), "gemv": gemv_cases()}))
