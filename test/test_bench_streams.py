"""``lingbot_map_bench --cameras N`` on the CPU with the tiny preset: the rows it prints, and the
batched run's poses against the same streams pushed one after another (the tool's own check)."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

from lingbot_map_ros.tools.bench import main as bench_main

ARGS = ["--device", "cpu", "--frames", "7", "--height", "28", "--width", "42", "--scale-frames", "2",
        "--sliding-window", "2", "--camera-iterations", "1", "--heads", "camera"]


def _pose_difference(out: str) -> float:
    return float(re.search(r"batched vs one after another \(same frames\): ([0-9.e+-]+)", out).group(1))


def test_cameras_prints_batched_and_sequential_rows(capsys, tmp_path):
    assert bench_main(["--cameras", "3", *ARGS, "--json", str(tmp_path / "part.json")]) == 0
    out = capsys.readouterr().out
    [row] = json.loads((tmp_path / "part.json").read_text())["rows"]
    assert (row["table"], row["streams"], row["processes_fps"]) == ("streams", 3, None)
    assert row["predicted_gb"] > 0 and row["fps_total"] > 0 and row["one_stream_ms"] > 0
    printed = re.search(r"\| batched \| 3 \| ([0-9.]+) \|", out)
    assert printed and abs(float(printed.group(1)) - row["ms_per_step"]) < 0.006
    assert row["sequential_fps"] == float(re.search(r"\| one after another \| 3 \| [0-9.]+ \| [0-9.]+ \| ([0-9.]+)",
                                                      out).group(1))
    # a part of a run of record: bench/record.py and the performance tables take it as it is
    import importlib.util
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(repo / "scripts"))
    spec = importlib.util.spec_from_file_location("perf_tables", repo / "scripts" / "perf_tables.py")
    perf = importlib.util.module_from_spec(spec)
    sys.modules["perf_tables"] = perf
    spec.loader.exec_module(perf)
    doc = json.loads((tmp_path / "part.json").read_text())
    run = perf.parse_run("2030-01-02-streams.json", {**doc, "date": "2030-01-02", "commit": "abc1234"})
    assert "| 3 | 42×28 | 2 | camera only |" in perf.render_readme_streams([run])
    for printed_row in ("| one stream (reference) | 1 |", "| batched | 3 |", "| one after another | 3 |"):
        assert printed_row in out, out
    assert "batched step of 3 / one stream's step" in out
    assert "batched path: eager (no CUDA graphs" in out and row["path"] == "eager"  # the CPU has no graphs
    assert _pose_difference(out) < 1e-5


def test_cameras_is_refused_out_of_range(capsys):
    with pytest.raises(SystemExit):
        bench_main(["--cameras", "9", *ARGS])
    assert "--cameras must be in 1..8" in capsys.readouterr().err


@pytest.mark.slow
def test_cameras_with_processes(capsys):
    # frames enough for a steady phase that the two processes share (it starts together in both)
    assert bench_main(["--cameras", "2", "--processes", *ARGS, "--frames", "14"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"\| 2 processes \| 2 \| [0-9.]+ \|", out), out


def test_profile_is_refused_without_a_gpu(capsys):
    with pytest.raises(SystemExit):
        bench_main(["--cameras", "2", "--profile", *ARGS])
    assert "--profile measures GPU kernel time: it needs --device cuda" in capsys.readouterr().err


class _Event:
    def __init__(self, key: str, us: float) -> None:
        self.key, self.device_time_total = key, us


def test_kernel_time_by_category_and_the_comparison_table():
    from lingbot_map_ros.tools.bench_streams import profile_comparison
    from lingbot_map_ros.tools.kernel_profile import kernel_ms_by_category

    events = [_Event("sm90_xmma_gemm_bf16", 4000.0), _Event("_attn_fwd_runs", 3000.0),
              _Event("aten::linear", 9000.0),  # host side: its kernels are counted under their own names
              _Event("triton_poi_fused_add_mul_0", 500.0), _Event("cudnn::conv2d_fprop", 1000.0)]
    one = kernel_ms_by_category(events, steps=2)
    assert one == {"gemm": 2.0, "attention": 1.5, "elementwise/other": 0.25, "conv (depth head)": 0.5}
    many = {"gemm": 3.0, "attention": 3.0, "elementwise/other": 0.5, "copy/index/cat": 0.1}
    table = profile_comparison(one, many, 2)
    assert "| gemm | 2.00 | 3.00 | 1.50x |" in table and "| attention | 1.50 | 3.00 | 2.00x |" in table
    assert "| copy/index/cat | 0 | 0.10 | - |" in table and "| conv (depth head) | 0.50 | 0.00 | 0.00x |" in table
    assert "| total | 4.25 | 6.60 | 1.55x |" in table
    assert table.index("| gemm |") < table.index("| elementwise/other |")  # the batched step's largest first


def test_kernel_time_leaves_out_the_operators_recorded_on_the_host():
    """A profile with the CPU activity too (the products' shapes) records host operators whose device time
    is their kernels': they are not counted a second time, whatever their name."""
    from torch.autograd import DeviceType

    from lingbot_map_ros.tools.kernel_profile import kernel_ms_by_category

    kernel, region = _Event("sm90_xmma_gemm_bf16", 4000.0), _Event("Torch-Compiled Region: 0/1", 7000.0)
    kernel.device_type, region.device_type = DeviceType.CUDA, DeviceType.CPU
    assert kernel_ms_by_category([kernel, region], steps=2) == {"gemm": 2.0}


def test_kernel_time_leaves_out_the_user_annotations_on_the_device_timeline():
    """With the CPU activity on, a ``torch.compile`` region is also an event on the device timeline that spans
    its kernels: counted, it inflated "elementwise/other" by the regions' length."""
    from torch.autograd import DeviceType

    from lingbot_map_ros.tools.kernel_profile import device_kernel_ms, kernel_ms_by_category

    fused, runs = _Event("triton_poi_fused_add_mul_0", 500.0), _Event("_attn_fwd_runs", 3000.0)
    region = _Event("Torch-Compiled Region: 0/1", 9000.0)
    for event in (fused, runs, region):
        event.device_type = DeviceType.CUDA
    fused.is_user_annotation = runs.is_user_annotation = False
    region.is_user_annotation = True
    assert kernel_ms_by_category([fused, runs, region], steps=2) == {"elementwise/other": 0.25, "attention": 1.5}
    assert set(device_kernel_ms([fused, runs, region], steps=2)) == {"triton_poi_fused_add_mul_0", "_attn_fwd_runs"}


def test_the_kernel_table_lists_the_kernels_that_grow_most_first():
    from lingbot_map_ros.tools.bench_streams import kernel_comparison

    one = {"sm90_xmma_gemm_bf16": 2.0, "_attn_fwd_runs": 1.5, "triton_poi_fused_add_0": 0.2}
    many = {"sm90_xmma_gemm_bf16": 3.0, "_attn_fwd_runs": 3.0, "triton_poi_fused_add_0": 0.3,
            "CatArrayBatchedCopy": 0.4}
    table = kernel_comparison(one, many, 2, top=3).splitlines()
    rows = [r for r in table if r.startswith("| `")]
    assert [r.split("`")[1] for r in rows] == ["_attn_fwd_runs", "sm90_xmma_gemm_bf16", "CatArrayBatchedCopy"]
    assert rows[0] == "| `_attn_fwd_runs` | attention | 1.500 | 3.000 | 2.00x |"
    assert rows[2] == "| `CatArrayBatchedCopy` | copy/index/cat | 0.000 | 0.400 | - |"


def test_the_profile_rows_are_a_step_profile_table_of_the_run_files(tmp_path):
    """--profile --json: a row per category seen on either side, that scripts/perf_tables.py accepts."""
    import argparse
    import importlib.util
    import json
    import sys
    from pathlib import Path

    from lingbot_map_ros.core.config import StreamConfig
    from lingbot_map_ros.tools.bench_streams import step_profile_rows

    args = argparse.Namespace(width=518, height=378, heads="depth+camera")
    rows = step_profile_rows({"gemm": 2.0, "attention": 1.5}, {"gemm": 3.0, "attention": 3.0, "copy/index/cat": 0.1},
                             2, args, StreamConfig(sliding_window=16))
    assert [(r["category"], r["one_stream_ms"], r["batched_ms"]) for r in rows] == [
        ("attention", 1.5, 3.0), ("gemm", 2.0, 3.0), ("copy/index/cat", 0.0, 0.1)]  # largest batched first
    assert {r["window"] for r in rows} == {16} and {r["geometry"] for r in rows} == {"518x378"}
    scripts = Path(__file__).resolve().parents[1] / "scripts"
    spec = importlib.util.spec_from_file_location("perf_tables", scripts / "perf_tables.py")
    perf = importlib.util.module_from_spec(spec)
    sys.modules["perf_tables"] = perf
    spec.loader.exec_module(perf)
    setup = {"gpu": "g", "host_cpus": 2, "torch": "t", "cuda": "c", "driver": "d", "official_commit": None, "notes": ""}
    (tmp_path / "2030-01-02-profile.json").write_text(json.dumps(
        {"run": "profile", "date": "2030-01-02", "commit": "abc1234", "setup": setup, "rows": rows}))
    text = perf.render_performance(perf.load_runs(tmp_path))
    assert "| attention | 1.50 | 3.00 | 2.00× |" in text and "| total | 3.50 | 6.10 | 1.74× |" in text


def test_profile_group_fills_the_windows_then_profiles_eager_ticks(monkeypatch):
    """On the CPU the profile has no kernels to count; what it must do all the same: fill every
    stream's window, then run the profiled ticks with every stream's graphs switched off."""
    import torch

    from lingbot_map_ros.core.config import StreamConfig
    from lingbot_map_ros.core.model_host import ModelHost
    from lingbot_map_ros.core.runtime import RuntimeConfig
    from lingbot_map_ros.tools import bench_streams

    base = ModelHost.load(RuntimeConfig(model_preset="tiny", device="cpu", dtype="float32"), log=lambda m: None)
    stream = StreamConfig(scale_frames=2, sliding_window=2, camera_iterations=1, with_depth=False)
    pools = bench_streams._frames(28, 42, 2, torch.device("cpu"))
    seen = []
    real_step = bench_streams.StreamGroup.step

    def step(group, frames):
        seen.append([group.manager(name).session.use_cuda_graphs for name in frames])
        return real_step(group, frames)

    monkeypatch.setattr(bench_streams.StreamGroup, "step", step)
    two = bench_streams.profile_group(base, stream, 2, pools, ticks=3)
    assert two.categories == {}  # the CPU runs no kernels the profiler times on a device
    start = bench_streams._steady_start(stream) + 2
    assert len(seen) == start + 3 and seen[-3:] == [[False, False]] * 3
    # the products are timed on the CPU too: the batched tick runs each of the single stream's products
    # once, with both streams' rows (a loop over the streams would double the calls and keep M)
    one = bench_streams.profile_group(base, stream, 1, pools, ticks=3)
    shapes = {(p.k, p.n, p.m): p.calls for p in one.products}
    assert (128, 384) in {(k, n) for k, n, _ in shapes}  # the tiny model's qkv (width 128) is among them
    assert {(p.k, p.n, p.m): p.calls for p in two.products} == {(k, n, 2 * m): c for (k, n, m), c in shapes.items()}


def test_products_by_shape_reads_the_operators_shapes_from_a_real_profile():
    """linear (through addmm), a 3-D linear (its batch folded into M), mm, bmm, baddbmm and addmm with a GELU
    epilogue: each once per tick with its (M, K, N); the operators above them (linear, matmul) are not
    counted twice."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from lingbot_map_ros.tools.gemm_profile import products_by_shape

    lin = torch.nn.Linear(64, 96)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(2):
            lin(torch.randn(10, 64))
            lin(torch.randn(3, 7, 64))
            torch.randn(10, 64) @ torch.randn(64, 32)
            torch.bmm(torch.randn(4, 5, 6), torch.randn(4, 6, 7))
            torch.baddbmm(torch.randn(2, 3, 7), torch.randn(2, 3, 4), torch.randn(2, 4, 7))
            torch.ops.aten._addmm_activation(torch.randn(8), torch.randn(5, 4), torch.randn(4, 8), use_gelu=True)
    products = products_by_shape(prof.key_averages(group_by_input_shape=True), 2, "cpu_time_total")
    assert sorted((p.m, p.k, p.n, p.calls) for p in products) == [
        (5, 4, 8, 1.0), (6, 4, 7, 1.0), (10, 64, 32, 1.0), (10, 64, 96, 1.0), (20, 6, 7, 1.0), (21, 64, 96, 1.0)]
    assert all(p.ms > 0 for p in products)
    assert [p.ms for p in products] == sorted((p.ms for p in products), reverse=True)  # longest first


def test_the_product_table_matches_by_weights_and_gives_throughput():
    from lingbot_map_ros.tools.gemm_profile import ProductTime, product_comparison

    assert ProductTime(1000, 1000, 1000, calls=1.0, ms=1.0).tflops == pytest.approx(2.0)
    one = [ProductTime(1005, 1024, 3072, 48.0, 2.0), ProductTime(1, 2048, 2048, 4.0, 0.1)]
    many = [ProductTime(2010, 1024, 3072, 48.0, 3.0), ProductTime(2, 2048, 2048, 4.0, 0.1),
            ProductTime(7, 9, 9, 1.0, 0.01)]  # a product the single stream has not
    table = product_comparison(one, many, 2)
    tflops_one = 2 * 1005 * 1024 * 3072 * 48 / 2e-3 / 1e12
    tflops_many = 2 * tflops_one / 1.5  # twice the work in 1.5 times the time
    assert f"| 1024 x 3072 | 1005 | 2.000 | {tflops_one:.0f} | 2010 | 3.000 | {tflops_many:.0f} | 1.50x |" in table
    assert "| 2048 x 2048 | 1 | 0.100 |" in table and "| 1.00x |" in table
    assert "| 9 x 9 | - | 0.000 | - | 7 | 0.010 |" in table
    assert "| all products | | 2.100 | | | 3.110 | | 1.48x |" in table
    assert table.index("1024 x 3072") < table.index("2048 x 2048")  # the batched step's longest first
    # no product recorded on either side (a profile without the operators): no ratio, not nan
    assert product_comparison([], [], 2).endswith("| all products | | 0.000 | | | 0.000 | | - |")


def _process_report(start: float, phases: list[tuple[int, float]]) -> dict:
    """A worker's report: ``phases`` of (frames, ms each) back to back from ``start`` (seconds)."""
    times, ends, t = [], [], start
    for frames, ms in phases:
        for _ in range(frames):
            t = round(t + ms / 1e3, 9)  # exact boundaries: no frame on both sides of one by rounding
            times.append(ms)
            ends.append(t)
    return {"times": times, "ends": ends, "start": start, "end": t, "peak": 1.0}


def test_processes_are_measured_while_all_of_them_run():
    """Two processes on one GPU: each runs alone at one stream's speed before the other's steady phase
    starts or after it ends; the row is what they get together (20 frames/s each at 50 ms), not the
    mean over their own spans (24 each, 48 together)."""
    from lingbot_map_ros.tools.bench_streams import overlap_of

    first = _process_report(0.0, [(20, 25.0), (40, 50.0)])  # alone until 0.5 s, then beside the second
    second = _process_report(0.5, [(40, 50.0), (20, 25.0)])  # beside the first until 2.5 s, then alone
    overlap = overlap_of([first, second])
    assert overlap.fps == pytest.approx(40.0)
    assert overlap.times.size == 80 and set(overlap.times.tolist()) == {50.0}
    assert overlap.fraction == pytest.approx(2.0 / 2.5)
    # steady phases that never overlap give no rate
    late = _process_report(5.0, [(10, 25.0)])
    assert np.isnan(overlap_of([first, late]).fps) and overlap_of([first, late]).fraction == 0.0
    # nor does a run too short for a steady phase (a worker that never reached it reports no frames)
    short = {"times": [], "ends": [], "start": 0.0, "end": 9.0, "peak": 1.0}
    assert np.isnan(overlap_of([first, short]).fps) and overlap_of([first, short]).fraction == 0.0
