"""What a ``SessionManager`` tells its callers: why a session started (``SessionCause``,
``SessionStart``, heard by the manager's listener), a frame the model failed on (``InferenceFailed``)
and what a settings change did (``Change``, ``ApplyResult``). Plain data, importing nothing of the
package: the node's threads and the tools read them without reaching into the manager."""
from __future__ import annotations

import enum
import traceback
from dataclasses import dataclass
from typing import Any


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


__all__ = ["ApplyResult", "Change", "InferenceFailed", "SessionCause", "SessionStart"]
