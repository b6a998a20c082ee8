"""SessionManager: owns the current streaming session and decides what a settings change needs.

Every caller that lets settings change while frames stream (the node's parameters, a tool) hands
the new ``(RuntimeConfig, StreamConfig)`` to ``apply`` and gets back what happened:

* a runtime field changed (checkpoint, preset, device, dtype, backend, ...): a **new model** is
  built first and only then swapped in, so a failure leaves the running model untouched;
* a cache/stream geometry field changed (``applies == "session"`` in ``settings.py``): a **new
  session** (new world frame) on the same model, by ``StreamingSession.reconfigure``; a changed
  ``long_run_policy`` is one of these: the session swaps its policy object (``long_run.py``), so
  model, caches and resolved runtime stay and one session class serves every policy;
* ``keyframe_interval`` or the depth head: applied **from the next frame**, same session.

Frames buffered for the joint scale-frame call are discarded by a reset or a new session; their
stamps come back in ``ApplyResult.discarded`` / from ``reset`` so the caller can give each one a
final status. Session ids stay monotonic across model swaps (``session_id``).

A model step that raises (a fault, CUDA out of memory) may have written part of its K/V pages and
evicted a window frame: no earlier state can be restored without copies, so ``push`` starts a new
session and raises ``InferenceFailed`` with the frames that reset discarded.

Not thread-safe by design: one thread (the node's inference thread) owns the manager.
"""
from __future__ import annotations

import enum
import traceback
from dataclasses import dataclass, field, fields
from typing import Any, Callable

import numpy as np
import torch

from .config import RuntimeConfig, StreamConfig, model_config, replace
from .results import CacheSnapshot, FrameResult
from .settings import applies_of_field
from .stream import SessionError, SessionInfo, StreamingSession, make_session


class InferenceFailed(RuntimeError):
    """The model raised for a frame; the session was started anew (``discarded``: the other frames
    that were buffered with it, whose stamps need a final status)."""

    def __init__(self, cause: BaseException, discarded: list[Any]) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        # The traceback's frames hold the failed step's tensors (for an out-of-memory, gigabytes of
        # activations): keep it as text and let the frames go now, not whenever the caller drops us.
        self.detail = "".join(traceback.format_exception(cause))
        cause.__traceback__ = None
        self.cause = cause
        self.discarded = discarded


class Change(str, enum.Enum):
    NONE = "nothing to apply"
    NEXT_FRAME = "applied from the next frame"
    NEW_SESSION = "new session"
    NEW_MODEL = "new model"


@dataclass(frozen=True)
class ApplyResult:
    change: Change
    fields: tuple[str, ...] = ()  # the RuntimeConfig/StreamConfig fields that differed
    discarded: list[Any] = field(default_factory=list)  # stamps of buffered frames the change dropped


MEMORY_HEADROOM = 1.25  # weights x this must fit in free device memory (activations and caches come on top)


def model_change_problems(runtime: RuntimeConfig) -> list[str]:
    """Every reason why a model for ``runtime`` cannot be built here, found before building it:
    device/dtype/backend, the checkpoint file (readable, safe, every key with its shape for the
    preset) and the device memory for the weights. Cheap: nothing is allocated."""
    from .model.checkpoint import CheckpointError, check_checkpoint, model_bytes
    from .runtime import resolve_runtime

    try:
        resolved = resolve_runtime(runtime)
    except (ValueError, RuntimeError) as exc:
        return [str(exc)]
    preset = runtime.resolved_preset()
    cfg = model_config(preset)
    problems: list[str] = []
    if runtime.checkpoint:
        try:
            check_checkpoint(cfg, runtime.checkpoint, allow_unsafe=runtime.allow_unsafe_checkpoint)
        except (CheckpointError, OSError, ValueError) as exc:
            problems.append(f"checkpoint {runtime.checkpoint!r} (model_preset {preset!r}): {exc}")
    if resolved.device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(resolved.device)
        need = model_bytes(cfg, resolved.dtype) * MEMORY_HEADROOM
        if need > free:
            problems.append(f"{resolved.device} has {free / 2**30:.1f} GiB free, the '{preset}' model needs "
                            f"~{need / 2**30:.1f} GiB")
    return problems


def changed_fields(old, new) -> tuple[str, ...]:
    """Names of the dataclass fields whose values differ between two configs of one type."""
    return tuple(f.name for f in fields(old) if getattr(old, f.name) != getattr(new, f.name))


class SessionManager:
    """The current session of one camera stream, and the one place that applies setting changes."""

    def __init__(self, runtime: RuntimeConfig, stream: StreamConfig, log: Callable[[str], None] = print,
                 build: Callable[..., StreamingSession] = make_session) -> None:
        """Builds the model and the first session (raises with the reason when it cannot)."""
        self._log = log
        self._build = build
        self._session = build(runtime, stream, log=log)
        self.runtime = runtime
        self._id_base = 0  # published session id = base + the session object's own id

    # ------------------------------------------------------------------ what the caller reads
    @property
    def session(self) -> StreamingSession:
        return self._session

    @property
    def session_id(self) -> int:
        """Monotonic over resets, new sessions and new models."""
        return self._id_base + int(self._session.session_id)

    @property
    def stream_cfg(self) -> StreamConfig:
        return self._session.stream_cfg

    @property
    def info(self) -> SessionInfo:
        return self._session.info

    @property
    def buffered(self) -> int:
        return self._session.buffered

    def snapshot(self) -> CacheSnapshot:
        return self._session.snapshot()

    def warnings(self) -> list[str]:
        return list(self._session.warnings())

    # ------------------------------------------------------------------ frames
    def push(self, frame: torch.Tensor | np.ndarray, stamp: Any = None) -> list[FrameResult]:
        """Frames processed now; ``SessionError`` for a frame the session refuses (state unchanged),
        ``InferenceFailed`` when the model raised (the session was reset)."""
        try:
            return self._session.push(frame, stamp=stamp)
        except SessionError:
            raise
        except Exception as exc:  # noqa: BLE001 - any model fault: only a new session is known to be consistent
            discarded = [s for s in self.reset() if s is not stamp]
            failure = InferenceFailed(exc, discarded)  # drops the failed step's frames and tensors
            if isinstance(exc, torch.cuda.OutOfMemoryError):
                torch.cuda.empty_cache()  # give the freed blocks back, for the next frame and others
        raise failure from None  # outside the except block: the cause's frames are already released

    def flush(self) -> list[FrameResult]:
        """The frames still buffered for the joint scale-frame call, processed now (a stream that ended
        before ``scale_frames`` frames)."""
        return self._session.flush()

    def reset(self) -> list[Any]:
        """New session (new world frame, caches emptied); returns the discarded buffered frames' stamps."""
        discarded = self._session.pending_stamps()
        self._session.reset()
        return discarded

    # ------------------------------------------------------------------ settings
    def apply(self, runtime: RuntimeConfig, stream: StreamConfig) -> ApplyResult:
        """Apply new settings; raises (and changes nothing) when a new model cannot be built."""
        runtime_changes = changed_fields(self.runtime, runtime)
        if runtime_changes:
            new = self._build(runtime, stream, log=self._log)  # may raise: the old model keeps running
            discarded = self._session.pending_stamps()
            self._swap(new)
            self.runtime = runtime
            return ApplyResult(Change.NEW_MODEL, runtime_changes, discarded)
        old = self._session.stream_cfg
        stream_changes = changed_fields(old, stream)
        session_changes = tuple(f for f in stream_changes if applies_of_field(f) == "session")
        if session_changes:
            discarded = self._session.pending_stamps()
            self._session.reconfigure(stream)  # may raise (bad window settings): then nothing changed
            return ApplyResult(Change.NEW_SESSION, session_changes, discarded)
        if not stream_changes:
            return ApplyResult(Change.NONE)
        if stream.keyframe_interval != old.keyframe_interval:
            self._session.set_keyframe_interval(stream.keyframe_interval)
            self._log(f"keyframe_interval {old.keyframe_interval} -> {stream.keyframe_interval} from the next frame")
        if stream.with_depth != old.with_depth:
            # the depth head reads the same tokens: no cache change, so no new session
            self._session.stream_cfg = replace(self._session.stream_cfg, with_depth=stream.with_depth)
            if stream.with_depth and not self._session.info.depth_available:
                self._log("depth requested but this model has no depth head: depth outputs stay silent")
        return ApplyResult(Change.NEXT_FRAME, stream_changes)

    def release(self) -> None:
        """Drop the session and the model (lifecycle cleanup): GPU memory goes back to the driver."""
        device = self._session.device
        del self._session
        if device.type == "cuda":
            torch.cuda.empty_cache()

    def _swap(self, new: StreamingSession) -> None:
        self._id_base = self.session_id + 1 - int(new.session_id)
        self._session = new


__all__ = ["ApplyResult", "Change", "InferenceFailed", "SessionManager", "changed_fields", "model_change_problems"]
