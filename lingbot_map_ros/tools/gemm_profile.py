"""The matrix products of a profiled step, by shape: where a batch of streams does or does not gain.

A batched step's products have the single stream's weights (``K x N``) and ``n`` times its rows
(``M``). Whether the batch pays off in them is their achieved throughput at ``M`` against ``n * M``: a
product far from the card's peak at one stream's ``M`` should gain, one already near it cannot. The
kernel names do not tell this (cuBLAS picks another kernel for another ``M``), the operators' shapes
do: ``profile(record_shapes=True)`` records them, ``key_averages(group_by_input_shape=True)`` keeps
them apart, and each operator's device time includes the kernels it launched.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional

# the operators that launch a product's kernel, and where their operands' shapes are in ``input_shapes``
# (``linear`` and ``matmul`` are not counted: they reach the device through ``addmm`` / ``mm``)
PRODUCT_OPERANDS: dict[str, tuple[int, int]] = {
    "aten::mm": (0, 1),      # mm(a [M, K], b [K, N])
    "aten::addmm": (1, 2),   # addmm(bias, a [M, K], b [K, N])
    "aten::bmm": (0, 1),     # bmm(a [B, M, K], b [B, K, N]): B folded into M
    "aten::baddbmm": (1, 2),  # baddbmm(bias, a [B, M, K], b [B, K, N])
    "aten::_addmm_activation": (1, 2),  # addmm with a GELU/ReLU epilogue (compiled code may pick it)
}


@dataclass(frozen=True)
class ProductTime:
    """One product shape of a step: ``m x k`` times ``k x n``, per tick."""

    m: int
    k: int
    n: int
    calls: float  # per tick
    ms: float  # device ms per tick, all calls

    @property
    def flops(self) -> float:
        """Floating-point operations per tick (2 M N K per call)."""
        return 2.0 * self.m * self.k * self.n * self.calls

    @property
    def tflops(self) -> float:
        """Achieved throughput."""
        return tflops(self.flops, self.ms)


def tflops(flops: float, ms: float) -> float:
    """``flops`` done in ``ms`` milliseconds, in TFLOP/s (0 for no time)."""
    return flops / (ms * 1e-3) / 1e12 if ms > 0 else 0.0


def _operand_dims(key: str, shapes) -> Optional[tuple[int, int, int]]:
    """``(M, K, N)`` of a product operator's recorded input shapes (batch dims folded into ``M``)."""
    slots = PRODUCT_OPERANDS.get(key)
    if slots is None or not shapes or len(shapes) <= max(slots):
        return None
    a, b = shapes[slots[0]], shapes[slots[1]]
    if len(a) < 2 or len(b) < 2:
        return None
    m = 1
    for d in a[:-1]:
        m *= int(d)
    return m, int(a[-1]), int(b[-1])


def products_by_shape(events: Iterable, ticks: int, time_attr: str = "device_time_total") -> list[ProductTime]:
    """Every product shape of ``events`` (``key_averages(group_by_input_shape=True)`` of a profile over
    ``ticks`` ticks), its calls and ms per tick, longest first. ``time_attr``: the event's time in µs
    (``device_time_total`` on a GPU; the tests use ``cpu_time_total``)."""
    totals: dict[tuple[int, int, int], list[float]] = {}
    for event in events:
        dims = _operand_dims(event.key, getattr(event, "input_shapes", None))
        us = float(getattr(event, time_attr, 0.0) or 0.0)
        if dims is None or us <= 0:
            continue
        entry = totals.setdefault(dims, [0.0, 0.0])
        entry[0] += event.count / ticks
        entry[1] += us / 1e3 / ticks
    products = [ProductTime(m, k, n, calls, ms) for (m, k, n), (calls, ms) in totals.items()]
    return sorted(products, key=lambda p: -p.ms)


def product_comparison(one: list[ProductTime], many: list[ProductTime], streams: int, top: int = 12) -> str:
    """The products of one stream's step beside the batched step of ``streams``, matched by their weights
    (``K x N``), the batched step's longest first: ms per tick, M, achieved TFLOP/s and the time ratio
    (``streams``.00x: no gain from the batch; the ratio of the throughputs says why)."""
    def by_weights(products: list[ProductTime]) -> dict[tuple[int, int], list[ProductTime]]:
        grouped: dict[tuple[int, int], list[ProductTime]] = {}
        for p in products:
            grouped.setdefault((p.k, p.n), []).append(p)
        return grouped

    alone, batched = by_weights(one), by_weights(many)
    order = sorted(set(alone) | set(batched), key=lambda kn: -sum(p.ms for p in batched.get(kn, [])))
    rows = [f"Matrix products by weight shape, eager (one stream beside {streams} streams batched; TFLOP/s "
            "achieved):", "",
            f"| K x N | one stream: M | ms | TFLOP/s | {streams} streams: M | ms | TFLOP/s | ratio |",
            "|---|---|---|---|---|---|---|---|"]

    def side(products: list[ProductTime]) -> tuple[str, float, str]:
        if not products:
            return "-", 0.0, "-"
        ms = sum(p.ms for p in products)
        rows_text = "/".join(str(m) for m in sorted({p.m for p in products}))
        return rows_text, ms, f"{tflops(sum(p.flops for p in products), ms):.0f}" if ms > 0 else "-"

    for k, n in order[:top]:
        m1, ms1, t1 = side(alone.get((k, n), []))
        m2, ms2, t2 = side(batched.get((k, n), []))
        ratio = f"{ms2 / ms1:.2f}x" if ms1 > 0 else "-"
        rows.append(f"| {k} x {n} | {m1} | {ms1:.3f} | {t1} | {m2} | {ms2:.3f} | {t2} | {ratio} |")
    total_one, total_many = sum(p.ms for p in one), sum(p.ms for p in many)
    ratio = f"{total_many / total_one:.2f}x" if total_one > 0 else "-"
    rows.append(f"| all products | | {total_one:.3f} | | | {total_many:.3f} | | {ratio} |")
    return "\n".join(rows)


__all__ = ["PRODUCT_OPERANDS", "ProductTime", "product_comparison", "products_by_shape"]
