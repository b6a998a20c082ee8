"""A step's outputs to the host with one wait: pinned staging buffers, copies queued behind the step.

``tensor.cpu()`` on a CUDA tensor waits for the device, then copies through pageable memory in
driver-sized chunks, and each of a step's outputs (pose, depth, confidence) waited again. With depth
on, that read-back (2 x 518x378 fp32) left the device idle for ~0.5 ms a frame on the H200
(measured with bench/host_gap.py). Here every output's copy is queued on the stream right after
the step, into a pinned buffer of its own (DMA at full speed), one synchronisation waits for all of
them, and each array handed out is a fresh host copy: results own their memory, the pinned buffers
are reused by the next step. On the CPU the outputs are already host tensors.

The wait itself: after the step the host's work on its results (the result, the caches' bookkeeping,
the next frame in) leaves the device idle, and a host thread woken from a long block does that work
several times slower than a thread that was running (its caches cold, its core clocked down: the
step's result took 0.28 ms on the H100's host against 0.035 ms warm). So the thread sleeps through
most of the expected wait and polls the step's end for the last ``POLL_LAST_S``: awake when the
outputs land, at the cost of that much of one core per step. The expectation is the shortest of the
last few waits; a step that ended before the thread woke (a shorter step) is overslept once, and
clears them, so the next wait polls from its start and measures the step anew.
"""
from __future__ import annotations

import collections
import time
from typing import Optional, Sequence

import numpy as np
import torch

POLL_LAST_S = 0.002  # the last this many seconds of the expected wait are polled (0: the driver's blocking wait)
WAITS_KEPT = 8  # the expected wait is the shortest of this many last waits


class StagedReadback:
    """Reads a fixed set of a step's outputs (by position: pose, depth, confidence) to the host."""

    def __init__(self) -> None:
        self._pinned: dict[int, torch.Tensor] = {}  # output position -> its float32 staging buffer
        self._waits: collections.deque[float] = collections.deque(maxlen=WAITS_KEPT)  # seconds
        self._done: Optional[torch.cuda.Event] = None

    def fetch(self, outputs: Sequence[Optional[torch.Tensor]]) -> list[Optional[np.ndarray]]:
        """float32 NumPy copies of ``outputs`` (None stays None), after the work that writes them."""
        devices = {t.device for t in outputs if t is not None}
        if not any(d.type == "cuda" for d in devices):
            return [None if t is None else t.float().cpu().numpy() for t in outputs]
        staged: list[Optional[torch.Tensor]] = []
        for position, t in enumerate(outputs):
            if t is None:
                staged.append(None)
                continue
            buffer = self._buffer(position, t.shape)
            buffer.copy_(t, non_blocking=True)  # queued behind the step; casts to float32 on the way
            staged.append(buffer)
        self._wait(devices)  # one wait for the step and every copy
        return [None if b is None else b.numpy().copy() for b in staged]

    def _wait(self, devices: set[torch.device]) -> None:
        """Until the current streams of ``devices`` are done: asleep, then polling (module docstring)."""
        if POLL_LAST_S <= 0 or len(devices) != 1:
            for device in devices:
                torch.cuda.current_stream(device).synchronize()
            return
        if self._done is None:
            self._done = torch.cuda.Event()
        self._done.record(torch.cuda.current_stream(next(iter(devices))))
        start = time.perf_counter()
        slept = bool(self._waits) and min(self._waits) > POLL_LAST_S
        if slept:
            time.sleep(min(self._waits) - POLL_LAST_S)
        overslept = slept
        while not self._done.query():
            overslept = False
            time.sleep(0)  # the GIL to the node's other threads between polls; the thread stays runnable
        if overslept:  # done before the thread woke: how long it took is unknown, so learn it again
            self._waits.clear()
        else:
            self._waits.append(time.perf_counter() - start)

    def _buffer(self, position: int, shape: torch.Size) -> torch.Tensor:
        buffer = self._pinned.get(position)
        if buffer is None or buffer.shape != shape:
            buffer = self._pinned[position] = torch.empty(shape, dtype=torch.float32, pin_memory=True)
        return buffer


__all__ = ["StagedReadback"]
