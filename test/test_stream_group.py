"""A StreamGroup's batched steps give every stream exactly the results of the same stream run alone.

The reference of each stream is a lone ``SessionManager`` around the same model, fed the same frames
in the same order (the single-camera path, itself checked against a whole-sequence pass in
``test_stream_parity.py``). The group runs several streams at different rates, entering phase 2 at
different ticks, with eviction and a long-run window switch inside the batched run, and faults,
resets, saves and loads of one stream while the others go on.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from stream_runs import ATOL, HW, STREAM, assert_same, frames_of, lone_results, run_group

from lingbot_map_ros.core.config import model_config
from lingbot_map_ros.core.model import build_model
from lingbot_map_ros.core.model_host import ModelHost
from lingbot_map_ros.core.runtime import resolve_for
from lingbot_map_ros.core.session_events import InferenceFailed
from lingbot_map_ros.core.session_manager import SessionManager
from lingbot_map_ros.core.stream_group import StreamGroup


@pytest.fixture(scope="module")
def loaded() -> ModelHost:
    cfg = model_config("tiny")
    model, _ = build_model(cfg, seed=4321, enable_depth=True)
    model.eval()
    rt = resolve_for(torch.device("cpu"), torch.float32, backend="sdpa")
    return ModelHost.around(model, cfg, rt)


@pytest.mark.parametrize("attention", ["loop", "pool-sdpa"])
def test_batched_streams_equal_their_lone_runs(loaded, attention):
    """Three streams: every tick, every other tick, and from tick 5 on; the fast one passes the
    stored-frame limit (a long-run window switch) and evicts inside the batched run. ``loop``: each
    stream's own backend; ``pool-sdpa``: one request over the pool (page ids of the shares), the
    addressing FlashInfer's batched plan uses."""
    schedule = {"front": list(range(26)), "rear": list(range(0, 26, 2)), "left": list(range(5, 26))}
    frames = {name: frames_of(seed, len(at)) for seed, (name, at) in enumerate(schedule.items())}
    group = StreamGroup(loaded, STREAM, list(schedule), log=lambda m: None, batched_attention=attention)
    got, fed, batched = run_group(group, schedule, frames, 26)
    assert batched > 20  # most phase-2 frames really ran batched
    assert group.manager("front").policy.window_switches >= 1
    assert max(r.cache.frames_evicted for r in got["rear"]) > 0
    assert len(group.pools) == 1 and group.pools[0].shares.num_shares == 3
    for name in schedule:
        assert_same(got[name], lone_results(loaded, frames[name][:fed[name]]))


def test_batched_step_is_one_model_call_and_separates_the_streams(loaded, monkeypatch):
    """The batched step is ONE forward over B frames, and a stream's results depend on its own
    frames only: a negative control (the reference of another stream's frames) must differ."""
    schedule = {"a": list(range(6)), "b": list(range(6))}
    frames = {"a": frames_of(11, 6), "b": frames_of(12, 6)}
    group = StreamGroup(loaded, STREAM, ["a", "b"], log=lambda m: None)
    calls = []
    forward = type(loaded.model).forward

    def counting(self, images, **kw):
        calls.append((images.shape[0], type(kw["global_attention"]).__name__))
        return forward(self, images, **kw)

    monkeypatch.setattr(type(loaded.model), "forward", counting)
    got, _, _ = run_group(group, schedule, frames, 6)
    # phase 1 of each stream alone (its 2 scale frames at tick 1), then 4 batched steps of 2 frames
    assert calls == [(2, "PagedKVCache")] * 2 + [(2, "GroupGlobalAttention")] * 4
    calls.clear()
    alone = StreamGroup(loaded, STREAM, ["a", "b"], log=lambda m: None, batch=False)  # the CUDA-graph default
    got_alone, _, batched = run_group(alone, schedule, frames, 6)
    assert batched == 0 and calls == [(2, "PagedKVCache")] * 2 + [(1, "PagedKVCache")] * 8
    monkeypatch.undo()
    for name in ("a", "b"):
        assert_same(got_alone[name], got[name])
    other = lone_results(loaded, frames["b"])
    assert np.abs(got["a"][-1].pose_enc - other[-1].pose_enc).max() > 1e-4


def test_one_stream_is_the_single_camera_path(loaded):
    """N = 1: the manager's own cache (no pool), and results bit-identical to a lone manager."""
    frames = frames_of(21, 7)
    group = StreamGroup(loaded, STREAM, ["only"], log=lambda m: None)
    got = [r for i, f in enumerate(frames) for r in group.step({"only": (f, i)})["only"].results]
    assert group.pools == [] and group.manager("only").session.page_storage is None
    want = lone_results(loaded, frames)
    for a, b in zip(got, want, strict=True):
        assert np.array_equal(a.pose_enc, b.pose_enc)
        assert (a.depth is None and b.depth is None) or np.array_equal(a.depth, b.depth)


def test_a_device_written_with_its_index_runs_the_shared_pool(loaded):
    """The pool checks its storage's device. A device written otherwise than tensors report it (``cpu:0``
    here, ``cuda`` against ``cuda:0`` on a GPU, where it once failed every batched step) runs the group
    with the same results."""
    rt = resolve_for(torch.device("cpu", 0), torch.float32, backend="sdpa")
    host = ModelHost.around(loaded.model, loaded.cfg, rt)
    frames = {"a": frames_of(41, 4), "b": frames_of(42, 4)}
    group = StreamGroup(host, STREAM, ["a", "b"], log=lambda m: None)
    got = {"a": [], "b": []}
    for i in range(4):
        for name, out in group.step({name: (frames[name][i], i) for name in frames}).items():
            got[name] += out.results
    assert group.pools, "two streams share a pool"
    for name in frames:
        assert_same(got[name], lone_results(loaded, frames[name]))


def _two_streams_with_fault(loaded, monkeypatch, fail_alone: bool):
    schedule = {"a": list(range(7)), "b": list(range(7))}
    frames = {"a": frames_of(31, 7), "b": frames_of(32, 7)}
    group = StreamGroup(loaded, STREAM, ["a", "b"], log=lambda m: None)
    got = {"a": [], "b": []}
    errors = {"a": [], "b": []}
    forward = type(loaded.model).forward
    b_cache = None

    def failing(self, images, **kw):
        if images.shape[0] == 2:  # only the batched call of tick 4 (the 2nd batched step)
            raise torch.OutOfMemoryError("injected: out of memory in the batched step")
        if fail_alone and kw["global_attention"] is b_cache:
            raise RuntimeError("injected: stream b fails alone too")
        return forward(self, images, **kw)

    for t in range(7):
        if t == 4:
            monkeypatch.setattr(type(loaded.model), "forward", failing)
            b_cache = group.manager("b").session.global_cache
        out = group.step({n: (frames[n][t], t) for n in schedule})
        if t == 4:
            monkeypatch.undo()
        for n, o in out.items():
            got[n] += o.results
            if o.error is not None:
                errors[n].append((t, o.error))
    return group, frames, got, errors


def test_a_failed_batched_step_reruns_each_stream_alone(loaded, monkeypatch):
    group, frames, got, errors = _two_streams_with_fault(loaded, monkeypatch, fail_alone=False)
    assert errors == {"a": [], "b": []}  # both re-ran alone and succeeded: every frame has its result
    for n in ("a", "b"):
        assert_same(got[n], lone_results(loaded, frames[n]))


def test_the_stream_that_fails_alone_gets_a_new_session_the_other_continues(loaded, monkeypatch):
    group, frames, got, errors = _two_streams_with_fault(loaded, monkeypatch, fail_alone=True)
    assert errors["a"] == []
    assert_same(got["a"], lone_results(loaded, frames["a"]))
    ((tick, err),) = errors["b"]
    assert tick == 4 and isinstance(err, InferenceFailed) and "fails alone" in str(err)
    assert [r.frame_index for r in got["b"]] == [0, 1, 2, 3, 0, 1]  # one result or one failure per frame
    assert group.manager("b").session_id == 1
    assert_same(got["b"][:4], lone_results(loaded, frames["b"][:4]))


def test_non_finite_output_stays_in_its_stream(loaded):
    schedule = {"a": list(range(6)), "b": list(range(6))}
    frames = {"a": frames_of(41, 6), "b": frames_of(42, 6)}
    frames["b"][4] = frames["b"][4].clone()
    frames["b"][4][0, 0, 0] = float("nan")
    group = StreamGroup(loaded, STREAM, ["a", "b"], log=lambda m: None)
    got = {"a": [], "b": []}
    flagged = []
    for t in range(6):
        for n, o in group.step({n: (frames[n][t], t) for n in schedule}).items():
            got[n] += o.results
            if o.non_finite:
                flagged.append((n, t))
    assert ("b", 4) in flagged and all(n == "b" for n, _ in flagged)
    assert_same(got["a"], lone_results(loaded, frames["a"]))


def test_reset_save_and_load_of_one_stream_leave_the_others_unchanged(loaded, tmp_path):
    schedule = {"a": list(range(9)), "b": list(range(9))}
    frames = {"a": frames_of(51, 9), "b": frames_of(52, 9)}
    group = StreamGroup(loaded, STREAM, ["a", "b"], log=lambda m: None)
    got = {"a": [], "b": []}
    for t in range(9):
        if t == 3:
            group.manager("b").save(str(tmp_path / "b"))
        if t == 5:
            group.reset("b")
        if t == 7:
            group.manager("b").load(str(tmp_path / "b"))
        for n, o in group.step({n: (frames[n][t], t) for n in schedule}).items():
            assert o.error is None
            got[n] += o.results
    assert_same(got["a"], lone_results(loaded, frames["a"]))
    # b: frames 0-2, saved, 3-4, reset (5-6: a new session's scale frames), loaded: 7-8 continue from the save
    lone = SessionManager(loaded, STREAM, log=lambda m: None)
    want = [r for t in range(3) for r in lone.push(frames["b"][t], t)]
    want += [r for t in (3, 4) for r in lone.push(frames["b"][t], t)]
    lone.reset()
    want += [r for t in (5, 6) for r in lone.push(frames["b"][t], t)]
    lone.load(str(tmp_path / "b"))
    want += [r for t in (7, 8) for r in lone.push(frames["b"][t], t)]
    for a, b in zip(got["b"], want, strict=True):
        np.testing.assert_allclose(a.pose_enc, b.pose_enc, rtol=0, atol=ATOL)
        assert a.cache == b.cache and a.frame_index == b.frame_index


def test_footprint_counts_every_stream_and_the_weights_once(loaded):
    """Predicted against allocated: the weights once, each stream's pages (the pool's shares) and
    camera cache; a budget that holds two streams' footprint refuses three, with the numbers."""
    from dataclasses import replace

    from lingbot_map_ros.core.memory_budget import MemoryBudgetExceeded
    from lingbot_map_ros.core.stream_group import group_footprint

    group = StreamGroup(loaded, STREAM, ["a", "b", "c"], log=lambda m: None)
    for t in range(2):  # the scale frames: every stream's caches allocated
        group.step({n: (frames_of(60 + t, 1)[0], t) for n in ("a", "b", "c")})
    fp = group_footprint(loaded, STREAM, 3, HW)
    one = group_footprint(loaded, STREAM, 1, HW)
    weights = sum(t.numel() * t.element_size() for t in [*loaded.model.parameters(), *loaded.model.buffers()])
    assert fp.part("weights") == one.part("weights") == weights
    assert fp.part("patch_pool") + fp.part("special_pool") == group.pool_bytes() == 3 * (
        one.part("patch_pool") + one.part("special_pool"))
    cameras = sum(m.session.camera_cache.nbytes for m in group.managers.values())
    assert fp.part("camera_cache") == cameras == 3 * one.part("camera_cache")
    assert fp.part("batched_step") > one.part("frame_step") and fp.total > one.total
    two = group_footprint(loaded, STREAM, 2).total
    tight = replace(STREAM, gpu_memory_budget=two / 1e9)
    StreamGroup(loaded, tight, ["a", "b"], log=lambda m: None)
    with pytest.raises(MemoryBudgetExceeded, match="for 3 cameras needs"):
        StreamGroup(loaded, tight, ["a", "b", "c"], log=lambda m: None)


def test_fit_window_shrinks_every_stream_to_what_the_group_fits(loaded):
    """With ``fit_window`` the window is fitted for all streams at once: the largest whose group
    footprint fits the budget, the same for every stream (one geometry for every share of the pool)."""
    from dataclasses import replace

    from lingbot_map_ros.core.stream_group import group_footprint

    # between windows 1 and 2 at the smallest depth chunk (the budget's first resort): window 1 fits
    at = {w: group_footprint(loaded, replace(STREAM, sliding_window=w, depth_chunk=1), 3).total for w in (1, 2)}
    between = (at[1] + at[2]) / 2
    tight = replace(STREAM, gpu_memory_budget=between / 1e9, fit_window=True)
    warned: list[str] = []
    group = StreamGroup(loaded, tight, ["a", "b", "c"], log=warned.append)
    window = group.stream.sliding_window
    assert window == 1 < STREAM.sliding_window
    assert {m.stream_cfg.sliding_window for m in group.managers.values()} == {window}
    budget = tight.gpu_memory_budget * 1e9
    assert group_footprint(loaded, replace(group.stream, sliding_window=window), 3).total <= budget
    assert group_footprint(loaded, replace(group.stream, sliding_window=window + 1), 3).total > budget
    assert any(f"sliding_window {window} instead of {STREAM.sliding_window}" in w and "for 3 cameras" in w
               for w in warned), warned


def test_a_refused_frame_ends_with_its_reason_and_changes_nothing(loaded):
    """A frame of another size in phase 2: that frame's outcome is the refusal (nothing changed), the
    same stream's next frames and the other stream go on as if it never came."""
    from lingbot_map_ros.core.session_errors import SessionError

    frames = {"a": frames_of(71, 6), "b": frames_of(72, 6)}
    wrong = torch.rand(3, 28, 28)
    group = StreamGroup(loaded, STREAM, ["a", "b"], log=lambda m: None)
    got = {"a": [], "b": []}
    for t in range(6):
        step = {n: (frames[n][t], t) for n in ("a", "b")}
        if t == 3:
            out = group.step({"a": step["a"], "b": (wrong, "wrong")})
            assert isinstance(out["b"].error, SessionError) and "frame size changed" in str(out["b"].error)
            assert out["b"].results == () and out["a"].error is None
            got["a"] += out["a"].results
            step = {"b": step["b"]}
        for n, o in group.step(step).items():
            assert o.error is None
            got[n] += o.results
    assert_same(got["a"], lone_results(loaded, frames["a"]))
    assert_same(got["b"], lone_results(loaded, frames["b"]))
