"""The commands other threads hand the inference thread, and what each one returns.

A command runs between two frames (two ticks with several cameras) on the inference thread, so a
session change never races a frame inside the model. Other threads hand it over through a
``CommandInbox``, which shares the condition the inference thread sleeps on with its frame queues.
Every command answers with one ``CommandResult``: whether it did what it was asked and the sentence to
show for it (a service's message, a log line), and for a save the copy of the session that the caller
writes off the inference thread.
"""
from __future__ import annotations

import threading
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


class PendingCommand:
    """A command handed to the inference thread, and its caller's wait for the answer."""

    def __init__(self, command: Command):
        self.command = command
        self._done = threading.Event()
        self._result: Optional[CommandResult] = None

    def answer(self, result: CommandResult) -> None:
        """The inference thread's answer (exactly once, also when the command raised)."""
        self._result = result
        self._done.set()

    def wait(self, timeout: float) -> Optional[CommandResult]:
        """The answer, or None when it did not come within ``timeout`` s (the command still runs)."""
        return self._result if self._done.wait(timeout) else None


class CommandInbox:
    """The commands waiting for the inference thread, on the condition it sleeps on (``cond``, shared with
    its frame queues, so a command wakes it as a frame does)."""

    def __init__(self, cond: threading.Condition):
        self._cond = cond
        self._waiting: list[PendingCommand] = []

    def submit(self, command: Command, wait: float = 0.0) -> Optional[CommandResult]:
        """Queue ``command``; with ``wait`` > 0 wait that long for its result (None: not yet)."""
        pending = PendingCommand(command)
        with self._cond:
            self._waiting.append(pending)
            self._cond.notify_all()
        return pending.wait(wait) if wait > 0 else None

    @property
    def waiting(self) -> bool:
        """Whether a command waits (read with the condition held)."""
        return bool(self._waiting)

    def take(self) -> list[PendingCommand]:
        """Every waiting command, oldest first (called with the condition held)."""
        taken, self._waiting = self._waiting, []
        return taken


__all__ = ["ApplyParameters", "Command", "CommandInbox", "CommandResult", "LoadSession", "PendingCommand", "Reset",
           "SaveSession"]
