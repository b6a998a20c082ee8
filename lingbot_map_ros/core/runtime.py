"""Resolve ``auto`` settings into a concrete device, dtype and attention backend, with reasons.

Users see the choice and its reason in the log and in the diagnostics, so "why is it slow" has an
answer: e.g. "sdpa (flashinfer is not installed)".
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import torch

from .config import RuntimeConfig

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class ResolvedRuntime:
    device: torch.device
    dtype: torch.dtype
    backend: str  # flashinfer | sdpa
    backend_reason: str


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested but CUDA is not available")
    return device


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        if device.type != "cuda":
            return torch.float32
        # The official recipe: bf16 on compute capability >= 8, fp16 below (MODEL_SPEC §14).
        major, _ = torch.cuda.get_device_capability(device)
        return torch.bfloat16 if major >= 8 else torch.float16
    return _DTYPES[name]


def flashinfer_unusable_reason(device: torch.device, dtype: torch.dtype) -> str:
    """Why FlashInfer cannot serve this configuration ("" when it can)."""
    if device.type != "cuda":
        return f"device is {device.type}, FlashInfer needs CUDA"
    if dtype not in (torch.bfloat16, torch.float16):
        return f"dtype is {str(dtype).replace('torch.', '')}, FlashInfer needs float16 or bfloat16"
    if importlib.util.find_spec("flashinfer") is None:
        return "flashinfer is not installed (pip install '.[gpu]')"
    return ""


def resolve_backend(name: str, device: torch.device, dtype: torch.dtype) -> tuple[str, str]:
    if name == "sdpa":
        return "sdpa", "requested"
    reason = flashinfer_unusable_reason(device, dtype)
    if name == "flashinfer":
        if reason:
            raise ValueError(f"attention_backend 'flashinfer' cannot run: {reason}")
        return "flashinfer", "requested"
    if reason:
        return "sdpa", f"auto: {reason}"
    return "flashinfer", "auto: CUDA with a half-precision dtype and flashinfer importable"


def resolve_flashinfer_kernel(name: str, device: torch.device) -> str:
    """``auto``: fa3 on Hopper (compute capability 9.x, where FlashInfer has it), fa2 elsewhere.

    fa3 is used over exact one-token pages, so it attends exactly the visible keys (unlike the
    official fa3 mode, MODEL_SPEC §16 #8); measured ~45 vs ~55 ms/frame on an H200 (docs/benchmarks.md).
    """
    if name in ("fa2", "fa3"):
        return name
    if name != "auto":
        raise ValueError(f"flashinfer kernel must be auto, fa2 or fa3 (got {name!r})")
    if device.type == "cuda" and torch.cuda.get_device_capability(device)[0] == 9:
        return "fa3"
    return "fa2"


def resolve_runtime(cfg: RuntimeConfig) -> ResolvedRuntime:
    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, device)
    backend, reason = resolve_backend(cfg.attention_backend, device, dtype)
    return ResolvedRuntime(device=device, dtype=dtype, backend=backend, backend_reason=reason)
