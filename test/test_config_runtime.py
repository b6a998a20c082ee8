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


def test_a_device_without_index_is_the_current_cuda_device(monkeypatch):
    """Torch compares devices as written (``cuda`` != ``cuda:0``) while CUDA tensors report the index:
    the shared page pool once refused its own storage for that. Every resolved CUDA device carries its
    index; a CPU device loses its index, as CPU tensors report it."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert runtime.concrete_device("cuda") == torch.device("cuda", 1)
    assert runtime.concrete_device(torch.device("cuda")) == torch.device("cuda", 1)
    assert runtime.concrete_device("cuda:0") == torch.device("cuda", 0)
    assert runtime.concrete_device("cpu") == torch.device("cpu")
    assert runtime.concrete_device("cpu:0") == torch.device("cpu")  # CPU tensors report no index
    assert runtime.resolve_device("cuda") == torch.device("cuda", 1)
    assert runtime.resolve_device("auto") == torch.device("cuda", 1)


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
    assert not rt.depth_beside_camera, "the depth head's own stream lives in the CUDA-graph step"
    assert not rt.depth_channels_last, "the CPU keeps NCHW weights (parity is checked there)"
    cfg = RuntimeConfig(device="cpu", attention_backend="sdpa", compile_blocks="off", autocast=False)
    assert runtime.resolve_runtime(cfg) == runtime.resolve_for(cpu, torch.float32, backend="sdpa",
                                                               compile_blocks="off", autocast=False)


@pytest.mark.parametrize("capability,flashinfer,expected", [
    ((9, 0), True, ("sdpa", "split")),  # Hopper: the split kernel was measured fastest (docs/performance.md)
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


def test_bench_variants_parse_into_overrides_the_node_never_sees():
    """The bench's A/B flags become a ``BenchOverrides`` (kernel requests, a stand-in capability, the
    Gluon layout), resolved by the node's own resolver; ``portable`` is ``auto`` at sm89; a flag of no
    meaning (the measurement switches that left the runtime among them) is refused by name."""
    from lingbot_map_ros.tools.bench import PORTABLE_CAPABILITY, BenchOverrides, parse_variant, variant_runtime

    cpu = torch.device("cpu")
    assert parse_variant("auto") == ("auto", [], BenchOverrides())
    assert parse_variant("portable")[2].capability == PORTABLE_CAPABILITY == (8, 9)
    assert parse_variant("auto+torchstep+singles@sm110")[2] == BenchOverrides(
        capability=(11, 0), step_kernels="torch", gluon_pairs=False)
    assert parse_variant("auto+pairs+parts9")[2] == BenchOverrides(gluon_pairs=True, kv_parts=9)
    assert parse_variant("auto+wholerows")[2] == BenchOverrides(whole_rows=True)
    assert parse_variant("auto+tailcall")[2] == BenchOverrides(fused_tail=False)
    assert parse_variant("auto+fusedtail")[2] == BenchOverrides(fused_tail=True)
    assert parse_variant("auto+tailafter")[2] == BenchOverrides(tail_beside=False)
    assert parse_variant("auto+sidetail")[2] == BenchOverrides(tail_beside=True)
    assert parse_variant("auto+framecudnn")[2] == BenchOverrides(frame_cudnn=True)
    assert parse_variant("auto+mergekernel")[2] == BenchOverrides(merge_kernel=True)
    assert parse_variant("auto+mergekernel+torchmerge")[2] == BenchOverrides(merge_kernel=False)
    assert parse_variant("sdpa:split+graph+compile+cudnnprefix") == (
        "sdpa:split", ["graph", "compile"], BenchOverrides(prefix_kernel="sdpa"))
    assert variant_runtime("auto", cpu, torch.float32) == runtime.resolve_for(cpu, torch.float32)
    for gone in ("auto+serialheads", "auto+onegraph", "auto+eagerdepth", "auto+nchwdepth", "auto+kv5",
                 "sdpa+graph+autotune", "auto+compile", "auto+parts0"):
        with pytest.raises(ValueError, match="unknown variant flags"):
            variant_runtime(gone, cpu, torch.float32)
    with pytest.raises(ValueError, match="bad capability"):
        parse_variant("auto@hopper")
    with pytest.raises(ValueError, match="stand-in compute capability needs a CUDA device"):
        variant_runtime("portable", cpu, torch.float32)


def test_resolved_runtime_holds_only_setting_and_capability_decisions():
    """Every field of ``ResolvedRuntime`` is decided by a user setting (``RuntimeConfig``) or by the
    device's capability: the measurement-only switches live in the bench's overrides, not here."""
    fields = {f.name for f in dataclasses.fields(runtime.ResolvedRuntime)}
    assert fields == {"device", "dtype", "backend", "backend_reason", "flashinfer_kernel", "sdpa_kernel",
                      "cuda_graphs", "compile_blocks", "autocast", "prefix_kernel", "step_kernels", "reasons"}


@pytest.fixture
def stand_in_gpu(monkeypatch):
    """A CUDA device on this machine (none here) with cuDNN, Triton and Gluon importable; FlashInfer per
    the test. The compute capability comes from ``resolve_for(capability=...)`` alone: if any decision
    read the real GPU's, the stub below would fail the test."""
    import importlib.util

    real_find_spec = importlib.util.find_spec
    present = {"triton": True, "triton.experimental.gluon": True, "flashinfer": False}

    def find_spec(name, *args, **kwargs):
        if name in present:
            return object() if present[name] else None
        return real_find_spec(name, *args, **kwargs)

    def no_gpu(*args, **kwargs):
        raise AssertionError("a decision read the real GPU's capability")

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.setattr(torch.cuda, "get_device_capability", no_gpu)
    monkeypatch.setattr(torch.backends.cudnn, "is_available", lambda: True)
    return present


# compute capability -> (what auto resolves to without FlashInfer, with FlashInfer): the table of
# docs/hardware.md. Ampere (A100 8.0, RTX 30 8.6), Orin (8.7) and Ada (8.9) have no TMA: cuDNN reads the split
# kernel's prefix; Hopper runs our Gluon runs kernel whatever is installed; Blackwell (10.0, RTX 50 12.0) and
# Thor (11.0) run its Triton version (TMA, no wgmma).
CAPABILITY_PATHS = {
    (8, 0): ("sdpa:split+graph+compiled+cudnnprefix", "flashinfer:fa2+graph+compiled"),
    (8, 6): ("sdpa:split+graph+compiled+cudnnprefix", "flashinfer:fa2+graph+compiled"),
    (8, 7): ("sdpa:split+graph+compiled+cudnnprefix", "flashinfer:fa2+graph+compiled"),
    (8, 9): ("sdpa:split+graph+compiled+cudnnprefix", "flashinfer:fa2+graph+compiled"),
    (9, 0): ("sdpa:split+graph+compiled", "sdpa:split+graph+compiled"),
    (10, 0): ("sdpa:split+graph+compiled", "flashinfer:fa2+graph+compiled"),
    (11, 0): ("sdpa:split+graph+compiled", "flashinfer:fa2+graph+compiled"),
    (12, 0): ("sdpa:split+graph+compiled", "flashinfer:fa2+graph+compiled"),
}


@pytest.mark.parametrize("capability", sorted(CAPABILITY_PATHS), ids=lambda c: f"sm{c[0]}{c[1]}")
@pytest.mark.parametrize("flashinfer", [False, True], ids=["no-flashinfer", "flashinfer"])
def test_auto_resolution_per_compute_capability(stand_in_gpu, capability, flashinfer):
    """What ``auto`` gives each GPU a robot may carry, resolved through a stand-in capability."""
    stand_in_gpu["flashinfer"] = flashinfer
    cuda = torch.device("cuda")
    rt = runtime.resolve_for(cuda, runtime.resolve_dtype("auto", cuda, capability), capability=capability)
    assert rt.dtype == torch.bfloat16
    assert rt.attention == CAPABILITY_PATHS[capability][flashinfer], rt.summary()
    assert rt.cuda_graphs and rt.compile_blocks and rt.step_kernels == "triton"
    assert rt.depth_beside_camera and rt.depth_channels_last
    wanted_prefix = {8: "sdpa", 9: "gluon"}.get(capability[0], "triton")
    assert rt.prefix_kernel == (wanted_prefix if rt.backend == "sdpa" else "sdpa")
    major, minor = capability
    assert rt.reasons[0] == f"resolved for compute capability {major}.{minor} (a stand-in for this GPU's)"
    if rt.backend == "flashinfer":
        assert rt.flashinfer_kernel == "fa2" and any("FlashInfer fa2 (auto: fa2 off Hopper)" in r for r in rt.reasons)


def test_stand_in_capability_reaches_every_kernel_check(stand_in_gpu):
    """Below compute capability 8 there is no cuDNN fused attention (varlen flash instead) and fp16."""
    cuda = torch.device("cuda")
    assert runtime.resolve_dtype("auto", cuda, (7, 5)) == torch.float16
    rt = runtime.resolve_for(cuda, torch.float16, capability=(7, 5))
    assert rt.attention == "sdpa:flash+graph+compiled" and rt.prefix_kernel == "sdpa"
    with pytest.raises(ValueError, match="prefix_kernel 'gluon' cannot run: it needs TMA"):
        runtime.resolve_for(cuda, torch.bfloat16, capability=(8, 7), prefix_kernel="gluon")
    with pytest.raises(ValueError, match="prefix_kernel 'gluon' cannot run: it needs Hopper's wgmma"):
        runtime.resolve_for(cuda, torch.bfloat16, capability=(10, 0), prefix_kernel="gluon")


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
                                      sdpa_kernel="split", cuda_graphs=True, step_kernels="triton")
    assert graphed.attention == "sdpa:split+graph+cudnnprefix"
    assert dataclasses.replace(graphed, prefix_kernel="triton").attention == "sdpa:split+graph"


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
                                      sdpa_kernel="split", cuda_graphs=True, prefix_kernel="triton",
                                      step_kernels="triton")
    assert graphed.attention == "sdpa:split+graph"
    assert dataclasses.replace(graphed, step_kernels="torch").attention == "sdpa:split+graph+torchstep"


def test_bench_kernel_constants_hold_for_one_variant_and_are_restored():
    """``+partsN``, ``+pairs``, ``+wholerows``, ``+fusedtail`` / ``+tailcall``, ``+framecudnn`` and
    ``+mergekernel`` / ``+torchmerge`` set the split kernel's key ranges, the Gluon layout, one call over every
    query row, the tail carried or not, a frame's own attention by cuDNN and a tail's merge for one variant's
    run only: inside, the factory's choice functions answer
    so; after, the shape-based choices are back."""
    pytest.importorskip("triton.experimental.gluon")
    from lingbot_map_ros.core.cache import gluon_runs, runs_plan, split_backend
    from lingbot_map_ros.tools.bench import kernel_constants, parse_variant

    choose, pairs = split_backend.auto_kv_splits, gluon_runs.PAIRS
    def cut(parts: int) -> bool:  # the runs plan of a 518x392 frame on an H200
        return runs_plan.plan_runs(1042, 16, 132, parts, query_tile=64, blocks_per_sm=2, pair_tile=128).ragged

    assert runs_plan.RAGGED_TAIL is None and cut(12)
    with kernel_constants(parse_variant("auto+pairs+parts11")[2]):
        assert split_backend.auto_kv_splits(1042, 16, 132, 72, query_tile=64, blocks_per_sm=2) == 11
        assert gluon_runs.PAIRS is True
        assert not cut(11)  # +partsN names one call over every row
    assert split_backend.auto_kv_splits is choose and gluon_runs.PAIRS is pairs and runs_plan.RAGGED_TAIL is None
    assert choose(1042, 16, 132, 72, query_tile=64, blocks_per_sm=2) == 12  # two waves of 272 programs, cut 12 ways
    with kernel_constants(parse_variant("auto+wholerows")[2]):
        assert not cut(12) and split_backend.auto_kv_splits is choose
    assert cut(12)

    def fused() -> bool:  # the same frame's tail carried by the Gluon kernel's whole tiles
        return runs_plan.plan_runs(1042, 16, 132, 12, query_tile=64, blocks_per_sm=2, pair_tile=128,
                                   fuse_tail=True).fused_tail

    assert runs_plan.FUSED_TAIL is True and fused()
    with kernel_constants(parse_variant("auto+tailcall")[2]):
        assert not fused() and cut(12)  # the cut stays, its tail a call of its own
    with kernel_constants(parse_variant("auto+fusedtail")[2]):
        assert fused()
    assert runs_plan.FUSED_TAIL is True and fused()

    def beside() -> bool:  # the same frame's tail call on a side stream beside the whole tiles
        return runs_plan.plan_runs(1042, 16, 132, 12, query_tile=64, blocks_per_sm=2).tail_beside

    assert runs_plan.TAIL_BESIDE is True and beside()
    with kernel_constants(parse_variant("auto+tailafter")[2]):
        assert not beside() and cut(12)  # the same cut, its tail after the whole tiles
    assert runs_plan.TAIL_BESIDE is True and beside()
    from lingbot_map_ros.core.model import frame_tiles

    assert frame_tiles.ENABLED is True
    with kernel_constants(parse_variant("auto+framecudnn")[2]):
        assert frame_tiles.ENABLED is False  # a frame's own attention in cuDNN's one call
    assert frame_tiles.ENABLED is True
    from lingbot_map_ros.core.cache import merge

    default_merge = merge.KERNEL
    for flag, kernel in (("mergekernel", True), ("torchmerge", False)):
        with kernel_constants(parse_variant(f"auto+{flag}")[2]):
            assert merge.KERNEL is kernel  # a tail's merge by our Triton kernel, or by PyTorch ops
        assert merge.KERNEL is default_merge
    with pytest.raises(RuntimeError), kernel_constants(parse_variant("auto+parts3+framecudnn+mergekernel")[2]):
        raise RuntimeError("a failing variant")
    assert split_backend.auto_kv_splits is choose and runs_plan.RAGGED_TAIL is None and frame_tiles.ENABLED is True
    assert merge.KERNEL is default_merge
