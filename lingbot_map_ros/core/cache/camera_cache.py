"""KV cache of the camera head's trunk (docs/model.md §10.3). Implements ``model.interfaces.CameraAttention``.

One token per frame per (iteration, block); no eviction and no window: a stored frame stays
visible until ``reset()`` (the official behaviour the weights were run with, §16 #2). The storage
is preallocated for ``capacity_frames`` tokens, so the cache never grows tensors; a step that would
not fit raises ``CacheFull`` before anything changes and the session decides (reset / new window).

All three cases run the same code: the step's k/v are written at slots ``[length, length+S)`` and
the queries attend over ``[0, length+S)``. Phase 1 (empty cache, S frames) thus attends among
its own S tokens, a keyframe attends over everything stored incl. itself, and a non-keyframe does
the same but ``end_step`` does not advance ``length``, so its slot is overwritten by the next step.
Because of that scratch slot, every step (stored or not) needs ``length + S <= capacity_frames``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .pages import CacheFull
from .sdpa_backend import default_sdpa_kernels, sdpa_kernel_context

DECODE_KERNELS = ("sdpa", "triton")


class CameraKVCache:
    """Preallocated ``[iterations, blocks, 2, capacity, H, D]`` K/V store of the camera-head trunk."""

    def __init__(
        self,
        num_iterations: int,
        num_blocks: int,
        num_heads: int,
        head_dim: int,
        capacity_frames: int,
        dtype: torch.dtype,
        device: torch.device | str,
        static: bool = False,
        decode_kernel: str = "sdpa",
    ) -> None:
        """``static``: CUDA-graph-safe one-frame steps: the write slot and the visible length live in
        device buffers set by ``begin_step``, and attention runs over the whole capacity with an
        additive mask (-inf past the visible length), so no shape or address depends on the length.
        ``decode_kernel`` (static one-frame steps): ``sdpa``, that masked SDPA call after two scatters;
        ``triton``, one split-key decode that also writes the slot (``camera_decode.py``, fp32)."""
        for label, value in (
            ("num_iterations", num_iterations),
            ("num_blocks", num_blocks),
            ("num_heads", num_heads),
            ("head_dim", head_dim),
            ("capacity_frames", capacity_frames),
        ):
            if value < 1:
                raise ValueError(f"{label} must be >= 1 (got {value})")
        if decode_kernel not in DECODE_KERNELS:
            raise ValueError(f"decode_kernel must be one of {DECODE_KERNELS} (got {decode_kernel!r})")
        if decode_kernel == "triton" and dtype != torch.float32:
            raise ValueError(f"the Triton camera decode runs in fp32 (the head's dtype), not {dtype}")
        self.decode_kernel = decode_kernel
        self.num_iterations = num_iterations
        self.num_blocks = num_blocks
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.capacity = capacity_frames
        self.dtype = dtype
        self.device = torch.device(device)
        # [iterations, blocks, 2 (K, V), capacity, H, D]
        self._storage = torch.zeros(
            (num_iterations, num_blocks, 2, capacity_frames, num_heads, head_dim), dtype=dtype, device=self.device
        )
        self._kernels = default_sdpa_kernels(self.device)  # the key length grows: avoid cuDNN re-plans
        self._length = 0
        self._step: tuple[int, bool] | None = None  # (num_frames, store) of the open step
        self.static = static
        self._slot = torch.zeros(1, dtype=torch.long, device=self.device)  # [1] write slot of a one-frame step
        self._positions = torch.arange(capacity_frames, device=self.device)  # [capacity]
        self._mask = torch.zeros(1, 1, 1, capacity_frames, dtype=dtype, device=self.device)  # additive
        self._mask_length: int | None = None  # the mask shows positions 0 .. this (None: not built yet)

    @property
    def storage(self) -> torch.Tensor:
        return self._storage

    @property
    def length(self) -> int:
        """Stored frames (tokens per iteration and block)."""
        return self._length

    @property
    def nbytes(self) -> int:
        """Bytes preallocated for K/V (all blocks)."""
        return self._storage.numel() * self._storage.element_size()

    @property
    def in_step(self) -> bool:
        return self._step is not None

    def begin_step(self, num_frames: int, *, store: bool) -> None:
        """Open a step of ``num_frames`` frames; raises ``CacheFull`` (nothing changed) when they do not fit."""
        if self._step is not None:
            raise RuntimeError("begin_step() while a step is open: call end_step() first")
        if num_frames < 1:
            raise ValueError(f"num_frames must be >= 1 (got {num_frames})")
        if self._length + num_frames > self.capacity:
            raise CacheFull(
                f"camera-head cache full: {self._length} of {self.capacity} frames stored, "
                f"a step of {num_frames} frame(s) does not fit; start a new session"
            )
        self._step = (num_frames, store)
        if self.static and num_frames == 1:
            self._slot.fill_(self._length)
            if self.decode_kernel == "sdpa":  # the decode kernel reads the slot, not a mask
                self._update_mask()

    def _update_mask(self) -> None:
        """Make the mask show positions ``0 .. length`` (stored tokens + this step's slot).

        The mask always shows ``0 .. _mask_length``, so when the length grew (stored frames, a load of
        a longer session) one fill opens the new positions (one launch on the host's critical path
        between two frames); only when it went down (a reset, a shorter load) is the mask rebuilt.
        """
        shown, length = self._mask_length, self._length
        if shown == length:
            return
        if shown is not None and shown < length:
            self._mask.view(-1)[shown + 1 : length + 1].fill_(0.0)  # [length - shown]
        else:
            visible = self._positions <= length  # [capacity]
            self._mask.copy_(torch.where(visible, 0.0, float("-inf")).to(self.dtype).view_as(self._mask))
        self._mask_length = length

    def __call__(
        self, iteration: int, block: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        """Write ``k, v [S, H, D]`` after the stored tokens and attend ``q [S, H, D]`` over all of them."""
        if self._step is None:
            raise RuntimeError("attention call outside a step: call begin_step() first")
        if not 0 <= iteration < self.num_iterations:
            raise IndexError(f"iteration {iteration} out of range 0..{self.num_iterations - 1}")
        if not 0 <= block < self.num_blocks:
            raise IndexError(f"block {block} out of range 0..{self.num_blocks - 1}")
        num_frames = self._step[0]
        expected = (num_frames, self.num_heads, self.head_dim)
        if tuple(q.shape) != expected or tuple(k.shape) != expected or tuple(v.shape) != expected:
            raise ValueError(
                f"q, k, v must be {list(expected)} (got {list(q.shape)}, {list(k.shape)}, {list(v.shape)})"
            )
        kv = self._storage[iteration, block]  # [2, capacity, H, D]
        if self.static and num_frames == 1:
            return self._attend_static(kv, q, k, v)
        end = self._length + num_frames
        kv[0, self._length : end] = k  # [S, H, D]
        kv[1, self._length : end] = v  # [S, H, D]
        # 4-D views: PyTorch's fused CUDA SDPA kernels take only 4-D inputs (3-D falls back to math).
        keys = kv[0, :end].transpose(0, 1).unsqueeze(0)  # [1, H, L+S, D]
        values = kv[1, :end].transpose(0, 1).unsqueeze(0)  # [1, H, L+S, D]
        qh = q.to(self.dtype).transpose(0, 1).unsqueeze(0)  # [1, H, S, D]
        with sdpa_kernel_context(self._kernels):
            out = F.scaled_dot_product_attention(qh, keys, values)  # [1, H, S, D]
        return out[0].transpose(0, 1).to(q.dtype)  # [S, H, D]

    def _attend_static(self, kv: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.decode_kernel == "triton":
            from .camera_decode import decode_attention

            return decode_attention(q.float(), k.float(), v.float(), kv[0], kv[1], self._slot).to(q.dtype)  # [1, H, D]
        kv[0].index_copy_(0, self._slot, k.to(self.dtype))  # [1, H, D] at the device-held slot
        kv[1].index_copy_(0, self._slot, v.to(self.dtype))
        keys = kv[0].transpose(0, 1).unsqueeze(0)  # [1, H, capacity, D]
        values = kv[1].transpose(0, 1).unsqueeze(0)
        qh = q.to(self.dtype).transpose(0, 1).unsqueeze(0)  # [1, H, 1, D]
        out = F.scaled_dot_product_attention(qh, keys, values, attn_mask=self._mask)  # [1, H, 1, D]
        return out[0].transpose(0, 1).to(q.dtype)  # [1, H, D]

    def end_step(self) -> None:
        """Close the step; only a stored step advances ``length``."""
        if self._step is None:
            raise RuntimeError("end_step() without begin_step()")
        num_frames, store = self._step
        if store:
            self._length += num_frames
        self._step = None

    def abort_step(self) -> bool:
        """Close a step whose model call failed, storing nothing. Always exact: a step writes only
        the slots from ``length`` on, which nothing stored occupies."""
        if self._step is None:
            raise RuntimeError("abort_step() without begin_step()")
        self._step = None
        return True

    def state_dict(self) -> dict:
        """Shapes and the stored length (JSON data); the K/V come from ``stored_tensor``."""
        if self._step is not None:
            raise RuntimeError("state_dict() while a step is open")
        return {"num_iterations": self.num_iterations, "num_blocks": self.num_blocks, "num_heads": self.num_heads,
                "head_dim": self.head_dim, "length": self._length}

    def stored_tensor(self, on_device: bool = False) -> torch.Tensor:
        """A copy of the stored frames' K/V, ``[iterations, blocks, 2, length, H, D]``, on the host or
        (``on_device``) in new memory on the cache's device."""
        stored = self._storage[:, :, :, : self._length]
        return stored.clone() if on_device else stored.cpu()

    def bytes_in_use(self) -> int:
        """What ``stored_tensor`` copies."""
        return self._storage[:, :, :, : self._length].numel() * self._storage.element_size()

    def check_state(self, state: dict) -> list[str]:
        """Why a saved camera cache cannot go into this one (empty: it can)."""
        return camera_state_problems(state, num_iterations=self.num_iterations, num_blocks=self.num_blocks,
                                     num_heads=self.num_heads, head_dim=self.head_dim, capacity=self.capacity)

    def load_state(self, state: dict, stored: torch.Tensor) -> None:
        """Restore in place (``stored``: ``stored_tensor``'s tensor, any device)."""
        problems = self.check_state(state)
        if problems:
            raise ValueError("; ".join(problems))
        length = int(state["length"])
        self._step = None
        self._storage[:, :, :, :length].copy_(stored.to(self.device, self.dtype))  # [I, B, 2, L, H, D]
        self._length = length

    def reset(self) -> None:
        """Forget every frame (storage kept; slots are rewritten before they become visible)."""
        self._length = 0
        self._step = None


def camera_state_problems(state: dict, *, num_iterations: int, num_blocks: int, num_heads: int, head_dim: int,
                          capacity: int) -> list[str]:
    """Why a saved camera cache cannot go into a cache of these shapes (empty: it can); needs no storage."""
    have = {"num_iterations": num_iterations, "num_blocks": num_blocks, "num_heads": num_heads, "head_dim": head_dim}
    problems = [f"camera cache {key} {state[key]} != {value}" for key, value in have.items()
                if int(state[key]) != value]
    if int(state["length"]) + 1 > capacity:  # + 1: the scratch slot of a non-keyframe
        problems.append(f"camera cache holds {state['length']} frames, this one {capacity - 1}")
    return problems


__all__ = ["CameraKVCache", "camera_state_problems", "DECODE_KERNELS"]
