"""What a streaming session raises for a frame it does not process now.

A module of its own because the session (``stream.py``), its long-run policies (``long_run.py``) and the
manager (``session_manager.py``) all raise or catch them, and none of the three may import a module
above it in that chain.
"""
from __future__ import annotations


class SessionError(RuntimeError):
    """A frame the session cannot take; the caller counts it as refused and carries on."""


class SessionStopped(SessionError):
    """The long-run policy ``stop`` was reached: the session refuses further frames until reset
    (raised by ``long_run.StopPolicy``)."""


class FrameSizeChanged(SessionError):
    """A frame of another model input size than the session's first frame."""


class StoredFrameLimit(Exception):
    """The keyframe pushed now would pass the session's stored-frame limit.

    A signal, not a refusal: ``StreamingSession.push`` raises it before changing any state, and the
    session manager asks the long-run policy what to do (refuse, start a new session, or start the
    next window and push the frame again). Not a ``SessionError``, so no caller can mistake it for
    a refused frame."""

    def __init__(self, stored: int, limit: int) -> None:
        super().__init__(f"{stored} stored frames: one more keyframe would pass the limit of {limit}")
        self.stored = stored
        self.limit = limit


__all__ = ["FrameSizeChanged", "SessionError", "SessionStopped", "StoredFrameLimit"]
