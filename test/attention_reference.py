"""The attention reference the cache and backend tests compare with: float64 dense attention over
the visible set that docs/model.md §9.2/§9.5 define (``SpecModel``, no pages), and a driver that
streams random K/V through a cache's one-frame backend and checks every output against it.
A helper module, not a test: the paged-cache, split, dense-backend and kernel checks import it."""
from __future__ import annotations

import math
import random

import torch

SPECIALS = 6


def dense_reference(q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor]) -> torch.Tensor:
    """softmax(q kᵀ/√D) v in float64; q [T, H, D], keys/values: pieces [n_i, H, D]."""
    k = torch.cat(keys).double()  # [N, H, D]
    v = torch.cat(values).double()  # [N, H, D]
    logits = torch.einsum("thd,nhd->htn", q.double(), k) / math.sqrt(q.shape[-1])  # [H, T, N]
    return torch.einsum("htn,nhd->thd", logits.softmax(-1), v)  # [T, H, D]


class SpecModel:
    """Which frames' tokens are visible, from §9.2/§9.5 only: a list of stored frame ids."""

    def __init__(self, scale_frames: int, window: int) -> None:
        self.scale_frames = scale_frames
        self.window = window
        self.stored: list[int] = []

    def visible(self, current: list[int], store: bool) -> tuple[list[int], list[int]]:
        """(frames with all tokens, frames with specials only) for a step over ``current``."""
        stored = self.stored + current if store else self.stored
        full = set(stored[: self.scale_frames]) | set(stored[-self.window :])
        everyone = stored if store else stored + current
        if not store:
            full |= set(current)
        return sorted(full), sorted(set(everyone) - full)


def drive_one_frame_backend(cache, backend, *, page_size: int, dtype: torch.dtype, scale: int, window: int,
                            steps: int, seed: int, keyframe_share: float, heads: int, head_dim: int) -> list:
    """Phase 1, then ``steps`` one-frame steps (random keyframes) through ``cache`` with ``backend`` as its
    one-frame backend; every output is compared with float64 attention over the spec's visible set.

    Stale slots are poisoned with huge values first, so any leak through a mask or an index shows.
    Returns ``(num_keys, mode)`` of the backend per one-frame step (``mode`` None where it has none)."""
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    tokens = SPECIALS + page_size
    cache.single_frame_backend = backend
    cache.storage.fill_(1e4)
    spec = SpecModel(scale, window)
    blocks = cache.num_blocks
    raw: list[dict[int, tuple[torch.Tensor, torch.Tensor]]] = [{} for _ in range(blocks)]
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    schedule = [(list(range(scale)), True)]
    schedule += [([scale + i], i == 0 or rng.random() < keyframe_share) for i in range(steps)]
    seen = []
    for frames, store in schedule:
        cache.begin_step(len(frames), store=store)
        full, specials_only = spec.visible(frames, store)
        for block in range(blocks):
            q, k, v = (torch.randn(len(frames) * tokens, heads, head_dim, generator=gen).to(dtype) for _ in range(3))
            for j, f in enumerate(frames):
                raw[block][f] = (k[j * tokens:(j + 1) * tokens], v[j * tokens:(j + 1) * tokens])
            keys = [raw[block][f][0] for f in full] + [raw[block][f][0][:SPECIALS] for f in specials_only]
            values = [raw[block][f][1] for f in full] + [raw[block][f][1][:SPECIALS] for f in specials_only]
            out = cache(block, q, k, v)
            assert out.shape == q.shape and out.dtype == dtype and torch.isfinite(out).all()
            torch.testing.assert_close(out.double(), dense_reference(q, keys, values), **tol)
        if len(frames) == 1:
            assert backend.num_keys == cache.visible_key_count
            seen.append((backend.num_keys, getattr(backend, "mode", None)))
        cache.end_step()
        if store:
            spec.stored += frames
        else:
            for block in range(blocks):
                del raw[block][frames[0]]
    assert len(seen) == steps and cache.stats().frames_evicted > 0 and cache.stats().special_pages > 1
    return seen
