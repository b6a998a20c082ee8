"""The footprint model (core/footprint.py) against the tensors actually allocated: the weights a
loaded model holds, the pools and the camera cache a session builds for its first frame, for the
tiny preset and a small full one, several widths and windows (within 5 %); and the budget logic
of core/memory_budget.py (refusal with the numbers, fit_window's choice, apply refusing a change)."""
from __future__ import annotations

import pytest
import torch

from lingbot_map_ros.core.config import RuntimeConfig, StreamConfig, model_config, replace
from lingbot_map_ros.core.footprint import GB, assumed_runtime, footprint, largest_fitting_window, weight_bytes
from lingbot_map_ros.core.memory_budget import MemoryBudgetExceeded
from lingbot_map_ros.core.session_manager import Change, SessionManager

SMALL = dict(scale_frames=2, max_frame_num=64, max_stored_frames=40, long_run_policy="reset", camera_iterations=2)


def tensor_bytes(module: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in [*module.parameters(), *module.buffers()])


def allocated_parts(manager: SessionManager) -> dict[str, int]:
    pools, camera_cache = manager.session.caches()
    return {"weights": tensor_bytes(manager.host.model), "pools": pools.nbytes, "camera_cache": camera_cache.nbytes}


def predicted_parts(manager: SessionManager, height: int, width: int) -> dict[str, int]:
    fp = footprint(manager.host.cfg, manager.host.resolved, manager.stream_cfg, height, width)
    return {"weights": fp.part("weights"), "pools": fp.part("patch_pool") + fp.part("special_pool"),
            "camera_cache": fp.part("camera_cache")}


def check_against_allocation(runtime: RuntimeConfig, cases) -> None:
    manager = SessionManager.open(runtime, StreamConfig(**SMALL, sliding_window=cases[0][2]), log=lambda m: None)
    gen = torch.Generator().manual_seed(1)
    for height, width, window in cases:
        manager.apply(runtime, StreamConfig(**SMALL, sliding_window=window, image_width=width))
        manager.push(torch.rand(3, height, width, generator=gen))
        manager.push(torch.rand(3, height, width, generator=gen))  # the scale frames: caches allocated
        got, want = allocated_parts(manager), predicted_parts(manager, height, width)
        for name in got:
            assert abs(want[name] - got[name]) <= 0.05 * got[name], (height, width, window, name, want, got)
        report = manager.memory_report()
        assert report.allocated == sum(got.values())  # on the CPU: the tensors' bytes
        assert report.predicted >= report.allocated  # the activations come on top


def test_tiny_footprint_matches_the_allocated_tensors():
    check_against_allocation(RuntimeConfig(model_preset="tiny", device="cpu"),
                             [(168, 224, 2), (210, 280, 5), (378, 518, 3), (294, 392, 8)])


@pytest.mark.slow
def test_small_full_footprint_matches_the_allocated_tensors():
    """The full preset (bf16 aggregator, fp32 heads, random weights) at small widths and windows."""
    check_against_allocation(RuntimeConfig(model_preset="full", device="cpu", dtype="bfloat16"),
                             [(168, 224, 1), (210, 280, 2)])


def test_weights_of_the_full_preset_in_bf16_and_fp32():
    """bf16 halves the aggregator, not the fp32 heads: ~1.2 B parameters in all."""
    fp32, bf16 = weight_bytes("full", torch.float32), weight_bytes("full", torch.bfloat16)
    params = fp32 / 4
    assert 1.0e9 < params < 1.5e9
    assert 0.5 * fp32 < bf16 < 0.8 * fp32


def test_footprint_grows_with_window_width_and_depth():
    cfg, rt = model_config("full"), assumed_runtime("cuda", torch.bfloat16)
    base = StreamConfig()
    small = footprint(cfg, rt, replace(base, sliding_window=16), 378, 518).total
    large = footprint(cfg, rt, base, 378, 518).total
    narrow = footprint(cfg, rt, base, 280, 392).total
    depth = footprint(cfg, rt, replace(base, with_depth=True), 378, 518).total
    assert small < large and narrow < large and depth > large
    table = footprint(cfg, rt, base, 378, 518).table()
    for name in ("weights", "patch_pool", "special_pool", "camera_cache", "cuda_graph_pool", "phase1_step",
                 "frame_step", "peak"):
        assert name in table


def test_largest_fitting_window_is_the_largest_that_fits():
    cfg, rt = model_config("full"), assumed_runtime("cuda", torch.bfloat16)
    stream = StreamConfig(with_depth=True, depth_chunk=1)
    budget = 8 * GB
    w = largest_fitting_window(cfg, rt, stream, 518, 518, budget)
    assert w is not None and 1 <= w < stream.sliding_window
    assert footprint(cfg, rt, replace(stream, sliding_window=w), 518, 518).total <= budget
    assert footprint(cfg, rt, replace(stream, sliding_window=w + 1), 518, 518).total > budget


def test_manager_refuses_fits_and_refuses_changes_with_the_numbers():
    runtime = RuntimeConfig(model_preset="tiny", device="cpu")
    stream = StreamConfig(**SMALL, sliding_window=6, image_width=224)
    cfg, rt = model_config("tiny"), assumed_runtime("cpu", torch.float32)
    need = {w: footprint(cfg, rt, replace(stream, sliding_window=w), 224, 224).total for w in (3, 4, 6)}
    budget = (need[3] + need[4]) / 2 / GB
    over = (need[6] - budget * GB) / GB
    reason = rf"needs {need[6] / GB:.2f} GB, the memory budget is {budget:.2f} GB \({over:.2f} GB too much"
    with pytest.raises(MemoryBudgetExceeded, match=reason):
        SessionManager.open(runtime, replace(stream, gpu_memory_budget=budget), log=lambda m: None)
    warnings: list[str] = []
    manager = SessionManager.open(runtime, replace(stream, gpu_memory_budget=budget, fit_window=True),
                                  log=lambda m: None, warn=warnings.append)
    assert manager.stream_cfg.sliding_window == 3
    assert warnings and "sliding_window 3 instead of 6" in warnings[0]
    assert any("fitted to 3" in w for w in manager.warnings())
    before = manager.stream_cfg
    assert manager.view().memory_problems(runtime, replace(stream, gpu_memory_budget=budget))  # fit_window off
    with pytest.raises(MemoryBudgetExceeded):
        manager.apply(runtime, replace(stream, gpu_memory_budget=budget))
    assert manager.stream_cfg == before  # nothing changed


def test_a_budget_change_that_keeps_the_fitted_window_keeps_the_map(one_torch_thread):
    """gpu_memory_budget and fit_window only change the caches through the window they fit: a change
    that keeps it keeps the session (the map), one that shrinks it starts a new session."""
    runtime = RuntimeConfig(model_preset="tiny", device="cpu")
    stream = StreamConfig(**SMALL, sliding_window=6, image_width=224)
    cfg, rt = model_config("tiny"), assumed_runtime("cpu", torch.float32)
    need = {w: footprint(cfg, rt, replace(stream, sliding_window=w), 224, 224).total for w in (3, 4, 6)}
    manager = SessionManager.open(runtime, stream, log=lambda m: None)
    gen = torch.Generator().manual_seed(2)
    for _ in range(4):
        manager.push(torch.rand(3, 28, 42, generator=gen))
    sid, stored, pushed = manager.session_id, manager.session.frames_stored, manager.session.frames_pushed
    roomy = replace(stream, gpu_memory_budget=2 * need[6] / GB)  # the window fits as configured
    result = manager.apply(runtime, roomy)
    assert result.change is Change.NEXT_FRAME and result.fields == ("gpu_memory_budget",)
    result = manager.apply(runtime, replace(roomy, fit_window=True))
    assert result.change is Change.NEXT_FRAME and result.fields == ("fit_window",)
    assert (manager.session_id, manager.session.frames_stored) == (sid, stored)  # the map is still there
    [r] = manager.push(torch.rand(3, 28, 42, generator=gen))
    assert r.frame_index == pushed and r.session_id == sid  # and the next frame continues it
    tight = replace(roomy, gpu_memory_budget=(need[3] + need[4]) / 2 / GB, fit_window=True)  # window 3 fits
    result = manager.apply(runtime, tight)
    assert result.change is Change.NEW_SESSION and result.fields == ("sliding_window",)
    assert manager.session_id == sid + 1 and manager.stream_cfg.sliding_window == 3


def test_phase1_depth_in_chunks_gives_the_unchunked_numbers():
    """fp32, tiny: the scale frames' depth head in calls of 1 frame equals one call of all 8 (noise floor)."""
    runtime = RuntimeConfig(model_preset="tiny", device="cpu")
    gen = torch.Generator().manual_seed(5)
    frames = [torch.rand(3, 56, 70, generator=gen) for _ in range(8)]
    outputs = []
    for chunk in (8, 1):
        stream = StreamConfig(scale_frames=8, sliding_window=4, with_depth=True, depth_chunk=chunk,
                              long_run_policy="reset", max_frame_num=64, max_stored_frames=40)
        manager = SessionManager.open(runtime, stream, log=lambda m: None)
        results = [r for f in frames for r in manager.push(f)]
        assert len(results) == 8 and manager.session.model.depth_head.frame_chunk == chunk
        outputs.append(torch.from_numpy(__import__("numpy").stack([r.depth for r in results])).double())
    ref, chunked = outputs
    assert torch.allclose(chunked, ref, rtol=1e-5, atol=1e-6), (chunked - ref).abs().max()


def test_budget_lowers_the_phase1_depth_chunk_before_the_window():
    runtime = RuntimeConfig(model_preset="tiny", device="cpu")
    stream = StreamConfig(**SMALL, sliding_window=4, image_width=224, with_depth=True)
    cfg, rt = model_config("tiny"), assumed_runtime("cpu", torch.float32)
    one = footprint(cfg, rt, replace(stream, depth_chunk=1), 224, 224).total
    assert footprint(cfg, rt, stream, 224, 224).total > one  # scale_frames 2: chunk 8 holds both frames
    manager = SessionManager.open(runtime, replace(stream, gpu_memory_budget=one / GB), log=lambda m: None)
    assert manager.stream_cfg.depth_chunk == 1 and manager.stream_cfg.sliding_window == 4


def test_an_fp32_checkpoint_is_cast_before_it_moves(monkeypatch):
    """Loading fp32 weights into the bf16 aggregator never moves an fp32 copy to the device: every
    tensor that changes device already has its final dtype (the meta device stands in for the GPU)."""
    from lingbot_map_ros.core.model import LingBotMap, build_model
    from lingbot_map_ros.core.model.checkpoint import apply_state_dict

    source, _ = build_model(model_config("tiny"), seed=3)
    state = source.state_dict()
    assert all(t.dtype == torch.float32 for t in state.values() if t.is_floating_point())
    with torch.device("meta"):
        model = LingBotMap(model_config("tiny"), enable_depth=True)
    model.aggregator.to(torch.bfloat16)
    moves: list[tuple[torch.dtype, torch.dtype]] = []
    real_to = torch.Tensor.to

    def spy(self, *args, **kwargs):
        out = real_to(self, *args, **kwargs)
        if out.device != self.device:
            moves.append((self.dtype, out.dtype))
        return out

    monkeypatch.setattr(torch.Tensor, "to", spy)
    apply_state_dict(model, state, device="meta")
    assert moves and all(before == after for before, after in moves), moves
    assert (torch.float32, torch.bfloat16) not in moves
    assert next(model.aggregator.parameters()).dtype == torch.bfloat16


def test_bench_footprint_prints_the_table_without_a_gpu(capsys):
    from lingbot_map_ros.tools import bench

    assert bench.main(["--footprint", "--width", "392", "--height", "294", "--sliding-window", "32",
                       "--heads", "camera,depth+camera"]) == 0
    out = capsys.readouterr().out
    assert out.count("| **peak** |") == 2 and "preset full, 392x294, bfloat16, cuda" in out
    cfg, rt = model_config("full"), assumed_runtime("cuda", torch.bfloat16)
    want = footprint(cfg, rt, StreamConfig(sliding_window=32, with_depth=True), 294, 392).total
    assert f"**{want / GB:.3f}**" in out


@pytest.mark.parametrize("kernel", ["split", "cudnn", "flash"])
def test_pools_of_the_one_frame_kernels_match_the_built_cache(kernel):
    """The tight pools of the dense one-frame kernels (what an H200 runs) and the official ones."""
    from lingbot_map_ros.core.cache import factory
    from lingbot_map_ros.core.runtime import resolve_for

    cfg = model_config("tiny")
    rt = resolve_for(torch.device("cpu"), torch.float32, backend="sdpa")
    object.__setattr__(rt, "cuda_graphs", True)  # the CUDA layout, built on the CPU
    object.__setattr__(rt, "sdpa_kernel", kernel)
    for window, (h, w) in ((3, (168, 224)), (7, (210, 280))):
        stream = StreamConfig(scale_frames=2, sliding_window=window, max_frame_num=64, max_stored_frames=40)
        page_size = (h // 14) * (w // 14)
        cache = factory.build_global_cache(rt, cfg, stream, page_size)
        fp = footprint(cfg, rt, stream, h, w)
        assert fp.part("patch_pool") + fp.part("special_pool") == cache.nbytes, (kernel, window)
        assert fp.part("camera_cache") == factory.build_camera_cache(rt, cfg, stream).nbytes
