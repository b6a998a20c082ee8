"""SessionArchive: a manager's saved sessions - capture, prepare, restore (docs/sessions.md).

A saved session is the map (the KV cache) with each class's own state dict, written through
``session_store.py``. Each direction comes in two halves so the stream pauses only for a copy:

* **save** - ``capture`` copies the session's whole memory between two frames (in device memory
  where ``SessionManager.staging_fits`` allows, else to the host); ``SessionCapture.write`` then
  writes it to disk on any thread while frames go on.
* **load** - ``prepare`` reads and checks a saved session on any thread (identity, state, CRCs),
  staging its files in device memory where they fit; the manager's ``commit_load`` then starts the
  loaded session through its one path of a new session, ``_start_session``, with ``restore`` as the
  step that fills the fresh session before anyone hears of it.

The archive reads the manager (its session, policy, host and settings) and changes nothing of it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Optional, Protocol

import torch

from .session_store import (
    PreparedSession,
    SessionCapture,
    SessionFileError,
    checked_manifest,
    fit_problems,
    read_session,
    session_identity,
    verify_files,
    weights_identity,
)


class ArchivedStream(Protocol):
    """What the archive reads of its manager (``SessionManager``; a protocol: no import upwards)."""

    host: Any  # ModelHost
    policy: Any  # LongRunPolicy
    session: Any  # StreamingSession
    stream_cfg: Any  # StreamConfig

    def staging_fits(self, nbytes: int) -> bool: ...


@dataclass(frozen=True)
class LoadReport:
    """What ``SessionManager.load`` restored; ``extra``: the caller's own state saved with it."""

    path: str
    frames: int
    stored: int
    session_id: int
    seconds: float
    extra: dict = field(default_factory=dict)
    pause_seconds: float = 0.0  # of which the commit between two frames (the stream's pause)
    staged_on: str = "host"  # where the files were read to before the commit

    def message(self) -> str:
        return (f"loaded session {self.path}: {self.frames} frames ({self.stored} stored), continuing as "
                f"session {self.session_id} in {self.seconds:.2f} s (the stream paused {self.pause_seconds:.3f} s; "
                f"staged on {self.staged_on})")


class SessionArchive:
    """Capture and restore of one manager's session."""

    def __init__(self, manager: ArchivedStream) -> None:
        self._manager = manager

    def identity(self) -> dict:
        """What a saved session is bound to: the weights, the model's shapes, the cache geometry, the dtype."""
        host = self._manager.host
        settings = host.settings
        weights = weights_identity(settings.checkpoint, host.cfg.preset, settings.seed, host.random_weights)
        return session_identity(weights, host.cfg, self._manager.stream_cfg, self._manager.session.dtype)

    # ------------------------------------------------------------------ save
    def capture(self, extra: Optional[dict] = None, on_device: Optional[bool] = None) -> SessionCapture:
        """The current session's whole memory copied now (``SessionError``: no map yet).

        Only this copy has to happen between two frames; ``SessionCapture.write`` (the disk, seconds
        for gigabytes) may then run on another thread while the session goes on. The copy is made
        in device memory where ``staging_fits`` (``on_device`` None; True/False force it): a copy
        inside the device, milliseconds, and the write moves it to the host file by file; else it
        is a copy to host memory, which the stream waits for (seconds for gigabytes)."""
        start = time.perf_counter()
        manager = self._manager
        session, policy = manager.session, manager.policy
        state = session.state_dict()  # SessionError: nothing to save yet
        if on_device is None:
            on_device = manager.staging_fits(session.bytes_in_use())
        on_device = bool(on_device) and session.device.type == "cuda"
        manifest = {
            "identity": self.identity(), "session": state, "policy": policy.state_dict(),
            "mapping": session.mapping, "extra": dict(extra or {}),
            "frames": policy.next_frame_index(session), "saved_on": str(session.device),
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
        session, policy = self._manager.session, self._manager.policy
        groups = [(f"global_{b:03d}", session.block_tensors(b, on_device)) for b in range(session.num_cache_blocks)]
        return groups + [("camera", {"kv": session.camera_tensor(on_device)}), ("policy", policy.state_tensors())]

    # ------------------------------------------------------------------ load
    def prepare(self, path: str, on_device: Optional[bool] = None) -> PreparedSession:
        """Read and check the session saved at ``path`` without touching the current one (any
        thread): not a session, damaged (CRC), a newer format, another checkpoint / model shape /
        geometry / dtype, a state that does not fit - each refused with ``SessionFileError`` naming
        the reason (or the fields that differ). Its files are staged in device memory where
        ``staging_fits`` (``on_device`` None), so the commit is a copy inside the device."""
        start = time.perf_counter()
        session = self._manager.session
        manifest = checked_manifest(path, self.identity(), session.check_state)
        verify_files(path, manifest)
        if on_device is None:
            on_device = self._manager.staging_fits(sum(int(f["bytes"]) for f in manifest["files"].values()))
        device = session.device if on_device and session.device.type == "cuda" else None
        try:
            groups = read_session(path, manifest, device)
        except torch.OutOfMemoryError:  # the device filled up since the check: commit from the mapped files
            device, groups = None, read_session(path, manifest, None)
        return PreparedSession(str(path), manifest, groups, str(device) if device is not None else "host",
                               time.perf_counter() - start)

    def check_commit(self, prepared: PreparedSession) -> None:
        """The identity and state checked again before a commit (settings may have changed since
        ``prepare``): ``SessionFileError``, nothing changed."""
        _, problems = fit_problems(prepared.manifest, self.identity(), self._manager.session.check_state)
        if problems:
            raise SessionFileError(f"session {prepared.path!r} no longer fits this node's settings: "
                                   + "; ".join(problems))

    def restore(self, prepared: PreparedSession) -> None:
        """Write the prepared state into the fresh session and policy (the step of ``_start_session``
        that fills a loaded session); the caches are written in place into the preallocated pools.
        The prepared tensors are released, also when it raises."""
        session, policy = self._manager.session, self._manager.policy
        manifest, groups = prepared.manifest, prepared.groups
        try:
            session.load_state(manifest["session"], lambda b: groups[f"global_{b:03d}"], groups["camera"]["kv"])
            policy.load_state(manifest["policy"], groups["policy"])
        finally:
            if session.device.type == "cuda":  # the copies read the staged tensors: done before they go
                torch.cuda.current_stream(session.device).synchronize()
            prepared.groups = {}

    def report(self, prepared: PreparedSession, session_id: int, pause: float) -> LoadReport:
        """What a commit restored (``pause``: its time between two frames)."""
        manifest = prepared.manifest
        return LoadReport(prepared.path, int(manifest["frames"]), self._manager.session.frames_stored,
                          session_id, prepared.seconds + pause, dict(manifest.get("extra") or {}),
                          pause, prepared.staged_on)


__all__ = ["ArchivedStream", "LoadReport", "SessionArchive"]
