"""Saved sessions on the GPU (device machine; skipped where there is no CUDA): a session saved and
loaded on CUDA with CUDA graphs continues as the uninterrupted run does (the load writes into the
captured graphs' pools), and a session moves between devices (saved on CUDA, loaded on the CPU, and
the reverse).

    python3 -m pytest test/test_gpu_sessions.py -q
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from lingbot_map_ros.core.config import RuntimeConfig, StreamConfig
from lingbot_map_ros.core.footprint import GB
from lingbot_map_ros.core.session_manager import SessionManager

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

H, W = 56, 84  # 4 x 6 patches
STREAM = StreamConfig(scale_frames=2, sliding_window=4, keyframe_interval=2, camera_iterations=2,
                      max_stored_frames=10, overlap_frames=4)


def manager(device: str, dtype: str, **runtime) -> SessionManager:
    runtime_cfg = RuntimeConfig(device=device, dtype=dtype, model_preset="tiny", seed=3, **runtime)
    return SessionManager.open(runtime_cfg, STREAM, log=lambda m: None)


def frames(n: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.rand(3, H, W, generator=g) for _ in range(n)]


def poses(m: SessionManager, fs) -> np.ndarray:
    return np.stack([r.pose_enc for f in fs for r in m.push(f)])


@pytest.mark.parametrize("backend", ["auto", "sdpa"])
def test_resume_on_cuda_with_graphs_equals_the_uninterrupted_run(backend, tmp_path):
    fs = frames(40)
    a = manager("cuda", "bfloat16", attention_backend=backend)
    assert a.session.runtime.cuda_graphs
    poses(a, fs[:20])  # a window switch and evictions before the save
    assert a.policy.window_switches >= 1
    a.save(str(tmp_path / "s"))
    b = manager("cuda", "bfloat16", attention_backend=backend)
    poses(b, fs[:3])  # b has pools and captured graphs already: the load writes into them
    pools = b.session._kv.storage.data_ptr()
    b.load(str(tmp_path / "s"))
    assert b.session._kv.storage.data_ptr() == pools
    expected, got = poses(a, fs[20:]), poses(b, fs[20:])
    assert a.policy.window_switches > 1
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6)


def test_a_session_moves_between_cuda_and_cpu(tmp_path):
    """fp32 on both devices (the dtype is part of a session's identity); the pools differ (CUDA graphs'
    tight pools vs the CPU's official ones), the page table is laid out afresh."""
    fs = frames(24)
    gpu = manager("cuda", "float32", cuda_graphs=False)
    cpu = manager("cpu", "float32")
    poses(gpu, fs[:14])
    poses(cpu, fs[:14])
    gpu.save(str(tmp_path / "from_gpu"))
    cpu.save(str(tmp_path / "from_cpu"))
    on_cpu, on_gpu = manager("cpu", "float32"), manager("cuda", "float32", cuda_graphs=False)
    on_cpu.load(str(tmp_path / "from_gpu"))
    on_gpu.load(str(tmp_path / "from_cpu"))
    rest_gpu, rest_cpu = poses(gpu, fs[14:]), poses(cpu, fs[14:])
    apart = float(np.abs(rest_gpu - rest_cpu).max())  # how far the two devices are apart anyway
    for moved in (poses(on_cpu, fs[14:]), poses(on_gpu, fs[14:])):
        assert np.isfinite(moved).all()
        assert float(np.abs(moved - rest_gpu).max()) <= 2 * apart + 1e-5
        assert float(np.abs(moved - rest_cpu).max()) <= 2 * apart + 1e-5


def test_a_capture_and_a_staged_load_stay_in_device_memory_and_resume_exactly(tmp_path):
    """Where the device has room, a save's capture is a copy inside device memory (the stream's pause
    is milliseconds) and the write moves it off the device while frames go on; a load is staged on the
    device before its commit. The resumed session continues as the captured instant did."""
    fs = frames(40)
    a = manager("cuda", "bfloat16")
    poses(a, fs[:20])
    assert a.staging_fits(a.session.bytes_in_use())
    capture = a.capture()
    assert capture.ready is not None
    assert all(t.is_cuda for name, group in capture.groups if name != "policy" for t in group.values())
    following = poses(a, fs[20:30])  # the pools change (a window switch too) before the write
    capture.write(str(tmp_path / "s"))
    b = manager("cuda", "bfloat16")
    poses(b, fs[:3])
    prepared = b.prepare_load(str(tmp_path / "s"))
    assert prepared.staged_on.startswith("cuda")
    assert all(t.is_cuda for group in prepared.groups.values() for t in group.values())
    report = b.commit_load(prepared)
    assert report.staged_on.startswith("cuda") and report.pause_seconds < report.seconds
    np.testing.assert_allclose(poses(b, fs[20:30]), following, rtol=0, atol=1e-6)


def test_without_room_in_the_budget_the_copies_go_to_the_host(tmp_path):
    probe = manager("cuda", "bfloat16")
    poses(probe, frames(6))
    need = probe.session.bytes_in_use()
    budget_gb = (probe.budgeted_bytes() + need / 2) / GB  # the session fits, a copy of it beside it does not
    tight = SessionManager.open(RuntimeConfig(device="cuda", dtype="bfloat16", model_preset="tiny", seed=3),
                                dataclasses.replace(STREAM, gpu_memory_budget=budget_gb), log=lambda m: None)
    poses(tight, frames(6))
    assert not tight.staging_fits(tight.session.bytes_in_use())
    capture = tight.capture()
    assert capture.ready is None and all(not t.is_cuda for _, group in capture.groups for t in group.values())
    capture.write(str(tmp_path / "s"))
    assert tight.prepare_load(str(tmp_path / "s")).staged_on == "host"
