"""The captured batched step's bookkeeping (``core/batched_graph.py``), on the CPU.

CUDA graphs do not exist here, so the capture is a stand-in with a graph's contract: ``capture``
runs the step once and keeps its outputs; every ``replay`` recomputes the step from the inputs'
current contents INTO those same output tensors. A step that forgot to refresh a static input, or
read another batch size's buffers, gives wrong results here as it would on the GPU; what only the GPU
can check (fixed addresses inside the caches, FlashInfer's wrapper) is in ``test_gpu_streams.py``.

The references are each stream run alone (``SessionManager``, the single-camera path), as in
``test_stream_group.py``.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import pytest
import torch
from stream_runs import STREAM, assert_same, frames_of, lone_results, run_group

from lingbot_map_ros.core.batched_graph import (
    BatchGraphs,
    BatchKey,
    CaptureFailed,
    decide_batching,
)
from lingbot_map_ros.core.cache.pages import PageTable
from lingbot_map_ros.core.cache.pool import batched_index_capacity, batched_page_request
from lingbot_map_ros.core.config import model_config
from lingbot_map_ros.core.cuda_graph import MAX_GRAPHS
from lingbot_map_ros.core.model import build_model
from lingbot_map_ros.core.model_host import ModelHost
from lingbot_map_ros.core.runtime import resolve_for
from lingbot_map_ros.core.session_manager import SessionManager
from lingbot_map_ros.core.stream_group import StreamGroup


def _copy_into(static: Any, fresh: Any) -> None:
    if isinstance(static, torch.Tensor):
        static.copy_(fresh)
    elif dataclasses.is_dataclass(static):
        for f in dataclasses.fields(static):
            a, b = getattr(static, f.name), getattr(fresh, f.name)
            assert (a is None) == (b is None), f.name
            if a is not None:
                _copy_into(a, b)
    else:
        raise TypeError(f"a captured output must be tensors (got {type(static)})")


class RerunCapturer:
    """A CUDA graph's contract on the CPU: outputs are fixed tensors, a replay rewrites them."""

    def __init__(self, fail_capture_at: int = 0, fail_replay_at: int = 0) -> None:
        self.captures = self.replays = self.resets = 0
        self.fail_capture_at, self.fail_replay_at = fail_capture_at, fail_replay_at

    def capture(self, run: Callable[[], Any]) -> tuple[Callable[[], None], Any]:
        self.captures += 1
        if self.captures == self.fail_capture_at:
            raise RuntimeError("injected: out of memory while capturing")
        output = run()

        def replay() -> None:
            self.replays += 1
            if self.replays == self.fail_replay_at:
                raise RuntimeError("injected: the replay failed")
            with torch.inference_mode():
                _copy_into(output, run())

        return replay, output

    def reset(self) -> None:
        self.resets += 1


# ---------------------------------------------------------------------- decisions
@pytest.mark.parametrize("batch,graphs,attention,path,words", [
    (False, True, "loop", "alone", "batch=False"),
    (False, False, "flashinfer", "alone", "batch=False"),
    (None, False, "loop", "eager", "no CUDA graphs"),
    (True, False, "pool-sdpa", "eager", "no CUDA graphs"),
    (None, True, "loop", "graphed", "loop over the streams"),
    (None, True, "flashinfer", "graphed", "FlashInfer plan"),
    (True, True, "loop", "graphed", "loop over the streams"),
    (True, True, "flashinfer", "graphed", "FlashInfer plan"),
    (True, True, "pool-sdpa", "eager", "cannot be captured"),
    (None, True, "pool-sdpa", "alone", "cannot be captured"),
])
def test_the_batching_decision_and_its_reason(batch, graphs, attention, path, words):
    decision = decide_batching(batch=batch, cuda_graphs=graphs, batched_attention=attention)
    assert decision.path == path and words in decision.reason, decision


# ---------------------------------------------------------------------- one step per batch size
def _unit_graphs(capturer) -> BatchGraphs:
    """A stand-in model: encode = a sum per frame, the step = tokens x rope."""
    def encode(images: torch.Tensor, variants: torch.Tensor) -> torch.Tensor:
        return images.sum(dim=(1, 2, 3)) + variants  # [B]

    return BatchGraphs(torch.device("cpu"), capturer, encode)


def _key(names, signature=(), depth=0) -> BatchKey:
    return BatchKey(tuple((n, 1, 2) for n in names), (signature,), depth, 2)


def test_a_step_per_batch_size_is_made_once_and_reused_with_fresh_inputs():
    capturer = RerunCapturer()
    graphs = _unit_graphs(capturer)
    two = graphs.step_for(2, (2, 2))
    assert graphs.step_for(2, (2, 2)) is two and graphs.step_for(3, (2, 2)) is not two
    with pytest.raises(ValueError, match="two or more"):
        graphs.step_for(1, (2, 2))
    runs = []

    def run_model(tokens, rope):
        runs.append(1)
        return tokens * rope  # [B]

    for tick in range(4):
        images = [torch.full((3, 2, 2), float(tick + i)) for i in range(2)]
        two.begin(images)
        out = two.finish(_key(["a", "b"]), [5 + tick, 7], run_model)
        want = torch.tensor([(12 * (tick + i) + 1) * r for i, r in enumerate([5 + tick, 7])], dtype=out.dtype)
        torch.testing.assert_close(out, want, rtol=0, atol=0)
    assert two.stats.encoder_captures == 1 and two.stats.captures == 1 and two.stats.replays == 4
    # another set of streams in a batch of two: one more capture, the encoder's graph is the same
    two.begin([torch.ones(3, 2, 2)] * 2)
    two.finish(_key(["a", "c"]), [1, 1], run_model)
    assert two.stats.captures == 2 and two.stats.encoder_captures == 1 and two.keys[-1].names == ("a", "c")
    assert graphs.stats()[2].replays == 5 and graphs.stats()[3].captures == 0


def test_finish_needs_begin_and_the_batch_size_of_the_step():
    graphs = _unit_graphs(RerunCapturer())
    two = graphs.step_for(2, (2, 2))
    with pytest.raises(RuntimeError, match="without begin"):
        two.finish(_key(["a", "b"]), [0, 0], lambda t, r: t)
    with pytest.raises(ValueError, match="2 streams got 3 frames"):
        two.begin([torch.zeros(3, 2, 2)] * 3)
    two.begin([torch.zeros(3, 2, 2)] * 2)
    with pytest.raises(ValueError, match="key of 3"):
        two.finish(_key(["a", "b", "c"]), [0, 0], lambda t, r: t)


def test_graphs_are_kept_lru_and_pruned_when_a_stream_has_new_caches():
    graphs = _unit_graphs(RerunCapturer())
    two = graphs.step_for(2, (2, 2))
    for i in range(MAX_GRAPHS + 3):
        two.begin([torch.zeros(3, 2, 2)] * 2)
        two.finish(_key(["a", "b"], signature=i), [0, 0], lambda t, r: t * r)
    assert len(two.keys) == MAX_GRAPHS and two.keys[0].signatures == (3,)
    # stream b's caches are other objects now (a new frame size): every graph naming the old ones goes
    dropped = graphs.prune({"a": (1, 2), "b": (9, 9)})
    assert dropped == MAX_GRAPHS and two.keys == []
    two.begin([torch.zeros(3, 2, 2)] * 2)
    two.finish(_key(["a", "b"]), [0, 0], lambda t, r: t * r)
    assert graphs.prune({"a": (1, 2), "b": (1, 2)}) == 0 and len(two.keys) == 1


def test_a_failed_capture_is_reported_as_such_and_refuses_the_batch_size():
    capturer = RerunCapturer(fail_capture_at=2)  # the encoder captures, the step's capture fails
    graphs = _unit_graphs(capturer)
    two = graphs.step_for(2, (2, 2))
    two.begin([torch.zeros(3, 2, 2)] * 2)
    with pytest.raises(CaptureFailed) as info:
        two.finish(_key(["a", "b"]), [0, 0], lambda t, r: t)
    assert info.value.batch == 2 and "injected" in str(info.value.cause)
    graphs.capture_failed(2, info.value.cause)
    assert capturer.resets == 1 and graphs.steps == {} and "batches of 2 run alone" in graphs.refused[2]


# ---------------------------------------------------------------------- buffer sizing
@pytest.mark.parametrize("token_pages", [False, True])
def test_the_index_buffers_hold_every_batch_the_tables_can_make(token_pages):
    """Tables driven through phase 1, keyframes, non-keyframes (their own page visible), eviction and
    special pages: every batched request fits the preallocated capacity, and a share's worth is the
    bound (the fullest table's request comes within one share of it)."""
    ps, b = 6, 3
    tables = [PageTable(scale_frames=2, sliding_window=3, page_size=ps, num_patch_pages=2 + 3 + 1, special_pages=16,
                        allocation=alloc) for alloc in ("lifo", "lowest", "lifo")]
    per_share = tables[0].num_pages
    capacity = batched_index_capacity(b, per_share, ps, token_pages=token_pages)
    assert capacity == b * per_share * (ps if token_pages else 1)
    biggest = 0
    for t in tables:
        t.append(2, defer_eviction=False)
    for step in range(14):
        for i, t in enumerate(tables):
            t.append(1, defer_eviction=(step + i) % 3 == 0)  # a non-keyframe every third frame
        request = batched_page_request(tables, [i * per_share for i in range(b)], 10, token_pages=token_pages)
        assert request.indices.size <= capacity and request.indices.max() < b * per_share * (ps if token_pages else 1)
        biggest = max(biggest, request.indices.size)
        for i, t in enumerate(tables):
            if (step + i) % 3 == 0:
                t.rollback()
    assert biggest > capacity // 2  # the bound is not loose by more than the pages never visible at once
    with pytest.raises(ValueError):
        batched_index_capacity(0, per_share, ps)


# ---------------------------------------------------------------------- the group
@pytest.fixture(scope="module")
def loaded() -> ModelHost:
    cfg = model_config("tiny")
    model, _ = build_model(cfg, seed=4321, enable_depth=True)
    model.eval()
    return ModelHost.around(model, cfg, resolve_for(torch.device("cpu"), torch.float32, backend="sdpa"))


def pushed(loaded: ModelHost, frames, stamps, reset_at: int = -1):
    """A lone stream's results for ``frames`` with ``stamps`` (a reset before frame ``reset_at``)."""
    manager = SessionManager(loaded, STREAM, log=lambda m: None)
    out = []
    for i, (f, stamp) in enumerate(zip(frames, stamps)):
        if i == reset_at:
            manager.reset()
        out += manager.push(f, stamp)
    return out


def test_graphed_batched_streams_equal_their_lone_runs(loaded):
    """Three streams at different rates entering phase 2 at different ticks, the fast one switching
    windows and the slow one evicting, with depth on every other frame of each (batches mix frames
    with and without depth): each equals its lone run to 1e-6, with one step made per batch size."""
    schedule = {"front": list(range(26)), "rear": list(range(0, 26, 2)), "left": list(range(5, 26))}
    frames = {name: frames_of(seed, len(at)) for seed, (name, at) in enumerate(schedule.items())}
    capturer = RerunCapturer()
    group = StreamGroup(loaded, STREAM, list(schedule), log=lambda m: None, batch=True, capturer=capturer)
    assert group.decision.path == "graphed"
    got, fed, batched = run_group(group, schedule, frames, 26)
    assert batched > 20 and group.path_counts["graphed"] > 10 and set(group.path_counts) == {"graphed"}
    assert group.manager("front").policy.window_switches >= 1
    assert max(r.cache.frames_evicted for r in got["rear"]) > 0
    stats = group.graph_stats()
    assert set(stats) == {2, 3}  # a step per batch size met, each made once
    assert all(s.encoder_captures == 1 for s in stats.values())
    assert sum(s.replays for s in stats.values()) == group.path_counts["graphed"]
    # keys: which streams in which order, how many with depth - each captured once, fewer than the replays
    keys = [k for step in group.batch_graphs.steps.values() for k in step.keys]
    captures, replays = (sum(getattr(s, f) for s in stats.values()) for f in ("captures", "replays"))
    assert len(set(keys)) == len(keys) == captures < replays
    assert {k.depth_frames for k in keys} >= {0, 1} and all(k.signatures == ((),) * len(k.streams) for k in keys)
    for name in schedule:
        assert_same(got[name], lone_results(loaded, frames[name][:fed[name]]))


def test_a_failed_replay_reruns_every_stream_of_it_alone(loaded):
    schedule = {"a": list(range(8)), "b": list(range(8))}
    frames = {"a": frames_of(21, 8), "b": frames_of(22, 8)}
    capturer = RerunCapturer(fail_replay_at=4)  # encoder replay 1, step 2, encoder 3, step 4: the 2nd batch
    group = StreamGroup(loaded, STREAM, ["a", "b"], log=lambda m: None, batch=True, capturer=capturer)
    got, fed, _ = run_group(group, schedule, frames, 8)
    assert fed == {"a": 8, "b": 8}
    for name in schedule:  # every frame exactly one result, the same as alone
        assert_same(got[name], lone_results(loaded, frames[name]))
    assert group.batch_graphs.refused == {} and group.path_counts == {"graphed": 6}  # a failed replay refuses nothing
    assert group.graph_stats()[2].replays == 5  # the failed one is not counted


def test_a_failed_capture_runs_the_batch_alone_and_then_batches_of_its_size_alone(loaded):
    schedule = {"a": list(range(7)), "b": list(range(7))}
    frames = {"a": frames_of(31, 7), "b": frames_of(32, 7)}
    capturer = RerunCapturer(fail_capture_at=2)
    logs: list[str] = []
    group = StreamGroup(loaded, STREAM, ["a", "b"], log=logs.append, batch=True, capturer=capturer)
    got, fed, batched = run_group(group, schedule, frames, 7)
    assert batched == 0 and capturer.captures == 2 and capturer.resets == 1
    assert group.path_counts["alone"] == 4 and group.path_counts["graphed"] == 1  # the failed one, then alone
    assert any("batches of 2 run alone" in m for m in logs)
    for name in schedule:
        assert_same(got[name], lone_results(loaded, frames[name]))


def test_a_reset_stream_keeps_its_caches_and_the_batched_graph(loaded):
    """A reset empties a stream's caches in place (same buffers): the batched graph replays on, and
    both streams still equal their lone runs (the reset one's reference is reset at the same frame)."""
    schedule = {"a": list(range(10)), "b": list(range(10))}
    frames = {"a": frames_of(41, 10), "b": frames_of(42, 10)}
    capturer = RerunCapturer()
    group = StreamGroup(loaded, STREAM, ["a", "b"], log=lambda m: None, batch=True, capturer=capturer)
    first, fed1, _ = run_group(group, {n: at[:5] for n, at in schedule.items()}, frames, 5)
    group.reset("b")
    second, _, batched = run_group(group, {n: at[:5] for n, at in schedule.items()},
                                   {n: f[5:] for n, f in frames.items()}, 5)
    assert batched > 0 and group.path_counts["graphed"] >= 5
    stamps = list(range(5)) * 2  # run_group numbers each part's frames from 0
    assert_same(first["a"] + second["a"], pushed(loaded, frames["a"], stamps))
    assert_same(first["b"] + second["b"], pushed(loaded, frames["b"], stamps, reset_at=5))
    assert group.graph_stats()[2].encoder_captures == 1


def test_the_eager_cpu_group_decides_eager_and_says_why(loaded):
    group = StreamGroup(loaded, STREAM, ["a", "b"], log=lambda m: None)
    assert group.decision.path == "eager" and "no CUDA graphs" in group.decision.reason
    assert group.graph_stats() == {}


def test_a_stream_refused_at_open_leaves_its_partner_to_its_own_step(loaded, monkeypatch):
    """Stream b's step is refused when it opens (a cache that cannot take the frame): b's frame ends
    with that error and nothing else changes, a's frame - a batch of one now - runs alone; both
    streams then go on as their lone runs do (b's without the refused frame)."""
    from lingbot_map_ros.core.session_errors import SessionError

    frames = {"a": frames_of(51, 6), "b": frames_of(52, 6)}
    group = StreamGroup(loaded, STREAM, ["a", "b"], log=lambda m: None, batch=True, capturer=RerunCapturer())
    session = group.manager("b").session
    opens = {"count": 0}
    real_open = session.open_step

    def refusing(step):
        opens["count"] += 1
        if opens["count"] == 2:
            raise SessionError("injected: the cache cannot take the frame")
        return real_open(step)

    monkeypatch.setattr(session, "open_step", refusing)
    got: dict[str, list] = {"a": [], "b": []}
    errors = []
    for t in range(6):
        for name, outcome in group.step({n: (frames[n][t], t) for n in frames}).items():
            if outcome.error is not None:
                errors.append((name, t, str(outcome.error)))
            got[name] += outcome.results
    assert errors == [("b", 3, "injected: the cache cannot take the frame")]
    assert group.path_counts["graphed"] == 4 and group.graph_stats()[2].replays == 3
    assert_same(got["a"], pushed(loaded, frames["a"], range(6)))
    kept = [t for t in range(6) if t != 3]
    assert_same(got["b"], pushed(loaded, [frames["b"][t] for t in kept], kept))
