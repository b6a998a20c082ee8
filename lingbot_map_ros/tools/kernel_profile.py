"""GPU kernel time of a profiled step, by kernel and by category: what the device spends its time on.

A profile with the CPU activity beside the CUDA one (``record_shapes`` needs it for the products' shapes,
``gemm_profile.py``) records three kinds of events with device time: the kernels themselves, the host
operators that launched them (their device time is their kernels') and user annotations such as a
``torch.compile`` region (on the device timeline too, spanning its kernels). Only the first kind is kernel
time; counting the others beside it counts the same microseconds again.
"""
from __future__ import annotations

# a kernel name's category: the first whose keys one of its substrings matches (lowercase), in this order
KERNEL_CATEGORIES = (
    ("attention", ("prefill", "flash", "fmha", "attention", "attn")),
    ("gemm", ("gemm", "matmul", "cutlass", "xmma", "nvjet", "cublas", "sm90_")),
    ("layernorm", ("layer_norm", "layernorm")),
    ("conv (depth head)", ("conv", "implicit", "winograd", "cudnn")),
    ("copy/index/cat", ("copy", "index", "cat", "gather", "scatter", "fill")),
)


def device_kernel_ms(events, steps: int) -> dict[str, float]:
    """GPU kernel ms per step by kernel name from a profiler's ``key_averages()`` over ``steps`` steps.

    Only the kernels: an operator recorded on the host (a profile with the CPU activity too) carries its
    kernels' time, and a user annotation (a ``torch.compile`` region, which the CPU activity brings onto the
    device timeline as well) spans them; counting either beside the kernels would count them again. Copies
    and fills the host issued (``Memcpy``/``Memset``) are not kernel time either."""
    from torch.autograd import DeviceType

    totals: dict[str, float] = {}
    for event in events:
        us = getattr(event, "device_time_total", 0.0) or getattr(event, "cuda_time_total", 0.0)
        operator = getattr(event, "device_type", None) == DeviceType.CPU
        annotation = bool(getattr(event, "is_user_annotation", False))
        host_side = event.key.startswith(("aten::", "cuda", "Memcpy", "Memset")) and "kernel" not in event.key.lower()
        if us <= 0 or host_side or operator or annotation:
            continue
        totals[event.key] = totals.get(event.key, 0.0) + us / 1e3 / steps
    return totals


def kernel_category(name: str) -> str:
    """The ``KERNEL_CATEGORIES`` category of a kernel's name (``elementwise/other`` when none matches)."""
    lowered = name.lower()
    return next((c for c, keys in KERNEL_CATEGORIES if any(k in lowered for k in keys)), "elementwise/other")


def by_category(kernel_ms: dict[str, float]) -> dict[str, float]:
    """Kernel ms by name (``device_kernel_ms``) summed per ``KERNEL_CATEGORIES`` category."""
    totals: dict[str, float] = {}
    for name, ms in kernel_ms.items():
        category = kernel_category(name)
        totals[category] = totals.get(category, 0.0) + ms
    return totals


def kernel_ms_by_category(events, steps: int) -> dict[str, float]:
    """GPU kernel ms per step by ``KERNEL_CATEGORIES`` (``device_kernel_ms`` says what counts)."""
    return by_category(device_kernel_ms(events, steps))


__all__ = ["KERNEL_CATEGORIES", "by_category", "device_kernel_ms", "kernel_category", "kernel_ms_by_category"]
