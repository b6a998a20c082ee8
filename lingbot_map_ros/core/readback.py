"""A step's outputs to the host with one wait: pinned staging buffers, copies queued behind the step.

``tensor.cpu()`` on a CUDA tensor waits for the device, then copies through pageable memory in
driver-sized chunks, and each of a step's outputs (pose, depth, confidence) waited again. With depth
on, that read-back (2 x 518x378 fp32) left the device idle for ~0.5 ms a frame on the H200
(measured with bench/host_gap.py). Here every output's copy is queued on the stream right after
the step, into a pinned buffer of its own (DMA at full speed), one synchronisation waits for all of
them, and each array handed out is a fresh host copy: results own their memory, the pinned buffers
are reused by the next step. On the CPU the outputs are already host tensors.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import torch


class StagedReadback:
    """Reads a fixed set of a step's outputs (by position: pose, depth, confidence) to the host."""

    def __init__(self) -> None:
        self._pinned: dict[int, torch.Tensor] = {}  # output position -> its float32 staging buffer

    def fetch(self, outputs: Sequence[Optional[torch.Tensor]]) -> list[Optional[np.ndarray]]:
        """float32 NumPy copies of ``outputs`` (None stays None), after the work that writes them."""
        devices = {t.device for t in outputs if t is not None}
        if not any(d.type == "cuda" for d in devices):
            return [None if t is None else t.float().cpu().numpy() for t in outputs]
        staged: list[Optional[torch.Tensor]] = []
        for position, t in enumerate(outputs):
            if t is None:
                staged.append(None)
                continue
            buffer = self._buffer(position, t.shape)
            buffer.copy_(t, non_blocking=True)  # queued behind the step; casts to float32 on the way
            staged.append(buffer)
        for device in devices:
            torch.cuda.current_stream(device).synchronize()  # one wait for the step and every copy
        return [None if b is None else b.numpy().copy() for b in staged]

    def _buffer(self, position: int, shape: torch.Size) -> torch.Tensor:
        buffer = self._pinned.get(position)
        if buffer is None or buffer.shape != shape:
            buffer = self._pinned[position] = torch.empty(shape, dtype=torch.float32, pin_memory=True)
        return buffer


__all__ = ["StagedReadback"]
