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
    huge = torch.rand(3, 14 * 148, 518)  # [3, 2072, 518]: caches and activations far above the cap
    total = torch.cuda.get_device_properties(0).total_memory

    def fault_and_recover() -> int:
        """One out-of-memory frame in a new session, then three good frames; memory allocated after."""
        manager.reset()
        torch.cuda.synchronize()
        torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total))
        try:
            with pytest.raises(InferenceFailed) as info:
                manager.push(huge)
        finally:
            torch.cuda.set_per_process_memory_fraction(1.0)
        assert isinstance(info.value.cause, torch.cuda.OutOfMemoryError), repr(info.value.cause)
        results = [r for _ in range(3) for r in manager.push(small)]
        assert len(results) == 3 and all(r.non_finite_fields() == [] for r in results)
        torch.cuda.synchronize()
        return torch.cuda.memory_allocated()

    for _ in range(3):
        manager.push(small)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    # One cap for every attempt: each huge frame then gets exactly as far before it fails, so what
    # the model caches per frame size (RoPE and position tables, a bounded LRU) is the same each time.
    cap = before + 64 * 2**20
    first = fault_and_recover()  # the caches and the CUDA graph are rebuilt once for the small size
    second = fault_and_recover()
    third = fault_and_recover()
    print(f"allocated MiB: before {before / 2**20:.1f}, after faults {first / 2**20:.1f}, "
          f"{second / 2**20:.1f}, {third / 2**20:.1f}")
    assert first - before <= 64 * 2**20, "the first recovery kept more than the cap allows"
    assert second == first and third == first, "each out-of-memory fault leaves memory behind"
