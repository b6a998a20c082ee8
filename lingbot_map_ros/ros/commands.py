"""The commands other threads hand the inference thread, and what each one returns.

A command runs between two frames on the inference thread (``inference.WorkQueue``), so a session
change never races a frame inside the model. Every command answers with one ``CommandResult``: whether
it did what it was asked and the sentence to show for it (a service's message, a log line), and for a
save the copy of the session that the caller writes off the inference thread.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Union

if TYPE_CHECKING:  # annotations only: this module stays light for the node's early imports
    from ..core.session_store import PreparedSession, SessionCapture


@dataclass(frozen=True)
class Reset:
    """``~/reset``, a time jump: a new session (new world frame)."""

    reason: str


@dataclass(frozen=True)
class ApplyParameters:
    """Parameters changed (``ros2 param set``): the session manager applies the node's values."""

    changed: tuple[str, ...]


@dataclass(frozen=True)
class SaveSession:
    """``~/save_session``: copy the session between two frames (``CommandResult.capture``)."""


@dataclass(frozen=True)
class LoadSession:
    """``~/load_session`` (a ``PreparedSession``: its commit) or ``initial_session`` (a path: read and commit)."""

    source: Union[str, "PreparedSession"]


Command = Union[Reset, ApplyParameters, SaveSession, LoadSession]


@dataclass(frozen=True)
class CommandResult:
    """What a command did: ``ok`` false when it raised or was refused; ``message`` says what happened
    (the reason when not ok); ``capture``: a save's copy of the session, for the caller to write."""

    ok: bool
    message: str
    capture: Optional["SessionCapture"] = None


__all__ = ["ApplyParameters", "Command", "CommandResult", "LoadSession", "Reset", "SaveSession"]
