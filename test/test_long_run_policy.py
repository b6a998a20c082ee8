"""The long-run policy as an object the session manager owns: one factory, one session class.

* ``policy_class`` / ``make_policy`` map every ``long_run_policy`` name to its class and refuse an
  unknown name or settings the policy cannot run with;
* each policy on its own, through the hooks the manager calls (a stand-in session records what a
  policy does to it: the stop and reset policies never touch it, they answer);
* a real session with ``StopPolicy`` refuses at the limit and every frame after it;
* ``SessionManager.apply`` swaps the policy at runtime on the same session object and model.
"""
from __future__ import annotations

import dataclasses
import gc
import weakref

import pytest
import torch

from lingbot_map_ros.core import long_run
from lingbot_map_ros.core.config import LONG_RUN_POLICIES, RuntimeConfig, StreamConfig
from lingbot_map_ros.core.long_run import (
    LimitAction,
    LongRunPolicy,
    ResetPolicy,
    StopPolicy,
    WindowPolicy,
    make_policy,
    policy_class,
)
from lingbot_map_ros.core.session_errors import SessionError, SessionStopped, StoredFrameLimit
from lingbot_map_ros.core.session_manager import Change, SessionCause, SessionManager
from lingbot_map_ros.core.stream import StreamingSession

H, W = 28, 42  # 2 x 3 patches
SMALL = dict(scale_frames=2, sliding_window=3, max_stored_frames=8, overlap_frames=3)
RUNTIME = RuntimeConfig(device="cpu", model_preset="tiny", seed=1)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def frames(n: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.rand(3, H, W, generator=g) for _ in range(n)]  # [3, H, W] each


# ------------------------------------------------------------------------------- the factory
@pytest.mark.parametrize("name,cls", [("window", WindowPolicy), ("reset", ResetPolicy), ("stop", StopPolicy)])
def test_factory_maps_each_name_to_its_class(name, cls):
    assert policy_class(name) is cls and cls.name == name
    policy = make_policy(StreamConfig(**SMALL, long_run_policy=name))
    assert type(policy) is cls and isinstance(policy, LongRunPolicy)


def test_factory_covers_exactly_the_configured_names_and_rejects_others():
    assert {policy_class(n).name for n in LONG_RUN_POLICIES} == set(LONG_RUN_POLICIES)
    with pytest.raises(ValueError, match="long_run_policy must be one of"):
        policy_class("forever")
    with pytest.raises(ValueError, match="long_run_policy must be one of"):
        make_policy(dataclasses.replace(StreamConfig(), long_run_policy="forever"))


def test_factory_refuses_settings_the_policy_cannot_run_with():
    bad = StreamConfig(**{**SMALL, "overlap_frames": 1})  # < scale_frames
    with pytest.raises(ValueError, match="overlap_frames"):
        make_policy(bad)
    assert type(make_policy(dataclasses.replace(bad, long_run_policy="reset"))) is ResetPolicy  # not its setting


def test_one_session_class_serves_every_policy():
    assert StreamingSession.__subclasses__() == []
    assert not hasattr(long_run, "session_class") and not hasattr(long_run, "WindowedSession")
    for name in LONG_RUN_POLICIES:
        manager = SessionManager.open(RUNTIME, StreamConfig(**SMALL, long_run_policy=name), log=lambda m: None)
        assert type(manager.session) is StreamingSession and type(manager.policy) is policy_class(name)


# ------------------------------------------------------------------------------- each policy alone
class FakeSession:
    """A session that records every call a policy makes on it."""

    def __init__(self, stream: StreamConfig) -> None:
        self.stream_cfg = stream
        self.calls: list = []

    def __getattr__(self, name: str):
        def record(*args, **kwargs):
            self.calls.append((name, args))

        return record


LIMIT = StoredFrameLimit(8, 8)


def test_stop_policy_refuses_from_the_limit_until_reset():
    cfg = StreamConfig(**SMALL, long_run_policy="stop")
    policy, session = StopPolicy(cfg), FakeSession(cfg)
    policy.admit()  # not reached: frames pass
    with pytest.raises(SessionStopped, match="8 stored frames reached the limit .max_stored_frames=8"):
        policy.at_limit(session, LIMIT)
    with pytest.raises(SessionStopped, match="reset the session"):
        policy.admit()
    assert policy.warnings(["x"]) == ["x", "long-run policy 'stop' reached: frames are refused until reset"]
    assert session.calls == []  # the stop policy never touches the session
    policy.reset(cfg)
    policy.admit()
    assert policy.warnings(["x"]) == ["x"]


def test_reset_policy_asks_the_manager_for_a_new_session():
    cfg = StreamConfig(**SMALL, long_run_policy="reset")
    policy, session = ResetPolicy(cfg), FakeSession(cfg)
    decision = policy.at_limit(session, LIMIT)
    assert decision.action is LimitAction.NEW_SESSION and "limit 8 reached" in decision.reason
    assert session.calls == []  # it answers; the manager starts the session (one path for every session)
    assert policy.warnings(["stored frames 8 of 8 before ..."]) == ["stored frames 8 of 8 before ..."]


def test_reset_policy_session_goes_through_the_managers_one_path():
    """The session the reset policy asks for reaches the listener like any other (counted by the node),
    and the frame at the limit is the first frame of the new session."""
    manager = SessionManager.open(RUNTIME, StreamConfig(**SMALL, long_run_policy="reset"), log=lambda m: None)
    starts = []
    manager.on_new_session = starts.append
    out = []
    for i, f in enumerate(frames(12)):
        out += manager.push(f, float(i))
    # scale frames 0, 1; keyframes 2..7 bring the stored count to 8; frame 8 starts session 1 as its first frame
    assert [(s.session_id, s.cause) for s in starts] == [(1, SessionCause.POLICY)]
    assert "limit 8 reached" in starts[0].reason and manager.last_start is starts[0]
    assert [int(r.stamp) for r in out if r.session_id == 1] == [8, 9, 10, 11]
    assert [r.frame_index for r in out if r.session_id == 1] == [0, 1, 2, 3]


def test_policies_without_windows_publish_in_the_session_frame():
    for cls in (StopPolicy, ResetPolicy):
        p = cls(StreamConfig(**SMALL, long_run_policy=cls.name))
        assert p.window_index == 0 and p.window_switches == 0 and p.overlap_buffered == 0
        assert p.transform.is_identity and p.last_alignment is None


# ------------------------------------------------------------------------------- real sessions
def test_stop_session_refuses_at_the_limit_and_every_frame_after_it():
    session = SessionManager.open(RUNTIME, StreamConfig(**SMALL, long_run_policy="stop", keyframe_interval=2),
                                  log=lambda m: None)
    processed, refused = [], []
    for i, f in enumerate(frames(20)):
        try:
            processed += [int(r.stamp) for r in session.push(f, float(i))]
        except SessionStopped as exc:
            refused.append((i, str(exc)))
    # scale frames 0, 1; then keyframes 2, 4, ..., 12 bring the stored count to 8; keyframe 14 hits the limit
    assert processed == list(range(14)) and [i for i, _ in refused] == list(range(14, 20))
    assert "8 stored frames reached the limit" in refused[0][1]
    # later frames are refused before any model call (StopPolicy.admit), not by hitting the limit again
    assert all("'stop' reached; reset the session to continue" in m for _, m in refused[1:])
    assert session.session.frames_stored == 8
    assert any("'stop' reached" in w for w in session.warnings())
    session.reset()
    assert not any("'stop' reached" in w for w in session.warnings())
    assert len(session.push(frames(1)[0], 0.0)) == 0 and len(session.push(frames(1)[0], 1.0)) == 2


def test_dropping_a_manager_frees_it_at_once():
    """The policy gets the session per call and keeps no reference to it: no cycle, so the manager,
    its session, the model and the caches go as soon as the last reference does."""
    manager = SessionManager.open(RUNTIME, StreamConfig(**SMALL), log=lambda m: None)
    for i, f in enumerate(frames(16)):
        manager.push(f, float(i))
    assert manager.policy.window_switches >= 1
    refs = [weakref.ref(x) for x in (manager, manager.session, manager.session.model, manager.policy)]
    gc.disable()
    try:
        del manager
        assert [r() for r in refs] == [None] * 4
    finally:
        gc.enable()


# ------------------------------------------------------------------------------- runtime swap
def test_session_manager_swaps_the_policy_at_runtime():
    manager = SessionManager.open(RUNTIME, StreamConfig(**SMALL), log=lambda m: None)
    session, model = manager.session, manager.session.model
    stream = iter(frames(200))
    count = 0

    def feed(n: int) -> tuple[list, list[str]]:
        nonlocal count
        out, errors = [], []
        for _ in range(n):
            count += 1
            try:
                out += manager.push(next(stream), float(count))
            except SessionError as exc:
                errors.append(str(exc))
        return out, errors

    out, errors = feed(20)
    assert not errors and isinstance(manager.policy, WindowPolicy) and manager.policy.window_switches >= 2
    assert {r.session_id for r in out} == {0} and max(r.window_index for r in out) >= 2

    # window -> stop: same session object and model, a new world frame, no window chain
    sid = manager.session_id
    r = manager.apply(RUNTIME, dataclasses.replace(manager.stream_cfg, long_run_policy="stop"))
    assert r.change is Change.NEW_SESSION and r.fields == ("long_run_policy",)
    assert manager.session is session and session.model is model and isinstance(manager.policy, StopPolicy)
    assert manager.session_id == sid + 1 and manager.policy.window_index == 0 and manager.policy.window_switches == 0
    out, errors = feed(10)
    assert len(out) == 8 and len(errors) == 2 and all("refuses further frames" in e or "'stop'" in e for e in errors)

    # a window policy that cannot run is refused and changes nothing: still stopped
    with pytest.raises(ValueError, match="overlap_frames"):
        manager.apply(RUNTIME, dataclasses.replace(manager.stream_cfg, long_run_policy="window", overlap_frames=1))
    assert isinstance(manager.policy, StopPolicy) and manager.session_id == sid + 1
    assert manager.stream_cfg.long_run_policy == "stop" and feed(1)[1]

    # stop -> reset: the stream goes on past the limit in new sessions
    manager.apply(RUNTIME, dataclasses.replace(manager.stream_cfg, long_run_policy="reset"))
    assert isinstance(manager.policy, ResetPolicy)
    out, errors = feed(20)
    assert not errors and len({r.session_id for r in out}) >= 2

    # reset -> window, then a window setting of the same policy: the policy object (and its count) stays
    manager.apply(RUNTIME, dataclasses.replace(manager.stream_cfg, long_run_policy="window"))
    policy = manager.policy
    assert isinstance(policy, WindowPolicy) and policy.window_switches == 0
    feed(16)
    switches = manager.policy.window_switches
    assert switches >= 1
    sid = manager.session_id
    r = manager.apply(RUNTIME, dataclasses.replace(manager.stream_cfg, overlap_frames=4))
    assert r.change is Change.NEW_SESSION and r.fields == ("overlap_frames",)
    assert manager.policy is policy and manager.policy.window_switches == switches and manager.policy.window_index == 0
    assert manager.session_id == sid + 1 and manager.policy.overlap_buffered == 0
    feed(20)
    assert manager.policy.overlap_buffered == 4 and manager.policy.window_switches > switches
