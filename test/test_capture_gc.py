"""``cuda_graph.capture_into`` and the garbage collector.

A dead session in a reference cycle holds CUDA graphs, attention wrappers and device tensors. If the
collector releases them while a capture is open, the capture is invalidated
(``cudaErrorStreamCaptureInvalidated``). ``capture_into`` collects before the capture and keeps the
collector off until it closes. CUDA graphs do not exist here, so ``torch.cuda.CUDAGraph`` and
``torch.cuda.graph`` are stand-ins with their contract (a context that captures, ``reset`` after a failure).
"""
from __future__ import annotations

import contextlib
import gc
import weakref

import pytest
import torch

from lingbot_map_ros.core import cuda_graph


class StandInGraph:
    def __init__(self) -> None:
        self.was_reset = False

    def reset(self) -> None:
        self.was_reset = True


@pytest.fixture
def stand_in_capture(monkeypatch):
    graphs: list[StandInGraph] = []

    def make() -> StandInGraph:
        graphs.append(StandInGraph())
        return graphs[-1]

    @contextlib.contextmanager
    def capturing(graph, pool=None):
        yield

    monkeypatch.setattr(torch.cuda, "CUDAGraph", make)
    monkeypatch.setattr(torch.cuda, "graph", capturing)
    return graphs


class Session:
    """Stands for a dead session: it refers to itself, so only the collector frees it."""

    def __init__(self) -> None:
        self.me = self


def test_dead_cycles_are_collected_before_the_capture_and_the_collector_is_off_during_it(stand_in_capture):
    dead = Session()
    dead_ref = weakref.ref(dead)
    del dead
    seen = {}

    def run() -> str:
        seen["collector on"] = gc.isenabled()
        seen["dead session alive"] = dead_ref() is not None
        return "outputs"

    assert gc.isenabled()
    graph, output = cuda_graph.capture_into(None, run)
    assert seen == {"collector on": False, "dead session alive": False}
    assert output == "outputs" and graph is stand_in_capture[0] and not graph.was_reset
    assert gc.isenabled()


def test_a_failed_capture_resets_its_graph_and_turns_the_collector_back_on(stand_in_capture):
    def run() -> None:
        raise RuntimeError("capture invalidated")

    with pytest.raises(RuntimeError, match="capture invalidated"):
        cuda_graph.capture_into(None, run)
    assert stand_in_capture[0].was_reset
    assert gc.isenabled()


def test_a_caller_that_turned_the_collector_off_keeps_it_off(stand_in_capture):
    gc.disable()
    try:
        cuda_graph.capture_into(None, lambda: None)
        assert not gc.isenabled()
    finally:
        gc.enable()
