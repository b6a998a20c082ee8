"""GPU faults are contained (device machine; skipped without CUDA): an out-of-memory inside the model
fails that one frame, the session starts anew, the next frames are processed, and no GPU memory is
left behind.

The out-of-memory is real: the process's share of the card is capped just above what is allocated
(``torch.cuda.set_per_process_memory_fraction``), then a frame much larger than the first ones is
pushed into a new session, so its activations cannot fit.
"""
from __future__ import annotations

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def test_out_of_memory_fails_one_frame_and_frees_its_memory():
    from lingbot_map_ros.core.config import RuntimeConfig, StreamConfig
    from lingbot_map_ros.core.session_manager import InferenceFailed, SessionManager

    runtime = RuntimeConfig(device="cuda", dtype="bfloat16", model_preset="tiny", attention_backend="sdpa")
    manager = SessionManager(runtime, StreamConfig(scale_frames=1, sliding_window=4), log=lambda _: None)
    small = torch.rand(3, 14 * 8, 518)  # [3, H, W]
    for _ in range(3):
        manager.push(small)
    torch.cuda.synchronize()
    baseline = torch.cuda.memory_allocated()
    total = torch.cuda.get_device_properties(0).total_memory
    manager.reset()
    huge = torch.rand(3, 14 * 148, 518)  # [3, 2072, 518]: caches and activations far above the cap
    torch.cuda.set_per_process_memory_fraction(min(1.0, (baseline + 64 * 2**20) / total))
    try:
        with pytest.raises(InferenceFailed) as info:
            manager.push(huge)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    assert isinstance(info.value.cause, torch.cuda.OutOfMemoryError), repr(info.value.cause)
    torch.cuda.synchronize()
    # the failed frame's activations are gone; its cache allocation may stay only while the session
    # still has that frame size, which a new session of the old size releases
    results = [r for _ in range(3) for r in manager.push(small)]
    assert len(results) == 3 and all(r.non_finite_fields() == [] for r in results)
    torch.cuda.synchronize()
    after = torch.cuda.memory_allocated()
    assert after <= baseline + 8 * 2**20, f"{(after - baseline) / 2**20:.1f} MiB left behind by the failed frame"
