"""GPU faults are contained (device machine; skipped without CUDA): an out-of-memory inside the model
fails that one frame, the session starts anew, the next frames are processed, and no GPU memory is
left behind.

The out-of-memory is real: the process's share of the card is capped just above what is allocated
(``torch.cuda.set_per_process_memory_fraction``), then a frame much larger than the first ones is
pushed into a new session, so its activations cannot fit.
"""
from __future__ import annotations

import gc
from collections import Counter

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def _live_cuda_tensors() -> Counter:
    """(shape, dtype) -> count of the CUDA tensors Python objects hold now (a leak's fingerprint)."""
    found: Counter = Counter()
    for obj in gc.get_objects():
        try:
            if isinstance(obj, torch.Tensor) and obj.is_cuda:
                found[(tuple(obj.shape), str(obj.dtype).replace("torch.", ""))] += 1
        except Exception:  # noqa: BLE001 - some objects refuse isinstance/attribute access
            pass
    return found


def _grown(before: Counter, after: Counter) -> str:
    new = after - before
    return ", ".join(f"{n}x {shape} {dtype}" for (shape, dtype), n in new.most_common(12)) or "none held by Python"


def _allocated_by_pool() -> dict:
    """Allocated bytes per memory pool (``(0, 0)``: the general pool; others: CUDA-graph pools)."""
    pools: dict = {}
    for segment in torch.cuda.memory_snapshot():
        used = sum(b["size"] for b in segment["blocks"] if b["state"] == "active_allocated")
        if used:
            key = tuple(segment.get("segment_pool_id", (0, 0)))
            pools[key] = pools.get(key, 0) + used
    return {k: round(v / 2**20, 1) for k, v in sorted(pools.items())}


def test_out_of_memory_fails_one_frame_and_frees_its_memory():
    from lingbot_map_ros.core.config import RuntimeConfig, StreamConfig
    from lingbot_map_ros.core.session_manager import InferenceFailed, SessionManager

    runtime = RuntimeConfig(device="cuda", dtype="bfloat16", model_preset="tiny", attention_backend="sdpa")
    manager = SessionManager.open(runtime, StreamConfig(scale_frames=1, sliding_window=4), log=lambda _: None)
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
        where = [line.strip() for line in info.value.detail.splitlines() if line.strip().startswith("File ")][-4:]
        print("out of memory at:", " <- ".join(reversed(where)))
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
    pools_before = _allocated_by_pool()
    first = fault_and_recover()  # the caches and the CUDA graph are rebuilt once for the small size
    tensors_first = _live_cuda_tensors()
    pools_first = _allocated_by_pool()
    second = fault_and_recover()
    third = fault_and_recover()
    tensors_third = _live_cuda_tensors()
    gc.collect()
    collected = torch.cuda.memory_allocated()
    print(f"allocated MiB: before {before / 2**20:.1f}, after faults {first / 2**20:.1f}, "
          f"{second / 2**20:.1f}, {third / 2**20:.1f}; after gc.collect() {collected / 2**20:.1f}; "
          f"new tensors after fault 3 vs 1: {_grown(tensors_first, tensors_third)}; MiB by pool before "
          f"{pools_before}, after fault 1 {pools_first}, after fault 3 {_allocated_by_pool()}")
    assert first - before <= 64 * 2**20, "the first recovery kept more than the cap allows"
    assert second == first and third == first, (
        f"each out-of-memory fault leaves memory behind: {(third - first) / 2**20:.1f} MiB over two faults, "
        f"{(third - collected) / 2**20:.1f} MiB of it freed only by gc.collect() (a reference cycle); "
        f"new tensors: {_grown(tensors_first, tensors_third)}")


def test_new_sizes_and_resets_leave_no_memory_behind():
    """The control for the fault test: the same cycle (reset, another frame size, back) without a fault."""
    from lingbot_map_ros.core.config import RuntimeConfig, StreamConfig
    from lingbot_map_ros.core.session_manager import SessionManager

    runtime = RuntimeConfig(device="cuda", dtype="bfloat16", model_preset="tiny", attention_backend="sdpa")
    manager = SessionManager.open(runtime, StreamConfig(scale_frames=1, sliding_window=4), log=lambda _: None)
    small = torch.rand(3, 14 * 8, 518)  # [3, H, W]
    medium = torch.rand(3, 14 * 20, 518)

    def cycle() -> int:
        manager.reset()
        assert len(manager.push(medium)) == 1
        manager.reset()
        assert len([r for _ in range(3) for r in manager.push(small)]) == 3
        torch.cuda.synchronize()
        return torch.cuda.memory_allocated()

    for _ in range(3):
        manager.push(small)
    first = cycle()
    tensors_first = _live_cuda_tensors()
    second, third = cycle(), cycle()
    print(f"allocated MiB after cycles: {first / 2**20:.1f}, {second / 2**20:.1f}, {third / 2**20:.1f}; "
          f"new tensors: {_grown(tensors_first, _live_cuda_tensors())}")
    grown = _grown(tensors_first, _live_cuda_tensors())
    assert second == first and third == first, f"a size change leaves memory behind: {grown}"


def test_out_of_memory_while_capturing_the_frame_graphs_is_contained():
    """The first one-frame step at a new size warms up and captures the image encoder's graph and the
    step's graph; when memory runs out there (the cap leaves 1 MiB above what is allocated), the frame
    fails, nothing of a half-made graph stays, and once memory is back the next frames capture anew and
    run. After a first such fault, three more leave the same memory: nothing accumulates."""
    from lingbot_map_ros.core.config import RuntimeConfig, StreamConfig
    from lingbot_map_ros.core.session_manager import InferenceFailed, SessionManager

    runtime = RuntimeConfig(device="cuda", dtype="bfloat16", model_preset="tiny", attention_backend="sdpa")
    manager = SessionManager.open(runtime, StreamConfig(scale_frames=1, sliding_window=4), log=lambda _: None)
    assert manager.session.runtime.cuda_graphs
    small = torch.rand(3, 14 * 8, 518)  # [3, H, W]
    medium = torch.rand(3, 14 * 24, 518)
    total = torch.cuda.get_device_properties(0).total_memory

    def cycle() -> int:
        """Graphs at the small size, then the medium size's first one-frame step without memory to spare."""
        manager.reset()
        assert len([r for _ in range(3) for r in manager.push(small)]) == 3
        manager.reset()
        assert len(manager.push(medium)) == 1  # the scale frame (eager): new caches, the graphs dropped
        assert manager.session._graph_step is None  # the new size dropped the small size's graphs
        step = manager.session._graphed_step()  # its fixed input buffers, before the cap; nothing captured
        assert not step.signatures and step.stats.encoder_captures == 0
        torch.cuda.synchronize()
        torch.cuda.set_per_process_memory_fraction(min(1.0, (torch.cuda.memory_allocated() + 2**20) / total))
        try:
            with pytest.raises(InferenceFailed) as info:
                manager.push(medium)
        finally:
            torch.cuda.set_per_process_memory_fraction(1.0)
        assert isinstance(info.value.cause, torch.cuda.OutOfMemoryError), repr(info.value.cause)
        results = [r for _ in range(3) for r in manager.push(medium)]  # scale frame, then two graphed steps
        assert len(results) == 3 and all(r.non_finite_fields() == [] for r in results)
        step = manager.session._graph_step
        assert step is not None and step.stats.encoder_captures >= 1 and step.stats.replays >= 2 and step.signatures
        del info, step  # the failure's traceback holds the failed frame's locals (its graph step) in a cycle
        gc.collect()
        torch.cuda.synchronize()
        return torch.cuda.memory_allocated()

    warm = cycle()  # the first fault at these sizes also builds what stays for good (tables, workspaces)
    after = [cycle() for _ in range(3)]
    print(f"allocated MiB after capture faults: {warm / 2**20:.1f}, then {[round(a / 2**20, 1) for a in after]}")
    assert after[1] == after[0] and after[2] == after[0], "each fault while capturing leaves memory behind"
