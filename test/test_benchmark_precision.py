"""The two weight-precision recipes (``core/precision.py``) on the CPU with the tiny random model: the
official one keeps the aggregator's float32 weights while the session runs in bf16 autocast, the
node's casts them; both against a model built in float32 from the same seed, and the official one
streams frames to finite poses."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from lingbot_map_ros.core.config import RuntimeConfig, StreamConfig, model_config
from lingbot_map_ros.core.model import build_model
from lingbot_map_ros.core.precision import PRECISIONS, extra_weight_bytes, loader
from lingbot_map_ros.core.session_manager import SessionManager

RUNTIME = RuntimeConfig(model_preset="tiny", device="cpu", dtype="bfloat16", seed=7)


@pytest.fixture(scope="module")
def reference():
    model, _ = build_model(model_config("tiny"), checkpoint="", seed=7, device=torch.device("cpu"),
                           dtype=torch.float32, enable_depth=True)
    return model.state_dict()


def test_official_keeps_float32_aggregator_weights_under_bf16(reference):
    loaded = loader("official")(RUNTIME, lambda _msg: None)
    assert loaded.resolved.dtype == torch.bfloat16  # autocast, caches and kernels stay in the compute dtype
    state = loaded.model.state_dict()
    assert state.keys() == reference.keys()
    for name, value in state.items():
        assert value.dtype == reference[name].dtype and torch.equal(value, reference[name]), name
    assert not loaded.model.training


def test_node_casts_the_aggregator_to_the_compute_dtype(reference):
    loaded = loader("node")(RUNTIME, lambda _msg: None)
    for name, value in loaded.model.state_dict().items():
        if name.startswith("aggregator.") and reference[name].is_floating_point():
            assert value.dtype == torch.bfloat16, name
            assert torch.equal(value, reference[name].to(torch.bfloat16)), name
        else:
            assert value.dtype == reference[name].dtype, name


def test_official_recipe_streams_to_finite_poses():
    stream = StreamConfig(scale_frames=2, sliding_window=3, camera_iterations=1)
    manager = SessionManager.open(RUNTIME, stream, log=lambda _msg: None, load=loader("official"))
    rng = np.random.default_rng(0)
    results = []
    for i in range(5):
        frame = torch.from_numpy(rng.random((3, 28, 56), dtype=np.float32))
        results += manager.push(frame, i)
    results += manager.flush()
    assert sorted(int(r.stamp) for r in results) == list(range(5))
    assert all(np.isfinite(r.c2w).all() for r in results)


def test_unknown_recipe_and_the_memory_cost():
    with pytest.raises(ValueError, match="precision must be one of official, node"):
        loader("half")
    assert PRECISIONS == ("official", "node")
    extra = extra_weight_bytes("tiny", torch.bfloat16)
    model, _ = build_model(model_config("tiny"), checkpoint="", seed=0, device=torch.device("cpu"),
                           dtype=torch.float32, enable_depth=True)
    agg = sum(p.numel() for n, p in model.named_parameters() if n.startswith("aggregator."))
    assert extra >= 2 * agg  # two more bytes per aggregator parameter (buffers on top)
