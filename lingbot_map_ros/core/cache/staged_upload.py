"""One small host→device upload per step without a host stall.

``torch.tensor(list, device="cuda")`` copies from pageable memory: the host waits for the copy, and
each call is its own launch. A step's plan (write slots, run table) is a few hundred integers built
on the host while the device is idle between two frames, so those waits are device idle time.
``StagedUpload`` writes them into a pinned host buffer and copies that with ``non_blocking=True``,
in stream order before the (replayed) kernels that read the device buffer. The pinned buffer is
reused only after the event of its previous copy has completed, so a queued copy never reads
half-overwritten data. On the CPU it is a plain copy.
"""
from __future__ import annotations

import numpy as np
import torch


class StagedUpload:
    """Copies NumPy arrays of one dtype into a fixed device tensor ``target`` (its leading elements)."""

    def __init__(self, target: torch.Tensor) -> None:
        if not target.is_contiguous():
            raise ValueError("the upload target must be contiguous (kernels and graphs read its address)")
        self.target = target
        self._on_cuda = target.device.type == "cuda"
        self._host = torch.empty(target.numel(), dtype=target.dtype, pin_memory=self._on_cuda)  # [n]
        self._copied: torch.cuda.Event | None = None

    def upload(self, values: np.ndarray) -> torch.Tensor:
        """Queue ``values`` (any shape, at most ``target.numel()`` elements) into ``target``; returns
        the written part of ``target`` (flat view)."""
        n = values.size
        if n > self.target.numel():
            raise ValueError(f"{n} values do not fit the upload target of {self.target.numel()}")
        flat = self.target.view(-1)[:n]  # [n]
        if not self._on_cuda:
            flat.copy_(torch.from_numpy(np.ascontiguousarray(values).reshape(-1)))
            return flat
        if self._copied is not None:
            self._copied.synchronize()  # the previous copy has read the pinned buffer
        self._host.numpy()[:n] = values.reshape(-1)
        flat.copy_(self._host[:n], non_blocking=True)
        self._copied = torch.cuda.Event()
        self._copied.record()
        return flat
