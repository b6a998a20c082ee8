"""Sizing a card without it: the window configure would pick for a memory budget, and the table
"what fits in N GB" (README: Fitting a small GPU), both from the footprint model (``core/footprint.py``)
through the same ``MemoryBudget.fit`` that configure runs (``core/memory_budget.py``), so
``lingbot_map_bench --footprint`` and the node cannot disagree.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

from .config import ModelConfig, RuntimeConfig, StreamConfig, planned_height
from .footprint import GB
from .memory_budget import MemoryBudget, MemoryBudgetExceeded
from .runtime import ResolvedRuntime

TABLE_BUDGETS_GB = (4, 6, 8, 12, 16, 24)
TABLE_WIDTHS = (518, 392, 280, 224)
TABLE_HEADS = ("depth+camera", "camera")
CAMERAS_TABLE_BUDGETS_GB = (8, 16, 24)
CAMERAS_TABLE_COUNTS = (2, 4)


@dataclass(frozen=True)
class Fit:
    """What configure decides for a budget: the stream it runs (``sliding_window`` fitted), the
    footprint at configure's check size, and its warning; or why nothing fits (``refused``)."""

    stream: Optional[StreamConfig]
    total_bytes: float
    warning: str = ""
    refused: str = ""


def configure_fit(cfg: ModelConfig, rt: ResolvedRuntime, runtime: RuntimeConfig, stream: StreamConfig,
                  cameras: int = 1) -> Fit:
    """The window configure picks for ``stream`` (its ``gpu_memory_budget`` > 0; ``fit_window``), with the
    settings' own rules (a window the long-run policy refuses), at configure's check size; ``cameras``:
    the streams of a several-camera node, which share the model and one window."""
    from .session_manager import settings_problems  # late: the manager imports the whole model

    if stream.gpu_memory_budget <= 0:
        raise ValueError("gpu_memory_budget 0 means the free memory of the device at configure: give a budget "
                         "in GB to size a card that is not here")
    budget = MemoryBudget(free_bytes=lambda device: 0.0)
    try:
        fitted, warning = budget.fit(cfg, rt, stream, lambda s: settings_problems(runtime, s), cameras)
    except MemoryBudgetExceeded as exc:
        return Fit(None, float("nan"), refused=str(exc))
    return Fit(fitted, float(budget.predict(cfg, rt, fitted, streams=cameras).total), warning)


def fit_line(fit: Fit, stream: StreamConfig) -> str:
    """One line for ``--footprint``: the window configure picks, or why it refuses."""
    h = planned_height(stream.image_width, stream.camera_aspect)
    where = f"configure's check at {stream.image_width}x{h}"
    if fit.stream is None:
        return f"gpu_memory_budget {stream.gpu_memory_budget:g} GB: configure refuses ({where}): {fit.refused}"
    return (f"gpu_memory_budget {stream.gpu_memory_budget:g} GB: configure runs sliding_window "
            f"{fit.stream.sliding_window} ({fit.total_bytes / GB:.2f} GB at {where})"
            + (f"; {fit.warning}" if fit.warning else ""))


def fits_table(cfg: ModelConfig, rt: ResolvedRuntime, runtime: RuntimeConfig, stream: StreamConfig,
               budgets=TABLE_BUDGETS_GB, widths=TABLE_WIDTHS, heads=TABLE_HEADS, cameras=(1,)) -> str:
    """Markdown: for each budget (GB) [x camera count] x ``image_width`` x heads, the window configure
    picks with ``fit_window: true`` (at most ``stream.sliding_window``) and its GB, or "-" when not
    even a window of 1 fits. ``cameras`` other than ``(1,)`` adds a column: the streams of one node."""
    several = tuple(cameras) != (1,)
    header = ("| budget | " + ("cameras | " if several else "")
              + " | ".join(f"`image_width` {w}, {h}" for w in widths for h in heads) + " |")
    lines = [header, "| ---: | " + ("---: | " if several else "")
             + " | ".join("---:" for _ in widths for _ in heads) + " |"]
    for gb in budgets:
        for count in cameras:
            cells = []
            for w in widths:
                for h in heads:
                    s = replace(stream, gpu_memory_budget=float(gb), fit_window=True, image_width=w,
                                with_depth=h == "depth+camera")
                    fit = configure_fit(cfg, rt, runtime, s, count)
                    cells.append("-" if fit.stream is None else
                                 f"{fit.stream.sliding_window} ({fit.total_bytes / GB:.1f} GB)")
            lines.append(f"| {gb} GB | " + (f"{count} | " if several else "") + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def cameras_fits_table(cfg: ModelConfig, rt: ResolvedRuntime, runtime: RuntimeConfig, stream: StreamConfig) -> str:
    """The table for several cameras (README: Several cameras): 8 / 16 / 24 GB x 2 and 4 cameras."""
    return fits_table(cfg, rt, runtime, stream, budgets=CAMERAS_TABLE_BUDGETS_GB, cameras=CAMERAS_TABLE_COUNTS)


__all__ = ["CAMERAS_TABLE_BUDGETS_GB", "CAMERAS_TABLE_COUNTS", "Fit", "TABLE_BUDGETS_GB", "TABLE_HEADS",
           "TABLE_WIDTHS", "cameras_fits_table", "configure_fit", "fit_line", "fits_table"]
