"""The step's read-back on the CPU: host tensors come back as float32 NumPy arrays, None kept."""
from __future__ import annotations

import numpy as np
import torch

from lingbot_map_ros.core.readback import StagedReadback


def test_cpu_outputs_come_back_as_float32_arrays_with_none_kept() -> None:
    pose = torch.randn(2, 9, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    depth = torch.rand(2, 4, 6, generator=torch.Generator().manual_seed(2)).bfloat16()
    got = StagedReadback().fetch((pose, depth, None))
    assert got[2] is None and got[0].dtype == got[1].dtype == np.float32
    np.testing.assert_array_equal(got[0], pose.float().numpy())
    np.testing.assert_array_equal(got[1], depth.float().numpy())


class _Stream:
    def __init__(self) -> None:
        self.synchronized = 0

    def synchronize(self) -> None:
        self.synchronized += 1


class _Event:
    """A step that ends after ``polls`` queries of its event."""

    polls = 3

    def __init__(self) -> None:
        self.recorded = 0
        self.left = 0

    def record(self, stream) -> None:
        self.recorded += 1
        self.left = _Event.polls

    def query(self) -> bool:
        self.left -= 1
        return self.left < 0


def _stand_ins(monkeypatch, waits: list[float], times: tuple[float, ...] = ()):
    """readback's CUDA calls and clock replaced: each wait lasts the next of ``waits`` seconds (or the
    clock reads ``times``: a wait reads it when it starts and when it ends a measured wait)."""
    from lingbot_map_ros.core import readback

    stream, sleeps = _Stream(), []
    clock = iter(times or [t for w in waits for t in (0.0, w)])
    monkeypatch.setattr(readback.torch.cuda, "current_stream", lambda device=None: stream)
    monkeypatch.setattr(readback.torch.cuda, "Event", _Event)
    monkeypatch.setattr(readback.time, "sleep", sleeps.append)
    monkeypatch.setattr(readback.time, "perf_counter", lambda: next(clock))
    return readback, stream, sleeps


def test_the_wait_sleeps_through_the_shortest_recent_wait_then_polls_its_last_part(monkeypatch) -> None:
    readback, stream, sleeps = _stand_ins(monkeypatch, [0.025, 0.030, 0.020, 0.024])
    r = readback.StagedReadback()
    device = {torch.device("cuda", 0)}
    r._wait(device)  # no history: polls from the start
    assert sleeps == [0] * _Event.polls and r._done.recorded == 1
    for expected_sleep in (0.025, 0.025, 0.020):  # the shortest of the waits so far, less the polled part
        sleeps.clear()
        r._wait(device)
        assert sleeps[0] == expected_sleep - readback.POLL_LAST_S and sleeps[1:] == [0] * _Event.polls
    assert stream.synchronized == 0 and list(r._waits) == [0.025, 0.030, 0.020, 0.024]


def test_a_step_done_before_the_thread_wakes_clears_the_expectation(monkeypatch) -> None:
    # the third wait reads the clock once (at its start): overslept, it is not measured
    readback, _, sleeps = _stand_ins(monkeypatch, [], times=(0.0, 0.025, 0.0, 0.030, 0.0, 0.0, 0.012))
    r = readback.StagedReadback()
    device = {torch.device("cuda", 0)}
    r._wait(device)
    r._wait(device)
    monkeypatch.setattr(_Event, "polls", 0)  # a shorter step: done at the first query after the sleep
    r._wait(device)
    assert list(r._waits) == []  # overslept once; its length is unknown
    monkeypatch.setattr(_Event, "polls", 2)
    sleeps.clear()
    r._wait(device)  # polled from the start, measured anew
    assert sleeps == [0, 0] and list(r._waits) == [0.012]


def test_the_wait_blocks_in_the_driver_when_polling_is_off(monkeypatch) -> None:
    readback, stream, sleeps = _stand_ins(monkeypatch, [0.025])
    monkeypatch.setattr(readback, "POLL_LAST_S", 0.0)
    r = readback.StagedReadback()
    r._wait({torch.device("cuda", 0)})
    assert stream.synchronized == 1 and sleeps == [] and r._done is None
