"""The official benchmark's depth metrics (``benchmark/benchmark/evaluation/depth.py``).

Per frame, a pixel counts when its reference depth lies strictly inside the dataset's clip range,
both depths are finite and the prediction is positive; a frame with fewer than 100 such pixels is
skipped. The prediction is scaled per frame by ``median(reference) / median(prediction)`` over those
pixels (the official default alignment, ``scale_only``). The metrics are then computed once over the
pixels of all frames pooled: AbsRel, SqRel, RMSE, log-RMSE (depths clipped at 1e-5 first) and the
percent of pixels with ``max(pred / ref, ref / pred)`` below 1.25, 1.25² and 1.25³.

The official repository publishes no depth numbers for ``lingbot-map.pt`` (every shipped config has
depth evaluation off); these metrics are here so a run can be compared with the official code's.
"""
from __future__ import annotations

from typing import Iterable

import numpy as np

MIN_PIXELS = 100
# configs/datasets/*.yaml evaluation.depth.gt_clip (the evaluator's default elsewhere: 0..80 m)
GT_CLIP = {"nrgbd": (0.0, 10.0), "eth3d": (0.0, 100.0), "oxford": (0.0, 200.0)}
DEFAULT_GT_CLIP = (0.0, 80.0)


def depth_metrics(pairs: Iterable[tuple[np.ndarray, np.ndarray]], gt_clip: tuple[float, float] = DEFAULT_GT_CLIP
                  ) -> dict[str, float]:
    """``pairs``: (predicted, reference) depth maps of one size per frame. Returns the metrics and
    ``frames`` / ``pixels`` used; an empty dict when no frame has enough valid pixels."""
    preds, refs, frames = [], [], 0
    lo, hi = gt_clip
    for pred, ref in pairs:
        pred, ref = np.asarray(pred, np.float64), np.asarray(ref, np.float64)
        if pred.shape != ref.shape:
            raise ValueError(f"depth maps of different sizes: {pred.shape} vs {ref.shape}")
        with np.errstate(invalid="ignore"):
            valid = (ref > lo) & (ref < hi) & np.isfinite(ref) & np.isfinite(pred) & (pred > 0)
        if valid.sum() < MIN_PIXELS:
            continue
        scale = np.median(ref[valid]) / np.median(pred[valid])
        preds.append(scale * pred[valid])
        refs.append(ref[valid])
        frames += 1
    if not frames:
        return {}
    p, g = np.concatenate(preds), np.concatenate(refs)
    ratio = np.maximum(p / g, g / p)
    return {
        "abs_rel": float(np.mean(np.abs(p - g) / g)),
        "sq_rel": float(np.mean((p - g) ** 2 / g)),
        "rmse": float(np.sqrt(np.mean((p - g) ** 2))),
        "log_rmse": float(np.sqrt(np.mean((np.log(np.clip(p, 1e-5, None)) - np.log(np.clip(g, 1e-5, None))) ** 2))),
        "delta_1_25": float(np.mean(ratio < 1.25) * 100.0),
        "delta_1_25_2": float(np.mean(ratio < 1.25**2) * 100.0),
        "delta_1_25_3": float(np.mean(ratio < 1.25**3) * 100.0),
        "frames": frames,
        "pixels": int(p.size),
    }


__all__ = ["DEFAULT_GT_CLIP", "GT_CLIP", "depth_metrics"]
