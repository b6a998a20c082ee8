"""The node's sends, off the inference thread: one thread that calls ``publish`` for it.

Why: a frame's outputs are up to a dozen messages (the camera's pose and statistics, its status, the
body's pose, odometry, path and /tf, depth and points on request). ``publish`` sends each one to every
matched reader on the calling thread (Fast DDS's default, synchronous mode), and on a computer whose
caches are cold when a frame's work starts each send costs a tenth of a millisecond or more. On the
inference thread that time is taken from the model: with the model on a GPU the device idles until the
next step is queued. Here the inference thread hands a frame's messages over in one piece and goes on;
this thread sends them, in the order they were handed over, beside the next model step.

What stays on the calling thread: every decision and every piece of state (placing, the ledger's
counters, the TF tree's own record of its sends, the path). The messages are built there and never
touched again, or, for the small ones sent with every frame, built by the sending thread from values
that do not change afterwards (``send_built``: numbers, tuples, a frame's finished result), so that
their conversion leaves the inference thread too. A frame's messages leave together and in their
order, so a reader that got a frame's final status got the outputs published before it.

A publisher is wrapped by ``deferred(node, publisher)``: a node with an ``outbox`` (the lingbot_map
node) sends through it; any other node (a test's stand-in, ``lingbot_map_offline``) sends at once.
"""
from __future__ import annotations

import collections
import contextlib
import threading
import time
from typing import Any, Callable, Iterator, Optional

PENDING_LIMIT = 256  # handed-over pieces waiting; beyond it the caller waits (back-pressure, nothing dropped)
COSTS_KEPT = 200  # per label: the thread CPU of the last pieces sent, for /diagnostics


class Outbox:
    """One sending thread for a node: ``send`` / ``batch`` hand messages over, ``flush`` waits for them."""

    def __init__(self, context_ok: Callable[[], bool], log_error: Callable[[str], None]) -> None:
        self._context_ok = context_ok
        self._log_error = log_error
        self._cond = threading.Condition()
        # (label, [(publisher, build or None, message or build's arguments), ...]) per piece
        self._pending: collections.deque = collections.deque()
        self._handed = 0  # pieces handed over so far
        self._sent = 0  # pieces sent (or failed) so far
        self._stop = False
        self._local = threading.local()  # the batch open on a thread
        self.failed = 0  # sends that raised while ROS was up
        self.last_failure = ""
        # label -> thread CPU ms of each piece sent (a frame's batch: what sending that frame cost)
        self.costs: dict[str, collections.deque] = {}
        self._thread = threading.Thread(target=self._run, name="lingbot_map_outbox", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ callers
    def send(self, publisher: Any, message: Any) -> None:
        """``publisher.publish(message)`` on the sending thread; inside a ``batch`` on this thread, with it."""
        self._add((publisher, None, message))

    def send_built(self, publisher: Any, build: Callable[..., Any], args: tuple) -> None:
        """``publisher.publish(build(*args))``, the message built on the sending thread too; ``args`` must not
        change after this call."""
        self._add((publisher, build, args))

    def _add(self, item: tuple) -> None:
        open_batch: Optional[list] = getattr(self._local, "batch", None)
        if open_batch is not None:
            open_batch.append(item)
        else:
            self._hand_over("", [item])

    @contextlib.contextmanager
    def batch(self, label: str) -> Iterator[None]:
        """Everything sent on this thread inside the block leaves as one piece, after the block, in order; its
        sending cost is recorded under ``label`` (a camera's name: one frame's outputs)."""
        outer = getattr(self._local, "batch", None)
        if outer is not None:  # nested: part of the outer piece
            yield
            return
        items: list = []
        self._local.batch = items
        try:
            yield
        finally:
            self._local.batch = None
            if items:
                self._hand_over(label, items)

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until everything handed over before this call was sent; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            target = self._handed
            while self._sent < target:
                left = deadline - time.monotonic()
                if left <= 0 or not self._thread.is_alive():
                    return False
                self._cond.wait(left)
        return True

    def close(self, timeout: float = 5.0) -> None:
        """Send what is waiting, then stop the thread (idempotent)."""
        self.flush(timeout)
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def cost_median(self, label: str) -> float:
        """Median thread CPU ms of the pieces sent under ``label`` (nan: none yet)."""
        with self._cond:
            values = sorted(self.costs.get(label, ()))
        return values[len(values) // 2] if values else float("nan")

    @property
    def waiting(self) -> int:
        with self._cond:
            return self._handed - self._sent

    def _hand_over(self, label: str, items: list) -> None:
        with self._cond:
            while (len(self._pending) >= PENDING_LIMIT and not self._stop
                   and threading.current_thread() is not self._thread):
                self._cond.wait(0.1)
            if self._stop or not self._thread.is_alive():  # closed (everything before was sent): send here
                self._handed += 1
                self._sent += 1
                run_now = True
            else:
                self._pending.append((label, items))
                self._handed += 1
                run_now = False
                self._cond.notify_all()
        if run_now:
            self._send_all(items)

    # ------------------------------------------------------------------ the sending thread
    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._stop:
                    self._cond.wait()
                if not self._pending:
                    return
                label, items = self._pending.popleft()
            start = time.thread_time()
            self._send_all(items)
            cost = (time.thread_time() - start) * 1e3
            with self._cond:
                self.costs.setdefault(label, collections.deque(maxlen=COSTS_KEPT)).append(cost)
                self._sent += 1
                self._cond.notify_all()

    def _send_all(self, items: list) -> None:
        for publisher, build, payload in items:
            try:
                publisher.publish(payload if build is None else build(*payload))
            except Exception as exc:  # noqa: BLE001 - one refused send must not stop the others
                if not self._context_ok():
                    continue  # after a signal nothing can be sent any more; that is no error
                self.failed += 1
                self.last_failure = f"{_topic(publisher)}: {type(exc).__name__}: {exc}"
                self._log_error(f"a send failed: {self.last_failure}")


class DeferredPublisher:
    """A publisher whose ``publish`` goes through an ``Outbox``; everything else is the publisher's own."""

    def __init__(self, outbox: Outbox, publisher: Any) -> None:
        self.outbox = outbox
        self.publisher = publisher

    def publish(self, message: Any) -> None:
        self.outbox.send(self.publisher, message)

    def publish_built(self, build: Callable[..., Any], *args: Any) -> None:
        self.outbox.send_built(self.publisher, build, args)

    def __getattr__(self, name: str) -> Any:  # get_subscription_count, topic_name, ...
        return getattr(self.publisher, name)


def _outbox_of(node: Any) -> Optional[Outbox]:
    """The node's outbox (None: a node without one sends at once)."""
    return getattr(node, "outbox", None)


def deferred(node: Any, publisher: Any) -> Any:
    """``publisher`` sending through ``node.outbox`` where the node has one, else itself."""
    outbox = _outbox_of(node)
    return publisher if outbox is None else DeferredPublisher(outbox, publisher)


def send_built(publisher: Any, build: Callable[..., Any], *args: Any) -> None:
    """``publisher.publish(build(*args))``: through its outbox, the building happens on the sending thread too
    (``args`` must not change afterwards); a plain publisher builds and sends at once."""
    if isinstance(publisher, DeferredPublisher):
        publisher.publish_built(build, *args)
    else:
        publisher.publish(build(*args))


def undeferred(publisher: Any) -> Any:
    """The rclpy publisher behind ``publisher`` (what ``destroy_publisher`` takes)."""
    return publisher.publisher if isinstance(publisher, DeferredPublisher) else publisher


@contextlib.contextmanager
def sending_batch(node: Any, label: str) -> Iterator[None]:
    """``node.outbox.batch(label)`` where the node has an outbox; else nothing to gather."""
    outbox = _outbox_of(node)
    if outbox is None:
        yield
    else:
        with outbox.batch(label):
            yield


def flush_sends(node: Any, timeout: float = 5.0) -> bool:
    """Wait until ``node.outbox`` sent what was handed over (True at once without an outbox)."""
    outbox = _outbox_of(node)
    return True if outbox is None else outbox.flush(timeout)


def send_cost_median(node: Any, label: str) -> float:
    """Median thread CPU ms of sending one piece under ``label`` on ``node.outbox`` (nan: none, or no outbox)."""
    outbox = _outbox_of(node)
    return float("nan") if outbox is None else outbox.cost_median(label)


def _topic(publisher: Any) -> str:
    try:
        return str(publisher.topic_name)
    except Exception:  # noqa: BLE001 - a stand-in without one
        return type(publisher).__name__


__all__ = ["DeferredPublisher", "Outbox", "deferred", "flush_sends", "send_built", "send_cost_median", "sending_batch",
           "undeferred"]
