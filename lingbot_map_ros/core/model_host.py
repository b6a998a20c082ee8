"""ModelHost: the model in memory, built once and shared by every stream of a node.

The weights are the largest allocation of the package (~2.3 GB for the official checkpoint in
bf16), so one copy serves every ``SessionManager`` built over the host: each manager owns its
sessions, caches and policy, the host owns the model, its shapes (``ModelConfig``) and the resolved
runtime it runs with. Everything that builds or checks a model lives here: ``ModelHost.load``
(resolve, build straight in the compute dtype, cast for inference), ``model_change_problems`` (the
checks before a build, nothing allocated) and ``swap`` (a new model for new runtime settings: built
first, swapped in only when that succeeded, so a failure leaves the running model untouched).
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from .config import ModelConfig, RuntimeConfig, model_config
from .model import LingBotMap, build_model
from .results import SessionInfo
from .runtime import ResolvedRuntime, resolve_runtime

MEMORY_HEADROOM = 1.25  # weights x this must fit in free device memory (activations and caches come on top)


def session_info(runtime: ResolvedRuntime, cfg: ModelConfig, model: Any, *, random_weights: bool) -> SessionInfo:
    """What the node reports of the model it runs (diagnostics, the first log lines)."""
    return SessionInfo(
        backend=runtime.backend,
        backend_reason=runtime.backend_reason,
        attention=runtime.attention,
        runtime_reasons=tuple(runtime.reasons),
        dtype=str(runtime.dtype).replace("torch.", ""),
        device=str(runtime.device),
        model_preset=cfg.preset,
        depth_available=getattr(model, "depth_head", None) is not None,
        random_weights=random_weights,
    )


def cast_for_inference(model: LingBotMap, dtype: torch.dtype) -> None:
    """Aggregator in the compute dtype; camera and depth heads stay fp32 (docs/model.md §14)."""
    model.eval()
    model.aggregator.to(dtype)


def preview(runtime: RuntimeConfig) -> tuple[ModelConfig, ResolvedRuntime]:
    """The model shapes and the resolved runtime of ``runtime``, nothing built (the memory budget
    checks a change with them before any model exists)."""
    return model_config(runtime.resolved_preset()), resolve_runtime(runtime)


def model_change_problems(runtime: RuntimeConfig) -> list[str]:
    """Every reason why a model for ``runtime`` cannot be built here, found before building it:
    device/dtype/backend, the checkpoint file (readable, safe, every key with its shape for the
    preset) and the device memory for the weights. Cheap: nothing is allocated."""
    from .model.checkpoint import CheckpointError, check_checkpoint, model_bytes

    try:
        resolved = resolve_runtime(runtime)
    except (ValueError, RuntimeError) as exc:
        return [str(exc)]
    preset = runtime.resolved_preset()
    cfg = model_config(preset)
    problems: list[str] = []
    if runtime.checkpoint:
        try:
            check_checkpoint(cfg, runtime.checkpoint, allow_unsafe=runtime.allow_unsafe_checkpoint)
        except (CheckpointError, OSError, ValueError) as exc:
            problems.append(f"checkpoint {runtime.checkpoint!r} (model_preset {preset!r}): {exc}")
    if resolved.device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(resolved.device)
        need = model_bytes(cfg, resolved.dtype) * MEMORY_HEADROOM
        if need > free:
            problems.append(f"{resolved.device} has {free / 2**30:.1f} GiB free, the '{preset}' model needs "
                            f"~{need / 2**30:.1f} GiB")
    return problems


class ModelHost:
    """One model in memory, its shapes and the runtime it was resolved for.

    ``settings`` are the runtime settings it stands for (what ``SessionManager.apply`` compares a
    change with), ``resolved`` what they resolved to, ``weights`` where the weights came from (the
    checkpoint path, or ``random(seed=N)``). Read by the threads that stream through it; changed
    only by ``swap``, on the thread that owns its managers."""

    def __init__(self, model: Any, cfg: ModelConfig, resolved: ResolvedRuntime, settings: RuntimeConfig, *,
                 random_weights: bool, weights: str = "") -> None:
        self.model = model
        self.cfg = cfg
        self.resolved = resolved
        self.settings = settings
        self.random_weights = random_weights
        self.weights = weights
        self.info: SessionInfo = session_info(resolved, cfg, model, random_weights=random_weights)
        # how ``swap`` builds the next model (None: ``ModelHost.load``; a tool's recipe stays with its host)
        self.builder: Optional[Callable[[RuntimeConfig, Callable[[str], None]], "ModelHost"]] = None

    @classmethod
    def load(cls, runtime: RuntimeConfig, log: Callable[[str], None] = print) -> "ModelHost":
        """The model for ``runtime``: resolved once, built (checkpoint weights or seeded random ones)
        straight in its compute dtype, cast for inference. Raises with the reason when it cannot."""
        resolved = resolve_runtime(runtime)
        preset = runtime.resolved_preset()
        cfg = model_config(preset)
        model, report = build_model(
            cfg, checkpoint=runtime.checkpoint, seed=runtime.seed, device=resolved.device,
            dtype=resolved.dtype,  # the aggregator is built/loaded in the compute dtype: one copy, no fp32 detour
            enable_depth=True, allow_unsafe=runtime.allow_unsafe_checkpoint,
        )
        if runtime.checkpoint:
            log(f"checkpoint {runtime.checkpoint}: {report.summary()}")
        else:
            log(f"NO CHECKPOINT: using random weights of the '{preset}' preset (seed {runtime.seed}); "
                "poses are NOT meaningful")
        cast_for_inference(model, resolved.dtype)
        host = cls(model, cfg, resolved, runtime, random_weights=not runtime.checkpoint, weights=report.source)
        info = host.info
        log(f"attention backend {info.backend} ({info.backend_reason}); dtype {info.dtype}; device {info.device}")
        if resolved.device.type == "cuda":
            log(f"one-frame steps: {resolved.summary()}")
        return host

    @classmethod
    def around(cls, model: Any, cfg: ModelConfig, resolved: ResolvedRuntime, *,
               settings: Optional[RuntimeConfig] = None, random_weights: bool = True) -> "ModelHost":
        """A host over a model that is built already (the benchmark's variants, tests' stand-in
        models). ``settings``: the runtime settings it stands for (default: the device, dtype and
        preset of ``resolved`` and ``cfg``)."""
        if settings is None:
            settings = RuntimeConfig(device=str(resolved.device), dtype=str(resolved.dtype).replace("torch.", ""),
                                     model_preset=cfg.preset)
        return cls(model, cfg, resolved, settings, random_weights=random_weights)

    def swap(self, runtime: RuntimeConfig, log: Callable[[str], None] = print,
             load: Optional[Callable[[RuntimeConfig, Callable[[str], None]], "ModelHost"]] = None) -> None:
        """Replace the model by one built for ``runtime``. The new one is built first (``load``, else
        the host's ``builder``, else ``ModelHost.load``): when that raises, nothing changed. Every
        manager over the host then needs a new session on the new model (``SessionManager.apply``)."""
        new = (load or self.builder or ModelHost.load)(runtime, log)
        old_device = self.resolved.device
        self.model, self.cfg, self.resolved, self.settings = new.model, new.cfg, new.resolved, runtime
        self.random_weights, self.weights, self.info = new.random_weights, new.weights, new.info
        if old_device.type == "cuda":
            torch.cuda.empty_cache()  # the old weights' blocks go back once their sessions dropped them

    def release(self) -> None:
        """Drop the model (lifecycle cleanup): its memory goes back to the driver once no session
        holds it."""
        device = self.resolved.device
        self.model = None
        if device.type == "cuda":
            torch.cuda.empty_cache()


__all__ = ["MEMORY_HEADROOM", "ModelHost", "cast_for_inference", "model_change_problems", "preview", "session_info"]
