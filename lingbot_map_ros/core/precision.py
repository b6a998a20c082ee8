"""Which precision the aggregator's weights are kept in: the node's recipe or the official benchmark's.

Both run the aggregator under autocast in the compute dtype (``RuntimeConfig.dtype``: bf16 on
Ampere and newer). They differ in the weights:

* ``node``: the aggregator is built in the compute dtype (the official demo casts it the same way):
  one half-size copy of the weights, and the residual stream, the norms and the layer scales run in
  bf16 too.
* ``official``: the aggregator keeps the checkpoint's float32 weights, as the official benchmark's
  method does (``model.to(device)``, then ``torch.amp.autocast(bf16)``): autocast still runs the
  matrix products in bf16, but every op autocast leaves alone (norms, layer scales, residual adds,
  position embeddings) sees float32 weights. This is what the published numbers were measured with;
  it costs the aggregator's weights twice the memory (``extra_weight_bytes``).

The recipe is chosen per model load, by handing ``loader(recipe)`` to ``SessionManager.open(load=...)``:
the node never passes one, so its behaviour is fixed by this module only where a tool asks.
"""
from __future__ import annotations

from typing import Callable

import torch

PRECISIONS = ("official", "node")


def loader(recipe: str) -> Callable:
    """A model loader (``runtime, log -> ModelHost``) for ``recipe`` (``ValueError`` for an unknown one).

    ``node`` is the package's own ``ModelHost.load``; ``official`` builds the same model with its
    aggregator in float32 while the resolved runtime (autocast dtype, KV caches, attention kernels)
    stays in the compute dtype.
    """
    from .model_host import ModelHost

    if recipe == "node":
        return ModelHost.load
    if recipe != "official":
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)} (got {recipe!r})")

    def load_official(runtime, log=print):
        from .config import model_config
        from .model import build_model
        from .runtime import resolve_runtime

        resolved = resolve_runtime(runtime)
        cfg = model_config(runtime.resolved_preset())
        model, report = build_model(cfg, checkpoint=runtime.checkpoint, seed=runtime.seed, device=resolved.device,
                                    dtype=torch.float32, enable_depth=True,
                                    allow_unsafe=runtime.allow_unsafe_checkpoint)
        model.eval()
        if runtime.checkpoint:
            log(f"checkpoint {runtime.checkpoint}: {report.summary()}")
        else:
            log(f"NO CHECKPOINT: using random weights of the '{cfg.preset}' preset (seed {runtime.seed}); "
                "poses are NOT meaningful")
        host = ModelHost(model, cfg, resolved, runtime, random_weights=not runtime.checkpoint, weights=report.source)
        info = host.info
        log(f"precision official: aggregator weights float32 under {info.dtype} autocast; "
            f"attention backend {info.backend}; device {info.device}")
        return host

    return load_official


def extra_weight_bytes(preset: str, compute_dtype: torch.dtype) -> int:
    """Device memory the ``official`` recipe needs beyond ``node``: the aggregator's weights in
    float32 instead of ``compute_dtype`` (counted on the meta device, nothing is allocated)."""
    from .footprint import weight_bytes

    return weight_bytes(preset, torch.float32) - weight_bytes(preset, compute_dtype)


__all__ = ["PRECISIONS", "extra_weight_bytes", "loader"]
