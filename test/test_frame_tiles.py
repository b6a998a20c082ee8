"""The rule of ``model/frame_tiles.py``: a frame's own attention goes to our kernel where cuDNN's 128-query
tiles would spill into more waves than our per-frame launches take, and only there. (Its numbers against
float64 run on the GPU: test_gpu.py.)"""
from __future__ import annotations

import pytest

from lingbot_map_ros.core.model.frame_tiles import CUDNN_QUERY_TILE, MAX_TAIL_ROWS, PAIR_ROWS, tile_rows

H100_SMS, HEADS = 132, 16


def waves(programs: int) -> int:
    return -(-programs // H100_SMS)


@pytest.mark.parametrize("frames,tokens,expected", [
    (1, 1042, 1024),  # 518x392, aggregator: cuDNN 144 programs (two waves); ours 128 (one)
    (1, 1041, 1024),  # 518x392, DINO encoder (cls + 4 registers)
    (1, 1005, 0),  # 518x378: cuDNN's 128 programs are one wave already
    (1, 783, 0),  # 518x294 (aggregator): cuDNN 112 programs, one wave
    (1, 1024, 0),  # whole tiles only: no tail to carry, cuDNN one wave
    (2, 1042, 1024),  # two streams: cuDNN 288 programs (three waves), ours two launches of one
    (4, 1042, 1024),  # four: cuDNN five waves, ours four
    (2, 1005, 0),  # two streams at 518x378: no carried tail (109 rows)
    (1, 1100, 0),  # a 76-row tail: more than the third warpgroup's 64
    (1, 100, 0),  # less than a tile
    (1, 2100, 0),  # 16 whole tiles x 16 heads: ours would not fit one wave
])
def test_our_kernel_only_where_cudnn_needs_more_waves(frames, tokens, expected):
    rows = tile_rows(frames, tokens, HEADS, H100_SMS)
    assert rows == expected
    if rows:  # the rule's own claim, counted independently
        ours = frames * waves(HEADS * rows // PAIR_ROWS)
        cudnn = waves(frames * HEADS * -(-tokens // CUDNN_QUERY_TILE))
        assert ours < cudnn
        assert rows % PAIR_ROWS == 0 and 0 < tokens - rows <= MAX_TAIL_ROWS


def test_cudnn_without_an_sm_count():
    assert tile_rows(1, 1042, HEADS, 0) == 0


def test_off_the_gpu_the_rule_never_applies():
    import torch

    from lingbot_map_ros.core.model.frame_tiles import our_rows

    q = torch.zeros(1, 1042, HEADS, 64, dtype=torch.bfloat16)  # a CPU tensor: cuDNN's path (SDPA) always
    assert our_rows(q) == 0
