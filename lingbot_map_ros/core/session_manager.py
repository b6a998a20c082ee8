"""SessionManager: the one owner of a camera stream's sessions - session, long-run policy, settings.

Every caller that streams frames goes through it (the node, the offline tool, the benchmarks); it is
the only code that builds a ``StreamingSession``. The model is a ``ModelHost`` (``model_host.py``),
which several managers (several cameras) may share.

* **frames** - ``push``: the policy admits the frame, the session processes it; at the session's
  stored-frame limit (``StoredFrameLimit``, raised before anything changed) the policy decides
  (``at_limit``: refuse, a new session, or push again in its next window) and the manager acts from
  outside the session. Results are mapped into the world frame by the policy (``to_world``).
* **new sessions** - a reset, a settings change, the policy, a model fault, the caller (non-finite
  outputs, a time jump) or a loaded session: all go through ``_start_session``, which starts the
  session and the policy in a new world frame (a loaded state fills it there), collects the buffered
  frames it drops and tells the listener (``on_new_session``) with the cause.
* **faults** - a step that raises (out of memory included) may have written part of its pages: one
  path, a new session, then ``InferenceFailed`` carrying the cause as text (the traceback's frames,
  which hold the step's tensors, are released).
* **settings** - ``apply``: a runtime field builds a **new model** on the host first (a failure keeps
  the running one); a ``session`` field of the settings table starts a **new session**; a ``budget``
  field re-checks the memory budget (a new session only when the fitted window changes); the rest
  applies **from the next frame**. Every change is checked against the budget before anything is built.
* **saved sessions** - ``save``/``load`` and their halves through ``SessionArchive``
  (``session_archive.py``); ``session.mapping = False`` localizes (nothing stored).

Session ids are monotonic. Not thread-safe by design: one thread (the node's inference thread) owns
the manager; other threads read ``view()`` snapshots, which are data only.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Optional

import numpy as np
import torch

from .config import ModelConfig, RuntimeConfig, StreamConfig, validate_runtime, validate_stream
from .long_run import LimitAction, LongRunPolicy, Refeed, make_policy, policy_class
from .memory_budget import BudgetCheck, MemoryBudget, MemoryReport, allocated_bytes
from .model_host import ModelHost, preview
from .results import CacheSnapshot, FrameResult, SessionInfo
from .runtime import ResolvedRuntime
from .session_archive import LoadReport, SessionArchive
from .session_errors import SessionError, SessionStopped, StoredFrameLimit
from .session_events import ApplyResult, Change, InferenceFailed, SessionCause, SessionStart
from .session_store import PreparedSession, SaveReport, SessionCapture
from .settings import applies_of_field
from .stream import Processed, StreamingSession


@dataclass(frozen=True)
class ManagerView:
    """What another thread may read of the manager: a snapshot taken by the owning thread, data only
    (nothing in it reaches back into the live manager)."""

    session_id: int = 0
    runtime: Optional[RuntimeConfig] = None
    stream_cfg: Optional[StreamConfig] = None
    info: Optional[SessionInfo] = None
    buffered: int = 0
    window_index: int = 0
    window_switches: int = 0
    snapshot: CacheSnapshot = field(default_factory=CacheSnapshot)
    warnings: tuple[str, ...] = ()
    last_start: Optional[SessionStart] = None
    memory: Optional[MemoryReport] = None  # predicted next to allocated (docs/memory.md)
    budget: Optional[BudgetCheck] = None  # the model and budget a parameter check runs against

    def memory_problems(self, runtime: RuntimeConfig, stream: StreamConfig) -> list[str]:
        """Why settings not applied yet would not fit the memory budget ([]: they fit, or no model
        yet); reads only this snapshot (the node refuses a parameter change with it)."""
        if self.budget is None:
            return []
        return self.budget.problems(runtime, stream, lambda s: settings_problems(runtime, s))


def settings_problems(runtime: RuntimeConfig, stream: StreamConfig) -> list[str]:
    """Every reason the settings cannot run, the long-run policy's own ones too (nothing is built)."""
    problems = validate_runtime(runtime) + validate_stream(stream)
    if not problems:  # the policy name is known now
        problems = policy_class(stream.long_run_policy).problems(stream)
    return problems


def changed_fields(old, new) -> tuple[str, ...]:
    """Names of the dataclass fields whose values differ between two configs of one type."""
    return tuple(f.name for f in fields(old) if getattr(old, f.name) != getattr(new, f.name))


class SessionManager:
    """The sessions of one camera stream over a model host, and the one place that starts them or
    applies settings."""

    def __init__(self, host: ModelHost, stream: StreamConfig, log: Callable[[str], None] = print, *,
                 warn: Optional[Callable[[str], None]] = None, budget: Optional[MemoryBudget] = None) -> None:
        """Checks the settings against the host's model and the memory budget and builds the first
        session (raises with the reason when it cannot). ``warn``: where a fitted window is reported
        (default ``log``); ``budget``: the memory budget (``open`` hands in the one it resolved
        before the model was built)."""
        problems = settings_problems(host.settings, stream)
        if problems:
            raise ValueError("; ".join(problems))
        self._log = log
        self._warn = warn if warn is not None else log
        self._memory = budget if budget is not None else MemoryBudget()
        self._owns_host = False
        self.host = host
        fitted = self._fit_memory(host.cfg, host.resolved, host.settings, stream)
        self._memory.adopt(stream, fitted)
        # Called with every SessionStart after the first session (the node counts them, renews its
        # input size, clears its path and map); set it once the listener exists.
        self.on_new_session: Optional[Callable[[SessionStart], None]] = None
        self.policy: LongRunPolicy = make_policy(fitted)
        self._session = StreamingSession(host.model, host.cfg, fitted, host.resolved, log)
        self._built_for = host.settings  # the runtime settings of the model the session runs on
        self._session_id = 0
        self.last_start = SessionStart(0, SessionCause.STARTED, "first session")

    @classmethod
    def open(cls, runtime: RuntimeConfig, stream: StreamConfig, log: Callable[[str], None] = print,
             warn: Optional[Callable[[str], None]] = None,
             load: Optional[Callable[[RuntimeConfig, Callable[[str], None]], ModelHost]] = None) -> "SessionManager":
        """A manager with a model host of its own (released with it): the settings and the memory
        budget are checked before the model is built. ``load``: how the host builds its models
        (``ModelHost.load`` unless given; the benchmark's precision recipes)."""
        problems = settings_problems(runtime, stream)
        if problems:
            raise ValueError("; ".join(problems))
        budget = MemoryBudget()
        budget.fit(*preview(runtime), stream, lambda s: settings_problems(runtime, s))  # raises with the numbers
        host = (load or ModelHost.load)(runtime, log)
        host.builder = load
        manager = cls(host, stream, log, warn=warn, budget=budget)
        manager._owns_host = True
        return manager

    @classmethod
    def around(cls, model: Any, cfg: ModelConfig, stream: StreamConfig, runtime: ResolvedRuntime,
               log: Callable[[str], None] = print, *, settings: Optional[RuntimeConfig] = None,
               random_weights: bool = True) -> "SessionManager":
        """A manager over a model that is built already (``ModelHost.around``): the benchmark's
        variants share one model, tests stream through stand-in models."""
        return cls(ModelHost.around(model, cfg, runtime, settings=settings, random_weights=random_weights),
                   stream, log)

    # ------------------------------------------------------------------ what the owner reads
    @property
    def session(self) -> StreamingSession:
        return self._session

    @property
    def session_id(self) -> int:
        """Monotonic over resets, new sessions and new models."""
        return self._session_id

    @property
    def stream_cfg(self) -> StreamConfig:
        """The stream settings in use (the fitted window, the budget's depth chunk)."""
        return self._session.stream_cfg

    def pending_stamps(self) -> list[Any]:
        """Stamps of the frames buffered for the joint scale-frame call (re-fed overlap frames excluded)."""
        return [s for s in self._session.pending_stamps() if not isinstance(s, Refeed)]

    def warnings(self) -> list[str]:
        return list(self.policy.warnings(self._session.warnings())) + self._memory.warning()

    def view(self) -> ManagerView:
        """A snapshot for other threads (the node's diagnostics and parameter checks run on the
        executor thread)."""
        host, session, policy = self.host, self._session, self.policy
        return ManagerView(
            session_id=self._session_id, runtime=host.settings, stream_cfg=session.stream_cfg, info=host.info,
            buffered=session.buffered, window_index=policy.window_index, window_switches=policy.window_switches,
            snapshot=session.snapshot(), warnings=tuple(self.warnings()), last_start=self.last_start,
            memory=self.memory_report(),
            budget=BudgetCheck(host.settings, host.cfg, host.resolved, self._memory.snapshot()),
        )

    # ------------------------------------------------------------------ memory (docs/memory.md)
    def _fit_memory(self, cfg: ModelConfig, rt: ResolvedRuntime, runtime: RuntimeConfig,
                    stream: StreamConfig) -> StreamConfig:
        """``stream`` as it fits the budget (``fit_window``: its window shrunk, warned); raises
        ``MemoryBudgetExceeded`` with the numbers."""
        fitted, warning = self._memory.fit(cfg, rt, stream, lambda s: settings_problems(runtime, s))
        if warning:
            self._warn(warning)
        return fitted

    def memory_report(self) -> MemoryReport:
        host, session = self.host, self._session
        predicted = self._memory.predict(host.cfg, host.resolved, self.stream_cfg, session.cache_frame_size).total
        allocated = allocated_bytes(session.device, host.model, session.caches())
        return MemoryReport(predicted, allocated, self._memory.bytes_for(self.stream_cfg, session.device),
                            self._memory.fitted_window, self._memory.configured_window)

    def budgeted_bytes(self) -> int:
        """The footprint the memory budget holds these settings to: at the configured width's tallest
        frame (a new camera may start a session at any size while a copy of the old one is kept)."""
        return int(self._memory.predict(self.host.cfg, self.host.resolved, self.stream_cfg).total)

    def staging_fits(self, nbytes: int) -> bool:
        """Whether a copy of ``nbytes`` may sit in device memory beside the session for a while (a
        save's capture, a load's staged files; ``MemoryBudget.staging_fits``)."""
        return self._memory.staging_fits(nbytes, self.stream_cfg, self._session.device, self.budgeted_bytes)

    # ------------------------------------------------------------------ saved sessions (SessionArchive)
    @property
    def archive(self) -> SessionArchive:
        """The saved sessions of this manager (made per use: no reference cycle keeps a dropped manager)."""
        return SessionArchive(self)

    def save(self, path: str, extra: Optional[dict] = None) -> SaveReport:
        """Write the current session to the folder ``path`` (``core/session_store.py``); nothing in
        the session changes. ``SessionError`` when there is no map yet, ``SessionFileError`` when it
        cannot be written (the previous folder there is then intact)."""
        return self.archive.capture(extra).write(path)

    def capture(self, extra: Optional[dict] = None, on_device: Optional[bool] = None) -> SessionCapture:
        """``SessionArchive.capture``: the session copied between two frames, written later."""
        return self.archive.capture(extra, on_device)

    def prepare_load(self, path: str, on_device: Optional[bool] = None) -> PreparedSession:
        """``SessionArchive.prepare``: read and check a saved session (any thread)."""
        return self.archive.prepare(path, on_device)

    def commit_load(self, prepared: PreparedSession) -> LoadReport:
        """Replace the current session by a prepared one (between two frames): the next frame
        continues it exactly. The identity and state are checked again (settings may have changed
        since ``prepare_load``; ``SessionFileError``, the current session kept); then a new session
        starts (``SessionCause.LOADED``) and the saved state fills it. When that fails, the new
        session stays empty (heard as a failure) and the error is raised."""
        start = time.perf_counter()
        self.archive.check_commit(prepared)
        session_start = self._start_session(f"session loaded from {prepared.path}", SessionCause.LOADED,
                                            fill=lambda: self.archive.restore(prepared))
        return self.archive.report(prepared, session_start.session_id, time.perf_counter() - start)

    def load(self, path: str, on_device: Optional[bool] = None) -> LoadReport:
        """``prepare_load`` then ``commit_load``, on the calling thread."""
        return self.commit_load(self.prepare_load(path, on_device))

    # ------------------------------------------------------------------ frames
    def push(self, frame: torch.Tensor | np.ndarray, stamp: Any = None) -> list[FrameResult]:
        """Frames processed now, in the world frame. ``SessionError`` for a frame refused (nothing
        changed); ``InferenceFailed`` when the model raised (a new session was started)."""
        try:
            self.policy.admit()
            try:
                processed = self._session.push(frame, stamp)
            except StoredFrameLimit as limit:
                processed = self._at_limit(frame, stamp, limit)
            return [self.policy.to_world(p) for p in processed]
        except SessionError:
            raise
        except Exception as exc:  # noqa: BLE001 - any model fault: only a new session is known to be consistent
            failure = self._failure(exc, stamp)
        raise failure from None  # outside the except block: the cause's frames are already released

    def flush(self) -> list[FrameResult]:
        """The frames still buffered for the joint scale-frame call, processed now (a stream that ended
        before ``scale_frames`` frames)."""
        try:
            return [self.policy.to_world(p) for p in self._session.flush()]
        except SessionError:
            raise
        except Exception as exc:  # noqa: BLE001 - as in push
            failure = self._failure(exc, None)
        raise failure from None

    def reset(self, reason: str = "reset requested", cause: SessionCause = SessionCause.RESET) -> SessionStart:
        """A new session (new world frame, caches emptied); the start says which buffered frames it dropped."""
        return self._start_session(reason, cause)

    def _at_limit(self, frame: Any, stamp: Any, limit: StoredFrameLimit) -> list[Processed]:
        """The session signalled its stored-frame limit: the policy decides, the manager acts."""
        try:
            decision = self.policy.at_limit(self._session, limit)
        except SessionStopped:
            raise  # refused; the policy changed nothing
        except SessionError as exc:  # the policy may have changed the session already: a fault
            raise RuntimeError(f"long-run policy '{self.policy.name}' at the stored-frame limit: {exc}") from None
        if decision.action is LimitAction.NEW_SESSION:
            self._start_session(decision.reason, SessionCause.POLICY)
        # PUSH_AGAIN: the policy made room. A second StoredFrameLimit here would be a policy bug, and
        # is not a SessionError: it takes the failure path.
        return self._session.push(frame, stamp)

    def _failure(self, exc: BaseException, stamp: Any) -> InferenceFailed:
        start = self._start_session(f"inference failed: {type(exc).__name__}: {exc}", SessionCause.FAILURE,
                                    keep=stamp)
        failure = InferenceFailed(exc, start)  # drops the failed step's frames and tensors
        if isinstance(exc, torch.cuda.OutOfMemoryError):
            torch.cuda.empty_cache()  # give the freed blocks back, for the next frame and others
        return failure

    # ------------------------------------------------------------------ settings
    def apply(self, runtime: RuntimeConfig, stream: StreamConfig) -> ApplyResult:
        """Apply new settings; raises (and changes nothing) when they cannot run, do not fit the memory
        budget, or a new model cannot be built."""
        problems = settings_problems(runtime, stream)
        if problems:
            raise ValueError("; ".join(problems))
        requested, host = stream, self.host
        runtime_changes = changed_fields(host.settings, runtime)
        stream = self._fit_memory(*(preview(runtime) if runtime_changes else (host.cfg, host.resolved)), runtime,
                                  stream)  # refused with the numbers: nothing changes
        if runtime_changes:
            host.swap(runtime, self._log)  # may raise: the old model keeps running
        self._memory.adopt(requested, stream)
        if self._session.model is not host.model:  # a new model (this change, or another manager's over the host)
            changes = changed_fields(self._built_for, host.settings)
            discarded = self.pending_stamps()
            self._adopt_policy(stream)
            mapping = self._session.mapping
            self._session = StreamingSession(host.model, host.cfg, stream, host.resolved, self._log)
            self._session.mapping = mapping
            self._built_for = host.settings
            start = self._start_session(f"parameters {list(changes)} changed (new model)",
                                        SessionCause.PARAMETERS, discarded=discarded)
            return ApplyResult(Change.NEW_MODEL, changes, start.discarded)
        old = self._session.stream_cfg
        stream_changes = changed_fields(old, stream)  # the fitted settings: a budget that keeps the window, none
        session_changes = tuple(f for f in stream_changes if applies_of_field(f) == "session")
        if session_changes:
            self._session.reconfigure(stream)
            self._adopt_policy(stream)
            start = self._start_session(f"parameters {list(session_changes)} changed", SessionCause.PARAMETERS)
            return ApplyResult(Change.NEW_SESSION, session_changes, start.discarded)
        if not stream_changes:
            return ApplyResult(Change.NONE)
        if stream.keyframe_interval != old.keyframe_interval:
            self._session.set_keyframe_interval(stream.keyframe_interval)
            self._log(f"keyframe_interval {old.keyframe_interval} -> {stream.keyframe_interval} from the next frame")
        # the rest is read at the next frame: the depth head's switch, rhythm and chunk (the budget's
        # choice), and budget fields whose fitted window is the one in use
        self._session.stream_cfg = stream
        if stream.depth_every != old.depth_every:
            self._log(f"depth_every {old.depth_every} -> {stream.depth_every} from the next frame")
        if stream.with_depth and not old.with_depth and not self.host.info.depth_available:
            self._log("depth requested but this model has no depth head: depth outputs stay silent")
        return ApplyResult(Change.NEXT_FRAME, stream_changes)

    def release(self) -> None:
        """Drop the session, and the model when the host is the manager's own (lifecycle cleanup):
        GPU memory goes back to the driver."""
        device = self._session.device
        del self._session
        if self._owns_host:
            self.host.release()
        elif device.type == "cuda":
            torch.cuda.empty_cache()

    def start_after(self, last_session_id: int, reason: str, cause: SessionCause) -> SessionStart:
        """A new session numbered after ``last_session_id``: a stream its owner rebuilt goes on counting."""
        self._session_id = max(self._session_id, last_session_id)
        return self._start_session(reason, cause)

    # ------------------------------------------------------------------ the one path of a new session
    def _start_session(self, reason: str, cause: SessionCause, *, discarded: Optional[list[Any]] = None,
                       keep: Any = None, fill: Optional[Callable[[], None]] = None) -> SessionStart:
        """Every new session: the session and the policy start a new world frame; ``fill`` writes a
        loaded state into it before anyone hears of it (when it raises, the session starts empty,
        heard as a failure, and the error goes on to the caller); the buffered frames it drops
        (``keep``: the caller's own frame, which it ends itself) go to the listener."""
        if discarded is None:
            discarded = self.pending_stamps()
        self._session_id = session_id = self._session_id + 1
        self._session.reset(session_id)
        self.policy.reset(self._session.stream_cfg)
        error: Optional[BaseException] = None
        if fill is not None:
            try:
                fill()
            except BaseException as exc:  # noqa: BLE001 - re-raised below, once the empty session is heard of
                error = exc
                self._session.reset(session_id)
                self.policy.reset(self._session.stream_cfg)
                cause, reason = SessionCause.FAILURE, f"{reason} failed: {type(exc).__name__}: {exc}"
        start = SessionStart(session_id, cause, reason, tuple(s for s in discarded if s is not keep))
        self.last_start = start
        if self.on_new_session is not None:
            self.on_new_session(start)
        if error is not None:
            raise error
        return start

    def _adopt_policy(self, stream: StreamConfig) -> None:
        """A changed ``long_run_policy`` swaps the policy object; the same policy keeps its object
        (its ``window_switches`` keep counting) and is reset with the new session."""
        if type(self.policy) is not policy_class(stream.long_run_policy):
            self.policy = make_policy(stream)


__all__ = [
    "ApplyResult", "Change", "InferenceFailed", "LoadReport", "ManagerView", "SaveReport", "SessionCapture",
    "SessionCause", "SessionManager", "SessionStart", "changed_fields", "settings_problems",
]
