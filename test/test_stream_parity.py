"""Streaming with the paged KV cache equals one whole-sequence pass with an explicit visibility mask.

The reference runs ALL frames through the same model in ONE forward call. Its global attention is a
dense masked attention whose mask is built here, independently of the cache code, from the rules of
docs/model.md §9.2/§9.5 (scale frames, sliding window of stored frames, specials of every stored frame,
non-keyframes seeing the cache plus themselves and being seen by nobody); the camera head gets the
causal keyframe mask of §10.3. RoPE frame indices and special-token variants follow §6/§7.2.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from lingbot_map_ros.core.config import SPECIAL_TOKENS_PER_FRAME, StreamConfig
from lingbot_map_ros.core.model.interfaces import _sdpa_tokens
from lingbot_map_ros.core.runtime import resolve_for
from lingbot_map_ros.core.session_manager import SessionManager


def frame_schedule(num_frames: int, scale: int, kf: int) -> tuple[list[bool], list[int]]:
    """Per frame: stored in the cache? and its RoPE frame index (docs/model.md §7.2, §9.5)."""
    stored, rope = [], []
    counter = 0
    for i in range(num_frames):
        if i < scale:
            stored.append(True)
            rope.append(i)
            continue
        if i == scale:
            counter = scale
        is_kf = (i - scale) % kf == 0
        stored.append(is_kf)
        rope.append(counter)
        counter += int(is_kf)
    return stored, rope


def visible_frames(i: int, stored: list[bool], scale: int, window: int) -> tuple[set[int], set[int]]:
    """(frames whose patch tokens frame i sees, frames whose special tokens it sees)."""
    if i < scale:
        everyone = set(range(min(scale, len(stored))))
        return everyone, everyone
    stored_before = [j for j in range(i) if stored[j]]
    phase2_stored = [j for j in stored_before if j >= scale]
    scale_frames = {j for j in stored_before if j < scale}
    if stored[i]:
        window_frames = set((phase2_stored + [i])[-window:])
    else:
        window_frames = set(phase2_stored[-window:]) | {i}
    return scale_frames | window_frames, set(stored_before) | {i}


class MaskedGlobalAttention:
    def __init__(self, mask: torch.Tensor) -> None:
        self.mask = mask  # [T, T] bool, True = may attend

    def __call__(self, block, q, k, v):
        return _sdpa_tokens(q, k, v, mask=self.mask)


class MaskedCameraAttention:
    def __init__(self, mask: torch.Tensor) -> None:
        self.mask = mask  # [S, S] bool

    def __call__(self, iteration, block, q, k, v):
        return _sdpa_tokens(q, k, v, mask=self.mask)


def whole_sequence_reference(model, frames: torch.Tensor, scale: int, window: int, kf: int, iterations: int):
    n, _, h, w = frames.shape
    num_patches = (h // 14) * (w // 14)
    p = SPECIAL_TOKENS_PER_FRAME + num_patches
    stored, rope = frame_schedule(n, scale, kf)
    token_mask = torch.zeros(n * p, n * p, dtype=torch.bool)
    camera_mask = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        patch_frames, special_frames = visible_frames(i, stored, scale, window)
        rows = slice(i * p, (i + 1) * p)
        for j in special_frames:
            token_mask[rows, j * p : j * p + SPECIAL_TOKENS_PER_FRAME] = True
        for j in patch_frames:
            token_mask[rows, j * p + SPECIAL_TOKENS_PER_FRAME : (j + 1) * p] = True
        camera_visible = set(range(min(scale, n))) if i < scale else {j for j in range(i) if stored[j]} | {i}
        for j in camera_visible:
            camera_mask[i, j] = True
    camera_variant = torch.tensor([0] + [1] * (n - 1))
    scale_variant = torch.tensor([0 if i < scale else 1 for i in range(n)])
    with torch.inference_mode():
        out = model(
            frames,
            rope_frames=torch.tensor(rope),
            camera_variant=camera_variant,
            scale_variant=scale_variant,
            global_attention=MaskedGlobalAttention(token_mask),
            camera_attention=MaskedCameraAttention(camera_mask),
            num_iterations=iterations,
        )
    return out.pose_enc.numpy(), stored


def stream_all(model, cfg, frames: torch.Tensor, stream_cfg: StreamConfig):
    """Every frame through a session manager around ``model`` (CPU, fp32, SDPA: the reference path)."""
    runtime = resolve_for(torch.device("cpu"), torch.float32, backend="sdpa")
    manager = SessionManager.around(model, cfg, stream_cfg, runtime, log=lambda m: None)
    results = []
    for f in frames:
        results += manager.push(f)
    results += manager.flush()
    return results, manager.session


SEED = 1234  # the weights of every test here (conftest's tiny_model, without the depth head)


@pytest.mark.parametrize("kf", [1, 2])
def test_streaming_equals_masked_whole_sequence(tiny_model, kf):
    cfg, model = tiny_model(SEED, depth=False)
    scale, window, iterations, n = 2, 3, 4, 14
    torch.manual_seed(100 + kf)
    frames = torch.rand(n, 3, 28, 42)  # 2x3 patches: non-square, page size 6
    stream_cfg = StreamConfig(scale_frames=scale, sliding_window=window, keyframe_interval=kf,
                              camera_iterations=iterations, max_frame_num=64, max_stored_frames=64)
    results, session = stream_all(model, cfg, frames, stream_cfg)
    ref, stored = whole_sequence_reference(model, frames, scale, window, kf, iterations)

    assert [r.frame_index for r in results] == list(range(n))
    assert [r.is_keyframe for r in results] == stored
    # eviction must really have happened in this test
    phase2_stored = sum(stored[scale:])
    assert phase2_stored > window
    assert results[-1].cache.frames_evicted == phase2_stored - window
    got = np.stack([r.pose_enc for r in results])
    np.testing.assert_allclose(got, ref, rtol=2e-4, atol=2e-5)


def test_reference_is_sensitive_to_the_window(tiny_model):
    """Negative control: the mask matters, so the parity test above can fail."""
    cfg, model = tiny_model(SEED, depth=False)
    torch.manual_seed(7)
    frames = torch.rand(10, 3, 28, 42)
    small, _ = whole_sequence_reference(model, frames, 2, 2, 1, 2)
    large, _ = whole_sequence_reference(model, frames, 2, 100, 1, 2)
    assert np.abs(small[-1] - large[-1]).max() > 1e-4
    np.testing.assert_allclose(small[:4], large[:4], rtol=1e-5, atol=1e-6)  # frames 0..3: nothing evicted yet


def test_flush_runs_short_sequences(tiny_model):
    cfg, model = tiny_model(SEED, depth=False)
    frames = torch.rand(2, 3, 28, 28)
    results, _ = stream_all(model, cfg, frames, StreamConfig(scale_frames=4, sliding_window=3))
    assert len(results) == 2 and all(r.is_scale_frame for r in results)
    ref, _ = whole_sequence_reference(model, frames, 4, 3, 1, 4)
    np.testing.assert_allclose(np.stack([r.pose_enc for r in results]), ref, rtol=2e-4, atol=2e-5)


def test_graph_step_serves_phase_two_only(tiny_model, monkeypatch):
    """The CUDA-graph step bakes in phase 2's token variants (camera and scale variant 1), so a scale
    phase of one frame (``scale_frames=1``, or a flush of one buffered frame) must not go there. On the
    CPU a stand-in computes what the graph step would; the stream must still equal the reference, and
    the stand-in must have served exactly the phase-2 frames."""
    from lingbot_map_ros.core.stream import StreamingSession

    cfg, model = tiny_model(SEED, depth=False)
    served: list[int] = []

    class GraphStepStandIn:
        def __init__(self, session: StreamingSession) -> None:
            self.session = session

        def begin(self, images: torch.Tensor) -> None:
            self.images = images  # [1, 3, H, W]

        def finish(self, rope_frame: int, with_depth: bool):
            served.append(rope_frame)
            ones = torch.ones(1, dtype=torch.long)  # what the captured graph holds
            return self.session._call_model(self.images, torch.tensor([rope_frame]), ones, ones, with_depth)

    monkeypatch.setattr(StreamingSession, "_graphed_step", lambda self: GraphStepStandIn(self))
    frames = torch.rand(6, 3, 28, 42, generator=torch.Generator().manual_seed(11))
    runtime = resolve_for(torch.device("cpu"), torch.float32, backend="sdpa")
    for stream_cfg, n in ((StreamConfig(scale_frames=1, sliding_window=3, max_frame_num=64, max_stored_frames=64), 6),
                          (StreamConfig(scale_frames=4, sliding_window=3), 1)):
        served.clear()
        manager = SessionManager.around(model, cfg, stream_cfg, runtime, log=lambda m: None)
        manager.session.use_cuda_graphs = True
        results = [r for f in frames[:n] for r in manager.push(f)] + manager.flush()
        ref, _ = whole_sequence_reference(model, frames[:n], min(stream_cfg.scale_frames, n), 3, 1, 4)
        assert served == list(range(1, n)), served  # phase 2's RoPE indices: 1..n-1 with one scale frame
        np.testing.assert_allclose(np.stack([r.pose_enc for r in results]), ref, rtol=2e-4, atol=2e-5)
