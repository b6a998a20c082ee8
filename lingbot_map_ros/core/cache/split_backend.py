"""One-frame attention as two dense calls, the contiguous patch prefix and a short tail, merged by
log-sum-exp.

Why: the fastest exact kernel PyTorch ships for one frame's global attention (cuDNN fused attention;
1005 queries x 16 heads x d 64 over ~73k keys) is fastest on a contiguous key range without a
mask (docs/performance.md, attention per layer: cuDNN over contiguous keys against the masked dense
call of ``MaskedDenseBackend``; FlashInfer fa3 over token pages is slower too), and it re-plans whenever the key
length changes. The streaming cache can give it exactly that, because attention does not depend on
the order of the keys:

* With the pool of ``scale + window + 1`` patch pages and ``PageTable(allocation="lowest")``
  (``factory.py`` pairs them), the stored patch pages are always pages ``0 .. n-1``; once the window
  is full a one-frame step sees *all* of pages ``0 .. R-1`` (``R = scale + window``): the
  **prefix**, a fixed-length contiguous region, read unmasked.
* The **tail** is everything after it in the block's storage: page ``R`` (the pool's spare page,
  where a non-keyframe's own frame sits in the steady state) and the special pages (6 tokens per
  stored frame, growing). It is short (one page + the special pool), read with a ``[1, 1, 1, N]``
  visibility mask, so its length is fixed too.

The partial results combine exactly: with ``lse_i = log Σ exp(s)`` over part ``i``,
``softmax over (∪ parts) · V = Σ_i w_i · out_i`` where ``w = softmax_i(lse_i)``.

While the window fills, the visible prefix is pages ``0 .. m-1`` with ``m < R``. Reading all ``R``
pages with a mask costs as much as the masked whole-storage path (the bias is paid per key tile),
so the filling prefix is cut at a bucket boundary ``h`` (a multiple of ``bucket_pages``, at most
``R/8`` apart): a **head** ``0 .. h-1`` read unmasked and a **remainder** of one bucket read with a
mask. ``h`` is part of ``plan_signature``, so there is one CUDA graph per bucket (``cuda_graph.py``
keeps them, so later windows replay them). A prefix with holes (another allocation order) falls
back to one masked call over all ``R`` pages; it stays exact, only slower. Masked slots always hold
finite values (storage starts zeroed and is only overwritten with K/V), so ``exp(-inf) = 0`` removes
them exactly.

With ``prefix_kernel="triton"`` or ``"gluon"`` (what ``auto`` picks on Hopper) the same pools are
read differently: the visible pages form a few contiguous runs (the prefix, a non-keyframe's page
right after it, the specials), and one call of our kernel (``triton_prefix.py``, ``gluon_runs.py``) reads all of them,
with the run starts and lengths in a device tensor written by ``plan``. No tail call, no merge (with
one part), no masks to rebuild per frame, and one CUDA graph for the filling and the full window:
faster than cuDNN's prefix + tail (docs/performance.md, attention per layer). A visible set of more runs than the
kernel takes goes through the regions below. Where one call's programs would spill into a second wave,
``runs_plan`` cuts the frame's query rows into two calls instead (whole query tiles in one wave, written
in place, and the ragged tail's rows in key ranges, merged, on a side stream beside the whole tiles), or,
with the Gluon kernel, one call whose whole-tile programs carry the tail's rows by a third warpgroup
(``fused_tail``), merged the same way.

The merge is a handful of elementwise ops on ``[T, H, D]``; with ``fuse_merge`` it is one
``torch.compile``-d kernel (compiled in the warm-up before the graph capture).

``kv_splits`` cuts an unmasked region into that many equal key ranges read by *one* call as a batch
(a strided view of the same storage, no copy; the queries repeated per range). The ranges are more
partials of the same exact merge. Why: cuDNN gives each thread block 128 queries of one head and
walks it over every key, so one frame makes ``ceil(T / 128) x H`` blocks that each take the whole
call. On an H200 (132 SMs) 1005 queries x 16 heads (518x378) are 128 blocks, one wave; 1042
queries (518x392, a 4:3 camera) are 144 blocks, two waves, and the call takes about twice as long
(docs/performance.md, attention per layer, the 518x392 rows). As ``S`` ranges the call has ``S`` times as many
blocks, each ``S`` times shorter, so the last wave is nearly full. ``auto_kv_splits`` picks ``S``
from that count (measured at 518x378: one range is best there, and each extra range costs about
0.8 %).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional, Sequence

import numpy as np
import torch
from torch import Tensor

from .backend import DenseStorageBackend, check_plan, visible_token_slots
from .merge import fused_merge, merge_into, merge_partials
from .staged_upload import StagedUpload
from .waves import waves_time

if TYPE_CHECKING:
    from .runs_plan import RunsPlan

KERNELS = ("cudnn", "efficient", "cpu")
PREFIX_KERNELS = ("sdpa", "triton", "gluon")  # ``kernel``'s prefix + masked tail / our kernel over runs (Triton, Gluon)
MODES = ("full", "filling", "masked", "tail")  # prefix unmasked / head + remainder / all masked / no prefix key


def attend_with_lse(kernel: str, q: Tensor, k: Tensor, v: Tensor, bias: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    """``softmax(q kᵀ/√D + bias) v`` and its log-sum-exp, from one fused kernel.

    q ``[1, H, T, D]``, k/v ``[1, H, N, D]`` (strided views are fine), bias ``[1, 1, 1, N]`` or None.
    Returns out ``[1, H, T, D]`` in q's dtype and lse ``[1, H, T]`` in float32 (natural log, the
    scores already scaled by 1/√D). All parts of a merge must come from the same kernel.
    """
    B, H, T, _ = q.shape
    if kernel == "cudnn":
        out, lse = torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, bias, True)[:2]  # lse [B, H, T, 1]
    elif kernel == "efficient":
        # lse [B, H, ceil32(T)]
        out, lse = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, bias, True)[:2]
    elif kernel == "cpu":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, attn_mask=bias)  # lse [B, H, T]
    else:
        raise ValueError(f"kernel must be one of {KERNELS} (got {kernel!r})")
    return out, lse.reshape(B, H, -1)[..., :T].to(_at_least_fp32(q.dtype))  # [B, H, T, D], [B, H, T]


def _at_least_fp32(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def key_ranges(x: Tensor, splits: int) -> Tensor:
    """``[1, H, N, D]`` (any strides) as ``[splits, H, N / splits, D]``: consecutive key ranges as a
    batch, a view of the same memory."""
    _, H, N, D = x.shape
    if N % splits:
        raise ValueError(f"{N} keys do not cut into {splits} equal ranges")
    n = N // splits
    s_batch, s_head, s_key, s_dim = x.stride()
    return x.as_strided((splits, H, n, D), (n * s_key, s_head, s_key, s_dim))  # [S, H, n, D]


QUERY_TILE = 128  # queries per thread block of cuDNN's fused attention on sm90 (one wave at 1005, two at 1042)
MAX_AUTO_SPLITS = 12


def auto_kv_splits(num_queries: int, num_heads: int, num_sms: int, prefix_pages: int, *,
                   query_tile: int = QUERY_TILE, blocks_per_sm: int = 1) -> int:
    """The number of key ranges (a divisor of ``prefix_pages``, at most 12) with the least
    ``waves_time`` for one frame's queries; 1 without an SM count (CPU). ``query_tile`` and
    ``blocks_per_sm``: the prefix kernel's (cuDNN: 128 and 1; the Triton kernel: 64 and 2)."""
    if num_sms <= 0:
        return 1
    blocks = -(-num_queries // query_tile) * num_heads
    candidates = [s for s in range(1, MAX_AUTO_SPLITS + 1) if prefix_pages % s == 0]
    return min(candidates, key=lambda s: (waves_time(s, blocks, num_sms * blocks_per_sm), s))


def usable_splits(keys: int, wanted: int) -> int:
    """The largest ``S <= wanted`` that cuts ``keys`` into equal ranges (1 always does)."""
    return next(s for s in range(max(wanted, 1), 0, -1) if keys % s == 0)


@dataclass(frozen=True)
class _Region:
    """Key slots ``[start, end)`` of a block's flat storage read by one kernel call; ``mask`` None =
    unmasked; ``splits``: key ranges read as one batch (only unmasked regions are cut)."""

    start: int
    end: int
    mask: Optional[Tensor]
    splits: int = 1


class SplitPrefixBackend(DenseStorageBackend):
    """The patch prefix (pages ``0 .. R-1``) and the tail (page ``R`` + special pages) attended apart,
    merged exactly."""

    def __init__(
        self,
        *,
        page_size: int,
        num_patch_pages: int,
        num_pages: int,
        num_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
        kernel: str = "cudnn",
        fuse_merge: bool = False,
        bucket_pages: int = 0,
        kv_splits: int = 1,
        prefix_kernel: str = "sdpa",
        runs_plan: Optional[RunsPlan] = None,
    ) -> None:
        """``num_patch_pages``: the patch pool (``scale + window + 1``; the prefix is all but its last
        page); ``num_pages``: patch + special pages of a block. ``kernel``: ``cudnn`` on the GPU,
        ``efficient`` (CUDA, any dtype) or ``cpu`` for tests. ``bucket_pages``: the filling prefix's
        cut points (0: ``ceil(R / 8)``, so at most 8 filling graphs). ``kv_splits``: key ranges per
        unmasked call (the largest divisor of its page count up to this; 1: one range).
        ``prefix_kernel``: ``sdpa`` = the regions above, each one ``kernel`` call; ``triton`` = every
        visible key in one call of the Triton kernel (``triton_prefix.py``, CUDA sm90+) over the
        contiguous runs of the visible pages (the run lengths on the device: one graph for every mode;
        ``kv_splits`` parts merged by LSE), the regions only for a visible set of more runs; ``gluon``: the
        same call as a Gluon kernel whose softmax overlaps the tensor cores (``gluon_runs.py``, sm90).
        ``runs_plan``: how a frame of its query count is cut into calls of that kernel (``runs_plan.py``:
        whole query tiles in one wave and a ragged tail in key ranges); None or one call: ``kv_splits``."""
        if kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {KERNELS} (got {kernel!r})")
        if prefix_kernel not in PREFIX_KERNELS:
            raise ValueError(f"prefix_kernel must be one of {PREFIX_KERNELS} (got {prefix_kernel!r})")
        self.prefix_kernel = prefix_kernel
        if num_patch_pages < 2 or num_pages <= num_patch_pages:
            raise ValueError(
                f"need num_patch_pages >= 2 and special pages after them (got {num_patch_pages}, {num_pages})"
            )
        super().__init__(page_size=page_size, num_pages=num_pages, num_heads=num_heads, head_dim=head_dim,
                         dtype=dtype, device=device)
        self.kernel = kernel
        self.prefix_pages = num_patch_pages - 1  # R = scale + window
        self.prefix_slots = self.prefix_pages * page_size
        self.bucket_pages = bucket_pages or -(-self.prefix_pages // 8)
        if kv_splits < 1:
            raise ValueError(f"kv_splits must be >= 1 (got {kv_splits})")
        self.kv_splits = kv_splits
        self.runs_plan = runs_plan
        self._merge = fused_merge() if fuse_merge else merge_partials
        # additive biases in the compute dtype (cuDNN reads the bias in q's dtype): 0 visible, -inf not.
        # Each masked region has a buffer of its own (a bias must start on an aligned address).
        def mask(n: int) -> torch.Tensor:
            return torch.full((1, 1, 1, n), float("-inf"), dtype=dtype, device=self.device)  # [1, 1, 1, n]

        self._prefix_mask = mask(self.prefix_slots)  # the whole prefix (mode masked)
        self._bucket_mask = mask(self.bucket_pages * page_size)  # one bucket (mode filling)
        self._tail_mask = mask(self.num_slots - self.prefix_slots)
        self._mode = "masked"
        self._head_pages = 0
        self._regions: list[_Region] = []
        self._num_queries = 0
        self._num_keys = 0
        self._runs: Optional[Tensor] = None  # int32 [MAX_RUNS, 2] on the device, read by the Triton kernel
        self._runs_upload: Optional[StagedUpload] = None
        self._use_runs = False  # the planned step goes through our kernel over the runs

    @property
    def mode(self) -> str:
        """``full`` (prefix unmasked), ``filling`` (head unmasked + one masked bucket), ``masked``
        (prefix with holes, one masked call) or ``tail`` (no visible prefix key)."""
        return self._mode

    @property
    def head_pages(self) -> int:
        """Prefix pages read unmasked in the planned step (``R`` when full)."""
        return self._head_pages

    @property
    def num_keys(self) -> int:
        return self._num_keys

    @property
    def plan_signature(self) -> tuple:
        """A captured graph holds one set of calls: one graph per mode and head length; the Triton
        kernel reads its run lengths on the device, so one graph serves all of its steps."""
        if self._use_runs:
            return (self._num_queries, "runs")
        return (self._num_queries, self._mode, self._head_pages)

    def plan(self, visible_pages: Sequence[int], last_page_len: int, num_query_tokens: int) -> None:
        check_plan(visible_pages, last_page_len, self.page_size, self.num_pages)
        ps, R = self.page_size, self.prefix_pages
        prefix = [p for p in visible_pages if p < R]
        tail = [p - R for p in visible_pages if p >= R]  # page ids within the tail region
        last_in_prefix = visible_pages[-1] < R
        if not tail:
            raise ValueError("the split backend needs a visible key after the prefix (every step has its own specials)")
        prefix_keys = len(prefix) * ps - (ps - last_page_len if last_in_prefix else 0)
        tail_keys = len(tail) * ps - (0 if last_in_prefix else ps - last_page_len)
        m = len(prefix)
        whole_pages_from_zero = not last_in_prefix and sorted(prefix) == list(range(m))
        self._num_queries = num_query_tokens
        self._num_keys = prefix_keys + tail_keys
        if self.prefix_kernel in ("triton", "gluon") and self._plan_runs(visible_pages, last_page_len):
            self._mode = ("full" if prefix_keys == self.prefix_slots else "tail" if prefix_keys == 0
                          else "filling" if whole_pages_from_zero else "masked")
            self._head_pages = m if whole_pages_from_zero else 0
            return
        tail_region = _Region(self.prefix_slots, self.num_slots, self._tail_mask)
        self._fill_mask(self._tail_mask, tail, ps if last_in_prefix else last_page_len)
        def unmasked(pages: int) -> _Region:
            return _Region(0, pages * ps, None, usable_splits(pages, self.kv_splits))

        if prefix_keys == self.prefix_slots:
            mode, head, regions = "full", R, [unmasked(R)]
        elif prefix_keys == 0:
            mode, head, regions = "tail", 0, []
        elif whole_pages_from_zero:  # the filling window: 0 .. m-1, cut at a bucket boundary
            b = self.bucket_pages
            head = b * ((m - 1) // b)  # leaves 1..b visible pages in the bucket
            end = min(head + b, R)
            self._fill_mask(self._bucket_mask, [p - head for p in prefix if p >= head], ps)
            bucket = _Region(head * ps, end * ps, self._bucket_mask[..., : (end - head) * ps])
            mode, regions = "filling", ([unmasked(head)] if head else []) + [bucket]
        else:  # holes: one masked call over the whole prefix
            self._fill_mask(self._prefix_mask, prefix, last_page_len if last_in_prefix else ps)
            mode, head, regions = "masked", 0, [_Region(0, self.prefix_slots, self._prefix_mask)]
        self._mode, self._head_pages = mode, head
        self._regions = regions + [tail_region]

    def _plan_runs(self, visible_pages: Sequence[int], last_page_len: int) -> bool:
        """Write the visible pages' runs for the Triton kernel; False (nothing written) when there are
        more than it takes."""
        from .triton_prefix import MAX_RUNS, contiguous_runs

        runs = contiguous_runs(list(visible_pages), last_page_len, self.page_size)
        self._use_runs = len(runs) <= MAX_RUNS
        if not self._use_runs:
            return False
        if self._runs is None:
            self._runs = torch.zeros(MAX_RUNS, 2, dtype=torch.int32, device=self.device)  # [MAX_RUNS, 2]
            self._runs_upload = StagedUpload(self._runs)
        table = np.zeros((MAX_RUNS, 2), dtype=np.int32)  # [MAX_RUNS, 2]; unused rows: length 0
        table[: len(runs)] = runs
        self._runs_upload.upload(table)  # in stream order before the (replayed) kernel, no host stall
        return True

    def _fill_mask(self, mask: Tensor, pages: list[int], last_page_len: int) -> None:
        """0 on the slots of ``pages`` (ids relative to the mask's region), -inf elsewhere."""
        flat = mask.view(-1)  # [n]
        flat.fill_(float("-inf"))
        if pages:
            flat.index_fill_(0, visible_token_slots(pages, last_page_len, self._offsets), 0.0)

    def run(self, kv_pages: tuple[Tensor, Tensor], q: Tensor) -> Tensor:
        """``q [T, H, D]`` over the planned keys of one block's ``(K, V)``, each ``[pages, page, H, D]``."""
        k, v = self._key_views(kv_pages)  # [1, H, N, D] each
        qh = q.to(k.dtype).transpose(0, 1).unsqueeze(0)  # [1, H, T, D]
        outs, lses = [], []
        if self._use_runs:
            return self._run_runs(kv_pages, q.to(k.dtype)).to(q.dtype)
        for r in self._regions:
            kr, vr, qr = k[:, :, r.start:r.end], v[:, :, r.start:r.end], qh
            if r.splits > 1:
                kr, vr = key_ranges(kr, r.splits), key_ranges(vr, r.splits)  # [S, H, n, D]
                qr = qh.expand(r.splits, -1, -1, -1).contiguous()  # [S, H, T, D]
            out, lse = attend_with_lse(self.kernel, qr, kr, vr, r.mask)
            outs.append(out)  # [S, H, T, D]
            lses.append(lse)  # [S, H, T]
        if len(outs) == 1 and outs[0].shape[0] == 1:
            return outs[0][0].transpose(0, 1).to(q.dtype)  # [T, H, D]
        return self._merge(outs, lses).to(q.dtype)  # [T, H, D]

    def _run_runs(self, kv_pages: tuple[Tensor, Tensor], q: Tensor) -> Tensor:
        """Every visible key in one call of our kernel over the planned runs (``kv_splits`` parts merged)."""
        if self.prefix_kernel == "gluon":
            from .gluon_runs import carries_tail, runs_attention, runs_attention_fused_tail
        else:
            from .triton_prefix import runs_attention

        h, d = self.num_heads, self.head_dim
        k = kv_pages[0].view(-1, h, d)  # [slots, H, D]: each slot's heads in one row
        v = kv_pages[1].view(-1, h, d)
        plan = self.runs_plan
        if plan is None or not plan.ragged or plan.num_queries != q.shape[0]:
            out, lse = runs_attention(q, k, v, self._runs, parts=self.kv_splits)  # [P, T, H, D], [P, H, T]
            if self.kv_splits == 1:
                return out[0]  # [T, H, D]
            return self._merge([out.transpose(1, 2)], [lse])  # [T, H, D]
        result = torch.empty(q.shape, dtype=q.dtype, device=q.device)  # [T, H, D]
        if plan.fused_tail and self.prefix_kernel == "gluon" and carries_tail(self.head_dim):
            head, tail = plan.calls  # one launch: the whole tiles in place, the tail's parts beside them
            out, lse = runs_attention_fused_tail(q, k, v, self._runs, head.rows, result.unsqueeze(0))
            merge_into(result[tail.start:], out, lse, self._merge)  # [P, tail, H, D] -> [tail, H, D]
            return result
        if plan.tail_beside and q.is_cuda:
            return self._run_tail_beside(plan, q, k, v, runs_attention, result)
        for call in plan.calls:  # whole tiles written in place, then the ragged tail's parts merged
            rows = slice(call.start, call.start + call.rows)
            if call.parts == 1:
                runs_attention(q[rows], k, v, self._runs, out=result[rows].unsqueeze(0))  # [1, rows, H, D]
                continue
            out, lse = runs_attention(q[rows], k, v, self._runs, parts=call.parts)  # [P, rows, H, D], [P, H, rows]
            merge_into(result[rows], out, lse, self._merge)
        return result

    def _run_tail_beside(self, plan: RunsPlan, q: Tensor, k: Tensor, v: Tensor, runs_attention: Callable,
                         result: Tensor) -> Tensor:
        """The whole tiles on the frame's stream and the tail's parts on a side stream forked before them.
        Why: the whole tiles are one wave that leaves some SMs idle (128 programs on 132 at 1042 queries x
        16 heads) and the tail's programs are memory-bound, so they can run there and on each SM the
        whole tiles give back, instead of after the last of them. The whole tiles are launched first so
        that their programs take the SMs first. Exact as the serial calls: the same calls, rows apart."""
        from ..cuda_graph import side_stream

        head, tail = plan.calls
        main = torch.cuda.current_stream(q.device)
        side = side_stream(q.device, "tail")
        side.wait_stream(main)  # forked before the whole tiles' launch: the tail does not wait for them
        runs_attention(q[:head.rows], k, v, self._runs, out=result[:head.rows].unsqueeze(0))  # [1, rows, H, D]
        rows = slice(tail.start, tail.start + tail.rows)
        with torch.cuda.stream(side):
            out, lse = runs_attention(q[rows], k, v, self._runs, parts=tail.parts)  # [P, rows, H, D], [P, H, rows]
            merge_into(result[rows], out, lse, self._merge)
        main.wait_stream(side)  # joined: what follows on the frame's stream sees the tail's rows
        return result


__all__ = ["SplitPrefixBackend", "attend_with_lse", "auto_kv_splits", "key_ranges", "usable_splits", "waves_time",
           "KERNELS", "MODES", "PREFIX_KERNELS"]
