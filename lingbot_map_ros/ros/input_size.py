"""The session's input size: one owner, asked from every thread that handles a frame.

The first frame of a session fixes ``W0 x H0``; the model input height, the crop and the published
intrinsics all follow from it, so a frame of another size must never reach the session. The owner of
that decision is the session's ``core.preprocess.FramePreprocessor`` (``fix_size``: adopt the first
size, raise ``ResolutionChanged`` for another one). ``InputSize`` holds the current session's
preprocessor, swaps in a fresh one when a new session starts, and serialises ``fix_size`` so two
threads cannot both adopt a size for the same fresh session.
"""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Callable, Optional

if TYPE_CHECKING:  # preprocess imports torch
    from ..core.preprocess import FramePreprocessor


class InputSize:
    """The current session's ``FramePreprocessor`` and the size check against it."""

    def __init__(self, make_preprocessor: Callable[[], FramePreprocessor]):
        self._make = make_preprocessor
        self._lock = threading.Lock()
        self._preproc: Optional[FramePreprocessor] = None

    def renew(self) -> None:
        """A new session: forget the size; the next frame checked fixes it."""
        preproc = self._make()
        with self._lock:
            self._preproc = preproc

    def check(self, width: int, height: int) -> FramePreprocessor:
        """Adopt ``width x height`` for the session or confirm it; the session's preprocessor.

        Raises ``ResolutionChanged`` for another size and ``ValueError`` for a size the model cannot
        take (nothing is adopted then); ``RuntimeError`` without a session.
        """
        with self._lock:
            preproc = self._preproc
            if preproc is None:
                raise RuntimeError("no session: the node is not configured")
            preproc.fix_size(int(width), int(height))
            return preproc

    @property
    def preprocessor(self) -> Optional[FramePreprocessor]:
        return self._preproc

    @property
    def input_wh(self) -> Optional[tuple[int, int]]:
        """The session's image size (W0, H0); None before its first frame or without a session."""
        preproc = self._preproc
        return preproc.input_wh if preproc is not None else None
