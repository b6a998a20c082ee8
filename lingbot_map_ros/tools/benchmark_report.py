"""The benchmark's numbers per dataset and the tables it prints, from the per-sequence metrics files.

Aggregation as the official benchmark does it (``benchmark/evaluate.py``, ``benchmark/benchmark/
evaluation/auc.py``): a dataset's ATE, RPE-trans and RPE-rot are the means over its sequences; its
pose AUC is given twice, **macro** (the mean of the sequences' AUCs) and **micro** (one AUC of all
sequences' pairs pooled). Tables are Markdown, in the official table's columns, with the official
numbers of ``lingbot-map.pt`` on the row below ours.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ..core.trajectory import AUC_THRESHOLDS_DEG, PoseAUC
from .datasets.base import Protocol


@dataclass
class DatasetSummary:
    """One dataset of a run: its finished sequences' metrics and the ones that failed."""

    name: str  # the --dataset name
    protocol: Protocol
    done: list[dict] = field(default_factory=list)  # per-sequence metrics (the metrics.json contents)
    failed: list[tuple[str, str]] = field(default_factory=list)  # (sequence, one-line reason)

    def mean(self, key: str) -> float:
        values = [m[key] for m in self.done if m.get(key) is not None]
        return float(np.mean(values)) if values else float("nan")

    def extra(self) -> list[str]:
        """Sequences run outside the official scene list (``--all-scenes``)."""
        return [m["sequence"] for m in self.done if not self.protocol.is_official_scene(m["sequence"])]

    def auc_macro(self, key: str = "auc") -> Optional[list[float]]:
        """``key``: ``auc`` (the official convention) or ``auc_inverse_convention``."""
        per_seq = [PoseAUC.from_json(m[key]) for m in self.done if m.get(key)]
        if not per_seq:
            return None
        return [float(np.mean([a.auc(t) for a in per_seq])) for t in AUC_THRESHOLDS_DEG]

    def auc_micro(self, key: str = "auc") -> Optional[list[float]]:
        per_seq = [PoseAUC.from_json(m[key]) for m in self.done if m.get(key)]
        if not per_seq:
            return None
        pooled = per_seq[0]
        for other in per_seq[1:]:
            pooled = pooled.merged(other)
        return [pooled.auc(t) for t in AUC_THRESHOLDS_DEG]

    def to_json(self) -> dict:
        official = self.protocol.official
        return {
            "dataset": self.name, "title": self.protocol.title, "sequences_done": len(self.done),
            "sequences_failed": len(self.failed),
            "ate": self.mean("ate"), "rpe_trans": self.mean("rpe_trans"), "rpe_rot": self.mean("rpe_rot"),
            "auc_macro": self.auc_macro(), "auc_micro": self.auc_micro(),
            "auc_inverse_convention_macro": self.auc_macro("auc_inverse_convention"),
            "auc_inverse_convention_micro": self.auc_micro("auc_inverse_convention"),
            "outside_official_scenes": self.extra(),
            "official": None if official is None else {
                "scenes": official.scenes, "ate": official.ate, "rpe_trans": official.rpe_trans,
                "rpe_rot": official.rpe_rot_deg, "auc_macro": official.auc_macro, "auc_micro": official.auc_micro,
                "points": None if official.points is None else dict(zip(POINT_COLUMNS, official.points))},
            "failed": [{"sequence": s, "reason": r} for s, r in self.failed],
            "sequences": [{k: m.get(k) for k in ("sequence", "frames", "evaluated", "ate", "rpe_trans", "rpe_rot",
                                                  "fps")} for m in self.done],
        }


def _num(value: Optional[float], digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}f}"


def _table(header: list[str], rows: list[list[str]], right_from: int = 1) -> list[str]:
    align = ["---" if i < right_from else "---:" for i in range(len(header))]
    return ["| " + " | ".join(r) + " |" for r in [header, align, *rows]]


POINT_COLUMNS = ("accuracy", "completeness", "chamfer", "precision", "recall", "f1")


def dataset_tables(summary: DatasetSummary) -> list[str]:
    """The dataset's table in the official columns, its AUC table where the official one has AUC, and
    the per-sequence table."""
    p, off = summary.protocol, summary.protocol.official
    total = len(summary.done) + len(summary.failed)
    lines = [f"## {p.title} (--dataset {summary.name}): {len(summary.done)} of {total} sequences", ""]
    extra = summary.extra()
    ours = f"{p.title} (this run)" if not extra else \
        f"{p.title} (this run, {len(extra)} of them outside the official scenes: *)"
    rows = [[ours, str(len(summary.done)), _num(summary.mean("ate")),
             _num(summary.mean("rpe_trans")), _num(summary.mean("rpe_rot"))]]
    if off is not None:
        rows.append([f"{p.title} (official lingbot-map.pt)", str(off.scenes), _num(off.ate), _num(off.rpe_trans),
                     _num(off.rpe_rot_deg)])
    lines += _table(["Dataset", "#Scenes", "ATE", "RPE-trans", "RPE-rot (deg)"], rows, right_from=1)
    if p.auc:
        auc_rows = []
        for label, ours, theirs in (("macro", summary.auc_macro(), off.auc_macro if off else None),
                                    ("micro", summary.auc_micro(), off.auc_micro if off else None)):
            auc_rows.append([f"{p.title} (this run)", label, *[_num(v, 2) for v in (ours or [None] * 4)]])
            if theirs:
                auc_rows.append([f"{p.title} (official lingbot-map.pt)", label, *[_num(v, 2) for v in theirs]])
        lines += [""] + _table(["Dataset", "Aggregation", *[f"AUC@{t}" for t in AUC_THRESHOLDS_DEG]], auc_rows,
                               right_from=2)
    if off is not None and off.points is not None:
        lines += ["", "Point cloud (official lingbot-map.pt; not computed by this command):", ""]
        lines += _table(["Dataset", "Accuracy", "Completeness", "Chamfer", "Precision", "Recall", "F1"],
                        [[p.title, *[_num(v, 3) for v in off.points[:3]], *[_num(v, 2) for v in off.points[3:]]]])
    seq_rows = []
    for m in summary.done:
        auc30 = PoseAUC.from_json(m["auc"]).auc(30) if m.get("auc") else None
        mark = "" if p.is_official_scene(m["sequence"]) else " *"
        seq_rows.append([m["sequence"] + mark, str(m["frames"]), str(m["evaluated"]), _num(m["ate"], 4),
                         _num(m["rpe_trans"], 4), _num(m["rpe_rot"], 3), _num(auc30, 2), _num(m.get("fps"), 2)])
    for name, reason in summary.failed:
        seq_rows.append([name, f"failed: {reason}", "", "", "", "", "", ""])
    lines += [""] + _table(["sequence", "frames", "evaluated", "ATE", "RPE-trans", "RPE-rot (deg)", "AUC@30", "fps"],
                           seq_rows, right_from=1)
    return lines


__all__ = ["DatasetSummary", "dataset_tables"]
