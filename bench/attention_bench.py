"""Per-layer attention micro-benchmark at the full model's steady-state shape (device machine).

One frame's global attention: 1005 queries (999 patches + 6 specials) x 16 heads x d 64 over the
visible set of a full window: 72 patch pages of 999 slots + the specials of F stored frames.
Every candidate reads the same paged storage through the package's own backend classes, is
checked against an fp32 reference over the gathered visible keys (relative L2 error), and is timed
with CUDA events as the median over rotating K/V sets (so L2 never holds the keys).
TFLOP/s counts the visible keys only (4·T·N·H·D FLOP), so a kernel that reads masked slots pays
for them in its rate.

    python3 bench/attention_bench.py [--stored 208] [--reps 30] [--kv-splits 1,2,3,4,6,8] [--quick] [--page 999]

``--kv-splits``: the split backend with its unmasked prefix read as a batch of that many key ranges
(``SplitPrefixBackend(kv_splits=S)``), full window and filling; ``--quick``: only those rows.
"""
from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys

import torch
import torch.nn.functional as F

from lingbot_map_ros.core.cache.backend import visible_token_slots
from lingbot_map_ros.core.cache.dense_backend import MaskedDenseBackend
from lingbot_map_ros.core.cache.sdpa_backend import StaticSdpaBackend

H, D, SPECIALS = 16, 64, 6
PAGE = 999  # patch tokens per frame (--page)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--stored", type=int, default=208, help="stored frames (specials visible)")
    p.add_argument("--scale", type=int, default=8)
    p.add_argument("--window", type=int, default=64)
    p.add_argument("--max-stored", type=int, default=321)
    p.add_argument("--sets", type=int, default=4)
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--kv-splits", default="1,2,3,4,6,8", help="key ranges of the split backend's prefix")
    p.add_argument("--quick", action="store_true", help="only the split backend per --kv-splits")
    p.add_argument("--prefix-kernels", default="sdpa,triton", help="the split backend's kernels (sdpa = cuDNN)")
    p.add_argument("--page", type=int, default=999, help="patch tokens per frame (999: 518x378, 1036: 518x392)")
    args = p.parse_args()
    global PAGE
    PAGE = args.page
    dev, dt = torch.device("cuda"), torch.bfloat16
    torch.manual_seed(0)
    patch_pages = args.scale + args.window + 1
    special_pages = -(-SPECIALS * args.max_stored // PAGE)
    num_pages = patch_pages + special_pages
    T = SPECIALS + PAGE
    # visible: every patch page but one (the free page of a keyframe step), then the used specials
    free = 5
    visible = [pg for pg in range(patch_pages) if pg != free]
    n_spec = SPECIALS * args.stored
    visible += list(range(patch_pages, patch_pages + -(-n_spec // PAGE)))
    last = n_spec % PAGE or PAGE
    sets = [
        (
            torch.randn(num_pages, PAGE, H, D, device=dev, dtype=dt),
            torch.randn(num_pages, PAGE, H, D, device=dev, dtype=dt),
        )
        for _ in range(args.sets)
    ]
    q = torch.randn(T, H, D, device=dev, dtype=dt)
    slots = visible_token_slots(visible, last, torch.arange(PAGE, device=dev))
    N = slots.numel()
    flop = 4 * T * N * H * D
    print(f"T={T} H={H} D={D} visible keys N={N} of {num_pages * PAGE} slots; {flop / 1e9:.1f} GFLOP per layer")

    def reference(kv, slots=slots):
        k = kv[0].view(-1, H, D)[slots].float().transpose(0, 1)[None]  # [1, H, N, D]
        v = kv[1].view(-1, H, D)[slots].float().transpose(0, 1)[None]
        qf = q.float().transpose(0, 1)[None]  # [1, H, T, D]
        out = torch.cat(
            [F.scaled_dot_product_attention(qf[:, h:h + 4], k[:, h:h + 4], v[:, h:h + 4]) for h in range(0, H, 4)],
            dim=1,
        )
        return out[0].transpose(0, 1)  # [T, H, D]

    ref = reference(sets[0])
    results = []

    def bench(name, plan, run, graph=False, ref_out=ref, keys=None):
        try:
            plan()
            out = torch.full_like(q, float("nan"))
            out.copy_(run(sets[0]))
            torch.cuda.synchronize()
            err = ((out.float() - ref_out).norm() / ref_out.norm()).item() if ref_out is not None else float("nan")
            finite = bool(torch.isfinite(out).all())
            if graph:  # capture one call per set, time the replays
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    for kv in sets:
                        run(kv)
                torch.cuda.current_stream().wait_stream(side)
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    for kv in sets:
                        run(kv)

                def step(i):
                    return g.replay()

                per = len(sets)
            else:

                def step(i):
                    return run(sets[i % len(sets)])

                per = 1
            for i in range(5):
                step(i)
            times = []
            for i in range(args.reps):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                step(i)
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b) * 1e3 / per)
            us = statistics.median(times)
            results.append((name, us, 4 * T * (keys or N) * H * D / us / 1e6, err, finite))
            print(f"{name}: {us:.0f} us, err {err:.2e}", flush=True)
        except Exception as exc:  # report and go on
            print(f"{name}: FAILED {type(exc).__name__}: {str(exc)[:300]}", flush=True)
            results.append((name, float("nan"), float("nan"), float("nan"), False))

    from lingbot_map_ros.core.cache.split_backend import SplitPrefixBackend, attend_with_lse
    R = patch_pages - 1
    visible_split = list(range(R)) + visible[len(visible) - -(-n_spec // PAGE):]
    slots_split = visible_token_slots(visible_split, last, torch.arange(PAGE, device=dev))
    assert slots_split.numel() == N
    ref_split = reference(sets[0], slots_split)
    filling = list(range(40)) + visible_split[R:]
    ref_filling = reference(sets[0], visible_token_slots(filling, last, torch.arange(PAGE, device=dev)))
    for prefix_kernel in args.prefix_kernels.split(","):
        for S in (int(x) for x in args.kv_splits.split(",")):
            sp_s = SplitPrefixBackend(page_size=PAGE, num_patch_pages=patch_pages, num_pages=num_pages, num_heads=H,
                                      head_dim=D, dtype=dt, device=dev, kernel="cudnn", fuse_merge=True, kv_splits=S,
                                      prefix_kernel=prefix_kernel)
            sp_s.plan(visible_split, last, T)
            used = sp_s._regions[0].splits if sp_s._regions else sp_s.kv_splits
            who = "cuDNN" if prefix_kernel == "sdpa" else prefix_kernel
            bench(f"split ({who} prefix), prefix as {used} key ranges (compiled merge, graph)",
                  lambda: sp_s.plan(visible_split, last, T), lambda kv: sp_s.run(kv, q), graph=True, ref_out=ref_split)
            sp_s.plan(filling, last, T)
            bench(f"split ({who} prefix), filling 40 of 72, head {sp_s.head_pages} as {used} "
                  "ranges (graph)", lambda: sp_s.plan(filling, last, T), lambda kv: sp_s.run(kv, q), graph=True,
                  ref_out=ref_filling, keys=sp_s.num_keys)
        if prefix_kernel != "sdpa":  # the node's calls at this frame size (factory.py): maybe whole tiles + a tail
            splits, cut = _node_split_calls(T, patch_pages - 1, prefix_kernel)
            sp_c = SplitPrefixBackend(page_size=PAGE, num_patch_pages=patch_pages, num_pages=num_pages, num_heads=H,
                                      head_dim=D, dtype=dt, device=dev, kernel="cudnn", fuse_merge=True,
                                      kv_splits=splits, prefix_kernel=prefix_kernel, runs_plan=cut)
            bench(f"split ({prefix_kernel}), the node's plan: {cut.reason} (compiled merge, graph)",
                  lambda: sp_c.plan(visible_split, last, T), lambda kv: sp_c.run(kv, q), graph=True,
                  ref_out=ref_split)
    if args.quick:
        _table(results)
        return 0

    for kernel in ("cudnn",):
        be = MaskedDenseBackend(
            page_size=PAGE, num_pages=num_pages, num_heads=H, head_dim=D, dtype=dt, device=dev, kernel=kernel
        )
        if kernel == "cudnn":
            bench("masked dense cudnn (CUDA graph)", lambda: be.plan(visible, last, T), lambda kv: be.run(kv, q),
                  graph=True)

    # cuDNN on contiguous, gathered keys (fixed length here: the best case, no mask)
    kc = [
        (
            kv[0].view(-1, H, D)[slots].transpose(0, 1)[None].contiguous(),  # [1, H, N, D]
            kv[1].view(-1, H, D)[slots].transpose(0, 1)[None].contiguous(),  # [1, H, N, D]
        )
        for kv in sets
    ]
    qh = q.transpose(0, 1)[None]

    def cudnn_contig(kv):
        i = next(j for j, s in enumerate(sets) if s[0] is kv[0])
        from torch.nn.attention import SDPBackend, sdpa_kernel
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(qh, kc[i][0], kc[i][1])[0].transpose(0, 1)
    bench("cudnn contiguous, no mask (reference)", lambda: None, cudnn_contig)

    # The split backend: the page table's "lowest" allocation keeps the stored patch pages at 0..R-1,
    # so a keyframe step of a full window sees exactly that prefix + the specials (same key count N).
    for fuse in (False, True):
        sp = SplitPrefixBackend(page_size=PAGE, num_patch_pages=patch_pages, num_pages=num_pages, num_heads=H,
                                head_dim=D, dtype=dt, device=dev, kernel="cudnn", fuse_merge=fuse)
        bench(f"split: cuDNN prefix (unmasked) + masked tail, {'compiled' if fuse else 'eager'} merge (graph)",
              lambda: sp.plan(visible_split, last, T), lambda kv: sp.run(kv, q), graph=True, ref_out=ref_split)
        if not fuse:
            print(f"split mode {sp.mode}, keys {sp.num_keys}", flush=True)
            qh4 = q.transpose(0, 1)[None]  # [1, H, T, D]
            n0 = sp.prefix_slots

            def part(kv, which):
                k = kv[0].view(1, -1, H, D).transpose(1, 2)
                v = kv[1].view(1, -1, H, D).transpose(1, 2)
                if which == "prefix":
                    return attend_with_lse("cudnn", qh4, k[:, :, :n0], v[:, :, :n0], None)[0][0].transpose(0, 1)
                return attend_with_lse("cudnn", qh4, k[:, :, n0:], v[:, :, n0:], sp._tail_mask)[0][0].transpose(0, 1)
            bench("  part: prefix alone, cuDNN unmasked + lse (graph)", lambda: None, lambda kv: part(kv, "prefix"),
                  graph=True, ref_out=None)
            bench("  part: tail alone, cuDNN masked + lse (graph)", lambda: None, lambda kv: part(kv, "tail"),
                  graph=True, ref_out=None)
    # the filling window (40 of 72 prefix pages stored: head 36 unmasked + one masked bucket) and a
    # prefix with a hole (one masked call over the whole prefix)
    specials_pages = visible_split[R:]
    for label, vis in (("window filling, 40 of 72 pages", list(range(40)) + specials_pages),
                       ("prefix with a hole (masked)", [pg for pg in visible_split if pg != 5])):
        spm = SplitPrefixBackend(page_size=PAGE, num_patch_pages=patch_pages, num_pages=num_pages, num_heads=H,
                                 head_dim=D, dtype=dt, device=dev, kernel="cudnn", fuse_merge=True)
        spm.plan(vis, last, T)
        print(f"{label}: mode {spm.mode}, head {spm.head_pages} pages, keys {spm.num_keys}", flush=True)
        bench(f"split, {label} (compiled merge, graph)", lambda: spm.plan(vis, last, T), lambda kv: spm.run(kv, q),
              graph=True, ref_out=reference(sets[0], visible_token_slots(vis, last, torch.arange(PAGE, device=dev))),
              keys=spm.num_keys)

    st = StaticSdpaBackend(page_size=PAGE, num_heads=H, head_dim=D,
                           max_keys=patch_pages * PAGE + SPECIALS * args.max_stored,
                           num_query_tokens=T, dtype=dt, device=dev)
    bench("static sdpa: gather + varlen flash (graph)", lambda: st.plan(visible, last, T), lambda kv: st.run(kv, q),
          graph=True)
    if importlib.util.find_spec("flashinfer") is not None:
        from lingbot_map_ros.core.cache.flashinfer_backend import FlashInferBackend
        for kernel in ("fa3",):
            fi = FlashInferBackend(page_size=PAGE, num_heads=H, head_dim=D, dtype=dt, device=dev, kernel=kernel,
                                   use_cuda_graph=True, max_visible_pages=num_pages + 1, max_query_tokens=T)
            bench(f"flashinfer {kernel} paged (graph)", lambda: fi.plan(visible, last, T), lambda kv: fi.run(kv, q),
                  graph=True)
            bench(f"flashinfer {kernel} paged, window filling, 40 of 72 pages (graph)",
                  lambda: fi.plan(filling, last, T), lambda kv: fi.run(kv, q), graph=True, ref_out=ref_filling,
                  keys=int(visible_token_slots(filling, last, torch.arange(PAGE, device=dev)).numel()))
    _table(results)
    return 0


def _node_split_calls(queries: int, prefix_pages: int, prefix_kernel: str):
    """The key ranges and the calls the node's factory plans for our kernel at this frame size on this GPU."""
    from lingbot_map_ros.core.cache.factory import split_kernel_calls

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    return split_kernel_calls(prefix_kernel, queries, H, sms, prefix_pages)


def _table(results: list) -> None:
    print()
    print("| attention option | us/layer | TFLOP/s | rel. error vs fp32 | finite |")
    print("|---|---|---|---|---|")
    for name, us, tf, err, fin in results:
        print(f"| {name} | {us:.0f} | {tf:.0f} | {err:.2e} | {fin} |")


if __name__ == "__main__":
    sys.exit(main())
