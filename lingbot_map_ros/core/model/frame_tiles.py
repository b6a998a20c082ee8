"""A frame's own attention (the DINO and frame blocks: T queries against the same T keys) by our Gluon
kernel where cuDNN's query tiles would spill into a second wave.

Why: on Hopper, PyTorch's SDPA runs cuDNN's fused attention, one program per 128-query tile and head. At
518x378 a frame is 1,005 tokens: 8 tiles x 16 heads = 128 programs, one wave on 132 SMs. A 640x480 camera
gives 518x392, 1,042 tokens: 9 x 16 = 144 programs, two waves (28 µs a call against 15 at 1,005 on an
H100, ``bench/frame_attention_bench.py``), +0.63 ms over the 48 such calls of a frame.

Our warp-specialised runs kernel (``cache/gluon_runs.py``) reads the frame's keys as one run: its programs
take the whole tiles of 128 rows (1,024: 8 x 16 = 128 programs, one wave) and carry the ragged tail (18
rows; 17 in the DINO encoder's 1,041) by a third warpgroup against the key blocks they stream anyway
(``runs_attention_fused_tail``): one launch and a small merge of the tail's parts, no side stream and no
copy (the kernel writes the token-major output the block's projection reads). A batched step's frames
each get a launch of their own, one wave each, where cuDNN's call over all of them needs more waves.

Exact as attention: each query's softmax over the same keys, in fp32 scores and sums as cuDNN's are; the
tail's parts merged by log-sum-exp. Used inside the CUDA-graph frame step only
(``BlockFusion(frame_tiles=True)``), where the runtime resolved our Gluon runs kernel (Hopper with
Triton): the tile sizes and the SM count are Hopper's facts.
"""
from __future__ import annotations

import functools

import torch
from torch import Tensor

CUDNN_QUERY_TILE = 128  # queries per program of cuDNN's fused attention on sm90 at d 64 (one wave at 1,005)
PAIR_ROWS = 128  # query rows per program of our warp-specialised kernel (two warpgroups of 64)
MAX_TAIL_ROWS = 64  # rows the third warpgroup carries (one warpgroup's tile)
# False: every frame attention in one cuDNN call even where our kernel would take it (the bench's
# ``+framecudnn``, for an A/B of one build); a kernel constant, not a setting.
ENABLED = True


def tile_rows(frames: int, tokens: int, heads: int, sms: int) -> int:
    """The whole tiles' rows our kernel takes (the rest is its carried tail), or 0: cuDNN's one call.

    ``frames`` frames (a batched step's streams) x ``heads`` heads x ``tokens`` queries on ``sms`` SMs.
    Ours runs a launch per frame of ``heads x whole tiles`` programs, one wave each; it is chosen where
    cuDNN's call over every frame would need more waves than that."""
    whole_tiles, tail = divmod(tokens, PAIR_ROWS)
    if whole_tiles == 0 or not 0 < tail <= MAX_TAIL_ROWS or sms <= 0 or heads * whole_tiles > sms:
        return 0
    cudnn_waves = -(-frames * heads * -(-tokens // CUDNN_QUERY_TILE) // sms)
    return whole_tiles * PAIR_ROWS if frames < cudnn_waves else 0


@functools.lru_cache(maxsize=None)
def sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


_WHOLE_RUNS: dict[tuple[int, int], Tensor] = {}  # (device index, tokens) -> int32 [[0, tokens]]


def whole_run(tokens: int, device: torch.device) -> Tensor | None:
    """The runs tensor of "every key of the frame" on ``device``, made outside a CUDA-graph capture (a host
    copy cannot be captured); None while capturing a size never seen in the warm-up."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    runs = _WHOLE_RUNS.get((index, tokens))
    if runs is None and not torch.cuda.is_current_stream_capturing():
        runs = _WHOLE_RUNS[(index, tokens)] = torch.tensor([[0, tokens]], dtype=torch.int32, device=device)
    return runs


def our_rows(q: Tensor) -> int:
    """``tile_rows`` for ``q [N, T, H, D]`` on its GPU, or 0 (disabled, not a half-precision CUDA tensor,
    or a head dim the carried tail does not take)."""
    if not ENABLED or not q.is_cuda or q.dtype not in (torch.bfloat16, torch.float16):
        return 0
    from ..cache.gluon_runs import carries_tail  # Triton's Gluon: imported only on the GPU

    if not carries_tail(q.shape[3]):
        return 0
    n, t, h, _ = q.shape
    index = q.device.index if q.device.index is not None else torch.cuda.current_device()
    return tile_rows(n, t, h, sm_count(index))


def tiles_attention(q: Tensor, k: Tensor, v: Tensor, rows: int) -> Tensor | None:
    """Softmax attention of ``q, k, v [N, T, H, D]`` (scale 1/√D, no mask), each frame by one launch of our
    kernel: ``rows`` whole-tile rows in place, the rest as the carried tail's parts merged; ``[N, T, H, D]``.
    None: not here (no runs tensor for this size inside a capture): the caller runs cuDNN's call."""
    from ..cache.gluon_runs import runs_attention_fused_tail
    from ..cache.merge import fused_merge, merge_into

    n, t, h, d = q.shape
    runs = whole_run(t, q.device)
    if runs is None:
        return None
    merge = fused_merge()
    out = torch.empty(n, t, h, d, dtype=q.dtype, device=q.device)  # [N, T, H, D]
    for i in range(n):  # each frame against its own keys
        parts, lse = runs_attention_fused_tail(q[i], k[i], v[i], runs, rows, out[i].unsqueeze(0))  # [G, tail, H, D]
        merge_into(out[i, rows:], parts, lse, merge)  # [G, tail, H, D] -> [tail, H, D]
    return out


__all__ = ["CUDNN_QUERY_TILE", "ENABLED", "our_rows", "tile_rows", "tiles_attention"]
