"""The preprocessing stage: frame n+1 is preprocessed while the model runs frame n.

Without it the inference thread preprocessed each frame itself (exact PIL bicubic resize to 518
wide, ~5 ms at 640x480 on a small CPU, ~10 ms at 1280x720) before pushing it, so its per-frame time
was preprocess + model + publish. With this stage the inference thread only pushes and publishes:
its throughput is set by the slower of the two stages (the model, on a robot's GPU), the latency of
one frame is unchanged (one more thread hand-off, well under a millisecond). PIL's resize and
PyTorch's ops release the GIL, so the overlap is real on a multi-core machine.

Bounded like the queue it replaces: one raw frame waiting for preprocessing, one in preprocessing,
one preprocessed frame waiting for the inference thread. A newer frame replaces the waiting one at
either slot (``LatestFrame``: the replaced one ends DROPPED_QUEUE), so the node never falls behind
the camera and holds at most four frames between callback and model.

Who owns the input size: the session's ``FramePreprocessor`` (``InputSize``). The callback checks a
frame against it, this stage checks again with the preprocessor it uses, and the inference thread
checks once more right before the push, because a new session (``~/reset``, a parameter change,
failure recovery) can start while a frame is here: that frame then becomes the new session's first
frame (its size is adopted; the tensor depends only on the size) or, when another size was adopted
meanwhile, it is rejected as a resolution change. A frame never reaches a session at another size.

The thread runs while the node is active: ``stop`` (deactivate, cleanup, shutdown, SIGTERM) joins it
after the frame in hand; that frame and the waiting one end DROPPED_INACTIVE.
"""
from __future__ import annotations

import collections
import threading
import time
from typing import Callable, Optional

from lingbot_map_ros.msg import FrameStatus

from .frames import Frame, FrameLedger, InputRejected, LatestFrame
from .input_size import InputSize
from .node_settings import SettingsSource

REPLACED_BEFORE_PREPROCESSING = "replaced by a newer frame before preprocessing"
PREPROCESSING_FAILED = "preprocessing_failed"  # REJECTED_INPUT kind: the preprocessor raised for the frame
TIMELINE_FRAMES = 8  # frames in the /diagnostics timeline


class PreprocessStage:
    """The preprocessing thread between the image callback (``offer``) and ``sink`` (the inference
    thread's one-slot queue). ``context_ok()`` says whether ROS is still up: during shutdown a frame
    in hand is dropped without a status (the status publisher is gone)."""

    def __init__(self, settings: SettingsSource, ledger: FrameLedger, input_size: InputSize,
                 sink: Callable[[Frame], None], context_ok: Callable[[], bool]):
        self._settings = settings
        self._ledger = ledger
        self._input_size = input_size
        self._sink = sink
        self._context_ok = context_ok
        self._waiting = LatestFrame(ledger, REPLACED_BEFORE_PREPROCESSING)
        self._cond = self._waiting.cond
        self._stop = False
        self._stop_reason = ""
        self._thread: Optional[threading.Thread] = None

    @property
    def running(self) -> bool:
        return self._thread is not None

    def start(self) -> None:
        with self._cond:
            self._stop = False
        self._thread = threading.Thread(target=self._loop, name="lingbot_map_preprocess", daemon=True)
        self._thread.start()

    def offer(self, frame: Frame) -> None:
        """From the image callback: the frame waits for preprocessing (replacing a waiting one)."""
        self._waiting.put(frame)

    def stop(self, reason: str, timeout: float = 30.0) -> None:
        """Join the thread (it finishes the frame in hand first); frames not handed on yet end
        DROPPED_INACTIVE with ``reason``."""
        with self._cond:
            self._stop = True
            self._stop_reason = reason
            self._cond.notify_all()
        thread, self._thread = self._thread, None
        if thread is not None and thread.is_alive() and thread is not threading.current_thread():
            thread.join(timeout)
        self._drop(self._waiting.take(), reason)

    def _drop(self, frame: Optional[Frame], reason: str) -> None:
        if frame is not None and self._context_ok():
            self._ledger.finish(frame.header, FrameStatus.DROPPED_INACTIVE, reason)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._stop and not self._waiting.waiting:
                    self._cond.wait(0.5)
                if self._stop:
                    return
                frame = self._waiting.take()
            try:
                self._handle(frame)
            except Exception as exc:  # the frame was ended or handed on before this; the stage lives on
                if not self._context_ok():
                    return  # shutting down: the status publisher is gone
                self._ledger.record_error(f"preprocessing thread: {type(exc).__name__}: {exc}", exc)
            with self._cond:
                if self._stop:
                    return

    def _handle(self, frame: Frame) -> None:
        """Preprocess ``frame`` and hand it on, unless it was rejected or the stage stopped meanwhile."""
        if not self._preprocess(frame):
            return
        with self._cond:
            stopped, reason = self._stop, self._stop_reason
        if stopped:  # deactivated while it was preprocessed: it goes no further
            self._drop(frame, reason)
            return
        self._sink(frame)

    def _preprocess(self, frame: Frame) -> bool:
        """RGB -> the model's input tensor on ``frame.model_image``; False when the frame was rejected."""
        t0 = time.perf_counter()
        frame.pre_start = t0
        frame.handoff_ms = (t0 - frame.received) * 1e3 - frame.convert_ms
        try:
            preproc = self._input_size.check(*frame.wh)  # a new session may have started since the callback
            preproc.fast_resize = self._settings.current.fast_resize  # the resize method applies from the next frame
            frame.model_image = preproc(frame.rgb)
        except InputRejected as exc:
            self._ledger.reject(frame.header, exc.kind, str(exc))
            return False
        except ValueError as exc:
            self._ledger.reject(frame.header, "unsupported", f"preprocessing failed: {exc}")
            return False
        except Exception as exc:  # noqa: BLE001 - a preprocessing fault fails this frame, not the stage
            if not self._context_ok():
                raise
            # The frame never reached the model, so it is not FAILED_INFERENCE: it is turned away at
            # the input, counted under its own kind, and the unexpected error is logged in full.
            reason = f"preprocessing failed: {type(exc).__name__}: {exc}"
            self._ledger.record_error(reason, exc)
            self._ledger.reject(frame.header, PREPROCESSING_FAILED, reason)
            return False
        frame.pre_end = time.perf_counter()
        frame.preprocess_ms = (frame.pre_end - t0) * 1e3
        frame.rgb = None  # the tensor is what travels on; the camera image is not needed any more
        return True


class PipelineTimeline:
    """When each stage worked on the last frames, and how often preprocessing overlapped the model.

    The inference thread records every pushed frame; /diagnostics shows the last ``TIMELINE_FRAMES``
    as ``stamp:preprocess start:preprocess end:push start:push end`` (ms since ``origin``) and counts
    the frames whose preprocessing ran while the previous frame was inside ``SessionManager.push``.
    """

    def __init__(self, origin: float):
        self._origin = origin
        self._lock = threading.Lock()
        self._frames: collections.deque = collections.deque(maxlen=TIMELINE_FRAMES)
        self._previous_push: Optional[tuple[float, float]] = None
        self.overlapped = 0

    def record(self, frame: Frame) -> None:
        with self._lock:
            previous = self._previous_push
            if previous is not None and frame.pre_start < previous[1] and frame.pre_end > previous[0]:
                self.overlapped += 1
            self._previous_push = (frame.push_start, frame.push_end)
            o = self._origin
            self._frames.append((frame.header.stamp.sec * 10**9 + frame.header.stamp.nanosec,
                                 (frame.pre_start - o) * 1e3, (frame.pre_end - o) * 1e3,
                                 (frame.push_start - o) * 1e3, (frame.push_end - o) * 1e3))

    def read(self) -> tuple[list, int]:
        with self._lock:
            return list(self._frames), self.overlapped


__all__ = ["PREPROCESSING_FAILED", "PipelineTimeline", "PreprocessStage", "REPLACED_BEFORE_PREPROCESSING"]
