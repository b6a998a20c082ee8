"""Sizing a card: ``lingbot_map_bench --footprint`` with a budget prints the window configure picks
(compared with a real configure of the tiny model), the README's "what fits" table is the footprint
model's, and an integrated GPU refuses the automatic budget.
"""
from __future__ import annotations

import re
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")

from lingbot_map_ros.core.config import RuntimeConfig, StreamConfig, model_config  # noqa: E402
from lingbot_map_ros.core.footprint import GB, assumed_runtime, footprint  # noqa: E402
from lingbot_map_ros.core.memory_budget import INTEGRATED_AUTO_REFUSED, MemoryBudget, MemoryBudgetExceeded  # noqa: E402
from lingbot_map_ros.core.sizing import TABLE_BUDGETS_GB, TABLE_HEADS, TABLE_WIDTHS  # noqa: E402
from lingbot_map_ros.tools import bench  # noqa: E402

PICKED = re.compile(r"configure runs sliding_window (\d+) \(([\d.]+) GB")


def _picked(out: str) -> list[tuple[int, float]]:
    return [(int(w), float(gb)) for w, gb in PICKED.findall(out)]


def test_footprint_with_a_budget_prints_the_window_a_real_configure_picks(capsys, one_torch_thread):
    from lingbot_map_ros.core.session_manager import SessionManager

    runtime = RuntimeConfig(model_preset="tiny", device="cpu")
    base = StreamConfig(scale_frames=2, sliding_window=12, max_frame_num=64, max_stored_frames=40, overlap_frames=2,
                        image_width=224)
    cfg, rt = model_config("tiny"), assumed_runtime("cpu", torch.float32)
    need = {w: footprint(cfg, rt, replace(base, sliding_window=w), 224, 224).total for w in (5, 6)}
    budget_gb = (need[5] + need[6]) / 2 / GB  # window 5 fits, 6 does not
    args = ["--footprint", "--model-preset", "tiny", "--device", "cpu", "--image-width", "224", "--width", "224",
            "--height", "168", "--scale-frames", "2", "--sliding-window", "12", "--max-frame-num", "64",
            "--max-stored-frames", "40", "--overlap-frames", "2", "--gpu-memory-budget", repr(budget_gb),
            "--fit-window", "--heads", "camera"]
    assert bench.main(args) == 0
    printed = _picked(capsys.readouterr().out)
    manager = SessionManager.open(runtime, replace(base, gpu_memory_budget=budget_gb, fit_window=True),
                                  log=lambda m: None, warn=lambda m: None)
    assert printed and printed[0][0] == manager.stream_cfg.sliding_window == 5, printed


def test_footprint_6_gb_fit_window_on_the_full_model(capsys):
    assert bench.main(["--footprint", "--gpu-memory-budget", "6", "--fit-window", "--heads", "depth+camera",
                       "--image-width", "392", "--width", "392", "--height", "294"]) == 0
    out = capsys.readouterr().out
    [(window, gb)] = _picked(out)
    cfg, rt = model_config("full"), assumed_runtime("cuda", torch.bfloat16)
    # configure checks at the width's tallest input (392 x 392), the phase-1 depth head in calls of one frame
    # when the default chunk does not fit: the window is the largest that fits 6 GB
    stream = StreamConfig(with_depth=True, image_width=392, depth_chunk=1)
    at = {w: footprint(cfg, rt, replace(stream, sliding_window=w), 392, 392).total for w in (window, window + 1)}
    assert at[window] <= 6 * GB < at[window + 1] and window < stream.sliding_window, (window, at)
    assert abs(gb - at[window] / GB) < 0.006
    assert f"window {window}, heads depth+camera" in out  # the table that follows is the fitted window's
    # at 518 not even a window of 1 fits 6 GB with the depth head: refused with the numbers, as configure does
    assert bench.main(["--footprint", "--gpu-memory-budget", "6", "--fit-window", "--heads", "depth+camera"]) == 0
    assert "configure refuses" in capsys.readouterr().out


def test_the_readme_fits_table_is_the_footprint_model():
    import scripts.readme_tables as tables

    text = tables.README.read_text(encoding="utf-8")
    [body] = tables.regions(text)["fits"]
    rows = [line.split("|")[1:-1] for line in body.splitlines() if line.startswith("| ") and "GB |" in line]
    assert [r[0].strip() for r in rows] == [f"{gb} GB" for gb in TABLE_BUDGETS_GB]
    cfg, rt = model_config("full"), assumed_runtime("cuda", torch.bfloat16)
    # one cell checked against the footprint directly: 8 GB, width 392, depth+camera
    column = [(w, h) for w in TABLE_WIDTHS for h in TABLE_HEADS].index((392, "depth+camera"))
    cell = rows[TABLE_BUDGETS_GB.index(8)][1 + column].strip()
    window = int(cell.split()[0])
    stream = StreamConfig(with_depth=True, image_width=392, depth_chunk=1)
    assert footprint(cfg, rt, replace(stream, sliding_window=window), 392, 392).total <= 8 * GB
    if window < stream.sliding_window:
        assert footprint(cfg, rt, replace(stream, sliding_window=window + 1), 392, 392).total > 8 * GB


def test_an_integrated_gpu_refuses_the_automatic_budget():
    cuda = torch.device("cuda")
    jetson = MemoryBudget(free_bytes=lambda d: 30 * GB, integrated=lambda d: True)
    with pytest.raises(MemoryBudgetExceeded) as err:
        jetson.bytes_for(StreamConfig(gpu_memory_budget=0.0), cuda)
    assert str(err.value) == INTEGRATED_AUTO_REFUSED and "integrated GPU" in str(err.value)
    assert jetson.bytes_for(StreamConfig(gpu_memory_budget=4.0), cuda) == 4 * GB  # an explicit budget is kept
    discrete = MemoryBudget(free_bytes=lambda d: 30 * GB, integrated=lambda d: False)
    assert discrete.bytes_for(StreamConfig(gpu_memory_budget=0.0), cuda) == 29.5 * GB


def test_a_known_camera_aspect_sizes_configure_and_crops_a_taller_camera(capsys, one_torch_thread):
    """camera_aspect 0.75 (a 640x480 camera): configure checks 224x168, not 224x224, so a budget that
    holds window 5 of a square holds more; the printed pick is a real configure's; a square camera is
    centre-cropped to the planned height."""
    from lingbot_map_ros.core.config import planned_height
    from lingbot_map_ros.core.preprocess import FramePreprocessor
    from lingbot_map_ros.core.session_manager import SessionManager

    base = StreamConfig(scale_frames=2, sliding_window=12, max_frame_num=64, max_stored_frames=40, overlap_frames=2,
                        image_width=224)
    cfg, rt = model_config("tiny"), assumed_runtime("cpu", torch.float32)
    need = {w: footprint(cfg, rt, replace(base, sliding_window=w), 224, 224).total for w in (5, 6)}
    budget_gb = (need[5] + need[6]) / 2 / GB
    assert planned_height(224, 0.75) == 168 and planned_height(224, 0.0) == 224
    args = ["--footprint", "--model-preset", "tiny", "--device", "cpu", "--image-width", "224", "--camera-aspect",
            "0.75", "--scale-frames", "2", "--sliding-window", "12", "--max-frame-num", "64", "--max-stored-frames",
            "40", "--overlap-frames", "2", "--gpu-memory-budget", repr(budget_gb), "--fit-window", "--heads", "camera"]
    assert bench.main(args) == 0
    [(window, _)] = _picked(capsys.readouterr().out)
    manager = SessionManager.open(RuntimeConfig(model_preset="tiny", device="cpu"),
                             replace(base, gpu_memory_budget=budget_gb, fit_window=True, camera_aspect=0.75),
                             log=lambda m: None, warn=lambda m: None)
    assert window == manager.stream_cfg.sliding_window > 5, window  # more than the square's 5
    at = footprint(cfg, rt, replace(base, sliding_window=window), 168, 224).total
    assert at <= budget_gb * GB
    if window < base.sliding_window:
        assert budget_gb * GB < footprint(cfg, rt, replace(base, sliding_window=window + 1), 168, 224).total
    prep = FramePreprocessor(width=224, max_height=planned_height(224, 0.75))
    prep.fix_size(300, 300)  # a square camera where a 4:3 one was planned for: cropped to the plan
    assert prep.model_hw == (168, 224) and prep.crop_offset_y == 28


def test_footprint_for_several_cameras_fits_one_window_for_all_and_the_readme_says_the_same(capsys):
    """``--footprint --cameras 2``: the window configure picks for two cameras on one node (the weights
    once, a pool share and camera cache each), checked against the footprint model directly, and the
    README's several-camera table shows the same pick."""
    import scripts.readme_tables as tables

    assert bench.main(["--footprint", "--cameras", "2", "--gpu-memory-budget", "16", "--fit-window",
                       "--heads", "depth+camera"]) == 0
    [(window, gb)] = _picked(capsys.readouterr().out)
    cfg, rt = model_config("full"), assumed_runtime("cuda", torch.bfloat16)
    stream = StreamConfig(with_depth=True, depth_chunk=1)
    at = {w: footprint(cfg, rt, replace(stream, sliding_window=w), 518, 518, 2).total for w in (window, window + 1)}
    assert at[window] <= 16 * GB < at[window + 1], (window, at)
    one = footprint(cfg, rt, replace(stream, sliding_window=window), 518, 518).total
    assert at[window] > one  # a second camera costs memory: the same window fits one camera with room
    [body] = tables.regions(tables.README.read_text(encoding="utf-8"))["fits-cameras"]
    row = next(line for line in body.splitlines() if line.startswith("| 16 GB | 2 |"))
    cell = row.split("|")[3].split()
    assert int(cell[0]) == window and abs(float(cell[1].strip("(")) - gb) <= 0.051, (cell, window, gb)
