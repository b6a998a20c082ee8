"""``cuda_graph.capture_into`` and the garbage collector.

A dead session in a reference cycle holds CUDA graphs, attention wrappers and device tensors. If the
collector releases them while a capture is open, the capture is invalidated
(``cudaErrorStreamCaptureInvalidated``). ``capture_into`` keeps the collector off until the capture
closes. CUDA graphs do not exist here, so ``torch.cuda.CUDAGraph`` and
``torch.cuda.graph`` are stand-ins with their contract (a context that captures, ``reset`` after a failure).
"""
from __future__ import annotations

import contextlib
import gc

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


def test_no_collection_runs_while_the_capture_is_open(stand_in_capture):
    """Inside the capture ``run`` makes enough cyclic garbage to trigger the collector many times over;
    none of those collections may run before the capture closes, and the collector works after it."""
    collections = {"during": 0, "after": 0}
    where = ["before"]

    def note(phase: str, info: dict) -> None:
        if phase == "start" and where[0] in collections:
            collections[where[0]] += 1

    def run() -> str:
        where[0] = "during"
        for _ in range(50_000):
            cycle: list = []
            cycle.append(cycle)
        where[0] = "after"
        return "outputs"

    gc.callbacks.append(note)
    try:
        graph, output = cuda_graph.capture_into(None, run)
        for _ in range(50_000):  # the same garbage after the capture: collected as usual
            cycle: list = []
            cycle.append(cycle)
    finally:
        gc.callbacks.remove(note)
    assert collections["during"] == 0, f"{collections['during']} collections ran during the capture"
    assert collections["after"] > 0
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
