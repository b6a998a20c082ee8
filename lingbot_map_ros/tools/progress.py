"""A one-line progress bar (count, percent, rate, ETA) for the tools' long runs, without tqdm.

Why our own: the tools must stay quiet in logs and CI (a bar rewritten with ``\\r`` turns a log
file into noise), and show life on a terminal (a 4-minute CPU run that prints nothing looks hung).
So the bar draws only when its stream is a terminal, at most a few times a second, and leaves one
final line behind. Nothing here imports torch or rclpy.
"""
from __future__ import annotations

import sys
import time
from typing import Optional, TextIO


def format_seconds(seconds: float) -> str:
    """``0:07``, ``3:25``, ``1:02:03``: short enough for a bar, unambiguous for hours-long runs."""
    seconds = max(0, int(round(seconds)))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class Progress:
    """``update()`` once per unit of work; ``close()`` at the end (or use it as a context manager).

    ``total`` may be None (unknown length: count and rate only). ``enabled`` defaults to
    ``stream.isatty()``; pass False for ``--quiet``.
    """

    def __init__(self, total: Optional[int], label: str, unit: str = "frames", *, stream: Optional[TextIO] = None,
                 enabled: Optional[bool] = None, min_interval: float = 0.25, width: int = 24) -> None:
        self.stream = stream if stream is not None else sys.stderr
        if enabled is None:
            try:
                enabled = bool(self.stream.isatty())
            except (AttributeError, ValueError):  # a closed or file-like stream without a terminal
                enabled = False
        self.enabled = enabled
        self.total = total if total and total > 0 else None
        self.label, self.unit, self.width = label, unit, width
        self.count = 0
        self.extra = ""
        self._start = time.monotonic()
        self._last_draw = 0.0
        self._min_interval = min_interval
        self._drawn = False

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def rate(self) -> float:
        """Units per second since the start (0 before the first unit)."""
        elapsed = time.monotonic() - self._start
        return self.count / elapsed if elapsed > 0 and self.count else 0.0

    def line(self) -> str:
        """The bar as text, e.g. ``[offline] 12/40  30% |#######          | 3.1 frames/s ETA 0:09``."""
        rate = self.rate()
        parts = [f"[{self.label}]"]
        if self.total:
            frac = min(1.0, self.count / self.total)
            filled = int(round(frac * self.width))
            parts.append(f"{self.count}/{self.total} {frac * 100:3.0f}% |{'#' * filled}{' ' * (self.width - filled)}|")
        else:
            parts.append(f"{self.count} {self.unit}")
        parts.append(f"{rate:.2f} {self.unit}/s" if rate else f"-- {self.unit}/s")
        elapsed = time.monotonic() - self._start
        if self.total and rate:
            parts.append(f"ETA {format_seconds(max(0.0, (self.total - self.count) / rate))}")
        else:
            parts.append(f"elapsed {format_seconds(elapsed)}")
        if self.extra:
            parts.append(self.extra)
        return " ".join(parts)

    def update(self, n: int = 1, extra: str = "") -> None:
        """Count ``n`` more units; redraw when enough time has passed (cheap otherwise)."""
        self.count += n
        if extra:
            self.extra = extra
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._last_draw >= self._min_interval or (self.total and self.count >= self.total):
            self._last_draw = now
            self._draw()

    def _draw(self) -> None:
        self.stream.write("\r\x1b[K" + self.line())  # carriage return + clear to end of line
        self.stream.flush()
        self._drawn = True

    def write(self, message: str) -> None:
        """Print a message above the bar (the bar is redrawn after it)."""
        if self.enabled and self._drawn:
            self.stream.write("\r\x1b[K")
        self.stream.write(message + "\n")
        if self.enabled and self._drawn:
            self._draw()
        self.stream.flush()

    def close(self) -> None:
        """Leave the final state of the bar on its own line (terminal only)."""
        if self.enabled:
            self._draw()
            self.stream.write("\n")
            self.stream.flush()
            self.enabled = False


__all__ = ["Progress", "format_seconds"]
