"""Run by test_camera_decode.py in a child process with ``TRITON_INTERPRET=1``: the camera head's
split-key decode (``core/cache/camera_decode.py``) on the CPU against float64, alone and inside a
static ``CameraKVCache`` driven through random stored / unstored steps, resets and loads.

Prints one JSON object: the worst errors per case and what the cache rows held afterwards."""
from __future__ import annotations

import json
import math
import os
import random
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import triton_interpreter  # noqa: E402,F401  (first: the interpreter, mended)

from lingbot_map_ros.core.cache import CameraKVCache  # noqa: E402
from lingbot_map_ros.core.cache.camera_decode import decode_attention  # noqa: E402


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


print(json.dumps({"errors": {**kernel_cases(), **cache_cases()}}))
