"""The refusals a streaming session raises for a frame it cannot take.

A module of their own because both the session (``stream.py``) and its long-run policies
(``long_run.py``) raise them, and the policies must not import the session they serve
(``stream.py`` builds its policy from ``long_run.py``: one direction only).
"""
from __future__ import annotations


class SessionError(RuntimeError):
    """A frame the session cannot take; the caller counts it as dropped and carries on."""


class SessionStopped(SessionError):
    """The long-run policy ``stop`` was reached: the session refuses further frames until reset
    (raised by ``long_run.StopPolicy``)."""


class FrameSizeChanged(SessionError):
    """A frame of another model input size than the session's first frame."""


__all__ = ["FrameSizeChanged", "SessionError", "SessionStopped"]
