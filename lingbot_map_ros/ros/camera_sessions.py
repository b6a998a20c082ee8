"""Saved sessions of several cameras: one folder, every stream in it.

``<session_path>/<camera>/`` is each camera stream's saved session (``SessionCapture.write``: its KV
cache, counters, long-run chain and its robot frames), ``<session_path>/cameras.json`` what joins
them: the camera names, the rig (anchors, units, the driver and its offset) and the body pose's path
and trajectory. The folder is replaced as a whole (``files.atomic_directory``). A session saved with
other camera names, or by a single-camera node, is refused with the names before anything changes.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from ..core.files import atomic_directory, atomic_write_text, recover_directory
from ..core.session_store import SessionFileError

RIG_FILE = "cameras.json"


@dataclass
class CamerasSaveReport:
    path: str
    reports: dict
    seconds: float

    def message(self) -> str:
        parts = "; ".join(f"{name}: {r.frames} frames ({r.stored} stored)" for name, r in self.reports.items())
        return f"saved the session of cameras {list(self.reports)} to {self.path} in {self.seconds:.2f} s ({parts})"


class CamerasCapture:
    """Every stream's capture and the rig's state, taken between two ticks; written later (any thread)."""

    def __init__(self, captures: dict[str, Any], state: dict):
        self.captures = captures
        self.state = state

    def write(self, path: str) -> CamerasSaveReport:
        start = time.perf_counter()
        try:
            with atomic_directory(path) as tmp:
                reports = {name: capture.write(str(Path(tmp) / name)) for name, capture in self.captures.items()}
                atomic_write_text(Path(tmp) / RIG_FILE, json.dumps(self.state))
        except OSError as exc:
            raise SessionFileError(f"cannot write {path}: {exc}") from exc
        return CamerasSaveReport(path, reports, time.perf_counter() - start)


@dataclass
class CamerasPrepared:
    """A saved session of several cameras, read and checked: each stream's ``PreparedSession``."""

    path: str
    prepared: dict[str, Any]
    state: dict


def prepare(path: str, names: list[str], managers: dict[str, Any], on_device: Optional[bool]) -> CamerasPrepared:
    """Read and check ``path`` for the cameras ``names``; ``SessionFileError`` with the reason."""
    recover_directory(path)
    rig_file = Path(path) / RIG_FILE
    if not rig_file.is_file():
        raise SessionFileError(f"{path} is not a session of several cameras (no {RIG_FILE}): it was saved by a "
                               "single-camera node, or is not a session")
    try:
        state = json.loads(rig_file.read_text())
    except (OSError, ValueError) as exc:
        raise SessionFileError(f"{rig_file} cannot be read: {exc}") from exc
    saved = list(state.get("names", []))
    if saved != list(names):
        raise SessionFileError(f"session {path} was saved with cameras {saved}; this node has cameras {list(names)}")
    prepared = {name: managers[name].prepare_load(str(Path(path) / name), on_device) for name in names}
    return CamerasPrepared(path, prepared, state)


__all__ = ["RIG_FILE", "CamerasCapture", "CamerasPrepared", "CamerasSaveReport", "prepare"]
