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


class PoolProgress:
    """One line for many workers at once (``--ray``): items done of the total, live workers, frames per
    second of all workers together and the ETA.

    The workers report frames done per item (``ray_runner.ProgressBoard``); ``update_from`` takes
    that snapshot. The ETA counts the frames left of the running items and, for the items not
    started yet, the mean length of those seen so far: an estimate until every item has started.
    Draws like ``Progress`` (terminal only); ``line()`` is what a log gets instead.
    """

    def __init__(self, total: int, label: str, unit: str = "items", *, stream: Optional[TextIO] = None,
                 enabled: Optional[bool] = None, min_interval: float = 0.5) -> None:
        self._bar = Progress(total, label, unit, stream=stream, enabled=enabled, min_interval=min_interval)
        self.total, self.label, self.unit = total, label, unit
        self.done = 0
        self.frames_done = 0  # frames streamed in this run, all workers
        self.workers = 0
        self.board: dict[str, dict] = {}
        self._finished: dict[str, int] = {}  # item -> its frame count, once it ended

    @property
    def enabled(self) -> bool:
        return self._bar.enabled

    def finished(self, key: str, frames: int) -> None:
        """An item ended (done, kept or failed); ``frames``: how many it streamed in this run (counted
        from here for items whose worker reported none)."""
        self.done += 1
        self._finished[key] = frames
        self._count()
        self._redraw()

    def update_from(self, board: dict[str, dict], workers: int) -> None:
        """The workers' latest counts: ``{item: {"frames": N, "done": n, "running": bool, ...}}``."""
        self.board, self.workers = board, workers
        self._count()
        self._redraw()

    def _count(self) -> None:
        self.frames_done = sum(int(e.get("done", 0)) for e in self.board.values()) + sum(
            n for k, n in self._finished.items() if k not in self.board)

    def rate(self) -> float:
        elapsed = time.monotonic() - self._bar._start
        return self.frames_done / elapsed if elapsed > 0 and self.frames_done else 0.0

    def eta(self) -> Optional[float]:
        """Seconds left at the current rate; None before any frame or any known item length."""
        rate = self.rate()
        lengths = [int(e["frames"]) for e in self.board.values() if e.get("frames")]
        lengths += [n for k, n in self._finished.items() if k not in self.board and n]
        if not rate or not lengths:
            return None
        running = [e for k, e in self.board.items() if e.get("running") and k not in self._finished]
        left = sum(max(0, int(e["frames"]) - int(e.get("done", 0))) for e in running)
        not_started = max(0, self.total - self.done - len(running))
        left += not_started * (sum(lengths) / len(lengths))
        return left / rate

    def line(self) -> str:
        eta = self.eta()
        rate = self.rate()
        return (f"[{self.label}] {self.done}/{self.total} {self.unit} done, {self.workers} workers, "
                f"{self.frames_done} frames at {rate:.2f} frames/s in total, "
                + (f"ETA {format_seconds(eta)}" if eta is not None and self.done < self.total else
                   f"elapsed {format_seconds(time.monotonic() - self._bar._start)}"))

    def _redraw(self) -> None:
        bar = self._bar
        if bar.enabled and time.monotonic() - bar._last_draw >= bar._min_interval:
            bar._last_draw = time.monotonic()
            bar.stream.write("\r\x1b[K" + self.line())
            bar.stream.flush()
            bar._drawn = True

    def write(self, message: str) -> None:
        """Print a message above the line (the line is drawn again after it)."""
        bar = self._bar
        if bar.enabled and bar._drawn:
            bar.stream.write("\r\x1b[K")
        bar.stream.write(message + "\n")
        bar.stream.flush()
        bar._last_draw = 0.0
        self._redraw()

    def close(self) -> None:
        if self._bar.enabled:
            self._bar.stream.write("\r\x1b[K" + self.line() + "\n")
            self._bar.stream.flush()
            self._bar.enabled = False


__all__ = ["PoolProgress", "Progress", "format_seconds"]
