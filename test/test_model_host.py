"""The model host (core/model_host.py) and what other threads read of a manager.

* One host, several managers: one copy of the weights, each manager its own sessions; a new model
  reaches every manager over the host.
* A failed model build changes nothing.
* The manager's view is data only: the node's parameter check runs on the executor thread while the
  inference thread may be swapping the model (``SessionManager.apply``), so it must not call into
  the live manager (its memory budget writes its automatic value on a check).
"""
from __future__ import annotations

import dataclasses
import threading
from types import SimpleNamespace

import pytest
import torch

from lingbot_map_ros.core.config import RuntimeConfig, StreamConfig, replace
from lingbot_map_ros.core.memory_budget import MemoryBudget
from lingbot_map_ros.core.model_host import ModelHost
from lingbot_map_ros.core.session_manager import Change, SessionManager

SMALL = dict(scale_frames=2, sliding_window=4, max_frame_num=64, max_stored_frames=40, long_run_policy="reset",
             camera_iterations=2, image_width=224)
RUNTIME = RuntimeConfig(model_preset="tiny", device="cpu")
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def quiet(_message: str) -> None:
    pass


def frames(n: int, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.rand(3, 28, 42, generator=gen) for _ in range(n)]


def test_managers_over_one_host_share_the_weights_and_stream_alone():
    host = ModelHost.load(RUNTIME, quiet)
    a, b = SessionManager(host, StreamConfig(**SMALL), quiet), SessionManager(host, StreamConfig(**SMALL), quiet)
    assert a.session.model is b.session.model is host.model
    seq = frames(5, seed=1)
    out_a = [r for f in seq for r in a.push(f)]
    out_b = [r for f in seq[:3] for r in b.push(f)]  # b is behind: its caches are its own
    assert len(out_a) == 5 and len(out_b) == 3
    for ra, rb in zip(out_a, out_b):
        assert torch.equal(torch.as_tensor(ra.c2w), torch.as_tensor(rb.c2w))
    b.reset()
    assert a.session.frames_pushed == 5 and b.session.frames_pushed == 0


def test_a_new_model_reaches_every_manager_over_the_host():
    host = ModelHost.load(RUNTIME, quiet)
    a, b = SessionManager(host, StreamConfig(**SMALL), quiet), SessionManager(host, StreamConfig(**SMALL), quiet)
    old = host.model
    result = a.apply(replace(RUNTIME, seed=5), StreamConfig(**SMALL))
    assert result.change is Change.NEW_MODEL and result.fields == ("seed",)
    assert host.model is not old and a.session.model is host.model and host.settings.seed == 5
    result = b.apply(replace(RUNTIME, seed=5), StreamConfig(**SMALL))  # the host has it already: b follows
    assert result.change is Change.NEW_MODEL and result.fields == ("seed",) and b.session.model is host.model
    assert b.apply(replace(RUNTIME, seed=5), StreamConfig(**SMALL)).change is Change.NONE


def test_a_failed_model_build_changes_nothing(monkeypatch):
    manager = SessionManager.open(RUNTIME, StreamConfig(**SMALL), quiet)
    for f in frames(3, seed=2):
        manager.push(f)
    model, sid, stored = manager.host.model, manager.session_id, manager.session.frames_stored

    def failing(cls, runtime, log=print):
        raise RuntimeError("no such model here")

    monkeypatch.setattr(ModelHost, "load", classmethod(failing))
    with pytest.raises(RuntimeError, match="no such model here"):
        manager.apply(replace(RUNTIME, seed=9), StreamConfig(**SMALL))
    assert manager.host.model is model and manager.host.settings == RUNTIME
    assert (manager.session_id, manager.session.frames_stored) == (sid, stored)


def test_the_view_holds_data_only():
    view = SessionManager.open(RUNTIME, StreamConfig(**SMALL), quiet).view()
    bound = [f.name for f in dataclasses.fields(view) if callable(getattr(view, f.name))]
    assert not bound, f"ManagerView fields that call back into the manager: {bound}"


def test_a_parameter_check_during_a_model_swap_reads_only_the_view(monkeypatch):
    """The node's ``on_set`` (executor thread) checks a change against the memory budget while the
    inference thread is inside ``apply`` building a new model: the check answers from the view taken
    before, and never runs the live manager's budget (``MemoryBudget.fit`` writes its automatic value)."""
    pytest.importorskip("rclpy")
    from lingbot_map_ros.ros.inference import SessionView
    from lingbot_map_ros.ros.node_settings import LiveSettings, NodeSettings
    from lingbot_map_ros.ros.parameter_callbacks import ParameterHandler
    from lingbot_map_ros.ros.parameters import PARAMETERS

    stream = StreamConfig(**SMALL)
    manager = SessionManager.open(RUNTIME, stream, quiet)
    view = manager.view()

    building, finish = threading.Event(), threading.Event()
    real_load = ModelHost.load.__func__

    def slow_load(cls, runtime, log=print):
        building.set()  # the inference thread is now inside the swap
        assert finish.wait(30)
        return real_load(cls, runtime, log)

    monkeypatch.setattr(ModelHost, "load", classmethod(slow_load))
    budget_threads: list[str] = []
    real_fit = MemoryBudget.fit

    def recorded_fit(self, *args):
        budget_threads.append(threading.current_thread().name)
        return real_fit(self, *args)

    monkeypatch.setattr(MemoryBudget, "fit", recorded_fit)
    swap = threading.Thread(target=lambda: manager.apply(replace(RUNTIME, seed=4), stream), name="inference")
    swap.start()
    try:
        assert building.wait(30)
        values = {p.name: p.default for p in PARAMETERS} | {k: getattr(RUNTIME, k) for k in ("model_preset", "device")}
        values |= {k: getattr(stream, k) for k in SMALL}
        session_view = SessionView(latest=view)
        handler = ParameterHandler(node=None, settings=LiveSettings(NodeSettings.from_values(values)),
                                   session_view=session_view, intake=None, timer=None, parts=None)

        def param(name, value):
            return SimpleNamespace(name=name, value=value)

        assert handler.on_set([param("keyframe_interval", 2)]).successful
        refused = handler.on_set([param("gpu_memory_budget", 1e-6)])  # nothing fits a microgigabyte
        assert not refused.successful and "memory budget" in refused.reason
        assert swap.is_alive()  # both answers came while the model was being swapped
        assert budget_threads == ["inference"], f"the live manager's budget ran on {budget_threads}"
    finally:
        finish.set()
        swap.join(60)
    assert manager.host.settings.seed == 4 and manager.session.model is manager.host.model
