"""Settings validation and the resolution of ``auto`` device / dtype / backend (with reasons)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from lingbot_map_ros.core import runtime
from lingbot_map_ros.core.config import (
    RuntimeConfig,
    StreamConfig,
    model_input_height,
    special_pages_capacity,
    validate_runtime,
    validate_stream,
)


def test_defaults_are_the_official_demo_and_valid():
    cfg = StreamConfig()
    assert (cfg.scale_frames, cfg.sliding_window, cfg.keyframe_interval, cfg.camera_iterations, cfg.max_frame_num) == (
        8, 64, 1, 4, 1024)
    assert validate_stream(cfg) == [] and validate_runtime(RuntimeConfig()) == []


@pytest.mark.parametrize(
    "changes, fragment",
    [
        (dict(scale_frames=0), "scale_frames must be in [1, 256] (got 0)"),
        (dict(sliding_window=0), "sliding_window must be in [1, 4096] (got 0)"),
        (dict(keyframe_interval=0), "keyframe_interval must be in [1, 100000] (got 0)"),
        (dict(camera_iterations=5), "camera_iterations must be in [1, 4] (got 5)"),
        (dict(max_frame_num=5), "max_frame_num (5) must exceed"),
        (dict(long_run_policy="forever"), "long_run_policy must be one of"),
        (dict(max_stored_frames=2000), "must not exceed max_frame_num"),
        (dict(overlap_frames=0), "overlap_frames must be in [1, 4096] (got 0)"),
    ],
)
def test_invalid_stream_settings_are_rejected_with_a_reason(changes, fragment):
    problems = validate_stream(StreamConfig(**changes))
    assert any(fragment in p for p in problems), problems


@pytest.mark.parametrize(
    "changes, fragment",
    [
        (dict(device="gpu"), "device must be auto, cpu, cuda or cuda:N"),
        (dict(dtype="int8"), "dtype must be"),
        (dict(attention_backend="triton"), "attention_backend must be"),
        (dict(model_preset="huge"), "model_preset must be one of"),
    ],
)
def test_invalid_runtime_settings_are_rejected_with_a_reason(changes, fragment):
    assert any(fragment in p for p in validate_runtime(RuntimeConfig(**changes)))


def test_height_rule_and_special_capacity():
    # docs/model.md §2.1 examples
    assert model_input_height(1280, 720) == 294 and model_input_height(640, 480) == 392
    assert model_input_height(480, 640) == 686  # cropped later to 518
    # ceil((1024 + 100) * 6 / 777) + 16
    assert special_pages_capacity(1024, 777) == 9 + 16


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU fallbacks")
def test_auto_resolution_on_a_cpu_machine_says_why():
    resolved = runtime.resolve_runtime(RuntimeConfig())
    assert resolved.device.type == "cpu" and resolved.dtype == torch.float32
    assert resolved.backend == "sdpa" and "CUDA" in resolved.backend_reason
    with pytest.raises(ValueError, match="flashinfer' cannot run"):
        runtime.resolve_runtime(RuntimeConfig(attention_backend="flashinfer"))
    with pytest.raises(ValueError, match="CUDA is not available"):
        runtime.resolve_device("cuda")
    assert runtime.resolve_flashinfer_kernel("auto", torch.device("cpu")) == "fa2"
    with pytest.raises(ValueError):
        runtime.resolve_flashinfer_kernel("fa9", torch.device("cpu"))


def test_flashinfer_needs_half_precision_even_on_cuda():
    reason = runtime.flashinfer_unusable_reason(torch.device("cuda"), torch.float32)
    assert "float16 or bfloat16" in reason


def test_resolve_for_one_owner_of_every_runtime_decision():
    """Graphs and fusion need CUDA; impossible requests fail with the reason; every decision is logged."""
    cpu = torch.device("cpu")
    rt = runtime.resolve_for(cpu, torch.float32, backend="sdpa", cuda_graphs=True, compile_blocks="auto")
    assert (rt.backend, rt.cuda_graphs, rt.compile_blocks, rt.sdpa_kernel) == ("sdpa", False, False, "flash")
    assert any("CUDA graphs off" in r for r in rt.reasons) and rt.summary().startswith("sdpa:flash+eager")
    with pytest.raises(ValueError, match="compile_blocks 'on' cannot run"):
        runtime.resolve_for(cpu, torch.float32, backend="sdpa", compile_blocks="on")
    with pytest.raises(ValueError, match="sdpa_kernel 'cudnn' cannot run"):
        runtime.resolve_for(cpu, torch.float32, backend="sdpa", sdpa_kernel="cudnn")
    with pytest.raises(ValueError, match="compile_blocks must be"):
        runtime.resolve_for(cpu, torch.float32, backend="sdpa", compile_blocks="maybe")
    assert not runtime.resolve_for(cpu, torch.float32, backend="sdpa", autocast=False).autocast
    assert not rt.parallel_heads, "the depth head's own stream lives in the CUDA-graph step"
    cfg = RuntimeConfig(device="cpu", attention_backend="sdpa", compile_blocks="off", autocast=False)
    assert runtime.resolve_runtime(cfg) == runtime.resolve_for(cpu, torch.float32, backend="sdpa",
                                                               compile_blocks="off", autocast=False)


@pytest.mark.parametrize("capability,flashinfer,expected", [
    ((9, 0), True, ("sdpa", "split")),  # Hopper: the split kernel was measured fastest (docs/benchmarks.md)
    ((8, 0), True, ("flashinfer", "split")),  # elsewhere FlashInfer first where it is installed
    ((8, 0), False, ("sdpa", "split")),  # no FlashInfer: SDPA, still the split kernel where cuDNN runs
    ((7, 5), False, ("sdpa", "flash")),  # no cuDNN fused attention below compute capability 8
])
def test_auto_backend_and_one_frame_kernel_by_capability(monkeypatch, capability, flashinfer, expected) -> None:
    """The ``auto`` rules of ``runtime.py`` for a CUDA device, with the device facts stubbed (no GPU here)."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.backends.cudnn, "is_available", lambda: True)
    monkeypatch.setattr(runtime, "flashinfer_unusable_reason",
                        lambda device, dtype: "" if flashinfer else "flashinfer is not installed")
    rt = runtime.resolve_for(torch.device("cuda"), torch.bfloat16)
    assert (rt.backend, rt.sdpa_kernel) == expected
    assert rt.cuda_graphs and any(r.startswith("backend ") for r in rt.reasons)
    with pytest.raises(ValueError, match="sdpa_kernel 'split' cannot run"):
        runtime.resolve_for(torch.device("cuda"), torch.float32, backend="sdpa", sdpa_kernel="split")


def test_limits_are_written_once_and_reported_once():
    """The settings table takes every core field's range and choices from the dataclass, and a value
    outside them gets exactly one reason (the table does not check the core fields a second time)."""
    from lingbot_map_ros.core.config import field_limits
    from lingbot_map_ros.core.settings import CORE_FIELDS, SETTINGS_BY_NAME, defaults, validate_values

    for name in CORE_FIELDS:
        cls = RuntimeConfig if name in RuntimeConfig.__dataclass_fields__ else StreamConfig
        row = SETTINGS_BY_NAME[name]
        assert {"range": row.range, "choices": row.choices} == field_limits(cls, name), name
    limited = [SETTINGS_BY_NAME[n] for n in sorted(CORE_FIELDS) if SETTINGS_BY_NAME[n].range or
               SETTINGS_BY_NAME[n].choices]
    assert len(limited) >= 12
    for row in limited:
        bad = row.range[1] + 1 if row.range else "no-such-choice"
        problems = validate_values({**defaults(), row.name: bad}, resolve=False)
        mine = [p for p in problems if p.startswith(row.name + " must be ")]  # its limit, not a cross-field rule
        assert len(mine) == 1, (row.name, problems)


def test_bench_variants_name_the_heads_order():
    """The depth head's second stream is the default (``+parallelheads`` says so explicitly) and
    ``+serialheads`` turns it off; it lives in the CUDA-graph step, so without graphs (CPU) it is off
    and the reasons say why."""
    from lingbot_map_ros.tools.bench import variant_runtime

    cpu = torch.device("cpu")
    rt = variant_runtime("auto+parallelheads", cpu, torch.float32)
    assert rt == runtime.resolve_for(cpu, torch.float32, parallel_heads=True)
    assert not rt.parallel_heads and any("second stream lives in the CUDA-graph step" in r for r in rt.reasons)
    assert variant_runtime("sdpa+eager+parallelheads", cpu, torch.float32).backend == "sdpa"
    assert not variant_runtime("auto", cpu, torch.float32).parallel_heads
    assert variant_runtime("auto+serialheads", cpu, torch.float32) == runtime.resolve_for(
        cpu, torch.float32, parallel_heads=False)
    assert variant_runtime("auto", cpu, torch.float32) == variant_runtime("auto+parallelheads", cpu, torch.float32)
    with pytest.raises(ValueError, match="unknown variant flags"):
        variant_runtime("auto+parallel", cpu, torch.float32)


def test_split_prefix_kernel_resolves_with_a_reason_and_names_itself():
    """``auto`` means our Triton kernel only where it can run (Triton, CUDA with TMA); elsewhere cuDNN
    (``sdpa``) with the reason; asking for the Triton kernel where it cannot run is refused; the bench
    flags map onto the same resolver."""
    from lingbot_map_ros.tools.bench import variant_runtime

    cpu = torch.device("cpu")
    assert runtime.resolve_prefix_kernel("auto", cpu) == ("sdpa", "auto: cuDNN, the Triton kernel cannot run "
                                                          f"({runtime.triton_prefix_unusable_reason(cpu)})")
    assert runtime.triton_prefix_unusable_reason(cpu) in ("triton is not installed", "it runs on CUDA")
    assert runtime.resolve_prefix_kernel("sdpa", cpu) == ("sdpa", "requested")
    with pytest.raises(ValueError, match="prefix_kernel 'triton' cannot run"):
        runtime.resolve_prefix_kernel("triton", cpu)
    with pytest.raises(ValueError, match="prefix_kernel must be one of"):
        runtime.resolve_prefix_kernel("cutlass", cpu)
    # only the split backend in the graph step has a prefix: on the CPU it is cuDNN's and unnamed
    rt = runtime.resolve_for(cpu, torch.float32)
    assert rt.prefix_kernel == "sdpa" and "prefix" not in rt.attention
    assert variant_runtime("auto+cudnnprefix", cpu, torch.float32) == rt
    with pytest.raises(ValueError, match="prefix_kernel 'triton' cannot run"):
        variant_runtime("auto+tritonprefix", cpu, torch.float32)
    # the name: no suffix for the default (Triton), +cudnnprefix for cuDNN's
    graphed = runtime.ResolvedRuntime(device=cpu, dtype=torch.bfloat16, backend="sdpa", backend_reason="",
                                      sdpa_kernel="split", cuda_graphs=True, parallel_heads=True,
                                      step_kernels="triton", encoder_graph=True)
    assert graphed.attention == "sdpa:split+graph+cudnnprefix"
    assert dataclasses.replace(graphed, prefix_kernel="triton").attention == "sdpa:split+graph"


def test_encoder_graph_resolves_with_the_graphs_and_names_its_absence() -> None:
    """The image encoder as a graph of its own lives in the CUDA-graph step: on with it (unless asked
    off, the bench's ``+onegraph``), off and unnamed without it; the reason line says which."""
    from lingbot_map_ros.tools.bench import variant_runtime

    cpu = torch.device("cpu")
    eager = runtime.resolve_for(cpu, torch.float32)
    assert not eager.cuda_graphs and not eager.encoder_graph and "onegraph" not in eager.attention
    assert not any("encoder" in r for r in eager.reasons)
    assert variant_runtime("auto+onegraph", cpu, torch.float32) == eager
    graphed = runtime.ResolvedRuntime(device=cpu, dtype=torch.bfloat16, backend="sdpa", backend_reason="",
                                      sdpa_kernel="split", cuda_graphs=True, parallel_heads=True,
                                      step_kernels="triton", prefix_kernel="gluon", encoder_graph=True)
    assert graphed.attention == "sdpa:split+graph"
    assert dataclasses.replace(graphed, encoder_graph=False).attention == "sdpa:split+graph+onegraph"
    if torch.cuda.is_available():  # the resolver itself, where graphs can be on
        cuda = torch.device("cuda")
        on = runtime.resolve_for(cuda, torch.bfloat16)
        off = runtime.resolve_for(cuda, torch.bfloat16, encoder_graph=False)
        assert on.encoder_graph and any("image encoder a graph of its own" in r for r in on.reasons)
        assert not off.encoder_graph and off.attention.endswith("+onegraph")
        assert variant_runtime("auto+onegraph", cuda, torch.bfloat16) == off


def test_step_kernels_resolve_with_a_reason_and_name_themselves() -> None:
    """The graph step's small kernels: ours in Triton wherever Triton runs on CUDA, PyTorch's otherwise
    (and whenever the graph step is off); a request that cannot run is refused."""
    cpu = torch.device("cpu")
    assert runtime.resolve_step_kernels("auto", cpu, graphs=False)[0] == "torch"
    assert runtime.resolve_step_kernels("triton", cpu, graphs=False)[0] == "torch"  # nothing to decode
    name, why = runtime.resolve_step_kernels("auto", cpu, graphs=True)
    assert name == "torch" and why.startswith("auto: ")
    with pytest.raises(ValueError, match="step_kernels 'triton' cannot run"):
        runtime.resolve_step_kernels("triton", cpu, graphs=True)
    with pytest.raises(ValueError, match="step_kernels must be one of"):
        runtime.resolve_step_kernels("flash", cpu, graphs=True)
    assert runtime.resolve_for(cpu, torch.float32).step_kernels == "torch"
    graphed = runtime.ResolvedRuntime(device=cpu, dtype=torch.bfloat16, backend="sdpa", backend_reason="",
                                      sdpa_kernel="split", cuda_graphs=True, parallel_heads=True,
                                      prefix_kernel="triton", step_kernels="triton", encoder_graph=True)
    assert graphed.attention == "sdpa:split+graph"
    assert dataclasses.replace(graphed, step_kernels="torch").attention == "sdpa:split+graph+torchstep"
