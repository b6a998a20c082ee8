"""Camera stamps that go back in time: a bag replayed again, a simulator's clock reset.

The session's trajectory, path, TF and map are a function of time; a frame stamped before the one
it follows would put a pose into the past of the same trajectory (a path that folds back, a TF
listener's "TF_OLD_DATA"). tf2's listeners handle a clock that jumps back by clearing their
buffer; the node does the same to its session: the frame starts a new session (new world frame),
with the reason ``time jumped back by X s``.

``TimeJumpDetector`` is plain Python over stamps in seconds (no ROS), so it is unit-tested on its
own; the inference thread asks it once per frame before the push.
"""
from __future__ import annotations

from typing import Optional

TIME_JUMP_COUNTER = "time_jump_sessions"  # the ledger counter of new sessions started by a jump back
_NEXT_SESSION = object()  # after a jump: whichever session id comes next is the one the jump started


class TimeJumpDetector:
    """Takes each frame's stamp and says when it went back in time.

    ``check(stamp, session_id)`` returns ``"time jumped back by X s"`` when ``stamp`` is earlier than
    the previous frame's of the same session by more than ``tolerance_s``, else None. The caller
    starts a new session on a jump, and the jump's frame is that session's first: the next frame is
    compared with it whatever the new session's id (a simulation reset twice in a row is two jumps).
    Any other new ``session_id`` (a reset, a parameter change) starts the comparison afresh, so a
    replay after ``~/reset`` is not reported a second time. Equal stamps are not a jump (a driver
    that repeats a stamp is a different problem). Not thread-safe: the inference thread is its only
    user.
    """

    def __init__(self, tolerance_s: float = 0.0) -> None:
        if tolerance_s < 0:
            raise ValueError(f"tolerance_s must be >= 0 (got {tolerance_s})")
        self.tolerance_s = float(tolerance_s)
        self._last: Optional[float] = None
        self._session: object = None  # the id of the last frame's session, or _NEXT_SESSION
        self.jumps = 0

    def check(self, stamp_s: float, session_id: int) -> Optional[str]:
        previous = self._last
        same_session = self._session is _NEXT_SESSION or session_id == self._session
        self._last, self._session = float(stamp_s), session_id
        if previous is None or not same_session or stamp_s >= previous - self.tolerance_s:
            return None
        self.jumps += 1
        self._session = _NEXT_SESSION  # the session the caller starts now: this frame is its first
        return f"time jumped back by {previous - stamp_s:.3f} s"


__all__ = ["TIME_JUMP_COUNTER", "TimeJumpDetector"]
