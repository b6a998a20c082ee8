"""GPU attention backends over the paged cache vs the SDPA backend and a float64 dense reference.

Runs on the device machine (``scripts/device_run.sh``); skipped where there is no CUDA (CI).
Every backend — FlashInfer fa2 (official layout), FlashInfer fa3 over exact token pages, their
CUDA-graph variants, and the static varlen-flash SDPA backend — drives its own ``PagedKVCache``
through the same random stream (phase 1, keyframes, non-keyframes, eviction), and every step's
output is compared with float64 softmax attention over the visible set built from the raw K/V.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import random

import numpy as np
import pytest
import torch

from lingbot_map_ros.core.config import StreamConfig

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]
HAS_FLASHINFER = importlib.util.find_spec("flashinfer") is not None
SPECIALS = 6
H, D = 16, 64


def visible_reference(frames, stored, i, scale, window):
    """float64 K, V of frame i's visible set (docs/model.md §9.2/§9.5) from raw per-frame tensors."""
    stored_before = [j for j in range(i) if stored[j]]
    phase2 = [j for j in stored_before if j >= scale]
    if i < scale:
        patch = special = list(range(scale))
    else:
        if stored[i]:
            win = (phase2 + [i])[-window:]
        else:
            win = phase2[-window:] + [i]
        patch = [j for j in stored_before if j < scale] + win
        special = stored_before + [i]
    ks = [frames[j][0][:SPECIALS] for j in special] + [frames[j][0][SPECIALS:] for j in patch]
    vs = [frames[j][1][:SPECIALS] for j in special] + [frames[j][1][SPECIALS:] for j in patch]
    return torch.cat(ks).double(), torch.cat(vs).double()  # [N, H, D]


def dense64(q, k, v):
    scores = torch.einsum("thd,nhd->htn", q.double(), k) / D**0.5  # [H, T, N]
    return torch.einsum("htn,nhd->thd", scores.softmax(-1), v)  # [T, H, D]


def make_caches(page_size, dtype, scale, window, kinds):
    from lingbot_map_ros.core.cache import PagedKVCache
    from lingbot_map_ros.core.cache.sdpa_backend import StaticSdpaBackend

    caches = {}
    common = dict(num_blocks=2, num_heads=H, head_dim=D, page_size=page_size, scale_frames=scale,
                  sliding_window=window, max_frame_num=64, dtype=dtype, device="cuda")
    tokens = SPECIALS + page_size
    for kind in kinds:
        if kind == "sdpa":
            caches[kind] = PagedKVCache(**common, backend="sdpa")
        elif kind == "sdpa-cudnn":  # the masked dense path with the factory's tight pools
            from lingbot_map_ros.core.cache.dense_backend import MaskedDenseBackend

            pools = dict(num_patch_pages=scale + window + 1, special_pages=-(-SPECIALS * 40 // page_size))
            cache = PagedKVCache(**common, backend="sdpa", **pools)
            cache.single_frame_backend = MaskedDenseBackend(
                page_size=page_size, num_pages=cache.table.num_pages, num_heads=H, head_dim=D, dtype=dtype,
                device="cuda", kernel="cudnn")
            caches[kind] = cache
        elif kind.startswith("sdpa-split"):  # contiguous prefix + masked tail, the factory's pools and allocation
            from lingbot_map_ros.core.cache.split_backend import SplitPrefixBackend

            pools = dict(num_patch_pages=scale + window + 1, special_pages=-(-SPECIALS * 40 // page_size))
            cache = PagedKVCache(**common, backend="sdpa", allocation="lowest", **pools)
            prefix = "triton" if "triton" in kind else "gluon" if "gluon" in kind else "sdpa"
            cache.single_frame_backend = SplitPrefixBackend(
                page_size=page_size, num_patch_pages=cache.table.num_patch_pages, num_pages=cache.table.num_pages,
                num_heads=H, head_dim=D, dtype=dtype, device="cuda", kernel="cudnn",
                fuse_merge=kind.endswith("fused"), kv_splits=5 if kind.endswith("kv") else 1,  # kv: 5 ranges of 1 page
                prefix_kernel=prefix, runs_plan=cut_plan(tokens, prefix) if kind.endswith("cut")
                else beside_plan(tokens) if kind.endswith("beside") else None)
            caches[kind] = cache
        elif kind == "sdpa-static":
            static = StaticSdpaBackend(page_size=page_size, num_heads=H, head_dim=D,
                                       max_keys=(scale + window + 1) * page_size + SPECIALS * 40,
                                       num_query_tokens=tokens, dtype=dtype, device="cuda")
            caches[kind] = PagedKVCache(**common, backend="sdpa", single_frame_backend=static)
        else:
            from lingbot_map_ros.core.cache.flashinfer_backend import FlashInferBackend

            kernel, graph = kind.split("-")[1], kind.endswith("graph")
            fi = dict(page_size=page_size, num_heads=H, head_dim=D, dtype=dtype, device="cuda", kernel=kernel)
            eager = FlashInferBackend(**fi)
            single = FlashInferBackend(**fi, use_cuda_graph=True, max_visible_pages=scale + window + 1 + 8,
                                       max_query_tokens=tokens) if graph else None
            caches[kind] = PagedKVCache(**common, backend=eager, single_frame_backend=single)
    return caches


def cut_plan(tokens: int, prefix_kernel: str):
    """The frame's rows cut as ``runs_plan.plan_runs`` cuts them on this GPU (1042 queries on an H100 or
    H200: 1024 rows in one wave of whole tiles, 18 carried by Gluon's whole tiles' third warpgroups, or in
    16 key ranges of a call of their own with Triton's kernel), or, where it keeps one call, Gluon's whole
    tiles carrying the rest where that is at most 64 rows, else at row 512 with the rest in 7 ranges: the
    cut's calls and offsets at every frame size."""
    from lingbot_map_ros.core.cache.runs_plan import RunsCall, RunsPlan, plan_runs

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    pair_tile = 128 if prefix_kernel == "gluon" else 0
    plan = plan_runs(tokens, H, sms, 1, query_tile=64, blocks_per_sm=2, pair_tile=pair_tile, fuse_tail=pair_tile > 0)
    if plan.ragged:
        return plan
    whole = tokens // 128 * 128
    if pair_tile and 0 < tokens - whole <= 64:  # Gluon: whole tiles carrying the rest (777 = 6 x 128 + 9)
        calls = (RunsCall(0, whole, 1), RunsCall(whole, tokens - whole, whole // 128))
        return RunsPlan(tokens, calls, "a test cut, its tail carried", fused_tail=True)
    return RunsPlan(tokens, (RunsCall(0, 512, 1), RunsCall(512, tokens - 512, 7)), "a test cut")


def beside_plan(tokens: int):
    """``cut_plan``'s rows of the tail call (never carried: the one-warpgroup kernel's plan, the same cut at
    1042 queries) with that call on a side stream beside the whole tiles (``runs_plan.TAIL_BESIDE``)."""
    return dataclasses.replace(cut_plan(tokens, "triton"), tail_beside=True)


def run_stream(page_size, dtype, kinds, steps=12, scale=2, window=3, seed=0):
    rng = random.Random(seed)
    torch.manual_seed(seed)
    caches = make_caches(page_size, dtype, scale, window, kinds)
    frames, stored = [], []
    worst = {kind: 0.0 for kind in kinds}
    modes: dict[str, list[str]] = {kind: [] for kind in kinds}
    plan = [(scale, True)] + [(1, rng.random() < 0.6) for _ in range(steps)]
    for num_frames, store in plan:
        t = num_frames * (SPECIALS + page_size)
        q, k, v = (torch.randn(t, H, D, device="cuda") for _ in range(3))
        first = len(frames)
        for f in range(num_frames):
            sl = slice(f * (SPECIALS + page_size), (f + 1) * (SPECIALS + page_size))
            frames.append((k[sl].to(dtype), v[sl].to(dtype)))
            stored.append(store)
        refs = []
        for f in range(num_frames):
            kr, vr = visible_reference(frames, stored, first + f, scale, window)
            sl = slice(f * (SPECIALS + page_size), (f + 1) * (SPECIALS + page_size))
            refs.append(dense64(q[sl].to(dtype), kr, vr))
        ref = torch.cat(refs)  # [T, H, D] float64
        for kind, cache in caches.items():
            cache.begin_step(num_frames, store=store)
            if num_frames == 1:
                backend = cache.single_frame_backend  # "+runs": the step went through our kernel over the runs
                runs = "+runs" if getattr(backend, "_use_runs", False) else ""
                modes[kind].append(getattr(backend, "mode", "") + runs)
            for block in range(2):
                out = cache(block, q.to(dtype), k.to(dtype), v.to(dtype))
                assert out.shape == ref.shape and torch.isfinite(out).all(), kind
                rel = ((out.double() - ref).norm() / ref.norm()).item()
                worst[kind] = max(worst[kind], rel)
            cache.end_step()
        if not store:
            frames.pop()
            stored.pop()
    return worst, modes


@pytest.mark.parametrize("page_size", [777, 999, 1036])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_sdpa_backends_match_float64(page_size, dtype):
    worst, modes = run_stream(page_size, dtype, ["sdpa", "sdpa-static", "sdpa-cudnn", "sdpa-split", "sdpa-split-fused",
                                                 "sdpa-split-kv"], steps=16)
    limit = 1e-2 if dtype == torch.bfloat16 else 2e-3
    print(f"page {page_size} {dtype}: {worst}")
    assert all(err < limit for err in worst.values()), worst
    # the split backend read the prefix cut at a bucket (window filling) and whole (full window)
    assert {"filling", "full"} <= set(modes["sdpa-split"]), modes["sdpa-split"]


def _gluon_unusable() -> str:
    from lingbot_map_ros.core.runtime import gluon_runs_unusable_reason

    return gluon_runs_unusable_reason(torch.device("cuda")) if torch.cuda.is_available() else "needs CUDA"


@pytest.mark.parametrize("kernel", [
    pytest.param("triton", marks=pytest.mark.skipif(not importlib.util.find_spec("triton"), reason="no triton")),
    pytest.param("gluon", marks=pytest.mark.skipif(bool(_gluon_unusable()), reason=_gluon_unusable() or "runs")),
])
@pytest.mark.parametrize("page_size", [777, 999, 1036])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_split_backend_with_our_runs_kernel_matches_float64(kernel, page_size, dtype):
    """The split backend with every visible key read by one call of our kernel over the runs (Triton
    or Gluon; one part, five parts merged, fused or not), or by the calls of a plan that cuts the rows
    (``cut_plan``: at 1042 queries the one the node runs on this GPU; ``beside_plan``: its tail on a side
    stream), against float64 and at least as close as with cuDNN's prefix + tail, through a filling and a
    full window."""
    kinds = ["sdpa-split", f"sdpa-split-{kernel}", f"sdpa-split-{kernel}-fused", f"sdpa-split-{kernel}-kv",
             f"sdpa-split-{kernel}-cut", f"sdpa-split-{kernel}-beside"]
    if page_size == 1036 and torch.cuda.get_device_properties(0).multi_processor_count == 132:
        plan = cut_plan(SPECIALS + page_size, kernel)
        carried = kernel == "gluon"
        assert [(c.rows, c.parts) for c in plan.calls] == [(1024, 1), (18, 8 if carried else 16)]
        assert plan.fused_tail == carried
    worst, modes = run_stream(page_size, dtype, kinds, steps=16)
    limit = 1e-2 if dtype == torch.bfloat16 else 2e-3
    print(f"page {page_size} {dtype} {kernel}: {worst}")
    assert all(err < limit for err in worst.values()), worst
    assert all(worst[kind] < 1.5 * worst["sdpa-split"] + 1e-4 for kind in kinds), worst
    assert {"filling+runs", "full+runs"} <= set(modes[f"sdpa-split-{kernel}"]), modes[f"sdpa-split-{kernel}"]


@pytest.mark.parametrize("kernel", [
    pytest.param("triton", marks=pytest.mark.skipif(not importlib.util.find_spec("triton"), reason="no triton")),
    pytest.param("gluon", marks=pytest.mark.skipif(bool(_gluon_unusable()), reason=_gluon_unusable() or "runs")),
])
def test_split_backend_tail_merged_by_our_kernel_matches_float64(kernel, monkeypatch):
    """At 1042 queries (page 1036 + 6 specials) the cut plans' tails (Gluon's carried by the whole tiles,
    Triton's as a call of its own after them or beside them) merged into the frame's output by our merge
    kernel (``merge.KERNEL``): against float64 through a filling and a full window, as close as the
    PyTorch merge of the same calls."""
    from lingbot_map_ros.core.cache import merge

    kinds = ["sdpa-split", f"sdpa-split-{kernel}-cut", f"sdpa-split-{kernel}-beside"]
    monkeypatch.setattr(merge, "KERNEL", False)
    torch_merge, _ = run_stream(1036, torch.bfloat16, kinds, steps=16)
    monkeypatch.setattr(merge, "KERNEL", True)
    ours, modes = run_stream(1036, torch.bfloat16, kinds, steps=16)
    print(f"{kernel}: merge kernel {ours}, PyTorch merge {torch_merge}")
    assert all(ours[kind] < 1e-2 and ours[kind] <= 1.5 * torch_merge[kind] + 1e-4 for kind in kinds), ours
    assert {"filling+runs", "full+runs"} <= set(modes[f"sdpa-split-{kernel}-cut"]), modes


@pytest.mark.parametrize("rows", [18, 17])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_tail_merge_kernel_matches_float64_in_a_cuda_graph(rows, dtype, monkeypatch):
    """``triton_merge.merge_parts_into`` at the node's shapes (8 parts of an 18-row tail, 17 in the DINO
    encoder, x 16 heads x d 64, one part empty: lse -inf and zeros) into a view of the frame's output:
    against float64, within one rounding of the PyTorch merge, the rows around left alone; then captured
    in a CUDA graph and replayed on new parts."""
    from lingbot_map_ros.core.cache import merge
    from lingbot_map_ros.core.cache.merge import merge_into, merge_partials
    from lingbot_map_ros.core.cache.triton_merge import merge_parts_into

    monkeypatch.setattr(merge, "KERNEL", False)  # merge_into below: the PyTorch merge and a copy, whatever the default
    gen = torch.Generator(device="cuda").manual_seed(rows)
    parts_count, start, total = 8, 1024, 1024 + rows

    def inputs():
        parts = torch.randn(parts_count, rows, H, D, device="cuda", generator=gen).to(dtype)  # [G, R, H, D]
        lse = torch.randn(parts_count, H, rows, device="cuda", generator=gen) * 3  # [G, H, R]
        parts[3], lse[3] = 0, float("-inf")
        return parts, lse

    def reference(parts, lse):
        return torch.einsum("ghr,grhd->rhd", torch.softmax(lse.double(), 0), parts.double())  # [R, H, D]

    parts, lse = inputs()
    out = torch.full((total, H, D), float("nan"), device="cuda", dtype=dtype)  # [T, H, D]
    merge_parts_into(out[start:], parts, lse)
    pytorch = torch.empty(rows, H, D, device="cuda", dtype=dtype)
    merge_into(pytorch, parts, lse, merge_partials)
    ref = reference(parts, lse)
    err = ((out[start:].double() - ref).norm() / ref.norm()).item()
    limit = 1e-2 if dtype == torch.bfloat16 else 2e-3
    assert err < limit, err
    assert torch.isnan(out[:start]).all()
    ulp = 2.0 ** (-7 if dtype == torch.bfloat16 else -10)
    assert ((out[start:].float() - pytorch.float()).abs() <= ulp * pytorch.float().abs() + 1e-6).all()

    static_parts, static_lse = parts.clone(), lse.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        merge_parts_into(out[start:], static_parts, static_lse)
    fresh = inputs()
    static_parts.copy_(fresh[0])
    static_lse.copy_(fresh[1])
    graph.replay()
    torch.cuda.synchronize()
    ref = reference(*fresh)
    assert ((out[start:].double() - ref).norm() / ref.norm()).item() < limit


@pytest.mark.skipif(bool(_gluon_unusable()), reason=_gluon_unusable() or "runs")
@pytest.mark.parametrize("pairs", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gluon_runs_kernel_matches_float64_on_poisoned_storage(dtype, pairs):
    """The Gluon kernel alone: 150 queries (not a multiple of its 64) x 2 heads over four runs of a
    poisoned storage (whole blocks, masked ends, a run shorter than a block, an empty row), read as 1,
    3 and 2,000 parts (more parts than keys: empty parts give lse -inf and zeros), each part against
    float64 on the same rounded inputs, and no worse than the Triton kernel on the same call; one
    warpgroup a program, and the warp-specialised kernel (``pairs``: 128 queries a program, so 150
    leave a half-empty second warpgroup; parts with no blocks at all for both consumers)."""
    import functools

    from lingbot_map_ros.core.cache import gluon_runs, triton_prefix

    gen = torch.Generator(device="cuda").manual_seed(7)
    t, slots, h, d = 150, 4000, 2, 64
    q = torch.randn(t, h, d, device="cuda", generator=gen).to(dtype)  # [T, H, D]
    k, v = (torch.full((slots, h, d), 3e4, device="cuda", dtype=dtype) for _ in range(2))  # poisoned
    runs = [(10, 1500), (1700, 300), (2500, 33)]
    for start, length in runs:
        k[start:start + length] = torch.randn(length, h, d, device="cuda", generator=gen).to(dtype)
        v[start:start + length] = torch.randn(length, h, d, device="cuda", generator=gen).to(dtype)
    order = torch.cat([torch.arange(start, start + length, device="cuda") for start, length in runs])
    table = torch.tensor(runs + [(0, 0)], dtype=torch.int32, device="cuda")
    for parts in (1, 3, 2000):
        errors = {}
        gluon_kernel = functools.partial(gluon_runs.runs_attention, pairs=pairs)
        for name, kernel in (("gluon", gluon_kernel), ("triton", triton_prefix.runs_attention)):
            out, lse = kernel(q, k, v, table, parts=parts)  # [P, T, H, D], [P, H, T]
            total = order.numel()
            out_err = lse_err = 0.0
            for p in range(parts):
                piece = order[p * total // parts:(p + 1) * total // parts]
                if piece.numel() == 0:
                    assert torch.isneginf(lse[p]).all() and (out[p] == 0).all(), (name, parts, p)
                    continue
                scores = torch.einsum("thd,nhd->htn", q.double(), k[piece].double()) / d ** 0.5  # [H, T, n]
                ref = torch.einsum("htn,nhd->thd", scores.softmax(-1), v[piece].double())
                out_err = max(out_err, ((out[p].double() - ref).norm() / ref.norm()).item())
                lse_err = max(lse_err, (lse[p].double() - scores.logsumexp(-1)).abs().max().item())
            errors[name] = (out_err, lse_err)
        print(f"{dtype} parts {parts} pairs {pairs}: {errors}")
        limit = 1e-2 if dtype == torch.bfloat16 else 2e-3
        assert errors["gluon"][0] < limit and errors["gluon"][1] < 1e-4, errors
        assert errors["gluon"][0] < 1.5 * errors["triton"][0] + 1e-4, errors


@pytest.mark.skipif(not HAS_FLASHINFER, reason="flashinfer not installed")
@pytest.mark.parametrize("page_size", [777, 999, 1036])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_flashinfer_fa2_matches_float64(page_size, dtype):
    worst, _ = run_stream(page_size, dtype, ["fi-fa2", "fi-fa2-graph", "sdpa"])
    limit = 1e-2 if dtype == torch.bfloat16 else 2e-3
    print(f"page {page_size} {dtype}: {worst}")
    assert all(err < limit for err in worst.values()), worst


@pytest.mark.skipif(not HAS_FLASHINFER, reason="flashinfer not installed")
@pytest.mark.parametrize("page_size", [777, 999, 1036])
def test_flashinfer_fa3_token_pages_match_float64(page_size):
    worst, _ = run_stream(page_size, torch.bfloat16, ["fi-fa3", "fi-fa3-graph"])
    print(f"page {page_size} bf16 fa3: {worst}")
    assert all(err < 1e-2 for err in worst.values()), worst


@pytest.mark.skipif(bool(_gluon_unusable()), reason=_gluon_unusable() or "runs")
@pytest.mark.parametrize("tiles,tail", [(2, 18), (8, 18), (3, 64), (1, 1)])
@pytest.mark.parametrize("runs", [[(10, 1500), (1700, 300), (2500, 33)], [(5, 300)]])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gluon_fused_tail_matches_float64_on_poisoned_storage(dtype, runs, tiles, tail):
    """``runs_attention_fused_tail``: ``tiles`` whole tiles of 128 queries x 2 heads written in place,
    and ``tail`` rows after them (18 as at 518x392, a full warpgroup's 64, one row) carried by the same
    programs' third warpgroups as ``tiles`` key shares (every ``tiles``-th block), over the poisoned storage
    of ``test_gluon_runs_kernel_matches_float64_on_poisoned_storage``: four runs (16 key blocks, a masked
    end, a run shorter than a block) or one run of 3 blocks, fewer than the tail's ranges (the empty
    ones give lse -inf and zeros). Against float64 on the same rounded inputs: the whole tiles' rows,
    each tail range over its key blocks, and the tail merged (``merge_partials``, as the split backend
    does); the rows of the output past the whole tiles are left to the caller."""
    from lingbot_map_ros.core.cache import gluon_runs
    from lingbot_map_ros.core.cache.merge import merge_partials

    gen = torch.Generator(device="cuda").manual_seed(11)
    head_rows, h, d, slots = 128 * tiles, 2, 64, 4000
    t = head_rows + tail
    q = torch.randn(t, h, d, device="cuda", generator=gen).to(dtype)  # [T, H, D]
    k, v = (torch.full((slots, h, d), 3e4, device="cuda", dtype=dtype) for _ in range(2))  # poisoned
    for start, length in runs:
        k[start:start + length] = torch.randn(length, h, d, device="cuda", generator=gen).to(dtype)
        v[start:start + length] = torch.randn(length, h, d, device="cuda", generator=gen).to(dtype)
    table = torch.tensor(runs + [(0, 0)] * (4 - len(runs)), dtype=torch.int32, device="cuda")  # [4, 2]
    blocks = [torch.arange(s + b, s + min(b + 128, n), device="cuda") for s, n in runs for b in range(0, n, 128)]
    order = torch.cat(blocks)

    def reference(rows: torch.Tensor, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scores = torch.einsum("thd,nhd->htn", rows.double(), k[keys].double()) / d ** 0.5  # [H, T, n]
        return torch.einsum("htn,nhd->thd", scores.softmax(-1), v[keys].double()), scores.logsumexp(-1)

    result = torch.full((t, h, d), float("nan"), device="cuda", dtype=dtype)  # [T, H, D]
    out, lse = gluon_runs.runs_attention_fused_tail(q, k, v, table, head_rows, result.unsqueeze(0))
    parts = tiles
    assert out.shape == (parts, tail, h, d) and lse.shape == (parts, h, tail)
    limit = 1e-2 if dtype == torch.bfloat16 else 2e-3
    ref_head, _ = reference(q[:head_rows], order)
    err = ((result[:head_rows].double() - ref_head).norm() / ref_head.norm()).item()
    assert err < limit, err
    assert torch.isnan(result[head_rows:]).all()  # the tail's rows are the caller's to write
    for p in range(parts):  # program p's tail warpgroup: every parts-th block, from the p-th
        mine = blocks[p::parts]
        if not mine:
            assert torch.isneginf(lse[p]).all() and (out[p] == 0).all(), p
            continue
        ref, ref_lse = reference(q[head_rows:], torch.cat(mine))
        assert ((out[p].double() - ref).norm() / ref.norm()).item() < limit, p
        assert (lse[p].double() - ref_lse).abs().max().item() < 1e-4, p
    merged = merge_partials([out.transpose(1, 2)], [lse])  # [tail, H, D]
    ref_tail, _ = reference(q[head_rows:], order)
    err = ((merged.double() - ref_tail).norm() / ref_tail.norm()).item()
    print(f"{dtype} tail warpgroup, tiles {tiles} tail {tail} runs {len(runs)}: {err:.2e}")
    assert err < limit, err


def _tiny_session_poses(**session_kwargs) -> tuple[torch.Tensor, object]:
    """pose_enc of a 16-frame tiny-preset bf16 stream (scale 2, window 3, keyframe every 2nd frame)."""
    manager = _tiny_bf16_manager(StreamConfig(scale_frames=2, sliding_window=3, keyframe_interval=2,
                                              max_frame_num=64, max_stored_frames=60, with_depth=True),
                                 **session_kwargs)
    frames = torch.rand(16, 3, 56, 84, generator=torch.Generator().manual_seed(2))
    out = [r for f in frames for r in manager.push(f)]
    return torch.stack([torch.from_numpy(r.pose_enc) for r in out]).double(), manager.session


def _tiny_bf16_manager(scfg, **runtime_kwargs):
    """A session manager over the tiny preset in bf16 on the GPU, attention ``sdpa`` + ``runtime_kwargs``."""
    from lingbot_map_ros.core.config import model_config
    from lingbot_map_ros.core.model import build_model
    from lingbot_map_ros.core.model_host import cast_for_inference
    from lingbot_map_ros.core.runtime import resolve_for
    from lingbot_map_ros.core.session_manager import SessionManager

    cfg = model_config("tiny")
    model, _ = build_model(cfg, seed=5, device="cuda", dtype=torch.float32)
    cast_for_inference(model, torch.bfloat16)
    runtime = resolve_for(torch.device("cuda"), torch.bfloat16, backend="sdpa", **runtime_kwargs)
    return SessionManager.around(model, cfg, scfg, runtime, log=lambda m: None)


@pytest.mark.parametrize("graphs,compile_blocks,sdpa_kernel,prefix", [
    (True, "off", "flash", "auto"),  # CUDA-graph replay of the static varlen-flash path
    (True, "on", "cudnn", "auto"),  # + fused blocks, masked cuDNN
    (True, "off", "split", "auto"),  # contiguous prefix (Triton where it runs) + masked tail, merged by LSE
    (True, "on", "split", "auto"),  # the same with fused blocks and the compiled merge
    (True, "on", "split", "sdpa"),  # the prefix read by cuDNN
    (True, "on", "split", "triton"),  # the Triton kernel where auto picks its Gluon version
])
def test_graphed_session_matches_eager_session(graphs, compile_blocks, sdpa_kernel, prefix):
    """A tiny-preset bf16 stream: each one-frame path vs the eager session (gathered SDPA)."""
    eager, _ = _tiny_session_poses(cuda_graphs=False, compile_blocks="off")
    poses, session = _tiny_session_poses(cuda_graphs=graphs, compile_blocks=compile_blocks, sdpa_kernel=sdpa_kernel,
                                         prefix_kernel=prefix)
    if compile_blocks == "on":
        assert session._fusion is not None and session._fusion.calls > 0
    if sdpa_kernel == "split":
        backend = session._kv.single_frame_backend
        assert type(backend).__name__ == "SplitPrefixBackend" and backend.mode == "full"
        assert backend.kv_splits >= 1
        wanted = ("sdpa" if prefix == "sdpa" or not importlib.util.find_spec("triton") else "triton"
                  if prefix == "triton" or _gluon_unusable() else "gluon")
        assert backend.prefix_kernel == wanted, backend.prefix_kernel
    rel = ((poses - eager).norm() / eager.norm()).item()
    print(f"{sdpa_kernel}+graph{'+compile' if compile_blocks == 'on' else ''} vs eager pose rel diff {rel:.2e}")
    assert torch.isfinite(poses).all() and rel < 2e-2


def test_depth_head_beside_the_camera_head_changes_nothing(monkeypatch):
    """The graph step with the depth head on its own stream (the default) gives the poses and depth
    maps of the same step with the heads one after the other (the test hands the step no side stream,
    so the model runs the depth head after the camera head): the same kernels on the same inputs. Also
    run with the fused blocks, whose capture warm-up forks from its own side stream."""
    from lingbot_map_ros.core import stream as stream_module

    beside = stream_module.side_stream

    def stream(serial: bool = False, **kwargs):
        monkeypatch.setattr(stream_module, "side_stream", (lambda device, role: None) if serial else beside)
        manager = _tiny_bf16_manager(StreamConfig(scale_frames=2, sliding_window=3, keyframe_interval=2,
                                                  max_frame_num=64, max_stored_frames=60, with_depth=True),
                                     cuda_graphs=True, sdpa_kernel="split", **kwargs)
        assert manager.session.runtime.depth_beside_camera
        frames = torch.rand(12, 3, 56, 84, generator=torch.Generator().manual_seed(4))
        out = [r for f in frames for r in manager.push(f)]
        assert manager.session._graph_step is not None and manager.session._graph_step.stats.replays >= 8
        return (torch.stack([torch.from_numpy(r.pose_enc) for r in out]),
                torch.stack([torch.from_numpy(r.depth) for r in out]),
                torch.stack([torch.from_numpy(r.depth_conf) for r in out]))

    for compile_blocks in ("off", "on"):
        side = stream(compile_blocks=compile_blocks)
        serial = stream(serial=True, compile_blocks=compile_blocks)
        diffs = [(a - b).abs().max().item() for a, b in zip(side, serial)]
        print(f"heads side by side vs serial (fusion {compile_blocks}): max |diff| pose, depth, conf {diffs}")
        assert all(torch.isfinite(t).all() for t in side)
        assert torch.equal(side[0], serial[0]), "the camera head's kernels are the same: poses must be equal"
        assert diffs[1] <= 1e-5 * serial[1].abs().max().item() and diffs[2] <= 1e-5 * serial[2].abs().max().item()


def test_encoder_graph_is_captured_once_and_replayed_every_frame():
    """The frame step as two graphs (the image encoder queued before the host's plan): through a
    filling and a full window, a reset and fused blocks, the encoder's graph is captured once per step
    and replayed every frame, and the poses follow the eager session's; a single scale frame keeps its
    own variants (the eager path, as without graphs)."""
    def stream(scale: int = 2, **kwargs):
        kwargs = {"cuda_graphs": True, "sdpa_kernel": "split", **kwargs}
        manager = _tiny_bf16_manager(StreamConfig(scale_frames=scale, sliding_window=3, keyframe_interval=2,
                                                  max_frame_num=64, max_stored_frames=60, with_depth=True),
                                     **kwargs)
        frames = torch.rand(12, 3, 56, 84, generator=torch.Generator().manual_seed(8))
        out = [r for f in frames[:7] for r in manager.push(f)]
        manager.reset()
        out += [r for f in frames for r in manager.push(f)]
        step = manager.session._graph_step
        return [torch.stack([torch.from_numpy(getattr(r, name)) for r in out])
                for name in ("pose_enc", "depth", "depth_conf")], step

    eager, _ = stream(cuda_graphs=False, compile_blocks="off")
    for compile_blocks in ("off", "on"):
        graphed, step = stream(compile_blocks=compile_blocks)
        assert step.stats.encoder_captures == 1
        assert step.stats.replays == 5 + 10 and step.stats.captures == len(step.signatures)
        rel = ((graphed[0].double() - eager[0].double()).norm() / eager[0].double().norm()).item()
        print(f"two-graph step (fusion {compile_blocks}) vs eager: pose rel diff {rel:.2e}")
        assert all(torch.isfinite(t).all() for t in graphed) and rel < 2e-2
    # one scale frame: the eager path with its own variants (the graphs hold phase 2's), as without graphs
    (graphed, _), (eager, _) = stream(scale=1, compile_blocks="off"), stream(scale=1, cuda_graphs=False,
                                                                            compile_blocks="off")
    first = (graphed[0][0].double() - eager[0][0].double()).norm() / eager[0][0].double().norm()
    whole = (graphed[0].double() - eager[0].double()).norm() / eager[0].double().norm()
    print(f"scale_frames 1, graphs vs eager: pose rel diff first frame {first:.2e}, stream {whole:.2e}")
    assert first < 1e-3 and whole < 2e-2


def test_depth_every_replays_one_graph_per_heads_variant():
    """depth_every 2 on the graph path: the frames alternate between a graph with the depth head and one
    without (both kept, each captured once); poses as with depth on every frame, depth on the schedule."""
    def run(every):
        manager = _tiny_bf16_manager(StreamConfig(scale_frames=2, sliding_window=3, keyframe_interval=1,
                                                  max_frame_num=64, max_stored_frames=60, with_depth=True,
                                                  depth_every=every),
                                     cuda_graphs=True, compile_blocks="off", sdpa_kernel="split")
        frames = torch.rand(12, 3, 56, 84, generator=torch.Generator().manual_seed(6))
        return [r for f in frames for r in manager.push(f)], manager.session._graph_step

    every, _ = run(1)
    some, step = run(2)
    assert [r.depth is not None for r in some] == [i < 2 or i % 2 == 0 for i in range(12)]
    # one graph per heads variant and plan signature: two with the Triton kernel (its run lengths live on
    # the device), more with cuDNN's prefix (one per filling bucket)
    assert step.stats.replays == 10 and step.stats.captures == len(step.signatures) >= 2
    poses = torch.stack([torch.from_numpy(r.pose_enc) for r in some]).double()
    ref = torch.stack([torch.from_numpy(r.pose_enc) for r in every]).double()
    rel = ((poses - ref).norm() / ref.norm()).item()
    print(f"depth_every 2 vs 1 on graphs: pose rel diff {rel:.2e}")
    assert torch.isfinite(poses).all() and rel < 1e-3


def test_depth_head_weights_channels_last_change_no_pose_and_no_depth(monkeypatch):
    """The depth head's weights in channels-last layout (the default on CUDA) against NCHW weights (the
    test overrides the runtime's layout): poses bit for bit equal (the head does not feed them), depth
    maps equal to fp32 summation order."""
    from lingbot_map_ros.core.runtime import ResolvedRuntime

    def run(channels_last):
        monkeypatch.setattr(ResolvedRuntime, "depth_channels_last", property(lambda self: channels_last))
        manager = _tiny_bf16_manager(StreamConfig(scale_frames=2, sliding_window=3, keyframe_interval=1,
                                                  max_frame_num=64, max_stored_frames=60, with_depth=True),
                                     cuda_graphs=True, sdpa_kernel="split")
        assert manager.session.runtime.depth_channels_last is channels_last
        frames = torch.rand(10, 3, 56, 84, generator=torch.Generator().manual_seed(8))
        return [r for f in frames for r in manager.push(f)]

    nchw, nhwc = run(False), run(True)
    poses = [torch.from_numpy(r.pose_enc) for r in nhwc]
    assert all(torch.equal(a, torch.from_numpy(b.pose_enc)) for a, b in zip(poses, nchw))
    depth = torch.stack([torch.from_numpy(r.depth) for r in nhwc]).double()
    ref = torch.stack([torch.from_numpy(r.depth) for r in nchw]).double()
    rel = ((depth - ref).norm() / ref.norm()).item()
    print(f"depth head channels-last vs NCHW weights: depth rel diff {rel:.2e}")
    assert torch.isfinite(depth).all() and rel < 1e-4


def _block_reference_error(block_kind: str, qk_kernel: bool = False):
    """One aggregator-shaped block (bf16 weights, autocast) eager and fused vs its float64 copy;
    ``qk_kernel``: the fused block's q/k-norm + RoPE as our Triton kernel (``qk_rope.py``)."""
    import copy

    from lingbot_map_ros.core.model.blocks import Block, frame_attend, global_attend
    from lingbot_map_ros.core.model.fusion import BlockFusion, fused_blocks
    from lingbot_map_ros.core.model.interfaces import DenseGlobalAttention
    from lingbot_map_ros.core.model.rope import Rope2D, Rope3D

    torch.manual_seed(11)
    ph, pw = 9, 13
    tokens = SPECIALS + ph * pw
    blk = Block(256, 4, qk_norm=True, layerscale_init=0.5).cuda()
    for prm in blk.parameters():  # non-trivial norms and gains
        prm.data.normal_(0.0, 0.5)
    ref_blk = copy.deepcopy(blk).double()
    blk = blk.to(torch.bfloat16)
    x = torch.randn(1, tokens, 256, device="cuda")  # [1, P, C]

    def attend(rope_dtype_device):
        if block_kind == "frame":
            return frame_attend(Rope2D(64, 100.0, SPECIALS).applier(ph, pw, rope_dtype_device))
        rope = Rope3D(64, 10000.0, (20, 22, 22), SPECIALS).applier(torch.tensor([3]), ph, pw, rope_dtype_device, 64)
        return global_attend(0, rope, DenseGlobalAttention())

    with torch.inference_mode():
        ref = ref_blk(x.double(), attend("cuda"))  # [1, P, C] float64
        with torch.autocast("cuda", dtype=torch.bfloat16):
            eager = blk(x.to(torch.bfloat16), attend("cuda"))
            fusion = BlockFusion(triton_kernels=qk_kernel)
            out = torch.full_like(eager, float("nan"))  # poisoned: every element must be written
            with fused_blocks(fusion):
                out.copy_(blk(x.to(torch.bfloat16), attend("cuda")))
    assert fusion.calls == 1
    rel = lambda a: ((a.double() - ref).norm() / ref.norm()).item()  # noqa: E731
    return rel(eager), rel(out), ((out.double() - eager.double()).norm() / eager.double().norm()).item(), out


@pytest.mark.parametrize("qk_kernel", [False, True], ids=["inductor-qk", "triton-qk"])
@pytest.mark.parametrize("block_kind", ["frame", "global"])
def test_fused_block_matches_float64(block_kind, qk_kernel):
    """torch.compile-fused block bodies (with Inductor's q/k-norm + RoPE or our kernel): same error class
    as the eager bf16 block against float64."""
    if qk_kernel and not importlib.util.find_spec("triton"):
        pytest.skip("triton not installed")
    eager_err, fused_err, diff, out = _block_reference_error(block_kind, qk_kernel)
    print(f"{block_kind} block ({'triton' if qk_kernel else 'inductor'} q/k): eager {eager_err:.2e}, "
          f"fused {fused_err:.2e}, fused vs eager {diff:.2e}")
    assert torch.isfinite(out).all()
    assert fused_err < max(1.5 * eager_err, 5e-3), (eager_err, fused_err)
    assert diff < 2e-2


@pytest.mark.parametrize("prefix", ["sdpa", "triton"])
def test_graphs_are_captured_once_per_plan_signature(prefix):
    """Split backend: with cuDNN's prefix each filling bucket (scale 2 + window 3 = 5 prefix pages:
    buckets of one page) and the full window get one capture; the Triton kernel reads its run lengths
    on the device, so one capture serves them all. A reset (a new session, or a long-run window)
    replays the graphs again instead of capturing anew."""
    if prefix == "triton" and not importlib.util.find_spec("triton"):
        pytest.skip("triton not installed")
    scfg = StreamConfig(scale_frames=2, sliding_window=3, keyframe_interval=1, max_frame_num=64, max_stored_frames=60)
    manager = _tiny_bf16_manager(scfg, cuda_graphs=True, compile_blocks="off", sdpa_kernel="split",
                                 prefix_kernel=prefix)
    session = manager.session
    frames = torch.rand(10, 3, 56, 84, generator=torch.Generator().manual_seed(4))
    first = [r.pose_enc for f in frames for r in manager.push(f)]
    step = session._graph_step
    wanted = [("filling", 2), ("filling", 3), ("full", 5)] if prefix == "sdpa" else [("runs",)]
    assert sorted(sig[1:] for sig in step.signatures) == wanted
    assert step.stats.captures == len(wanted)
    manager.reset()
    second = [r.pose_enc for f in frames for r in manager.push(f)]
    assert session._graph_step is step and step.stats.captures == len(wanted) and step.stats.replays == 2 * 8
    # the same frames in a new session give the same poses: the kept graphs replay the same step
    import numpy as np

    assert len(first) == len(second) == 10
    assert all(np.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(first, second))


def test_camera_decode_in_a_graph_matches_float64():
    """The camera head's split-key decode (the graph step's default) replayed in one CUDA graph while the
    stored length changes (stored and unstored steps, a reset, a load): every call against float64 over
    the tokens the test keeps itself, and the slot it wrote; masked SDPA beside it for the spread."""
    from lingbot_map_ros.core.cache import CameraKVCache

    heads, dim, capacity = 16, 128, 40
    gen = torch.Generator(device="cuda").manual_seed(8)
    caches = {kernel: CameraKVCache(1, 2, heads, dim, capacity, torch.float32, "cuda", static=True,
                                    decode_kernel=kernel) for kernel in ("triton", "sdpa")}
    q, k, v = (torch.zeros(2, 1, heads, dim, device="cuda") for _ in range(3))  # graph inputs, per block
    graphs, outs = {}, {}
    for kernel, cache in caches.items():
        cache.begin_step(1, store=False)
        for _ in range(2):  # warm-up (compiles the kernels) outside the capture
            [cache(0, b, q[b], k[b], v[b]) for b in range(2)]
        graphs[kernel] = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graphs[kernel]):
            outs[kernel] = [cache(0, b, q[b], k[b], v[b]) for b in range(2)]
        cache.end_step()
        cache.reset()
    mine = [torch.empty(0, 2, heads, dim, device="cuda", dtype=torch.float64) for _ in range(2)]
    worst = {"triton": 0.0, "sdpa": 0.0}
    plan = ["stored"] * 30 + ["unstored", "stored"] * 3 + ["reset"] + ["stored"] * 5 + ["load", "unstored"]
    saved = None
    for i, action in enumerate(plan):
        if action == "reset":
            saved = ({kernel: (c.state_dict(), c.stored_tensor()) for kernel, c in caches.items()},
                     [m.clone() for m in mine])
            for cache in caches.values():
                cache.reset()
            mine = [m[:0] for m in mine]
            continue
        if action == "load":
            for kernel, cache in caches.items():
                cache.load_state(*saved[0][kernel])
            mine = saved[1]
            continue
        for tensor in (q, k, v):
            tensor.copy_(torch.randn(tensor.shape, device="cuda", generator=gen) * 2)
        for kernel, cache in caches.items():
            cache.begin_step(1, store=action == "stored")
            graphs[kernel].replay()
        for b in range(2):
            kv = torch.cat((mine[b], torch.stack((k[b], v[b]), 1).double()))  # [L + 1, 2, H, D]
            scores = torch.einsum("shd,nhd->hsn", q[b].double(), kv[:, 0]) / dim**0.5  # [H, 1, N]
            ref = torch.einsum("hsn,nhd->shd", scores.softmax(-1), kv[:, 1])  # [1, H, D]
            for kernel in caches:
                worst[kernel] = max(worst[kernel], ((outs[kernel][b].double() - ref).norm() / ref.norm()).item())
            slot = caches["triton"].length
            assert torch.equal(caches["triton"].storage[0, b, 0, slot], k[b][0]), (i, b)
            assert torch.equal(caches["triton"].storage[0, b, 1, slot], v[b][0]), (i, b)
            if action == "stored":
                mine[b] = kv
        for cache in caches.values():
            cache.end_step()
    print(f"camera decode in a graph vs float64: triton {worst['triton']:.2e}, masked sdpa {worst['sdpa']:.2e}")
    assert caches["triton"].length == caches["sdpa"].length == 33  # the load brought back 33 stored frames
    assert worst["triton"] < 1e-5 and worst["sdpa"] < 1e-4


@pytest.mark.parametrize("style", ["halves", "pairs"])
def test_qk_norm_rope_kernel_rounds_the_eager_result(style):
    """q/k-norm + RoPE at the full model's shape (1005 tokens x 16 heads x 64) on the model's tables
    against the eager path (autocast's fp32 LayerNorm, the fp32 rotation, one rounding to bf16): the
    same bf16 value almost everywhere (the two fp32 results differ by reduction order, which flips a
    rounding only next to a tie), and everywhere within one ulp plus fp32 noise of the terms (a
    rotation that cancels leaves a result far smaller than its terms); float64 beside it for the record."""
    from lingbot_map_ros.core.model.qk_rope import qk_norm_rope
    from lingbot_map_ros.core.model.rope import Rope2D, Rope3D, apply_rope_2d, apply_rope_3d

    gen = torch.Generator(device="cuda").manual_seed(12)
    ph, pw, h, d = 27, 37, 16, 64
    if style == "halves":
        cos, sin = Rope2D(d, 100.0, SPECIALS).tables(ph, pw, "cuda", torch.float32)
        rotate = apply_rope_2d
    else:
        cos, sin = Rope3D(d, 10000.0, (20, 22, 22), SPECIALS).tables(torch.tensor([40]), ph, pw, "cuda", torch.float32)
        rotate = lambda x, c, s: apply_rope_3d(x[0], c, s)[None]  # noqa: E731
    t = cos.shape[0]
    qkv = (torch.randn(1, t, 3, h, d, device="cuda", generator=gen) * 2 + 0.3).to(torch.bfloat16)
    norms = [(torch.randn(d, device="cuda", generator=gen).to(torch.bfloat16),
              torch.randn(d, device="cuda", generator=gen).to(torch.bfloat16) * 0.2) for _ in range(2)]
    q, k = qk_norm_rope(qkv, norms[0], norms[1], 1e-5, cos, sin, style)
    for name, out, x, (w, b) in (("q", q, qkv[:, :, 0], norms[0]), ("k", k, qkv[:, :, 1], norms[1])):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = torch.nn.functional.layer_norm(x, (d,), w, b, 1e-5)  # fp32 under autocast
        ref = rotate(y.float(), cos, sin)  # fp32, what the eager block rounds
        flipped = (out != ref.to(torch.bfloat16)).float().mean().item()
        ulp = torch.exp2(torch.floor(torch.log2(ref.abs().clamp_min(2.0 ** -100))) - 7)
        noise = 1e-6 * y.abs().amax(-1, keepdim=True)  # fp32 noise of the terms, per head vector
        beyond = ((out.float() - ref).abs() - ulp - noise).max().item()
        exact = rotate(torch.nn.functional.layer_norm(x.double(), (d,), w.double(), b.double(), 1e-5),
                       cos.double(), sin.double())
        print(f"{style} {name}: {flipped:.2e} of the elements round the other way than eager; rel error vs "
              f"float64 {((out.double() - exact).norm() / exact.norm()).item():.2e}")
        assert flipped < 1e-3 and beyond <= 0, (flipped, beyond)


def test_kv_write_kernel_equals_index_copy():
    """The one-frame K/V write at the full model's shape (bf16): the storage equals index_copy_'s bit for bit."""
    from lingbot_map_ros.core.cache.kv_write import write_rows

    gen = torch.Generator(device="cuda").manual_seed(13)
    t, h, d, slots = 1005, 16, 64, 74 * 999
    qkv = torch.randn(t, 3, h, d, device="cuda", generator=gen).to(torch.bfloat16)
    k, v = qkv[:, 1].contiguous(), qkv[:, 2]  # k as the fused pre region returns it, v a strided view
    index = torch.randperm(slots, device="cuda", generator=gen)[:t]
    flat = torch.randn(2, slots, h, d, device="cuda", generator=gen).to(torch.bfloat16)
    expected = flat.clone()
    expected.index_copy_(1, index, torch.stack((k, v)))
    write_rows(k, v, index, flat)
    assert torch.equal(flat, expected)


@pytest.mark.parametrize("triton_kernels", [False, True], ids=["inductor", "gemv"])
def test_fused_camera_head_matches_the_eager_head(triton_kernels):
    """The camera head's trunk blocks through the graph step's fused regions (fp32, autocast off) over
    three stored frames against the eager fp32 head (the head upcasts its input to fp32, so float64 is
    not on offer here): equal to fp32 noise, and every trunk call went through the fused regions."""
    from lingbot_map_ros.core.cache import CameraKVCache
    from lingbot_map_ros.core.model.camera_head import CameraCausalHead
    from lingbot_map_ros.core.model.fusion import BlockFusion, fused_blocks

    torch.manual_seed(14)
    head = CameraCausalHead(dim=256, num_heads=4, trunk_depth=2, layerscale_init=0.5).cuda()
    for prm in head.parameters():
        prm.data.normal_(0.0, 0.1)
    tokens = torch.randn(3, 1, 256, device="cuda")  # three frames' camera tokens

    def run(fusion):
        cache = CameraKVCache(2, 2, 4, 64, 8, torch.float32, "cuda", static=True, decode_kernel="sdpa")
        outs = []
        with torch.inference_mode(), fused_blocks(fusion):
            for token in tokens:
                cache.begin_step(1, store=True)
                outs.append(torch.stack(head(token, cache, num_iterations=2)))  # [2, 1, 9]
                cache.end_step()
        return torch.stack(outs).double()

    eager = run(None)
    if triton_kernels and not importlib.util.find_spec("triton"):
        pytest.skip("triton not installed")
    fusion = BlockFusion(triton_kernels=triton_kernels)
    fused = run(fusion)
    rel = ((fused - eager).norm() / eager.norm()).item()
    print(f"camera head fused ({'gemv' if triton_kernels else 'inductor'}) vs eager (fp32): rel diff {rel:.2e}")
    assert fusion.calls == 3 * 2 * 2  # frames x iterations x trunk blocks
    assert torch.isfinite(fused).all() and rel < 1e-5


def test_compiled_depth_head_matches_float64():
    """The DPT head's arithmetic compiled (``BlockFusion(depth_head=True)``: Inductor fuses its ReLUs,
    residual adds, upsamplings and position codes around cuDNN's convolutions) against the same
    arithmetic in float64 on the same tokens, beside the eager fp32 head: both within fp32 (TF32
    convolutions) noise of float64, the compiled one no farther than the eager one, and it really ran."""
    import copy

    from lingbot_map_ros.core.config import model_config
    from lingbot_map_ros.core.model import build_model
    from lingbot_map_ros.core.model.depth_head import dpt_chunk
    from lingbot_map_ros.core.model.fusion import BlockFusion, fused_blocks

    head = build_model(model_config("tiny"), seed=21, enable_depth=True)[0].depth_head.cuda()
    for prm in head.parameters():
        prm.data.normal_(0.0, 0.05)
    head.use_channels_last(True)
    hw = (56, 84)
    gen = torch.Generator(device="cuda").manual_seed(22)
    tokens = [torch.randn(1, 6 + 4 * 6, head.norm.normalized_shape[0], device="cuda", generator=gen)
              for _ in range(4)]  # 4 x [1, P, 2C]

    def run(fusion):
        with torch.inference_mode(), fused_blocks(fusion):
            depth, conf = head(tokens, hw)
        return torch.stack([depth, conf]).double()  # [2, 1, H, W]

    head64 = copy.deepcopy(head).double()
    with torch.inference_mode():
        reference = torch.stack(dpt_chunk(head64, [t.double() for t in tokens],
                                          head64._pe_codes(hw, tokens[0].device, torch.float64), hw))
    eager = run(None)
    fusion = BlockFusion(depth_head=True)
    fused = run(fusion)
    assert fusion.depth_calls == 1
    err_eager = ((eager - reference).norm() / reference.norm()).item()
    err_fused = ((fused - reference).norm() / reference.norm()).item()
    print(f"depth head vs float64: eager {err_eager:.2e}, compiled {err_fused:.2e}")
    assert torch.isfinite(fused).all() and err_fused < 5e-3 and err_fused < 2 * err_eager + 1e-6


def test_staged_readback_returns_owned_copies_after_the_step():
    """The step's outputs come back with one wait: the values of ``.cpu()`` (float32), None kept, after
    work still queued when ``fetch`` was called (a long matmul writes the last output), and the arrays
    handed out own their memory (the next fetch reuses the pinned buffers without touching them)."""
    from lingbot_map_ros.core.readback import StagedReadback

    readback = StagedReadback()
    a = torch.randn(2048, 2048, device="cuda")
    first_pose = torch.randn(1, 9, device="cuda")
    depth = (a @ a @ a)[:378, :518]  # queued work: fetch must wait for it
    got = readback.fetch((first_pose, depth, None))
    assert got[2] is None and got[0].dtype == np.float32 and got[1].shape == (378, 518)
    np.testing.assert_array_equal(got[0], first_pose.cpu().numpy())
    np.testing.assert_array_equal(got[1], depth.cpu().numpy())
    kept = got[1].copy()
    again = readback.fetch((torch.zeros(1, 9, device="cuda"), torch.full((378, 518), 7.0, device="cuda"), None))
    assert (again[1] == 7.0).all() and np.array_equal(got[1], kept), "a later fetch changed an earlier result"
    bf16 = readback.fetch((first_pose.bfloat16(), None, None))[0]
    np.testing.assert_array_equal(bf16, first_pose.bfloat16().float().cpu().numpy())


@pytest.mark.parametrize("merge_kernel", [False, True])
@pytest.mark.parametrize("tokens", [1042, 1041])
@pytest.mark.parametrize("frames", [1, 2])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_frame_tiles_match_float64_in_a_cuda_graph(tokens, frames, dtype, merge_kernel, monkeypatch):
    """A frame's own attention by our kernel as at 518x392 (``model/frame_tiles.py``: whole tiles in place, the
    tail's rows carried by the third warpgroup and merged, by PyTorch ops or by our merge kernel): against
    float64 per frame, as tight as cuDNN's call, also when captured in a CUDA graph and replayed on new
    inputs (the frame step's way)."""
    import torch.nn.functional as F

    from lingbot_map_ros.core.cache import merge
    from lingbot_map_ros.core.model.frame_tiles import tiles_attention

    monkeypatch.setattr(merge, "KERNEL", merge_kernel)

    rows = tokens // 128 * 128
    torch.manual_seed(tokens + frames)
    qkv = torch.randn(frames, tokens, 3, H, D, device="cuda", dtype=dtype)  # [N, T, 3, H, D]

    def split(x):  # q contiguous (as after the aggregator's q/k-norm + RoPE), k and v views (as DINO's)
        q, k, v = x.unbind(2)
        return q.contiguous(), k, v  # [N, T, H, D] each

    def reference(x):
        q, k, v = (t.double() for t in x.unbind(2))
        w = torch.einsum("nthd,nshd->nhts", q, k).div(D**0.5).softmax(-1)  # [N, H, T, T]
        return torch.einsum("nhts,nshd->nthd", w, v)  # [N, T, H, D]

    def cudnn(x):
        q, k, v = split(x)
        return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)

    out = tiles_attention(*split(qkv), rows)
    assert out is not None and out.shape == (frames, tokens, H, D) and out.dtype == dtype
    ref = reference(qkv)
    err, cudnn_err = ((o.double() - ref).abs().max().item() for o in (out, cudnn(qkv)))
    tail_err = (out[:, rows:].double() - ref[:, rows:]).abs().max().item()
    print(f"{dtype} frames {frames} tokens {tokens}: ours {err:.2e} (tail rows {tail_err:.2e}), cuDNN {cudnn_err:.2e}")
    assert err <= 1.5 * cudnn_err + 1e-4 and tail_err <= 1.5 * cudnn_err + 1e-4

    static = qkv.clone()
    q, k, v = split(static)
    tiles_attention(q, k, v, rows)  # warm-up outside the capture (the runs tensor, the compiled merge)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        q, k, v = split(static)
        captured = tiles_attention(q, k, v, rows)
    assert captured is not None
    fresh = torch.randn_like(qkv)
    static.copy_(fresh)
    graph.replay()
    torch.cuda.synchronize()
    replay_err = (captured.double() - reference(fresh)).abs().max().item()
    assert replay_err <= 1.5 * cudnn_err + 1e-4, replay_err
