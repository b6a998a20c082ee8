"""ros/outbox.py: the node's sends on a thread of their own, in order, nothing lost."""
from __future__ import annotations

import threading
import time

import pytest

from lingbot_map_ros.ros import outbox as outbox_module
from lingbot_map_ros.ros.outbox import DeferredPublisher, Outbox, deferred, flush_sends, send_cost_median, undeferred


class Recorder:
    """A publisher stand-in: records (topic, message, thread name) of every publish."""

    def __init__(self, topic: str, log: list, gate: threading.Event | None = None, fail: bool = False):
        self.topic_name = topic
        self._log = log
        self._gate = gate
        self._fail = fail

    def publish(self, message) -> None:
        if self._gate is not None:
            self._gate.wait(10)
        if self._fail:
            raise RuntimeError("refused")
        self._log.append((self.topic_name, message, threading.current_thread().name))

    def get_subscription_count(self) -> int:
        return 3


@pytest.fixture
def box():
    errors: list[str] = []
    outbox = Outbox(context_ok=lambda: True, log_error=errors.append)
    outbox.errors = errors
    yield outbox
    outbox.close()


def test_sends_leave_in_order_on_the_outbox_thread(box):
    log: list = []
    a, b = Recorder("a", log), Recorder("b", log)
    box.send(a, 1)
    with box.batch("cam0"):
        box.send(b, 2)
        box.send(a, 3)
    box.send(b, 4)
    assert box.flush(5)
    assert [(t, m) for t, m, _ in log] == [("a", 1), ("b", 2), ("a", 3), ("b", 4)]
    assert {name for _, _, name in log} == {"lingbot_map_outbox"}
    assert box.waiting == 0


def test_a_batch_leaves_after_its_block_as_one_piece_with_its_cost(box):
    log: list = []
    pub = Recorder("pose", log)
    with box.batch("cam1"):
        box.send(pub, "x")
        time.sleep(0.05)
        assert log == []  # nothing leaves while the frame's messages are gathered
        with box.batch("inner"):  # nested: part of the outer piece
            box.send(pub, "y")
    assert box.flush(5)
    assert [m for _, m, _ in log] == ["x", "y"]
    assert len(box.costs["cam1"]) == 1 and "inner" not in box.costs
    assert box.cost_median("cam1") >= 0.0
    assert box.cost_median("nobody") != box.cost_median("nobody")  # nan


def test_another_threads_send_is_not_part_of_an_open_batch(box):
    log: list = []
    pub = Recorder("status", log)
    with box.batch("cam0"):
        box.send(pub, "mine")
        other = threading.Thread(target=lambda: box.send(pub, "executor's"))
        other.start()
        other.join()
        assert box.flush(5)
        assert [m for _, m, _ in log] == ["executor's"]
    assert box.flush(5)
    assert [m for _, m, _ in log] == ["executor's", "mine"]


def test_a_failed_send_is_counted_and_the_rest_still_leave(box):
    log: list = []
    with box.batch("cam0"):
        box.send(Recorder("bad", log, fail=True), 1)
        box.send(Recorder("good", log), 2)
    assert box.flush(5)
    assert [m for _, m, _ in log] == [2]
    assert box.failed == 1 and "bad" in box.last_failure and "refused" in box.errors[0]


def test_a_failed_send_after_shutdown_is_no_error():
    up = [True]
    errors: list[str] = []
    box = Outbox(context_ok=lambda: up[0], log_error=errors.append)
    up[0] = False
    box.send(Recorder("late", [], fail=True), 1)
    assert box.flush(5)
    box.close()
    assert box.failed == 0 and errors == []


def test_flush_waits_for_what_was_handed_over_and_close_sends_the_rest(box):
    log: list = []
    gate = threading.Event()
    slow = Recorder("slow", log, gate=gate)
    box.send(slow, 1)
    box.send(slow, 2)
    assert not box.flush(0.1)  # the first send is held
    gate.set()
    assert box.flush(5) and len(log) == 2
    gate.clear()
    box.send(slow, 3)
    threading.Timer(0.1, gate.set).start()
    box.close()
    assert [m for _, m, _ in log] == [1, 2, 3]
    box.send(Recorder("after", log), 4)  # closed: sent on the caller's thread
    assert log[-1][1] == 4 and log[-1][2] == threading.current_thread().name


def test_a_full_outbox_holds_the_caller_back_and_drops_nothing(box, monkeypatch):
    monkeypatch.setattr(outbox_module, "PENDING_LIMIT", 3)
    log: list = []
    gate = threading.Event()
    slow = Recorder("slow", log, gate=gate)
    done = threading.Event()

    def producer() -> None:
        for i in range(10):
            box.send(slow, i)
        done.set()

    threading.Thread(target=producer).start()
    time.sleep(0.2)
    assert not done.is_set()  # held back: one piece in the send, three waiting
    gate.set()
    assert done.wait(5) and box.flush(5)
    assert [m for _, m, _ in log] == list(range(10))


def test_deferred_only_where_the_node_has_an_outbox(box):
    log: list = []
    pub = Recorder("pose", log)

    class Plain:
        pass

    class WithOutbox:
        outbox = box

    assert deferred(Plain(), pub) is pub
    wrapped = deferred(WithOutbox(), pub)
    assert isinstance(wrapped, DeferredPublisher) and undeferred(wrapped) is pub and undeferred(pub) is pub
    assert wrapped.get_subscription_count() == 3 and wrapped.topic_name == "pose"
    with outbox_module.sending_batch(WithOutbox(), "cam0"):
        wrapped.publish("p")
    with outbox_module.sending_batch(Plain(), "cam0"):
        pub.publish("direct")
    assert log[-1][1] == "direct"
    assert flush_sends(WithOutbox(), 5) and flush_sends(Plain())
    assert [m for _, m, _ in log] == ["direct", "p"] or [m for _, m, _ in log] == ["p", "direct"]
    assert send_cost_median(WithOutbox(), "cam0") >= 0.0
    assert send_cost_median(Plain(), "cam0") != send_cost_median(Plain(), "cam0")  # nan


def test_a_built_message_is_built_on_the_sending_thread_in_its_place(box):
    log: list = []
    pub = Recorder("stats", log)
    builders: list[str] = []

    def build(a, b):
        builders.append(threading.current_thread().name)
        return a + b

    wrapped = DeferredPublisher(box, pub)
    with box.batch("cam0"):
        wrapped.publish("first")
        outbox_module.send_built(wrapped, build, "sec", "ond")
        wrapped.publish("third")
    assert box.flush(5)
    assert [m for _, m, _ in log] == ["first", "second", "third"] and builders == ["lingbot_map_outbox"]
    outbox_module.send_built(pub, build, "at ", "once")  # a plain publisher: built and sent on this thread
    assert log[-1][1:] == ("at once", threading.current_thread().name)
    assert builders[-1] == threading.current_thread().name


def test_a_builder_that_raises_is_a_failed_send(box):
    log: list = []

    def broken():
        raise ValueError("no such frame")

    with box.batch("cam0"):
        box.send_built(Recorder("bad", log), broken, ())
        box.send(Recorder("good", log), "still sent")
    assert box.flush(5)
    assert [m for _, m, _ in log] == ["still sent"] and box.failed == 1 and "no such frame" in box.last_failure
