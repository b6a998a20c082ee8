"""The streaming global-attention KV cache: preallocated pages per block, one shared page table.

Implements ``model.interfaces.GlobalAttention``. One step of the session is::

    cache.begin_step(num_frames, store=...)   # page table updated, write index + backend plan built
    for block in range(num_blocks):           # inside the model's global blocks
        out = cache(block, q, k, v)           # write this step's k/v, attend over the visible set
    cache.end_step()                          # non-keyframes are rolled back here

Semantics (docs/model.md §9): ``store=True`` appends the step's frames (phase 1: the scale frames at
once; phase-2 keyframe: one frame) and applies eviction *before* attention, so the step sees
scale frames + the last ``W`` stored frames (incl. itself) + specials of every stored frame.
``store=False`` (non-keyframe) appends with eviction deferred, so the step sees the cache as it
stands plus its own tokens (up to ``W + 1`` recent frames), and ``end_step`` rolls the append
back: nothing is stored and no counter moves (§9.5).

Geometry (page size = patch tokens per frame, i.e. the image size; scale frames; window; pool
sizes; head shape; dtype; device) is fixed at construction: the storage is preallocated once like
gpt-fast's caches. A change of any of these needs a new cache object; ``reset()`` only empties it.
If a step fails half way (an exception inside the model), call ``reset()``: blocks may then hold
different frames.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..config import special_pages_capacity
from ..runtime import concrete_device
from .backend import AttentionBackend
from .pages import AppendPlan, PageStats, PageTable, TableMark
from .sdpa_backend import SdpaBackend
from .staged_upload import StagedUpload

WRITE_KERNELS = ("torch", "triton")  # how one-frame steps write their k, v (``PagedKVCache(write_kernel=...)``)


@dataclass(frozen=True)
class _Step:
    num_frames: int
    store: bool
    num_tokens: int
    plan: AppendPlan


class PagedKVCache:
    """Paged K/V storage of every global block plus the page table they share."""

    def __init__(
        self,
        num_blocks: int,
        num_heads: int,
        head_dim: int,
        page_size: int,
        scale_frames: int,
        sliding_window: int,
        max_frame_num: int,
        dtype: torch.dtype,
        device: torch.device | str,
        backend: str | AttentionBackend = "sdpa",
        num_patch_pages: int | None = None,
        single_frame_backend: AttentionBackend | None = None,
        special_pages: int | None = None,
        allocation: str = "lifo",
        write_kernel: str = "torch",
        storage: torch.Tensor | None = None,
    ) -> None:
        """``backend``: ``"sdpa"`` or an ``AttentionBackend`` (``cache/factory.py`` builds them from
        the runtime). ``single_frame_backend``: an optional second backend for one-frame steps
        (phase 2), e.g. a CUDA-graph-capable one whose buffers have fixed addresses; multi-frame
        steps (phase 1) keep using ``backend``. ``num_patch_pages`` / ``special_pages``: pool sizes
        (None = the official ones). ``allocation``: the page table's allocation order (``pages.py``;
        ``lowest`` keeps the stored patch pages a contiguous prefix for ``split_backend.py``).
        ``write_kernel``: how one-frame steps put their k and v into the pages: ``torch`` (stack +
        ``index_copy_``) or ``triton`` (one kernel, ``kv_write.py``; CUDA); the bytes are the same.
        ``storage``: the pages to use instead of allocating them, ``[blocks, 2, pages, page, H, D]`` of
        this cache's shapes and dtype - a stream's share of a group's pool (``pool.py``), a view."""
        if write_kernel not in WRITE_KERNELS:
            raise ValueError(f"write_kernel must be one of {WRITE_KERNELS} (got {write_kernel!r})")
        self.write_kernel = write_kernel
        if num_blocks < 1 or num_heads < 1 or head_dim < 1:
            raise ValueError(
                f"num_blocks, num_heads, head_dim must be >= 1 (got {num_blocks}, {num_heads}, {head_dim})"
            )
        if max_frame_num < 1:
            raise ValueError(f"max_frame_num must be >= 1 (got {max_frame_num})")
        self.table = PageTable(
            scale_frames=scale_frames,
            sliding_window=sliding_window,
            page_size=page_size,
            num_patch_pages=num_patch_pages,
            special_pages=(
                special_pages if special_pages is not None else special_pages_capacity(max_frame_num, page_size)
            ),
            allocation=allocation,
        )
        self.num_blocks = num_blocks
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.page_size = page_size
        self.specials_per_frame = self.table.specials_per_frame
        self.tokens_per_frame = self.specials_per_frame + page_size
        self.max_frame_num = max_frame_num
        self.dtype = dtype
        self.device = concrete_device(device)  # cuda -> cuda:N: the storage check below compares devices
        # [blocks, 2 (K, V), pages, page, H, D]: per block K and V are each one contiguous [pages, page, H, D]
        # tensor (see backend.py for why not [pages, 2, page, H, D]); zero-filled so stale slots are never NaN.
        shape = (num_blocks, 2, self.table.num_pages, page_size, num_heads, head_dim)
        if storage is None:
            self._storage = torch.zeros(shape, dtype=dtype, device=self.device)
        else:
            if tuple(storage.shape) != shape or storage.dtype != dtype or storage.device != self.device:
                raise ValueError(f"storage must be {list(shape)} {dtype} on {self.device} "
                                 f"(got {list(storage.shape)} {storage.dtype} on {storage.device})")
            if not storage[0, 0].is_contiguous():
                raise ValueError("each block's K and V pages must be contiguous (a slice of a pool along its pages)")
            self._storage = storage
        if isinstance(backend, str):
            if backend.lower() != "sdpa":
                raise ValueError(
                    f"backend by name must be 'sdpa' (got {backend!r}); build others with cache/factory.py"
                )
            backend = SdpaBackend(page_size=page_size, device=self.device)
        elif not isinstance(backend, AttentionBackend):
            raise TypeError(f"backend must be 'sdpa' or an AttentionBackend (got {type(backend)!r})")
        self.backend = backend
        self.single_frame_backend = single_frame_backend
        self._host_offsets = np.arange(page_size, dtype=np.int64)  # [page]
        # [T] token slot of each of the step's tokens. One persistent buffer sized for the largest
        # step (phase 1): a one-frame step always uses the view [:P] of it, a fixed address, so a
        # captured CUDA graph's index_copy_ reads the current step's slots.
        max_tokens = max(1, scale_frames) * self.tokens_per_frame
        self._write_slot_buffer = torch.zeros(max_tokens, dtype=torch.long, device=self.device)
        self._slot_upload = StagedUpload(self._write_slot_buffer)
        self._write_slots: torch.Tensor | None = None
        self._step: _Step | None = None
        self._mark: TableMark | None = None  # the table before the open step (``abort_step``)
        self.last_step_visible_keys = 0

    # ------------------------------------------------------------------ views

    @property
    def storage(self) -> torch.Tensor:
        """All pages: ``[blocks, 2, pages, page, H, D]`` (0 = K, 1 = V)."""
        return self._storage

    def block_storage(self, block: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Pages of one block as the backends take them: ``(k_pages, v_pages)``, each ``[pages, page, H, D]``."""
        kv = self._storage[block]  # [2, pages, page, H, D]
        return kv[0], kv[1]

    @property
    def nbytes(self) -> int:
        """Bytes preallocated for K/V (all blocks)."""
        return self._storage.numel() * self._storage.element_size()

    @property
    def frames_stored(self) -> int:
        """Frames stored (``F`` of docs/model.md §7.2 outside a non-keyframe step)."""
        return self.table.frames_stored

    @property
    def visible_key_count(self) -> int:
        """Keys a query of the current (or, outside a step, the next stored-only) step sees."""
        return self.table.visible_key_count

    @property
    def in_step(self) -> bool:
        return self._step is not None

    @property
    def step_plan(self) -> AppendPlan | None:
        """Where the current step's frames went (pages, special slots, evicted pages)."""
        return None if self._step is None else self._step.plan

    def stats(self) -> PageStats:
        return self.table.stats()

    # ------------------------------------------------------------------ steps

    def begin_step(self, num_frames: int, *, store: bool, undoable: bool = False) -> None:
        """Append this step's frames to the page table, build its write index and plan the backend.

        Raises ``PoolExhausted`` (nothing changed) when the pools cannot take the frames.
        ``undoable``: mark the table first, so that ``abort_step`` can take the step back (a group's
        batched step); a lone stream's step does not pay for the copy.
        """
        if self._step is not None:
            raise RuntimeError("begin_step() while a step is open: call end_step() first")
        if num_frames < 1:
            raise ValueError(f"num_frames must be >= 1 (got {num_frames})")
        if store:
            # A stored multi-frame step must not evict its own frames: they would vanish from the
            # attention of the very call that is supposed to see all of them (phase 1).
            room_in_scale = max(0, self.table.scale_frames - len(self.table.scale_pages))
            joining_window = num_frames - min(num_frames, room_in_scale)
            if joining_window > self.table.sliding_window:
                raise ValueError(
                    f"a stored step of {num_frames} frames would evict its own frames "
                    f"(scale room {room_in_scale}, window {self.table.sliding_window})"
                )
        mark = self.table.mark() if undoable else None
        plan = self.table.append(num_frames, defer_eviction=not store)

        ps, sp = self.page_size, self.specials_per_frame
        # Built on the host (NumPy) and uploaded once, without a host stall (staged_upload.py)
        patch_slots = np.asarray(plan.patch_pages, dtype=np.int64)[:, None] * ps + self._host_offsets  # [S, page]
        special_slots = np.asarray(plan.special_slots, dtype=np.int64).reshape(num_frames, sp)  # [S, 6]
        # [T], frame-major [6 specials, page patches]: slot p*page+o is row p*page+o of the flat K (and V) pages
        slots = np.concatenate((special_slots, patch_slots), axis=1).reshape(-1)  # [T]
        num_tokens = num_frames * self.tokens_per_frame
        if num_tokens > self._write_slot_buffer.numel():
            self._write_slot_buffer = torch.zeros(num_tokens, dtype=torch.long, device=self.device)
            self._slot_upload = StagedUpload(self._write_slot_buffer)
        self._write_slots = self._slot_upload.upload(slots)  # [T], a view of the persistent buffer

        self._backend_for(num_frames).plan(self.table.visible_pages(), self.table.last_page_len, num_tokens)
        self.last_step_visible_keys = self.table.visible_key_count
        self._step = _Step(num_frames=num_frames, store=store, num_tokens=num_tokens, plan=plan)
        self._mark = mark

    def _backend_for(self, num_frames: int) -> AttentionBackend:
        """One-frame steps use the single-frame backend when one is set (CUDA graphs), others ``backend``."""
        if num_frames == 1 and self.single_frame_backend is not None:
            return self.single_frame_backend
        return self.backend

    def __call__(self, block: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Store this step's ``k, v [T, H, D]`` in block ``block``'s pages, attend ``q [T, H, D]``."""
        kv = self.write(block, q, k, v)  # [2, pages, page, H, D]
        return self._backend_for(self._step.num_frames).run((kv[0], kv[1]), q)  # type: ignore[union-attr]

    def write(self, block: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The first half of a call: check the shapes, put ``k, v [T, H, D]`` into block ``block``'s
        pages; returns the block's storage ``[2, pages, page, H, D]``. A group's batched attention
        (``core/stream_group.py``) writes each stream's k, v here and attends over the pool at once."""
        step = self._step
        if step is None:
            raise RuntimeError("attention call outside a step: call begin_step() first")
        if not 0 <= block < self.num_blocks:
            raise IndexError(f"block {block} out of range 0..{self.num_blocks - 1}")
        expected = (step.num_tokens, self.num_heads, self.head_dim)
        if tuple(k.shape) != expected or tuple(v.shape) != expected or tuple(q.shape) != expected:
            raise ValueError(
                f"q, k, v must be {list(expected)} for a step of {step.num_frames} frame(s) "
                f"(got {list(q.shape)}, {list(k.shape)}, {list(v.shape)})"
            )
        kv = self._storage[block]  # [2, pages, page, H, D]
        flat = kv.view(2, -1, self.num_heads, self.head_dim)  # [2, pages*page, H, D]
        if self.write_kernel == "triton" and step.num_frames == 1 and k.dtype == v.dtype == self.dtype:
            from .kv_write import write_rows

            write_rows(k, v, self._write_slots, flat)  # one kernel, no stacked copy
        else:
            flat.index_copy_(1, self._write_slots, torch.stack((k, v)).to(self.dtype))  # [2, T, H, D] in one write
        return kv

    def end_step(self) -> None:
        """Close the step; a non-keyframe's append is rolled back (its pages are simply reused later)."""
        step = self._step
        if step is None:
            raise RuntimeError("end_step() without begin_step()")
        if not step.store:
            self.table.rollback()
        self._step = None
        self._mark = None

    def abort_step(self) -> bool:
        """Close a step whose model call failed: the page table goes back to where it was before
        ``begin_step``. Returns whether the cache is then exactly as before (the step wrote only free
        pages and unused special slots); False when its append reused a page it evicted, whose old
        K/V the step may have overwritten (``PageTable.overwrote_visible``): the caller starts a new
        session then."""
        step, mark = self._step, self._mark
        if step is None or mark is None:
            raise RuntimeError("abort_step() without begin_step(undoable=True)")
        self.table.restore(mark)
        self._step, self._mark = None, None
        return not self.table.overwrote_visible(step.plan)

    # ------------------------------------------------------------------ saved sessions

    def state_dict(self) -> dict:
        """Shapes and page table (JSON data); the K/V of the stored frames come from ``block_tensors``."""
        if self._step is not None:
            raise RuntimeError("state_dict() while a step is open")
        return {"num_blocks": self.num_blocks, "num_heads": self.num_heads, "head_dim": self.head_dim,
                "dtype": str(self.dtype).replace("torch.", ""), "table": self.table.state_dict()}

    def bytes_in_use(self) -> int:
        """What ``block_tensors`` copies, summed over the blocks."""
        pages = len(self.table.scale_pages) + len(self.table.window_pages)
        tokens = pages * self.page_size + self.table.special_tokens
        return self.num_blocks * 2 * tokens * self.num_heads * self.head_dim * self.dtype.itemsize

    def block_tensors(self, block: int, on_device: bool = False) -> dict[str, torch.Tensor]:
        """A copy of what one block holds of the map: only the pages in use, never the whole pool; on
        the host, or with ``on_device`` in new memory on the cache's device (no synchronisation).

        ``patch`` [2, scale + window, page, H, D] in the table's order (scale pages, then the window
        oldest first); ``special`` [2, special_tokens, H, D], the packed special stream of every
        stored frame (evicted ones included)."""
        pages = torch.tensor(self.table.scale_pages + self.table.window_pages, dtype=torch.long, device=self.device)
        kv = self._storage[block]  # [2, pages, page, H, D]
        first = self.table.num_patch_pages * self.page_size
        flat = kv.view(2, -1, self.num_heads, self.head_dim)  # [2, pages*page, H, D]
        patch = kv.index_select(1, pages)  # [2, n, page, H, D], a copy
        special = flat[:, first:first + self.table.special_tokens]  # [2, specials, H, D], a view of the pool
        if on_device:
            return {"patch": patch, "special": special.clone()}
        return {"patch": patch.cpu(), "special": special.cpu()}

    def check_state(self, state: dict) -> list[str]:
        """Why a saved cache cannot go into this one (empty: it can); nothing changes."""
        return cache_state_problems(state, num_blocks=self.num_blocks, num_heads=self.num_heads,
                                    head_dim=self.head_dim, dtype=self.dtype, table=self.table)

    def load_state(self, state: dict, block_tensors) -> None:
        """Restore a saved cache in place: the page table, then each block's pages written straight
        into the preallocated storage (``block_tensors(b)``: ``block_tensors``' dict, any device) -
        no second pool is allocated and every storage address stays (captured CUDA graphs stay valid)."""
        problems = self.check_state(state)
        if problems:
            raise ValueError("; ".join(problems))
        pages = torch.tensor(self.table.load_state_dict(state["table"]), dtype=torch.long, device=self.device)
        self._step, self._write_slots, self.last_step_visible_keys = None, None, 0
        first = self.table.num_patch_pages * self.page_size
        specials = self.table.special_tokens
        for block in range(self.num_blocks):
            saved = block_tensors(block)
            kv = self._storage[block]  # [2, pages, page, H, D]
            kv.index_copy_(1, pages, saved["patch"].to(self.device, self.dtype))  # [2, n, page, H, D]
            flat = kv.view(2, -1, self.num_heads, self.head_dim)
            flat[:, first:first + specials].copy_(saved["special"].to(self.device, self.dtype))

    def reset(self) -> None:
        """Forget every frame. Pages are not zeroed: a slot is always written before it is visible."""
        self.table.reset()
        self._step = None
        self._mark = None
        self._write_slots = None
        self.last_step_visible_keys = 0


def cache_state_problems(state: dict, *, num_blocks: int, num_heads: int, head_dim: int, dtype: torch.dtype,
                         table: PageTable) -> list[str]:
    """Why a saved global cache cannot go into a cache of these shapes and this table's pools (empty:
    it can); ``table`` is not changed (a probe of the same pools takes the saved state). No storage
    is needed, so a session can check a saved state for a frame size it has no caches for yet."""
    have = {"num_blocks": num_blocks, "num_heads": num_heads, "head_dim": head_dim}
    problems = [f"global cache {key} {state[key]} != {value}" for key, value in have.items()
                if int(state[key]) != value]
    name = str(dtype).replace("torch.", "")
    if state["dtype"] != name:
        problems.append(f"KV cache dtype {state['dtype']} != {name}")
    probe = PageTable(scale_frames=table.scale_frames, sliding_window=table.sliding_window,
                      page_size=table.page_size, num_patch_pages=table.num_patch_pages,
                      special_pages=table.special_pages, specials_per_frame=table.specials_per_frame,
                      allocation=table.allocation)
    try:
        probe.load_state_dict(state["table"])
    except (ValueError, KeyError, TypeError) as exc:
        problems.append(f"page table: {exc}")
    return problems


__all__ = ["PagedKVCache", "cache_state_problems"]
