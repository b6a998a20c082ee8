"""One figure per run: trajectory top view, per-frame latency, KV-cache occupancy over frames; and one
per benchmark sequence: the aligned trajectory over the ground truth, and the error per frame.

Why a picture: a drifting trajectory, a latency spike at the window change or a cache that fills
with special pages are obvious at a glance and invisible in a table of numbers. Used by
``lingbot_map_offline --plot``, ``lingbot_map_demo --plot`` and ``lingbot_map_benchmark``.

matplotlib is optional for the package (installed by ``scripts/setup_env.sh``); it is imported only
here, with the Agg canvas (no display, no global backend switch), so tools check ``available()``
before any work. ``plot_run`` returns the arrays it drew, so tests check the panels' data, not pixels.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from ..core.files import atomic_open

CACHE_SERIES = ("scale", "window", "free", "special")  # page counts drawn in the cache panel
PLOT_SUFFIXES = (".png", ".pdf", ".svg")


def available() -> Optional[str]:
    """None when matplotlib imports, else the sentence that says how to get it."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return "matplotlib is not installed: run scripts/setup_env.sh again, or pip install matplotlib"
    return None


@dataclass
class RunSeries:
    """What one run produced, frame by frame (arrays of equal length N, in processing order)."""

    frame: np.ndarray  # [N] frame numbers (x axis)
    position: np.ndarray  # [N, 3] camera centres in the world frame (the first camera's optical frame)
    latency_ms: np.ndarray  # [N] model time per frame
    cache: dict = field(default_factory=dict)  # name in CACHE_SERIES -> [N] pages in use
    session: Optional[np.ndarray] = None  # [N] session id (the top view starts a new line per session)

    @classmethod
    def from_results(cls, results: Sequence) -> "RunSeries":
        """From ``core.results.FrameResult`` objects (the offline tool)."""
        c = [r.cache for r in results]
        return cls(
            frame=np.arange(len(results)),
            position=np.array([np.asarray(r.c2w)[:3, 3] for r in results], dtype=np.float64).reshape(-1, 3),
            latency_ms=np.array([r.latency_ms for r in results], dtype=np.float64),
            cache={"scale": np.array([s.scale_pages for s in c]), "window": np.array([s.window_pages for s in c]),
                   "free": np.array([s.free_pages for s in c]), "special": np.array([s.special_pages for s in c])},
            session=np.array([r.session_id for r in results]),
        )


def labels_overlap(axis, renderer, min_gap_em: float = 0.5) -> bool:
    """Whether two visible tick labels of ``axis`` (an x or y axis) come closer than ``min_gap_em``
    of their font size (touching labels read as one number: ``-0.0035-0.0030``)."""
    labels = [t for t in axis.get_ticklabels() if t.get_visible() and t.get_text()]
    if len(labels) < 2:
        return False
    half = min_gap_em * labels[0].get_fontsize() * renderer.dpi / 72.0 / 2.0  # pixels on each side
    boxes = [b.from_extents(b.x0 - half, b.y0 - half, b.x1 + half, b.y1 + half)
             for b in (t.get_window_extent(renderer) for t in labels)]
    return any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])


def _declutter_ticks(fig, ax, max_bins: int = 6) -> None:
    """Fewer ticks on ``ax`` until no two tick labels overlap.

    Why: the top view keeps an equal aspect ratio in a third of the figure's width, and a trajectory
    that spans millimetres gets labels like ``-0.0035`` every 0.0005: matplotlib's default locator
    counts ticks, not how wide their labels are, so they run into each other. Measured on the
    rendered figure, so it holds for any range and font."""
    from matplotlib.ticker import MaxNLocator

    renderer = fig.canvas.get_renderer()
    bins = max_bins
    while True:
        fig.canvas.draw()
        crowded = [a for a in (ax.xaxis, ax.yaxis) if labels_overlap(a, renderer)]
        if not crowded or bins < 2:
            return
        for a in crowded:
            a.set_major_locator(MaxNLocator(nbins=bins))
        bins -= 1


def plot_run(path: str | Path, series: RunSeries, title: str = "") -> dict:
    """Write the three-panel figure to ``path`` (format from its extension); returns what was drawn:
    ``{"top_view": (x, z), "latency": (frames, ms), "cache": {name: (frames, pages)}, "axes": [titles]}``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    n = len(series.frame)
    fig = Figure(figsize=(15, 4.6), layout="constrained")
    FigureCanvasAgg(fig)
    ax_top, ax_lat, ax_cache = fig.subplots(1, 3)
    drawn: dict = {"cache": {}}

    # Top view: the world frame is the first camera's optical frame (x right, y down, z forward), so
    # the ground plane of a forward-looking camera is x-z.
    x, z = series.position[:, 0], series.position[:, 2]
    sessions = series.session if series.session is not None else np.zeros(n, dtype=int)
    for sid in np.unique(sessions):
        m = sessions == sid
        ax_top.plot(x[m], z[m], "-", lw=1.2, label=f"session {sid}" if len(np.unique(sessions)) > 1 else None)
    if n:
        ax_top.plot(x[:1], z[:1], "go", label="start")
        ax_top.plot(x[-1:], z[-1:], "rs", label="end")
    ax_top.set(title="trajectory (top view)", xlabel="x (right, model units)", ylabel="z (forward, model units)")
    ax_top.set_aspect("equal", adjustable="datalim")
    ax_top.legend(loc="best", fontsize=8)
    ax_top.grid(alpha=0.3)
    drawn["top_view"] = (x.copy(), z.copy())

    ax_lat.plot(series.frame, series.latency_ms, ".-", lw=0.8, ms=3)
    if n:
        med = float(np.median(series.latency_ms))
        ax_lat.axhline(med, color="gray", ls="--", lw=0.8, label=f"median {med:.1f} ms")
        ax_lat.legend(loc="best", fontsize=8)
    ax_lat.set(title="model latency per frame", xlabel="frame", ylabel="ms")
    ax_lat.grid(alpha=0.3)
    drawn["latency"] = (np.asarray(series.frame).copy(), np.asarray(series.latency_ms).copy())

    for name in CACHE_SERIES:
        if name in series.cache:
            values = np.asarray(series.cache[name])
            ax_cache.plot(series.frame, values, lw=1.2, label=f"{name} pages")
            drawn["cache"][name] = (np.asarray(series.frame).copy(), values.copy())
    ax_cache.set(title="KV-cache occupancy", xlabel="frame", ylabel="pages")
    ax_cache.legend(loc="best", fontsize=8)
    ax_cache.grid(alpha=0.3)

    for ax in (ax_lat, ax_cache):  # frame numbers and page counts are whole numbers
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax_cache.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax_cache.set_ylim(bottom=0)  # page counts: from zero, so a flat line reads as a count
    if title:
        fig.suptitle(title)
    _declutter_ticks(fig, ax_top)
    drawn["axes"] = [a.get_title() for a in fig.axes]
    drawn["figure"] = fig
    with atomic_open(path, "wb") as f:  # never half a figure under the name
        fig.savefig(f, dpi=110, format=Path(path).suffix.lstrip(".").lower() or "png")
    return drawn


def plot_against_ground_truth(path: str | Path, gt_xyz: np.ndarray, est_xyz: np.ndarray, errors: np.ndarray,
                              title: str = "") -> dict:
    """Write the benchmark figure of one sequence: the Sim(3)-aligned estimate [N, 3] (solid) over the
    ground truth [N, 3] (dashed) in the XY, XZ and YZ planes of the ground truth's frame, and the ATE
    error per evaluated frame [N]. Returns what was drawn: ``{"planes": {"xy": (gt [N, 2], est [N, 2]),
    ...}, "errors": [N], "axes": [titles]}``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(16, 4.4), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 4)
    drawn: dict = {"planes": {}}
    for ax, (name, (a, b)) in zip(axes[:3], (("xy", (0, 1)), ("xz", (0, 2)), ("yz", (1, 2)))):
        ax.plot(gt_xyz[:, a], gt_xyz[:, b], "--", color="gray", lw=1.2, label="ground truth")
        ax.plot(est_xyz[:, a], est_xyz[:, b], "-", color="tab:blue", lw=1.2, label="estimate (Sim(3)-aligned)")
        if len(gt_xyz):
            ax.plot(gt_xyz[:1, a], gt_xyz[:1, b], "go", ms=4)
        ax.set(title=f"{name.upper()} plane", xlabel=f"{name[0]} (m)", ylabel=f"{name[1]} (m)")
        ax.set_aspect("equal", adjustable="datalim")
        ax.grid(alpha=0.3)
        ax.locator_params(nbins=5)  # few ticks: long tick labels of metric coordinates must not overlap
        drawn["planes"][name] = (gt_xyz[:, [a, b]].copy(), est_xyz[:, [a, b]].copy())
    axes[0].legend(loc="best", fontsize=8)
    ax_err = axes[3]
    ax_err.plot(np.arange(len(errors)), errors, ".-", lw=0.8, ms=3)
    ax_err.set(title="position error per frame (ATE)", xlabel="evaluated frame", ylabel="m")
    ax_err.grid(alpha=0.3)
    drawn["errors"] = np.asarray(errors).copy()
    if title:
        fig.suptitle(title)
    drawn["axes"] = [a.get_title() for a in fig.axes]
    with atomic_open(path, "wb") as f:  # never half a figure under the name
        fig.savefig(f, dpi=100, format=Path(path).suffix.lstrip(".").lower() or "png")
    return drawn


__all__ = ["CACHE_SERIES", "PLOT_SUFFIXES", "RunSeries", "available", "plot_against_ground_truth", "plot_run"]
