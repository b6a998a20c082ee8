"""The frame-attention cut's rule (``model/frame_cut.py``): where cuDNN's 128-query tiles would spill into a
second wave of programs, and only there. (The cut's numbers against float64 run on the GPU: test_gpu.py.)"""
from __future__ import annotations

import pytest

from lingbot_map_ros.core.model.frame_cut import CUDNN_QUERY_TILE, whole_tile_rows

H100_SMS, HEADS = 132, 16


def programs(frames: int, rows: int) -> int:
    return frames * HEADS * -(-rows // CUDNN_QUERY_TILE)


@pytest.mark.parametrize("frames,tokens,expected", [
    (1, 1042, 1024),  # 518x392, aggregator: 144 programs (two waves) -> 128 (one)
    (1, 1041, 1024),  # 518x392, DINO encoder (cls + 4 registers)
    (1, 1005, 0),  # 518x378: 128 programs, one wave already
    (1, 783, 0),  # 518x294: 112 programs
    (1, 1024, 0),  # whole tiles only: nothing to cut
    (2, 1042, 1024),  # two streams: 288 programs (three waves) -> 256 (two)
    (2, 1005, 0),  # two streams at 518x378: 256 programs, two waves either way
    (1, 1100, 0),  # a 76-row tail: more than one program of the runs kernel a head
    (1, 100, 0),  # less than a tile
])
def test_cut_only_where_the_tail_adds_a_wave(frames, tokens, expected):
    rows = whole_tile_rows(frames, tokens, HEADS, H100_SMS)
    assert rows == expected
    if rows:  # the rule's own claim, counted independently: one wave fewer, and whole tiles only
        waves = lambda n: -(-n // H100_SMS)  # noqa: E731
        assert waves(programs(frames, rows)) < waves(programs(frames, tokens))
        assert rows % CUDNN_QUERY_TILE == 0 and 0 < tokens - rows <= 64


def test_no_cut_without_a_gpu_count():
    assert whole_tile_rows(1, 1042, HEADS, 0) == 0
