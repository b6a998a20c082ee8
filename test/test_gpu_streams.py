"""Several streams on the GPU (device machine; skipped where there is no CUDA): the batched attention
over a group's pool against float64, and the captured batched step against each stream run alone.

* float64 references of the batched attention: B streams' caches over one ``SharedKVPool``, driven
  through different histories (phase 1, keyframes, non-keyframes, eviction); every phase-2 step
  attends in ONE batched call (FlashInfer's plan over the streams' page lists, eager and in a CUDA
  graph re-planned between replays; the loop over the streams' split/runs and cuDNN backends inside
  a CUDA graph), and each stream's rows are compared with a dense float64 softmax over its own
  visible set, built from the raw K/V;
* the captured batched step (``StreamGroup(batch=True)`` under CUDA graphs, ``core/batched_graph.py``)
  on a tiny bf16 model, for every kernel path, against each stream run alone (the single-camera path,
  CUDA graphs included) within the official backends' spread (4.3e-3 relative);
* a group of one stream, and two streams that never share a tick, replay the single-camera graphs:
  bit for bit the lone run;
* two streams at different rates entering phase 2 at different frames.

    python3 -m pytest test/test_gpu_streams.py -q
"""
from __future__ import annotations

import importlib.util
import random

import numpy as np
import pytest
import torch
from stream_runs import run_group
from test_gpu import SPECIALS, D, H, dense64, visible_reference

from lingbot_map_ros.core.config import StreamConfig

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]
HAS_FLASHINFER = importlib.util.find_spec("flashinfer") is not None
HAS_TRITON = importlib.util.find_spec("triton") is not None
SPREAD = 4.3e-3  # the official backends' relative spread in bf16 (docs/perf)
BLOCKS, SCALE, WINDOW = 2, 2, 3


# ---------------------------------------------------------------------- float64 of the batched attention
def _pool_caches(kind: str, page_size: int, dtype: torch.dtype, streams: int):
    """``streams`` caches over one pool's shares, each with the single-frame backend of ``kind``."""
    from lingbot_map_ros.core.cache import PagedKVCache
    from lingbot_map_ros.core.cache.pages import PageTable
    from lingbot_map_ros.core.cache.pool import SharedKVPool

    pools = dict(num_patch_pages=SCALE + WINDOW + 1, special_pages=-(-SPECIALS * 40 // page_size))
    allocation = "lowest" if kind.startswith("split") else "lifo"
    probe = PageTable(scale_frames=SCALE, sliding_window=WINDOW, page_size=page_size, allocation=allocation, **pools)
    pool = SharedKVPool(num_shares=streams, num_blocks=BLOCKS, pages_per_share=probe.num_pages, page_size=page_size,
                        num_heads=H, head_dim=D, dtype=dtype, device="cuda")
    caches = []
    for s in range(streams):
        cache = PagedKVCache(num_blocks=BLOCKS, num_heads=H, head_dim=D, page_size=page_size, scale_frames=SCALE,
                             sliding_window=WINDOW, max_frame_num=64, dtype=dtype, device="cuda", backend="sdpa",
                             allocation=allocation, storage=pool.share(f"s{s}"), **pools)
        common = dict(page_size=page_size, num_pages=cache.table.num_pages, num_heads=H, head_dim=D, dtype=dtype,
                      device="cuda")
        if kind.startswith("split"):
            from lingbot_map_ros.core.cache.split_backend import SplitPrefixBackend

            cache.single_frame_backend = SplitPrefixBackend(
                num_patch_pages=cache.table.num_patch_pages, kernel="cudnn", kv_splits=1,
                prefix_kernel=kind.split("-")[1], **common)
        elif kind == "cudnn":
            from lingbot_map_ros.core.cache.dense_backend import MaskedDenseBackend

            cache.single_frame_backend = MaskedDenseBackend(kernel="cudnn", **common)
        caches.append(cache)
    return pool, caches


class _Histories:
    """Each stream's raw K/V per frame and stored flags (the float64 reference's inputs)."""

    def __init__(self, streams: int, seed: int) -> None:
        self.rng = random.Random(seed)
        self.frames: list[list] = [[] for _ in range(streams)]
        self.stored: list[list[bool]] = [[] for _ in range(streams)]

    def step(self, s: int, k: torch.Tensor, v: torch.Tensor, store: bool, num_frames: int, dtype, page_size):
        t = SPECIALS + page_size
        for f in range(num_frames):
            self.frames[s].append((k[f * t:(f + 1) * t].to(dtype), v[f * t:(f + 1) * t].to(dtype)))
            self.stored[s].append(store)

    def reference(self, s: int, q: torch.Tensor) -> torch.Tensor:
        i = len(self.frames[s]) - 1
        kr, vr = visible_reference(self.frames[s], self.stored[s], i, SCALE, WINDOW)
        return dense64(q, kr, vr)  # [T, H, D] float64

    def forget_last(self, s: int) -> None:
        self.frames[s].pop()
        self.stored[s].pop()


def _phase_one(caches, hist: _Histories, page_size: int, dtype) -> None:
    t = SPECIALS + page_size
    for s, cache in enumerate(caches):
        q, k, v = (torch.randn(SCALE * t, H, D, device="cuda") for _ in range(3))
        hist.step(s, k, v, True, SCALE, dtype, page_size)
        cache.begin_step(SCALE, store=True)
        for block in range(BLOCKS):
            cache(block, q.to(dtype), k.to(dtype), v.to(dtype))
        cache.end_step()


def _graphed(fn, graphs: dict, signature):
    """``fn()`` captured once per ``signature`` (after a warm-up on a side stream), then replayed."""
    if signature not in graphs:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fn()
        graphs[signature] = (graph, out)
    graph, out = graphs[signature]
    graph.replay()
    return out


def _run_batched(kind: str, page_size: int, dtype: torch.dtype, streams: int = 3, steps: int = 12,
                 graph: bool = False, seed: int = 0) -> tuple[float, int]:
    """Phase 1 per stream, then ``steps`` batched phase-2 steps; the worst relative error of any
    stream's rows against float64, and the graphs captured (0 eager)."""
    from lingbot_map_ros.core.cache.batched import GroupGlobalAttention
    from lingbot_map_ros.core.cache.pool import batched_index_capacity, batched_page_request

    torch.manual_seed(seed)
    pool, caches = _pool_caches(kind, page_size, dtype, streams)
    hist = _Histories(streams, seed)
    _phase_one(caches, hist, page_size, dtype)
    t = SPECIALS + page_size
    backend = None
    if kind.startswith("fi-"):
        from lingbot_map_ros.core.cache.flashinfer_backend import BatchedFlashInferBackend

        kernel = kind.split("-")[1]
        extra = dict(batch_size=streams, max_indices=batched_index_capacity(
            streams, pool.shares.pages_per_share, page_size, token_pages=kernel == "fa3")) if graph else {}
        backend = BatchedFlashInferBackend(num_heads=H, head_dim=D, dtype=dtype, device="cuda", kernel=kernel, **extra)
    static_q = torch.zeros(streams * t, H, D, dtype=dtype, device="cuda")  # [B·T, H, D]
    static_k, static_v = torch.zeros_like(static_q), torch.zeros_like(static_q)
    graphs: dict = {}
    worst = 0.0
    for _ in range(steps):
        stores = [hist.rng.random() < 0.6 for _ in range(streams)]
        q, k, v = (torch.randn(streams * t, H, D, device="cuda") for _ in range(3))
        for s, cache in enumerate(caches):
            hist.step(s, k[s * t:(s + 1) * t], v[s * t:(s + 1) * t], stores[s], 1, dtype, page_size)
            cache.begin_step(1, store=stores[s])
        if backend is not None:
            request = batched_page_request([c.table for c in caches], [pool.shares.first_page(f"s{s}")
                                                                        for s in range(streams)], t,
                                           token_pages=backend.token_pages)
            backend.plan(request, page_size)
            attention = GroupGlobalAttention(caches, t, pool.storage, backend)
            signature = backend.plan_signature if graph else None
        else:
            attention = GroupGlobalAttention(caches, t)
            signature = tuple(c.single_frame_backend.plan_signature for c in caches)
        static_q.copy_(q.to(dtype))
        static_k.copy_(k.to(dtype))
        static_v.copy_(v.to(dtype))
        refs = [hist.reference(s, static_q[s * t:(s + 1) * t]) for s in range(streams)]
        for block in range(BLOCKS):
            def call(block=block):
                return attention(block, static_q, static_k, static_v)  # [B·T, H, D]

            out = _graphed(call, graphs, (signature, block)) if graph else call()
            assert torch.isfinite(out).all(), kind
            for s in range(streams):
                got = out[s * t:(s + 1) * t].double()
                worst = max(worst, ((got - refs[s]).norm() / refs[s].norm()).item())
        for s, cache in enumerate(caches):
            cache.end_step()
            if not stores[s]:
                hist.forget_last(s)
    return worst, len(graphs)


@pytest.mark.skipif(not HAS_FLASHINFER, reason="flashinfer not installed")
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "cuda-graph"])
@pytest.mark.parametrize("kernel", ["fa2", "fa3"])
@pytest.mark.parametrize("page_size", [777, 999])
def test_batched_flashinfer_plan_over_the_pool_matches_float64(kernel, page_size, graph):
    """ONE plan over three streams' page lists (and, in a CUDA graph, the wrapper of that batch size
    re-planned outside the graph every step) gives each stream its own attention."""
    worst, captured = _run_batched(f"fi-{kernel}", page_size, torch.bfloat16, graph=graph)
    print(f"batched FlashInfer {kernel} page {page_size} {'graph' if graph else 'eager'}: {worst:.2e}, "
          f"{captured} graphs")
    assert worst < 1e-2, worst
    if graph:
        assert captured >= BLOCKS


@pytest.mark.parametrize("kind", [
    "cudnn",
    "split-sdpa",
    pytest.param("split-triton", marks=pytest.mark.skipif(not HAS_TRITON, reason="no triton")),
])
def test_loop_over_the_streams_inside_a_graph_matches_float64(kind):
    """The split/runs and cuDNN paths: each stream's own kernel on its own pages, all in one graph
    per plan signature (the split backend's filling buckets re-capture, as the group's keys do)."""
    worst, captured = _run_batched(kind, 999, torch.bfloat16, graph=True)
    print(f"loop {kind} in a graph: {worst:.2e}, {captured} graphs")
    assert worst < 1e-2 and captured >= BLOCKS, (worst, captured)


# ---------------------------------------------------------------------- the captured batched step
HW = (56, 84)  # 4 x 6 patches
STREAM = StreamConfig(scale_frames=2, sliding_window=3, keyframe_interval=2, camera_iterations=2, max_frame_num=64,
                      max_stored_frames=12, overlap_frames=3, with_depth=True, depth_every=2)

PATHS = [
    pytest.param(dict(backend="flashinfer", flashinfer_kernel="fa2"), "auto", id="flashinfer-fa2",
                 marks=pytest.mark.skipif(not HAS_FLASHINFER, reason="flashinfer not installed")),
    pytest.param(dict(backend="flashinfer", flashinfer_kernel="fa3"), "auto", id="flashinfer-fa3",
                 marks=pytest.mark.skipif(not HAS_FLASHINFER, reason="flashinfer not installed")),
    pytest.param(dict(backend="flashinfer", flashinfer_kernel="fa2"), "loop", id="flashinfer-fa2-loop",
                 marks=pytest.mark.skipif(not HAS_FLASHINFER, reason="flashinfer not installed")),
    pytest.param(dict(backend="sdpa", sdpa_kernel="split", prefix_kernel="auto"), "auto", id="split-runs"),
    pytest.param(dict(backend="sdpa", sdpa_kernel="split", prefix_kernel="sdpa"), "auto", id="split-cudnn-prefix"),
    pytest.param(dict(backend="sdpa", sdpa_kernel="cudnn"), "auto", id="cudnn"),
]


def _host(**runtime):
    from lingbot_map_ros.core.config import model_config
    from lingbot_map_ros.core.model import build_model
    from lingbot_map_ros.core.model_host import ModelHost, cast_for_inference
    from lingbot_map_ros.core.runtime import resolve_for

    cfg = model_config("tiny")
    model, _ = build_model(cfg, seed=5, device="cuda", dtype=torch.float32, enable_depth=True)
    cast_for_inference(model, torch.bfloat16)
    model.eval()
    rt = resolve_for(torch.device("cuda"), torch.bfloat16, cuda_graphs=True, compile_blocks="off", **runtime)
    return ModelHost.around(model, cfg, rt)


def _frames(seed: int, n: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.rand(3, *HW, generator=g) for _ in range(n)]


def _alone(host, frames) -> list:
    from lingbot_map_ros.core.session_manager import SessionManager

    manager = SessionManager(host, STREAM, log=lambda m: None)
    return [r for i, f in enumerate(frames) for r in manager.push(f, i)]


def _relative(got: list, want: list, field: str) -> float:
    a = np.stack([getattr(r, field) for r in got if getattr(r, field) is not None]).astype(np.float64)
    b = np.stack([getattr(r, field) for r in want if getattr(r, field) is not None]).astype(np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-12))


def _assert_near_alone(got: list, want: list, tolerance: float = SPREAD) -> dict:
    assert [r.frame_index for r in got] == [r.frame_index for r in want]
    assert [(r.depth is None) for r in got] == [(r.depth is None) for r in want]
    assert all(np.isfinite(r.pose_enc).all() for r in got)
    errors = {f: _relative(got, want, f) for f in ("pose_enc", "depth")}
    assert all(e < tolerance for e in errors.values()), errors
    return errors


@pytest.mark.parametrize("runtime,attention", PATHS)
def test_graphed_batched_step_equals_each_stream_alone(runtime, attention):
    """Three streams (every tick, every other tick, from tick 4 on): the batched steps replay captured
    graphs of two and three streams, and each stream's poses and depth stay within the official spread
    of the same stream run alone."""
    from lingbot_map_ros.core.stream_group import StreamGroup

    host = _host(**runtime)
    schedule = {"front": list(range(16)), "rear": list(range(0, 16, 2)), "left": list(range(4, 16))}
    frames = {name: _frames(seed, len(at)) for seed, (name, at) in enumerate(schedule.items())}
    group = StreamGroup(host, STREAM, list(schedule), log=lambda m: None, batched_attention=attention, batch=True)
    assert group.decision.path == "graphed", group.decision
    got, _, _ = run_group(group, schedule, frames, 16)
    stats = group.graph_stats()
    assert group.path_counts["graphed"] >= 8 and set(stats) == {2, 3}, (group.path_counts, stats)
    assert all(s.encoder_captures == 1 and s.replays > s.captures for s in stats.values()), stats
    for name, at in schedule.items():
        errors = _assert_near_alone(got[name], _alone(host, frames[name][:len(at)]))
        print(f"{runtime} {attention} {name}: {errors}")


@pytest.mark.parametrize("runtime,attention", PATHS[:1] + PATHS[3:4])
def test_streams_that_never_share_a_tick_replay_the_lone_graphs_bit_for_bit(runtime, attention):
    """A group of one, and two streams on alternate ticks, never batch: the single-camera captured
    step, bit for bit (the same kernels on the same inputs)."""
    from lingbot_map_ros.core.stream_group import StreamGroup

    host = _host(**runtime)
    frames = {"a": _frames(1, 10), "b": _frames(2, 10)}
    solo = StreamGroup(host, STREAM, ["a"], log=lambda m: None, batched_attention=attention, batch=True)
    got, _, _ = run_group(solo, {"a": list(range(10))}, frames, 10)
    want = _alone(host, frames["a"])
    np.testing.assert_array_equal(np.stack([r.pose_enc for r in got["a"]]), np.stack([r.pose_enc for r in want]))
    pair = StreamGroup(host, STREAM, ["a", "b"], log=lambda m: None, batched_attention=attention, batch=True)
    got, _, _ = run_group(pair, {"a": list(range(0, 20, 2)), "b": list(range(1, 20, 2))}, frames, 20)
    assert pair.path_counts == {} and pair.graph_stats() == {}
    for name in ("a", "b"):
        want = _alone(host, frames[name])
        np.testing.assert_array_equal(np.stack([r.pose_enc for r in got[name]]),
                                      np.stack([r.pose_enc for r in want]))
        for r, w in zip(got[name], want):
            if w.depth is not None:
                np.testing.assert_array_equal(r.depth, w.depth)


@pytest.mark.parametrize("runtime,attention", PATHS[:1] + PATHS[3:4])
def test_two_streams_at_different_rates_enter_phase_two_at_different_frames(runtime, attention):
    """``a`` every tick from tick 0, ``b`` every third tick from tick 5: ``b``'s scale frames come while
    ``a`` runs phase 2 alone, then batches of two alternate with lone steps of ``a``; ``a`` passes the
    stored-frame limit (a long-run window) inside the run."""
    from lingbot_map_ros.core.stream_group import StreamGroup

    host = _host(**runtime)
    schedule = {"a": list(range(40)), "b": list(range(5, 40, 3))}
    frames = {name: _frames(10 + seed, len(at)) for seed, (name, at) in enumerate(schedule.items())}
    group = StreamGroup(host, STREAM, ["a", "b"], log=lambda m: None, batched_attention=attention, batch=True)
    got, _, _ = run_group(group, schedule, frames, 40)
    assert group.path_counts["graphed"] >= 8 and group.manager("a").policy.window_switches >= 1
    for name, at in schedule.items():
        _assert_near_alone(got[name], _alone(host, frames[name][:len(at)]))


def test_the_default_runs_the_captured_batched_step_under_cuda_graphs():
    """Without ``batch`` a group on CUDA graphs replays the captured batched step, says why, and gives
    what ``batch=True`` gives, bit for bit (the same graphs over the same frames)."""
    from lingbot_map_ros.core.stream_group import StreamGroup

    host = _host(backend="sdpa", sdpa_kernel="split")
    frames = {"a": _frames(1, 6), "b": _frames(2, 6)}
    schedule = {"a": list(range(6)), "b": list(range(6))}
    default = StreamGroup(host, STREAM, ["a", "b"], log=lambda m: None)
    assert default.decision.path == "graphed" and "loop over the streams" in default.decision.reason
    got, _, _ = run_group(default, schedule, frames, 6)
    assert default.path_counts["graphed"] == 4 and len(got["a"]) == 6, default.path_counts
    asked = StreamGroup(host, STREAM, ["a", "b"], log=lambda m: None, batch=True)
    want, _, _ = run_group(asked, schedule, frames, 6)
    for name in schedule:
        for a, b in zip(got[name], want[name]):
            assert np.array_equal(a.pose_enc, b.pose_enc) and np.array_equal(a.depth, b.depth)
