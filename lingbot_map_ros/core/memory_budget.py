"""The memory budget of a session manager: settings that do not fit are refused before anything is
allocated, or (``fit_window``) the sliding window shrinks until they fit (docs/memory.md).

The check runs on the footprint (``core/footprint.py``) at the configured width and the tallest
input the settings allow: ``camera_aspect``'s height when the camera is known (a taller camera is
centre-cropped to it), else the width's square (portrait images are centre-cropped to it), so whatever
camera connects later, its sessions stay inside the budget: phase 1 of every new session, window switches
(they reuse the caches) and every change ``SessionManager.apply`` accepts.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from .config import ModelConfig, RuntimeConfig, StreamConfig, model_config, planned_height, replace
from .footprint import GB, Footprint, budget_problem, fits, footprint, largest_fitting_window
from .runtime import ResolvedRuntime, resolve_runtime

MEMORY_MARGIN_GB = 0.5  # kept free of an automatic budget: the CUDA context's growth, other processes' jitter


class MemoryBudgetExceeded(ValueError):
    """The settings do not fit the memory budget; the message has the numbers."""


@dataclass(frozen=True)
class MemoryReport:
    """Predicted next to allocated, for the diagnostics (bytes; budget 0 = no limit)."""

    predicted: int
    allocated: int
    budget: float
    fitted_window: Optional[int] = None  # the window fit_window chose (None: the configured one fits)
    configured_window: int = 0


def device_free_bytes(device: torch.device) -> float:
    """Free memory of ``device`` plus what this process holds already (released before a rebuild)."""
    free, _ = torch.cuda.mem_get_info(device)
    return float(free + torch.cuda.memory_allocated(device))


def predict(cfg: ModelConfig, rt: ResolvedRuntime, stream: StreamConfig,
            hw: Optional[tuple[int, int]] = None, streams: int = 1) -> Footprint:
    """The footprint at ``hw`` (the session's frame size), else at the tallest input the settings allow
    (``camera_aspect``'s, else the width's square); ``streams``: that many cameras on the one model."""
    h, w = hw if hw is not None else (planned_height(stream.image_width, stream.camera_aspect), stream.image_width)
    return footprint(cfg, rt, stream, h, w, streams)


def fit_stream(cfg: ModelConfig, rt: ResolvedRuntime, stream: StreamConfig,
               rules: Callable[[StreamConfig], list[str]], budget: float,
               streams: int = 1) -> tuple[StreamConfig, str]:
    """``(stream, "")`` when it fits ``budget`` (bytes, 0: no limit); with ``fit_window`` the largest
    window that fits and the warning that says so; else ``MemoryBudgetExceeded`` with what does not
    fit and by how much. ``rules``: the settings' own reasons against a window (the long-run policy's
    overlap, say). ``streams``: the cameras that share the model, each with these settings (the
    window is the same for all of them, so it shrinks for all). Pure: it reads its arguments only
    (``MemoryBudget.adopt`` records the choice)."""
    what = f" for {streams} cameras" if streams > 1 else ""
    fp = predict(cfg, rt, stream, streams=streams)
    if fits(fp, budget):
        return stream, ""
    if stream.with_depth:  # phase 1's depth head in smaller calls: the same numbers in less memory
        for chunk in (4, 2, 1):
            if chunk < stream.depth_chunk:
                stream = replace(stream, depth_chunk=chunk)
                fp = predict(cfg, rt, stream, streams=streams)
                if fits(fp, budget):
                    return stream, ""
    if not stream.fit_window:
        raise MemoryBudgetExceeded(budget_problem(fp, budget, f"sliding_window {stream.sliding_window}{what}")
                                   + "; lower sliding_window or image_width, or set fit_window true")
    h, w = planned_height(stream.image_width, stream.camera_aspect), stream.image_width
    best = largest_fitting_window(cfg, rt, stream, h, w, budget, streams)
    if best is None:
        smallest = footprint(cfg, rt, replace(stream, sliding_window=1), h, w, streams)
        raise MemoryBudgetExceeded(f"fit_window: not even sliding_window 1 fits{what}: "
                                   + budget_problem(smallest, budget, f"sliding_window 1{what}"))
    fitted = replace(stream, sliding_window=best)
    problems = rules(fitted)
    if problems:  # the rules only tighten for smaller windows: no smaller one can do better
        raise MemoryBudgetExceeded(f"fit_window: sliding_window {best} is the largest that fits the memory "
                                   f"budget ({budget / GB:.2f} GB), but: " + "; ".join(problems))
    need = footprint(cfg, rt, fitted, h, w, streams).total
    return fitted, (f"fit_window: sliding_window {best} instead of {stream.sliding_window} fits the memory "
                    f"budget{what} ({need / GB:.2f} of {budget / GB:.2f} GB; window {stream.sliding_window} needs "
                    f"{fp.total / GB:.2f} GB)")


@dataclass(frozen=True)
class BudgetSnapshot:
    """A ``MemoryBudget`` as data: the automatic budgets it resolved so far, by device."""

    automatic: tuple[tuple[str, float], ...] = ()

    def bytes_for(self, stream: StreamConfig, device: torch.device) -> float:
        """As the manager's ``MemoryBudget.bytes_for``: its automatic budget where it resolved one, else
        what a budget of its own resolves now (nothing shared is written)."""
        known = dict(self.automatic).get(str(device))
        if known is not None and stream.gpu_memory_budget <= 0 and device.type == "cuda":
            return known
        return MemoryBudget().bytes_for(stream, device)


@dataclass(frozen=True)
class BudgetCheck:
    """What a check of settings against a manager's budget needs, as data (``ManagerView.budget``):
    the settings its model stands for, that model's shapes and resolved runtime, and the budget.
    The executor thread checks a parameter change with it while the inference thread may be
    swapping the model: it reads nothing of the live manager."""

    settings: RuntimeConfig
    cfg: ModelConfig
    resolved: ResolvedRuntime
    budget: BudgetSnapshot

    def problems(self, runtime: RuntimeConfig, stream: StreamConfig,
                 rules: Callable[[StreamConfig], list[str]]) -> list[str]:
        """Why ``runtime`` + ``stream`` would not fit ([]: they fit); a new model is previewed."""
        try:
            if runtime == self.settings:
                cfg, rt = self.cfg, self.resolved
            else:
                cfg, rt = model_config(runtime.resolved_preset()), resolve_runtime(runtime)
            fit_stream(cfg, rt, stream, rules, self.budget.bytes_for(stream, rt.device))
        except (ValueError, RuntimeError) as exc:  # over the budget, or a runtime that does not resolve
            return [str(exc)]
        return []


def integrated_gpu(device: torch.device) -> bool:
    """Whether ``device`` is an integrated GPU (a Jetson): its memory is the system's RAM."""
    return device.type == "cuda" and bool(getattr(torch.cuda.get_device_properties(device), "is_integrated", False))


INTEGRATED_AUTO_REFUSED = ("gpu_memory_budget 0 (the free memory at configure) is refused on an integrated GPU "
                           "(a Jetson): its memory is the system RAM that the rest of the robot (nav2, drivers) "
                           "shares, and what is free at configure is not this node's; set gpu_memory_budget to the "
                           "GB it may use (lingbot_map_bench --footprint sizes it)")


class MemoryBudget:
    """The budget of one manager: 0 GB means the free memory at the first check minus a margin on
    CUDA (remembered, so the model the manager loads itself does not shrink it), no limit on the CPU.
    On an integrated GPU 0 is refused (``INTEGRATED_AUTO_REFUSED``): free memory there is the system's."""

    def __init__(self, free_bytes: Callable[[torch.device], float] = device_free_bytes,
                 integrated: Callable[[torch.device], bool] = integrated_gpu) -> None:
        self._free_bytes = free_bytes
        self._integrated = integrated
        self._auto: dict[str, float] = {}
        self.fitted_window: Optional[int] = None
        self.configured_window = 0

    def bytes_for(self, stream: StreamConfig, device: torch.device) -> float:
        if stream.gpu_memory_budget > 0:
            return stream.gpu_memory_budget * GB
        if device.type != "cuda":
            return 0.0
        if self._integrated(device):
            raise MemoryBudgetExceeded(INTEGRATED_AUTO_REFUSED)
        key = str(device)
        if key not in self._auto:
            self._auto[key] = max(0.0, self._free_bytes(device) - MEMORY_MARGIN_GB * GB)
        return self._auto[key]

    def predict(self, cfg: ModelConfig, rt: ResolvedRuntime, stream: StreamConfig,
                hw: Optional[tuple[int, int]] = None, streams: int = 1) -> Footprint:
        return predict(cfg, rt, stream, hw, streams)

    def fit(self, cfg: ModelConfig, rt: ResolvedRuntime, stream: StreamConfig,
            rules: Callable[[StreamConfig], list[str]], streams: int = 1) -> tuple[StreamConfig, str]:
        """``fit_stream`` against this budget (resolving and remembering an automatic one)."""
        return fit_stream(cfg, rt, stream, rules, self.bytes_for(stream, rt.device), streams)

    def snapshot(self) -> BudgetSnapshot:
        """The budget as data, for checks on another thread (``BudgetCheck``)."""
        return BudgetSnapshot(tuple(self._auto.items()))

    def adopt(self, requested: StreamConfig, fitted: StreamConfig) -> None:
        """Record the window in use for the diagnostics."""
        changed = fitted.sliding_window != requested.sliding_window
        self.fitted_window = fitted.sliding_window if changed else None
        self.configured_window = requested.sliding_window

    def staging_fits(self, nbytes: int, stream: StreamConfig, device: torch.device,
                     budgeted: Callable[[], int]) -> bool:
        """Whether a copy of ``nbytes`` may sit in device memory beside a session for a while (a
        save's capture, a load's staged files): CUDA, the budgeted footprint (``budgeted()``, at the
        width's tallest frame: a new camera may start a session at any size while the copy is kept)
        plus the copy within the budget, and the copy within the free memory less the margin."""
        if device.type != "cuda" or nbytes <= 0:
            return False
        free, _ = torch.cuda.mem_get_info(device)
        if nbytes > free - MEMORY_MARGIN_GB * GB:
            return False
        budget = self.bytes_for(stream, device)
        return not budget or budgeted() + nbytes <= budget

    def warning(self) -> list[str]:
        if self.fitted_window is None:
            return []
        return [f"sliding_window fitted to {self.fitted_window} (configured {self.configured_window}) "
                "for gpu_memory_budget"]


def allocated_bytes(device: torch.device, model: torch.nn.Module, caches: list) -> int:
    """What is allocated now: the CUDA allocator's count, or on the CPU the tensors' bytes (weights
    and the caches' pools)."""
    if device.type == "cuda":
        return int(torch.cuda.memory_allocated(device))
    tensors = list(model.parameters()) + list(model.buffers())
    return sum(t.numel() * t.element_size() for t in tensors) + sum(c.nbytes for c in caches if c is not None)


__all__ = ["INTEGRATED_AUTO_REFUSED", "MEMORY_MARGIN_GB", "BudgetCheck", "BudgetSnapshot", "MemoryBudget",
           "MemoryBudgetExceeded", "MemoryReport", "allocated_bytes", "device_free_bytes", "fit_stream",
           "integrated_gpu", "predict"]
