"""Streaming KV caches: paged global-attention cache (page table + per-block pages + backend) and
the camera-head cache. Plain-Python page bookkeeping lives in ``pages``; attention kernels behind
the ``AttentionBackend`` seam (``sdpa_backend``; FlashInfer optional)."""
from .backend import AttentionBackend
from .camera_cache import CameraKVCache
from .paged import PagedKVCache
from .pages import (
    SPECIAL_TOKENS_PER_FRAME,
    AppendPlan,
    CacheFull,
    PageStats,
    PageTable,
    PoolExhausted,
)
from .sdpa_backend import SdpaBackend

__all__ = [
    "SPECIAL_TOKENS_PER_FRAME",
    "AppendPlan",
    "AttentionBackend",
    "CacheFull",
    "CameraKVCache",
    "PageStats",
    "PageTable",
    "PagedKVCache",
    "PoolExhausted",
    "SdpaBackend",
]
