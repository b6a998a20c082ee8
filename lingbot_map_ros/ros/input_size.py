"""The session's input size: one owner, asked from every thread that handles a frame.

The first frame of a session fixes ``W0 x H0``; the model input height, the crop and the published
intrinsics all follow from it, so a frame of another size must never reach the session. The owner of
that decision is the session's ``core.preprocess.FramePreprocessor`` (``fix_size``: adopt the first
size, raise ``ResolutionChanged`` for another one). ``InputSize`` holds the current session's
preprocessor, swaps in a fresh one when a new session starts, and serialises ``fix_size`` so two
threads cannot both adopt a size for the same fresh session.

Three threads ask it (``ros/pipeline.py`` says why): the image callback (a wrong size is rejected
before any queue), the preprocessing thread (with the preprocessor it then uses) and the inference
thread right before the push (a new session may have started while the frame was being
preprocessed). The answer and the rejection wording are the same everywhere.
"""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Callable, Optional

from .frames import InputRejected

if TYPE_CHECKING:  # preprocess imports torch
    from ..core.preprocess import FramePreprocessor


class InputSize:
    """The current session's ``FramePreprocessor`` and the size check against it."""

    def __init__(self, make_preprocessor: Callable[[], FramePreprocessor]):
        from ..core.preprocess import ResolutionChanged

        self._resolution_changed = ResolutionChanged
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

        Raises ``InputRejected`` (kind ``resolution_changed`` for another size, ``unsupported`` for
        a size the model cannot take; nothing is adopted then); ``RuntimeError`` without a session.
        """
        with self._lock:
            preproc = self._preproc
            if preproc is None:
                raise RuntimeError("no session: the node is not configured")
            try:
                preproc.fix_size(int(width), int(height))
            except self._resolution_changed as exc:
                raise InputRejected("resolution_changed", f"resolution changed mid-session: {exc}; call "
                                    "~/reset to start a session at the new size") from exc
            except ValueError as exc:
                raise InputRejected("unsupported", f"cannot preprocess this size: {exc}") from exc
            return preproc

    @property
    def preprocessor(self) -> Optional[FramePreprocessor]:
        return self._preproc

    @property
    def input_wh(self) -> Optional[tuple[int, int]]:
        """The session's image size (W0, H0); None before its first frame or without a session."""
        preproc = self._preproc
        return preproc.input_wh if preproc is not None else None
