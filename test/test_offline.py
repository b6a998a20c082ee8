"""``lingbot_map_offline``: the parity tool (frames .npy -> .npz/.json/TUM) on the tiny and full presets."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from lingbot_map_ros.core.config import StreamConfig
from lingbot_map_ros.core.trajectory import read_tum
from lingbot_map_ros.tools import offline


def _frames(tmp_path, n: int, h: int, w: int, seed: int):
    frames = torch.rand(n, 3, h, w, generator=torch.Generator().manual_seed(seed)).numpy()
    path = tmp_path / "frames.npy"
    np.save(path, frames.astype(np.float32))
    return path, frames


@pytest.mark.slow
def test_tiny_offline_matches_the_session_and_writes_every_output(tmp_path, tiny_manager):
    path, frames = _frames(tmp_path, 9, 28, 42, seed=3)
    out, tum, js = tmp_path / "r.npz", tmp_path / "t.tum", tmp_path / "r.json"
    common = ["--frames", str(path), "--model-preset", "tiny", "--device", "cpu", "--dtype", "float32",
              "--attention-backend", "sdpa", "--scale-frames", "2", "--sliding-window", "3",
              "--keyframe-interval", "2", "--camera-iterations", "2", "--seed", "11", "--quiet"]
    assert offline.main(common + ["--out", str(out), "--tum", str(tum)]) == 0
    assert offline.main(common + ["--out", str(js)]) == 0

    result = np.load(out)
    assert result["pose_enc"].shape == (9, 9) and result["pose_enc"].dtype == np.float32
    assert result["c2w"].shape == (9, 4, 4) and result["intrinsics"].shape == (9, 3, 3)
    # frames 0, 1 scale; then keyframes every 2nd phase-2 frame: 2, 4, 6, 8
    assert result["is_keyframe"].tolist() == [True, True, True, False, True, False, True, False, True]
    np.testing.assert_allclose(np.array(json.loads(js.read_text())["pose_enc"]), result["pose_enc"], rtol=1e-6)
    stamps, positions, _ = read_tum(tum)
    assert stamps.tolist() == [float(i) for i in range(9)]
    np.testing.assert_allclose(positions, result["c2w"][:, :3, 3], atol=1e-9)

    # the same numbers as driving the session directly with the same weights
    stream = StreamConfig(scale_frames=2, sliding_window=3, keyframe_interval=2, camera_iterations=2)
    manager = tiny_manager(stream, seed=11)  # the weights of the tool's --seed 11
    direct = [r for f in frames for r in manager.push(torch.from_numpy(f))]
    np.testing.assert_allclose(np.stack([r.pose_enc for r in direct]), result["pose_enc"], rtol=1e-5, atol=1e-6)


def test_offline_rejects_bad_settings(tmp_path, capsys):
    path, _ = _frames(tmp_path, 2, 28, 28, seed=1)
    rc = offline.main(["--frames", str(path), "--model-preset", "tiny", "--scale-frames", "0",
                       "--out", str(tmp_path / "x.npz")])
    assert rc == 2
    assert "scale_frames must be" in capsys.readouterr().err  # one line from the settings table


@pytest.mark.slow
def test_full_preset_on_cpu_small_frames(tmp_path):
    """The official shapes, fp32 on CPU, 12 frames of 70x56, a 2/3 window, kf 2."""
    path, _ = _frames(tmp_path, 12, 56, 70, seed=5)
    out = tmp_path / "full.npz"
    rc = offline.main(["--frames", str(path), "--model-preset", "full", "--device", "cpu", "--dtype", "float32",
                       "--attention-backend", "sdpa", "--scale-frames", "2", "--sliding-window", "3",
                       "--keyframe-interval", "2", "--out", str(out), "--quiet"])
    assert rc == 0
    result = np.load(out)
    assert result["pose_enc"].shape == (12, 9) and np.isfinite(result["pose_enc"]).all()
    assert result["is_keyframe"].sum() == 2 + 5  # 2 scale frames + keyframes 2, 4, 6, 8, 10
