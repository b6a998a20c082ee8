"""A frame's own attention (the DINO and frame blocks: T queries against the same T keys) cut where cuDNN's
query tiles would spill into a second wave.

Why: on Hopper, PyTorch's SDPA runs cuDNN's fused attention, one program per 128-query tile and head. At
518x378 a frame is 1,005 tokens: 8 tiles x 16 heads = 128 programs, one wave on 132 SMs (15 µs on an H100).
A 640x480 camera gives 518x392, 1,042 tokens: 9 x 16 = 144 programs, two waves, 28 µs, over the 48 such
calls of a frame +0.63 ms (bench/frame_attention_bench.py; FlashAttention-2 and the memory-efficient kernel
are slower still). The cut:

* **whole tiles**: the first ``rows`` queries (1,024) in one cuDNN call, one wave;
* **the tail**: the few rows left (18; 17 in the DINO encoder's 1,041) by our runs kernel
  (``cache/triton_prefix.py``: one 64-query program a head over the frame's keys as one run), on a side
  stream forked before the whole tiles: its 16 programs take SMs the whole tiles leave idle.

The whole tiles are written to a token-major output (what the block's projection reads), the tail's rows
straight into it by the kernel. Exact as attention: each query's softmax over the same keys; the tail's
rows round as our kernel does (fp32 scores and sums), the rest as cuDNN does.

Used inside the CUDA-graph frame step only (``BlockFusion(frame_cut=True)``), where the runtime resolved our
Gluon runs kernel (Hopper with Triton): the tile and the SM count are Hopper's facts.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor

CUDNN_QUERY_TILE = 128  # queries per program of cuDNN's fused attention on sm90 at d 64 (one wave at 1,005)
MAX_TAIL_ROWS = 64  # one program of the runs kernel (its BLOCK_M) a head and frame
# False: every frame attention in one cuDNN call even where the fusion cuts (the bench's ``+framewhole``, for an
# A/B of one build); a kernel constant, not a setting.
ENABLED = True


def whole_tile_rows(frames: int, tokens: int, heads: int, sms: int) -> int:
    """The query rows of the cut's cuDNN call (whole tiles), or 0 where cutting saves no wave.

    ``frames`` frames (a batched step's streams) x ``heads`` heads x ``tokens`` queries on ``sms`` SMs."""
    whole_tiles, tail = divmod(tokens, CUDNN_QUERY_TILE)
    if whole_tiles == 0 or tail == 0 or tail > MAX_TAIL_ROWS or sms <= 0:
        return 0
    waves_uncut = -(-frames * heads * (whole_tiles + 1) // sms)
    waves_cut = -(-frames * heads * whole_tiles // sms)
    return whole_tiles * CUDNN_QUERY_TILE if waves_cut < waves_uncut else 0


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


def cut_rows(q: Tensor) -> int:
    """The whole tiles' rows for ``q [N, T, H, D]`` on its GPU, or 0: no cut (see ``whole_tile_rows``)."""
    if not ENABLED or not q.is_cuda or q.dtype not in (torch.bfloat16, torch.float16):
        return 0
    n, t, h, _ = q.shape
    index = q.device.index if q.device.index is not None else torch.cuda.current_device()
    return whole_tile_rows(n, t, h, sm_count(index))


def cut_attention(q: Tensor, k: Tensor, v: Tensor, rows: int) -> Tensor | None:
    """Softmax attention of ``q, k, v [N, T, H, D]`` (scale 1/√D, no mask): the first ``rows`` queries by
    cuDNN, the rest by our runs kernel on a side stream; ``[N, T, H, D]``. None: cannot cut here (no runs
    tensor for this size inside a capture): the caller runs the whole call."""
    from ..cache.triton_prefix import runs_attention
    from ..cuda_graph import side_stream

    n, t, h, d = q.shape
    runs = whole_run(t, q.device)
    if runs is None:
        return None
    out = torch.empty(n, t, h, d, dtype=q.dtype, device=q.device)  # [N, T, H, D]
    main = torch.cuda.current_stream(q.device)
    side = side_stream(q.device, "frame_tail")
    side.wait_stream(main)  # forked before the whole tiles: the tail does not wait for them
    head = F.scaled_dot_product_attention(q[:, :rows].transpose(1, 2), k.transpose(1, 2),
                                          v.transpose(1, 2))  # [N, H, rows, D]
    with torch.cuda.stream(side):
        for i in range(n):  # each frame's tail against its own keys
            runs_attention(q[i, rows:], k[i], v[i], runs, out=out[i, rows:].unsqueeze(0))  # [1, T - rows, H, D]
    out[:, :rows] = head.transpose(1, 2)
    main.wait_stream(side)  # joined: the block's projection sees the tail's rows
    return out


__all__ = ["CUDNN_QUERY_TILE", "ENABLED", "cut_attention", "cut_rows", "whole_tile_rows"]
