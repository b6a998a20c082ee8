"""Several streams against each stream alone: the helpers the stream-group tests share.

``test_stream_group.py`` (eager, CPU), ``test_batched_graph.py`` (the captured batched step with a
stand-in capture, CPU) and ``test_gpu_streams.py`` (the GPU) all feed a ``StreamGroup`` on a schedule and
compare each stream with the same frames pushed through a ``SessionManager`` of its own.
"""
from __future__ import annotations

import numpy as np
import torch

from lingbot_map_ros.core.config import StreamConfig
from lingbot_map_ros.core.model_host import ModelHost
from lingbot_map_ros.core.session_manager import SessionManager
from lingbot_map_ros.core.stream_group import StreamGroup

ATOL = 1e-6
HW = (28, 42)  # 2 x 3 patches: page size 6
STREAM = StreamConfig(scale_frames=2, sliding_window=3, camera_iterations=2, max_frame_num=64,
                      max_stored_frames=8, overlap_frames=3, with_depth=True, depth_every=2)


def frames_of(seed: int, n: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.rand(3, *HW, generator=g) for _ in range(n)]


def lone_results(loaded: ModelHost, frames: list[torch.Tensor], stream: StreamConfig = STREAM):
    manager = SessionManager(loaded, stream, log=lambda m: None)
    return [r for i, f in enumerate(frames) for r in manager.push(f, i)]


def assert_same(got, want) -> None:
    """Results of one stream: frame by frame, pose, depth and the cache's statistics."""
    assert [r.frame_index for r in got] == [r.frame_index for r in want]
    assert [r.stamp for r in got] == [r.stamp for r in want]
    for a, b in zip(got, want):
        np.testing.assert_allclose(a.pose_enc, b.pose_enc, rtol=0, atol=ATOL)
        np.testing.assert_allclose(a.c2w, b.c2w, rtol=0, atol=10 * ATOL)
        assert (a.depth is None) == (b.depth is None)
        if a.depth is not None:
            np.testing.assert_allclose(a.depth, b.depth, rtol=0, atol=ATOL)
            np.testing.assert_allclose(a.depth_conf, b.depth_conf, rtol=0, atol=ATOL)
        assert a.cache == b.cache
        assert (a.is_keyframe, a.rope_frame_index, a.session_id) == (b.is_keyframe, b.rope_frame_index, b.session_id)


def run_group(group: StreamGroup, schedule: dict[str, list[int]], frames: dict[str, list[torch.Tensor]], ticks: int):
    """``schedule[name]``: the ticks at which that stream gets its next frame."""
    got: dict[str, list] = {n: [] for n in schedule}
    fed = {n: 0 for n in schedule}
    batched = 0
    for t in range(ticks):
        step = {}
        for name, at in schedule.items():
            if t in at:
                step[name] = (frames[name][fed[name]], fed[name])
                fed[name] += 1
        for name, outcome in group.step(step).items():
            assert outcome.error is None, outcome.error
            got[name] += outcome.results
            batched += outcome.batched
    return got, fed, batched
