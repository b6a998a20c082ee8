"""``depth_every``: the depth head on frames 0, N, 2N, ... of a session (and every scale frame).

The frames between must get exactly the poses of a stream that runs the depth head on every frame
(the depth head reads the aggregator's tokens and writes nothing the next frame sees), and the depth
maps that are computed must be those of that stream."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from lingbot_map_ros.core.config import StreamConfig, validate_stream
from lingbot_map_ros.core.session_manager import Change, SessionManager
from lingbot_map_ros.core.settings import defaults, validate_values

pytestmark = pytest.mark.usefixtures("one_torch_thread")
SCALE = 2


SEED = 7  # the weights of every test here (conftest's tiny_model)


@pytest.fixture
def depth_manager(tiny_manager):
    """``depth_manager(depth_every)``: a session with the depth head on that rhythm."""
    def make(depth_every: int) -> SessionManager:
        stream = StreamConfig(scale_frames=SCALE, sliding_window=3, keyframe_interval=2, max_frame_num=64,
                              max_stored_frames=60, with_depth=True, depth_every=depth_every)
        return tiny_manager(stream, seed=SEED, backend="auto")

    return make


def _frames(n: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return [torch.rand(3, 28, 42, generator=g) for _ in range(n)]


@pytest.mark.parametrize("every", [2, 3])
def test_depth_on_every_nth_frame_and_the_same_poses(depth_manager, every):
    frames = _frames(13)
    every_frame, every_nth = depth_manager(1), depth_manager(every)
    reference = [r for f in frames for r in every_frame.push(f)]
    results = [r for f in frames for r in every_nth.push(f)]
    assert len(results) == len(reference) == 13
    with_depth = [i for i, r in enumerate(results) if r.depth is not None]
    assert with_depth == [i for i in range(13) if i < SCALE or i % every == 0]
    for i, (r, ref) in enumerate(zip(results, reference)):
        np.testing.assert_array_equal(r.pose_enc, ref.pose_enc, err_msg=f"frame {i}")
        assert (r.depth_conf is None) == (r.depth is None)
        if r.depth is not None:
            np.testing.assert_array_equal(r.depth, ref.depth, err_msg=f"frame {i}")
            assert np.isfinite(r.depth).all()


def test_a_change_applies_from_the_next_frame_in_the_same_session(depth_manager):
    manager = depth_manager(1)
    frames = _frames(12)
    first = [r for f in frames[:6] for r in manager.push(f)]
    assert all(r.depth is not None for r in first)
    session = manager.session_id
    result = manager.apply(manager.host.settings, replace(manager.session.stream_cfg, depth_every=4))
    assert result.change is Change.NEXT_FRAME and result.fields == ("depth_every",)
    later = [r for f in frames[6:] for r in manager.push(f)]
    assert manager.session_id == session
    assert [r.depth is not None for r in later] == [i % 4 == 0 for i in range(6, 12)]


def test_out_of_range_values_are_refused_with_the_reason():
    assert any("depth_every" in p for p in validate_stream(StreamConfig(depth_every=0)))
    problems = validate_values({**defaults(), "depth_every": 0}, resolve=False)
    assert any("depth_every must be in [1, 10000]" in p for p in problems), problems
