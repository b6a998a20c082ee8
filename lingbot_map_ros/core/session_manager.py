"""SessionManager: the one owner of a camera stream's sessions - model, session, long-run policy.

Every caller that streams frames goes through it (the node's inference thread, the offline tool,
the benchmarks), and it is the only code that builds a model or a ``StreamingSession``:

* **frames** - ``push``: the policy admits the frame, the session processes it, and when the session
  signals its stored-frame limit (``StoredFrameLimit``, raised before anything changed) the manager
  asks the policy (``at_limit``) and acts on the answer from outside the session: refuse, start a new
  session, or push the frame again after the policy started the next window. Every result is mapped
  into the world frame by the policy (``to_world``). No push ever runs inside another.
* **new sessions** - whoever asks for one (a reset, a settings change, the long-run policy, a model
  fault, the caller after non-finite outputs or a time jump) gets it through ``_start_session``: the
  session and the policy start a new world frame, the buffered frames it discards are collected, and
  the listener (``on_new_session``) hears of it with the cause, so counters, input sizes and maps
  follow every session, not only the ones the caller started.
* **faults** - a model step that raises (CUDA out of memory included) may have written part of its
  K/V pages and evicted a window frame: no earlier state can be restored without copies, so every
  fault, during a window switch too, takes one path: a new session, then ``InferenceFailed`` carrying
  the cause as text (the traceback's frames, which hold the failed step's tensors, are released).
* **settings** - ``apply``: a runtime field changed (checkpoint, preset, device, dtype, backend, ...):
  a **new model** is built first and only then swapped in, so a failure leaves the running model
  untouched; a cache/stream geometry field (``applies == "session"`` in ``settings.py``): a **new
  session** on the same model (a changed ``long_run_policy`` swaps the policy object);
  ``keyframe_interval`` or the depth head: **from the next frame**, same session.

* **saved sessions** - ``save(path, extra)`` writes the session (the KV cache is the map) with each
  class's own state dict through ``session_store.py``; ``load(path)`` checks everything first (a
  refusal keeps the current session), then replaces the session in place as one more new session
  (``SessionCause.LOADED``) that continues exactly; ``mapping = False`` localizes (nothing stored).

Session ids are monotonic over everything above. Not thread-safe by design: one thread (the node's
inference thread) owns the manager; other threads read ``view()`` snapshots.
"""
from __future__ import annotations

import enum
import time
import traceback
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Optional

import numpy as np
import torch

from .config import ModelConfig, RuntimeConfig, StreamConfig, model_config, replace, validate_runtime, validate_stream
from .long_run import LimitAction, LongRunPolicy, Refeed, Sim3, WindowAlignment, make_policy, policy_class
from .memory_budget import MemoryBudget, MemoryReport, allocated_bytes
from .model import LingBotMap, build_model
from .results import CacheSnapshot, FrameResult, SessionInfo
from .runtime import ResolvedRuntime, resolve_runtime
from .session_errors import SessionError, SessionStopped, StoredFrameLimit
from .session_store import (
    SESSION_GEOMETRY,
    PreparedSession,
    SaveReport,
    SessionCapture,
    SessionFileError,
    checked_manifest,
    fit_problems,
    read_session,
    session_identity,
    verify_files,
    weights_identity,
)
from .settings import applies_of_field
from .stream import Processed, StreamingSession

MEMORY_HEADROOM = 1.25  # weights x this must fit in free device memory (activations and caches come on top)


class SessionCause(str, enum.Enum):
    """Why a session started (the node counts each cause)."""

    STARTED = "started"  # the manager's first session
    RESET = "reset"  # a caller's reset (the node's ~/reset)
    PARAMETERS = "parameters"  # settings changed: a new session, or a new model
    POLICY = "policy"  # the long-run policy asked for a new world frame
    FAILURE = "failure"  # the model raised
    NON_FINITE = "non_finite"  # the caller saw non-finite outputs in a row
    TIME_JUMP = "time_jump"  # the caller saw the stamps go back
    LOADED = "loaded"  # a saved session replaced the current one (``load``)


@dataclass(frozen=True)
class SessionStart:
    """A new session (a new world frame) and why it started."""

    session_id: int
    cause: SessionCause
    reason: str
    discarded: tuple[Any, ...] = ()  # stamps of the buffered frames it dropped (each needs a final status)


class InferenceFailed(RuntimeError):
    """The model raised for a frame; the manager started a new session (``start``)."""

    def __init__(self, cause: BaseException, start: SessionStart) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        # The traceback's frames hold the failed step's tensors (for an out-of-memory, gigabytes of
        # activations): keep it as text and let the frames go now, not whenever the caller drops us.
        self.detail = "".join(traceback.format_exception(cause))
        cause.__traceback__ = None
        self.cause = cause
        self.start = start

    @property
    def discarded(self) -> tuple[Any, ...]:
        return self.start.discarded


class Change(str, enum.Enum):
    NONE = "nothing to apply"
    NEXT_FRAME = "applied from the next frame"
    NEW_SESSION = "new session"
    NEW_MODEL = "new model"


@dataclass(frozen=True)
class ApplyResult:
    change: Change
    fields: tuple[str, ...] = ()  # the RuntimeConfig/StreamConfig fields that differed
    discarded: tuple[Any, ...] = ()  # stamps of buffered frames the change dropped


@dataclass(frozen=True)
class LoadedModel:
    """A model ready to stream: its shapes, the resolved runtime it runs with, and what that is."""

    model: LingBotMap
    cfg: ModelConfig
    runtime: ResolvedRuntime
    info: SessionInfo
    weights: str = ""  # where the weights came from: the checkpoint path, or random(seed=N)


@dataclass(frozen=True)
class ManagerView:
    """What another thread may read of the manager: a snapshot taken by the owning thread."""

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
    # the budget check of settings not applied yet (the node refuses a parameter change with it)
    memory_problems: Optional[Callable[[RuntimeConfig, StreamConfig], list[str]]] = None


@dataclass(frozen=True)
class LoadReport:
    """What ``SessionManager.load`` restored; ``extra``: the caller's own state saved with it."""

    path: str
    frames: int
    stored: int
    session_id: int
    seconds: float
    extra: dict = field(default_factory=dict)
    start: Optional["SessionStart"] = None
    pause_seconds: float = 0.0  # of which the commit between two frames (the stream's pause)
    staged_on: str = "host"  # where the files were read to before the commit

    def message(self) -> str:
        return (f"loaded session {self.path}: {self.frames} frames ({self.stored} stored), continuing as "
                f"session {self.session_id} in {self.seconds:.2f} s (the stream paused {self.pause_seconds:.3f} s; "
                f"staged on {self.staged_on})")


def session_info(runtime: ResolvedRuntime, cfg: ModelConfig, model: Any, *, random_weights: bool) -> SessionInfo:
    return SessionInfo(
        backend=runtime.backend,
        backend_reason=runtime.backend_reason,
        attention=runtime.attention,
        runtime_reasons=tuple(runtime.reasons),
        dtype=str(runtime.dtype).replace("torch.", ""),
        device=str(runtime.device),
        model_preset=cfg.preset,
        depth_available=getattr(model, "depth_head", None) is not None,
        random_weights=random_weights,
    )


def load_model(runtime: RuntimeConfig, log: Callable[[str], None] = print) -> LoadedModel:
    """The model for ``runtime``: resolved once, built (checkpoint weights or seeded random ones)
    straight in its compute dtype, cast for inference. Raises with the reason when it cannot."""
    resolved = resolve_runtime(runtime)
    preset = runtime.resolved_preset()
    cfg = model_config(preset)
    model, report = build_model(
        cfg, checkpoint=runtime.checkpoint, seed=runtime.seed, device=resolved.device,
        dtype=resolved.dtype,  # the aggregator is built/loaded in the compute dtype: one copy, no fp32 detour
        enable_depth=True, allow_unsafe=runtime.allow_unsafe_checkpoint,
    )
    if runtime.checkpoint:
        log(f"checkpoint {runtime.checkpoint}: {report.summary()}")
    else:
        log(f"NO CHECKPOINT: using random weights of the '{preset}' preset (seed {runtime.seed}); "
            "poses are NOT meaningful")
    cast_for_inference(model, resolved.dtype)
    info = session_info(resolved, cfg, model, random_weights=not runtime.checkpoint)
    log(f"attention backend {info.backend} ({info.backend_reason}); dtype {info.dtype}; device {info.device}")
    if resolved.device.type == "cuda":
        log(f"one-frame steps: {resolved.summary()}")
    return LoadedModel(model, cfg, resolved, info, weights=report.source)


def cast_for_inference(model: LingBotMap, dtype: torch.dtype) -> None:
    """Aggregator in the compute dtype; camera and depth heads stay fp32 (docs/model.md §14)."""
    model.eval()
    model.aggregator.to(dtype)


def settings_problems(runtime: RuntimeConfig, stream: StreamConfig) -> list[str]:
    """Every reason the settings cannot run, the long-run policy's own ones too (nothing is built)."""
    problems = validate_runtime(runtime) + validate_stream(stream)
    if not problems:  # the policy name is known now
        problems = policy_class(stream.long_run_policy).problems(stream)
    return problems


def model_change_problems(runtime: RuntimeConfig) -> list[str]:
    """Every reason why a model for ``runtime`` cannot be built here, found before building it:
    device/dtype/backend, the checkpoint file (readable, safe, every key with its shape for the
    preset) and the device memory for the weights. Cheap: nothing is allocated."""
    from .model.checkpoint import CheckpointError, check_checkpoint, model_bytes

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
    """The sessions of one camera stream, and the one place that starts them or applies settings."""

    def __init__(self, runtime: RuntimeConfig, stream: StreamConfig, log: Callable[[str], None] = print,
                 load: Optional[Callable[[RuntimeConfig, Callable[[str], None]], LoadedModel]] = None,
                 warn: Optional[Callable[[str], None]] = None) -> None:
        """Checks the settings, builds the model and the first session (raises with the reason when
        it cannot). ``load`` builds the model: ``load_model`` unless given (the benchmark hands in one
        that reuses a built model, tests stand-in models). ``warn``: where a fitted window is
        reported (default ``log``)."""
        problems = settings_problems(runtime, stream)
        if problems:
            raise ValueError("; ".join(problems))
        self._log = log
        self._warn = warn if warn is not None else log
        self._load = load if load is not None else load_model
        self._memory = MemoryBudget()
        requested = stream
        if load is None:  # the budget is checked before anything is allocated
            stream = self._fit_memory(*self._preview(runtime), runtime, stream)
        # Called with every SessionStart after the first session (the node counts them, renews its
        # input size, clears its path and map); set it once the listener exists.
        self.on_new_session: Optional[Callable[[SessionStart], None]] = None
        self.policy: LongRunPolicy = make_policy(stream)
        self.runtime = runtime
        self._loaded = self._load(runtime, log)
        if load is not None:
            stream = self._fit_memory(self._loaded.cfg, self._loaded.runtime, runtime, stream)
        self._memory.adopt(requested, stream)
        self._session = StreamingSession(self._loaded.model, self._loaded.cfg, stream, self._loaded.runtime, log)
        self._session_id = 0
        self.last_start = SessionStart(0, SessionCause.STARTED, "first session")

    @classmethod
    def around(cls, model: Any, cfg: ModelConfig, stream: StreamConfig, runtime: ResolvedRuntime,
               log: Callable[[str], None] = print, *, settings: Optional[RuntimeConfig] = None,
               random_weights: bool = True) -> "SessionManager":
        """A manager over a model that is built already: the benchmark's variants share one model,
        tests stream through stand-in models. ``settings``: the runtime settings it stands for (what
        ``apply`` compares with; default: the device, dtype and preset of ``runtime`` and ``cfg``)."""
        loaded = LoadedModel(model, cfg, runtime, session_info(runtime, cfg, model, random_weights=random_weights))
        if settings is None:
            settings = RuntimeConfig(device=str(runtime.device), dtype=str(runtime.dtype).replace("torch.", ""),
                                     model_preset=cfg.preset)
        return cls(settings, stream, log, load=lambda _runtime, _log: loaded)

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
        return self._session.stream_cfg

    @property
    def info(self) -> SessionInfo:
        return self._loaded.info

    @property
    def buffered(self) -> int:
        return self._session.buffered

    def pending_stamps(self) -> list[Any]:
        """Stamps of the frames buffered for the joint scale-frame call (re-fed overlap frames excluded)."""
        return [s for s in self._session.pending_stamps() if not isinstance(s, Refeed)]

    def snapshot(self) -> CacheSnapshot:
        return self._session.snapshot()

    def warnings(self) -> list[str]:
        return list(self.policy.warnings(self._session.warnings())) + self._memory.warning()

    # ------------------------------------------------------------------ memory (docs/memory.md)
    def _preview(self, runtime: RuntimeConfig) -> tuple[ModelConfig, ResolvedRuntime]:
        """The model shapes and resolved runtime of ``runtime``, nothing built."""
        return model_config(runtime.resolved_preset()), resolve_runtime(runtime)

    def _fit_memory(self, cfg: ModelConfig, rt: ResolvedRuntime, runtime: RuntimeConfig,
                    stream: StreamConfig) -> StreamConfig:
        """``stream`` as it fits the budget (``fit_window``: its window shrunk, warned); raises
        ``MemoryBudgetExceeded`` with the numbers."""
        fitted, warning = self._memory.fit(cfg, rt, stream, lambda s: settings_problems(runtime, s))
        if warning:
            self._warn(warning)
        return fitted

    def memory_problems(self, runtime: RuntimeConfig, stream: StreamConfig) -> list[str]:
        """Why these settings would not fit the budget ([]: they fit); changes nothing."""
        try:
            same_model = not changed_fields(self.runtime, runtime)
            cfg, rt = (self._loaded.cfg, self._loaded.runtime) if same_model else self._preview(runtime)
            self._memory.fit(cfg, rt, stream, lambda s: settings_problems(runtime, s))
        except ValueError as exc:
            return [str(exc)]
        return []

    def memory_report(self) -> MemoryReport:
        session = self._session
        hw = session._kv_hw  # the session's frame size once its caches exist
        predicted = self._memory.predict(self._loaded.cfg, self._loaded.runtime, self.stream_cfg, hw).total
        allocated = allocated_bytes(session.device, self._loaded.model, [session._kv, session._camera_kv])
        return MemoryReport(predicted, allocated, self._memory.bytes_for(self.stream_cfg, session.device),
                            self._memory.fitted_window, self._memory.configured_window)

    # the long-run window chain (a policy without windows: window 0, no switches, identity)
    @property
    def window_index(self) -> int:
        return self.policy.window_index

    @property
    def window_switches(self) -> int:
        return self.policy.window_switches

    @property
    def transform(self) -> Sim3:
        return self.policy.transform

    @property
    def last_alignment(self) -> Optional[WindowAlignment]:
        return self.policy.last_alignment

    @property
    def overlap_buffered(self) -> int:
        return self.policy.overlap_buffered

    def view(self) -> ManagerView:
        """A snapshot for other threads (the node's diagnostics run on the executor thread)."""
        return ManagerView(
            session_id=self.session_id, runtime=self.runtime, stream_cfg=self.stream_cfg, info=self.info,
            buffered=self.buffered, window_index=self.window_index, window_switches=self.window_switches,
            snapshot=self.snapshot(), warnings=tuple(self.warnings()), last_start=self.last_start,
            memory=self.memory_report(), memory_problems=self.memory_problems,
        )

    # ------------------------------------------------------------------ mapping and saved sessions
    @property
    def mapping(self) -> bool:
        """False: localization - frames get poses against the map, nothing is stored."""
        return self._session.mapping

    @mapping.setter
    def mapping(self, on: bool) -> None:
        self._session.mapping = bool(on)

    def identity(self) -> dict:
        """What a saved session is bound to: the weights, the model's shapes, the cache geometry, the dtype."""
        runtime = self.runtime
        return session_identity(weights_identity(runtime.checkpoint, self._loaded.cfg.preset, runtime.seed,
                                                 self.info.random_weights),
                                self._loaded.cfg, self.stream_cfg, self._session.dtype)

    def save(self, path: str, extra: Optional[dict] = None) -> SaveReport:
        """Write the current session to the folder ``path`` (``core/session_store.py``); nothing in
        the session changes. ``SessionError`` when there is no map yet, ``SessionFileError`` when it
        cannot be written (the previous folder there is then intact)."""
        return self.capture(extra).write(path)

    def budgeted_bytes(self) -> int:
        """The footprint the memory budget holds these settings to: at the configured width's tallest
        frame (a new camera may start a session at any size while a copy of the old one is kept)."""
        return int(self._memory.predict(self._loaded.cfg, self._loaded.runtime, self.stream_cfg).total)

    def staging_fits(self, nbytes: int) -> bool:
        """Whether a copy of ``nbytes`` may sit in device memory beside the session for a while (a
        save's capture, a load's staged files; ``MemoryBudget.staging_fits``)."""
        return self._memory.staging_fits(nbytes, self.stream_cfg, self._session.device, self.budgeted_bytes)

    def capture(self, extra: Optional[dict] = None, on_device: Optional[bool] = None) -> SessionCapture:
        """The current session's whole memory copied now (``SessionError``: no map yet).

        Only this copy has to happen between two frames; ``SessionCapture.write`` (the disk, seconds
        for gigabytes) may then run on another thread while the session goes on. The copy is made
        in device memory where ``staging_fits`` (``on_device`` None; True/False force it): a copy
        inside the device, milliseconds, and the write moves it to the host file by file; else it
        is a copy to host memory, which the stream waits for (seconds for gigabytes)."""
        start = time.perf_counter()
        session = self._session
        state = session.state_dict()  # SessionError: nothing to save yet
        if on_device is None:
            on_device = self.staging_fits(session.bytes_in_use())
        on_device = bool(on_device) and session.device.type == "cuda"
        manifest = {
            "identity": self.identity(), "session": state, "policy": self.policy.state_dict(),
            "mapping": self.mapping, "extra": dict(extra or {}),
            "frames": self._frames_handed_out(), "saved_on": str(session.device),
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        try:
            groups = self._copy_groups(on_device)
        except torch.OutOfMemoryError:  # the device filled up since the check: the host copy instead
            on_device = False
            groups = self._copy_groups(False)
        if session.device.type == "cpu":  # there .cpu() is the tensor itself: a view of a pool the next frame writes
            groups = [(name, {k: v.clone() for k, v in tensors.items()}) for name, tensors in groups]
        ready = None
        if on_device:
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(session.device))
        return SessionCapture(manifest, groups, int(manifest["frames"]), session.frames_stored,
                              time.perf_counter() - start, ready, session.device if on_device else None)

    def _copy_groups(self, on_device: bool) -> list[tuple[str, dict[str, torch.Tensor]]]:
        """A copy of the session's tensors, one entry per file of the saved session."""
        session = self._session
        groups = [(f"global_{b:03d}", session.block_tensors(b, on_device)) for b in range(session.num_cache_blocks)]
        return groups + [("camera", {"kv": session.camera_tensor(on_device)}), ("policy", self.policy.state_tensors())]

    def prepare_load(self, path: str, on_device: Optional[bool] = None) -> PreparedSession:
        """Read and check the session saved at ``path`` without touching the current one (any
        thread): not a session, damaged (CRC), a newer format, another checkpoint / model shape /
        geometry / dtype, a state that does not fit - each refused with ``SessionFileError`` naming
        the reason (or the fields that differ). Its files are staged in device memory where
        ``staging_fits`` (``on_device`` None), so ``commit_load`` is a copy inside the device."""
        start = time.perf_counter()
        manifest = checked_manifest(path, self.identity(), self._session.check_state)
        verify_files(path, manifest)
        if on_device is None:
            on_device = self.staging_fits(sum(int(f["bytes"]) for f in manifest["files"].values()))
        device = self._session.device if on_device and self._session.device.type == "cuda" else None
        try:
            groups = read_session(path, manifest, device)
        except torch.OutOfMemoryError:  # the device filled up since the check: commit from the mapped files
            device, groups = None, read_session(path, manifest, None)
        return PreparedSession(str(path), manifest, groups, str(device) if device is not None else "host",
                               time.perf_counter() - start)

    def commit_load(self, prepared: PreparedSession) -> LoadReport:
        """Replace the current session by a prepared one (between two frames): the next frame
        continues it exactly. The identity and state are checked again (settings may have changed
        since ``prepare_load``; ``SessionFileError``, the current session kept); the caches are
        written in place into the preallocated pools. The prepared tensors are released."""
        start = time.perf_counter()
        path, manifest, groups = prepared.path, prepared.manifest, prepared.groups
        _, problems = fit_problems(manifest, self.identity(), self._session.check_state)
        if problems:
            raise SessionFileError(f"session {path!r} no longer fits this node's settings: " + "; ".join(problems))
        # from here on the current session is replaced: a failure leaves a fresh, empty session
        discarded = self.pending_stamps()
        self._session_id = session_id = self._session_id + 1
        self._session.reset(session_id)
        self.policy.reset(self._session.stream_cfg)
        try:
            self._session.load_state(manifest["session"], lambda b: groups[f"global_{b:03d}"], groups["camera"]["kv"])
            self.policy.load_state(manifest["policy"], groups["policy"])
        except BaseException:
            self._session.reset(session_id)
            self.policy.reset(self._session.stream_cfg)
            raise
        finally:
            if self._session.device.type == "cuda":  # the copies read the staged tensors: done before they go
                torch.cuda.current_stream(self._session.device).synchronize()
            prepared.groups = {}
        reason = f"session loaded from {path}"
        self.last_start = session_start = SessionStart(session_id, SessionCause.LOADED, reason, tuple(discarded))
        if self.on_new_session is not None:
            self.on_new_session(session_start)
        pause = time.perf_counter() - start
        return LoadReport(str(path), int(manifest["frames"]), self._session.frames_stored, session_id,
                          prepared.seconds + pause, dict(manifest.get("extra") or {}), session_start,
                          pause, prepared.staged_on)

    def load(self, path: str, on_device: Optional[bool] = None) -> LoadReport:
        """``prepare_load`` then ``commit_load``, on the calling thread."""
        return self.commit_load(self.prepare_load(path, on_device))

    def _frames_handed_out(self) -> int:
        """The next frame's ``frame_index`` in the current world frame."""
        return self.policy.next_frame_index(self._session)

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
        """Apply new settings; raises (and changes nothing) when they cannot run or a new model
        cannot be built."""
        problems = settings_problems(runtime, stream)
        if problems:
            raise ValueError("; ".join(problems))
        requested = stream
        runtime_changes = changed_fields(self.runtime, runtime)
        preview = self._preview(runtime) if runtime_changes else (self._loaded.cfg, self._loaded.runtime)
        stream = self._fit_memory(*preview, runtime, stream)  # refused with the numbers: nothing changes
        if runtime_changes:
            loaded = self._load(runtime, self._log)  # may raise: the old model keeps running
            self._memory.adopt(requested, stream)
            discarded = self.pending_stamps()
            self._adopt_policy(stream)
            self._loaded, self.runtime = loaded, runtime
            mapping = self._session.mapping
            self._session = StreamingSession(loaded.model, loaded.cfg, stream, loaded.runtime, self._log)
            self._session.mapping = mapping
            start = self._start_session(f"parameters {list(runtime_changes)} changed (new model)",
                                        SessionCause.PARAMETERS, discarded=discarded)
            return ApplyResult(Change.NEW_MODEL, runtime_changes, start.discarded)
        self._memory.adopt(requested, stream)
        old = self._session.stream_cfg
        stream_changes = changed_fields(old, stream)
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
        if stream.depth_chunk != old.depth_chunk:  # the budget's choice of frames per depth-head call
            self._session.stream_cfg = replace(self._session.stream_cfg, depth_chunk=stream.depth_chunk)
        if stream.depth_every != old.depth_every:
            self._session.stream_cfg = replace(self._session.stream_cfg, depth_every=stream.depth_every)
            self._log(f"depth_every {old.depth_every} -> {stream.depth_every} from the next frame")
        if stream.with_depth != old.with_depth:
            # the depth head reads the same tokens: no cache change, so no new session
            self._session.stream_cfg = replace(self._session.stream_cfg, with_depth=stream.with_depth)
            if stream.with_depth and not self.info.depth_available:
                self._log("depth requested but this model has no depth head: depth outputs stay silent")
        return ApplyResult(Change.NEXT_FRAME, stream_changes)

    def release(self) -> None:
        """Drop the session and the model (lifecycle cleanup): GPU memory goes back to the driver."""
        device = self._session.device
        del self._session
        del self._loaded
        if device.type == "cuda":
            torch.cuda.empty_cache()

    # ------------------------------------------------------------------ the one path of a new session
    def _start_session(self, reason: str, cause: SessionCause, *, discarded: Optional[list[Any]] = None,
                       keep: Any = None) -> SessionStart:
        """Every new session: the session and the policy start a new world frame; the buffered frames
        it drops (``keep``: the caller's own frame, which it ends itself) go to the listener."""
        if discarded is None:
            discarded = self.pending_stamps()
        self._session_id = session_id = self._session_id + 1
        self._session.reset(session_id)
        self.policy.reset(self._session.stream_cfg)
        start = SessionStart(session_id, cause, reason, tuple(s for s in discarded if s is not keep))
        self.last_start = start
        if self.on_new_session is not None:
            self.on_new_session(start)
        return start

    def _adopt_policy(self, stream: StreamConfig) -> None:
        """A changed ``long_run_policy`` swaps the policy object; the same policy keeps its object
        (its ``window_switches`` keep counting) and is reset with the new session."""
        if type(self.policy) is not policy_class(stream.long_run_policy):
            self.policy = make_policy(stream)


__all__ = [
    "ApplyResult", "Change", "InferenceFailed", "LoadReport", "LoadedModel", "ManagerView", "SaveReport",
    "SESSION_GEOMETRY", "SessionCapture", "SessionCause", "SessionManager",
    "SessionStart", "cast_for_inference", "changed_fields", "load_model", "model_change_problems",
    "session_info", "settings_problems",
]
