"""Per-layer attention micro-benchmark at the full model's steady-state shape (device machine).

One frame's global attention: 1005 queries (999 patches + 6 specials) x 16 heads x d 64 over the
visible set of a full window: 72 patch pages of 999 slots + the specials of F stored frames.
Every candidate reads the same paged storage through the package's own backend classes, is
checked against an fp32 reference over the gathered visible keys (relative L2 error), and is timed
with CUDA events as the median over rotating K/V sets (so L2 never holds the keys).
TFLOP/s counts the visible keys only (4·T·N·H·D FLOP), so a kernel that reads masked slots pays
for them in its rate.

    python3 scripts/attention_bench.py [--stored 208] [--reps 30]
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

H, D, PAGE, SPECIALS = 16, 64, 999, 6


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--stored", type=int, default=208, help="stored frames (specials visible)")
    p.add_argument("--scale", type=int, default=8)
    p.add_argument("--window", type=int, default=64)
    p.add_argument("--max-stored", type=int, default=321)
    p.add_argument("--sets", type=int, default=4)
    p.add_argument("--reps", type=int, default=30)
    args = p.parse_args()
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
    sets = [(torch.randn(num_pages, PAGE, H, D, device=dev, dtype=dt), torch.randn(num_pages, PAGE, H, D, device=dev, dtype=dt))
            for _ in range(args.sets)]
    q = torch.randn(T, H, D, device=dev, dtype=dt)
    slots = visible_token_slots(visible, last, torch.arange(PAGE, device=dev))
    N = slots.numel()
    flop = 4 * T * N * H * D
    print(f"T={T} H={H} D={D} visible keys N={N} of {num_pages * PAGE} slots; {flop / 1e9:.1f} GFLOP per layer")

    def reference(kv):
        k = kv[0].view(-1, H, D)[slots].float().transpose(0, 1)[None]  # [1, H, N, D]
        v = kv[1].view(-1, H, D)[slots].float().transpose(0, 1)[None]
        out = torch.cat([F.scaled_dot_product_attention(q.float().transpose(0, 1)[None][:, h:h + 4], k[:, h:h + 4], v[:, h:h + 4])
                         for h in range(0, H, 4)], dim=1)
        return out[0].transpose(0, 1)  # [T, H, D]

    ref = reference(sets[0])
    results = []

    def bench(name, plan, run, graph=False):
        try:
            plan()
            out = torch.full_like(q, float("nan"))
            out.copy_(run(sets[0]))
            torch.cuda.synchronize()
            err = ((out.float() - ref).norm() / ref.norm()).item()
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
                step = lambda i: g.replay()
                per = len(sets)
            else:
                step = lambda i: run(sets[i % len(sets)])
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
            results.append((name, us, flop / us / 1e6, err, finite))
            print(f"{name}: {us:.0f} us, err {err:.2e}", flush=True)
        except Exception as exc:  # report and go on
            print(f"{name}: FAILED {type(exc).__name__}: {str(exc)[:300]}", flush=True)
            results.append((name, float("nan"), float("nan"), float("nan"), False))

    for kernel in ("cudnn",):
        be = MaskedDenseBackend(page_size=PAGE, num_pages=num_pages, num_heads=H, head_dim=D, dtype=dt, device=dev, kernel=kernel)
        bench(f"masked dense {kernel} (eager)", lambda: be.plan(visible, last, T), lambda kv: be.run(kv, q))
        if kernel == "cudnn":
            bench("masked dense cudnn (CUDA graph)", lambda: be.plan(visible, last, T), lambda kv: be.run(kv, q), graph=True)

    # cuDNN on contiguous, gathered keys (fixed length here: the best case, no mask)
    kc = [(kv[0].view(-1, H, D)[slots].transpose(0, 1)[None].contiguous(), kv[1].view(-1, H, D)[slots].transpose(0, 1)[None].contiguous())
          for kv in sets]
    qh = q.transpose(0, 1)[None]

    def cudnn_contig(kv):
        i = next(j for j, s in enumerate(sets) if s[0] is kv[0])
        from torch.nn.attention import SDPBackend, sdpa_kernel
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(qh, kc[i][0], kc[i][1])[0].transpose(0, 1)
    bench("cudnn contiguous, no mask (reference)", lambda: None, cudnn_contig)

    # Probe for the layout that would close the gap: the visible keys as one contiguous region of a
    # fixed-size buffer, read by cuDNN's ragged (THD) path with device-held offsets, so the key length
    # can change between graph replays without a new plan. Reports error and time, and whether a
    # replay after changing the device offsets still matches the reference of the new length.
    nmax = num_pages * PAGE
    kbuf = [(torch.randn(nmax, H, D, device=dev, dtype=dt), torch.randn(nmax, H, D, device=dev, dtype=dt)) for _ in range(args.sets)]
    cu_q = torch.tensor([0, T], dtype=torch.int32, device=dev)
    start = nmax - N
    cu_k = torch.tensor([start, nmax], dtype=torch.int32, device=dev)

    def ragged(kv):
        i = next(j for j, s in enumerate(sets) if s[0] is kv[0])
        kb, vb = kbuf[i]
        return torch.ops.aten._cudnn_attention_forward(q, kb, vb, None, cu_q, cu_k, T, nmax, False, 0.0, False, False,
                                                       scale=D ** -0.5)[0]
    try:
        def ref_region(i, a, b):
            k = kbuf[i][0][a:b].float().transpose(0, 1)[None]
            v = kbuf[i][1][a:b].float().transpose(0, 1)[None]
            return F.scaled_dot_product_attention(q.float().transpose(0, 1)[None], k, v)[0].transpose(0, 1)
        out = ragged(sets[0]).float()
        r = ref_region(0, start, nmax)
        print(f"cudnn ragged region: shape {tuple(out.shape)} err {((out - r).norm() / r.norm()).item():.2e}", flush=True)
        g = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream(); side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            ragged(sets[0])
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(g):
            gout = ragged(sets[0])
        cu_k[0] = start + 999 + 12  # a shorter region, same buffer: device-side change only
        g.replay(); torch.cuda.synchronize()
        r2 = ref_region(0, start + 1011, nmax)
        print(f"cudnn ragged after device-side length change in graph replay: err {((gout.float() - r2).norm() / r2.norm()).item():.2e}", flush=True)
        cu_k[0] = start
    except Exception as exc:
        print(f"cudnn ragged probe FAILED {type(exc).__name__}: {str(exc)[:400]}", flush=True)
    bench("cudnn ragged contiguous region (device offsets)", lambda: None, ragged)
    bench("cudnn ragged contiguous region (CUDA graph)", lambda: None, ragged, graph=True)

    st = StaticSdpaBackend(page_size=PAGE, num_heads=H, head_dim=D, max_keys=patch_pages * PAGE + SPECIALS * args.max_stored,
                           num_query_tokens=T, dtype=dt, device=dev)
    bench("static sdpa: gather + varlen flash (graph)", lambda: st.plan(visible, last, T), lambda kv: st.run(kv, q), graph=True)
    if importlib.util.find_spec("flashinfer") is not None:
        from lingbot_map_ros.core.cache.flashinfer_backend import FlashInferBackend
        for kernel in ("fa3",):
            fi = FlashInferBackend(page_size=PAGE, num_heads=H, head_dim=D, dtype=dt, device=dev, kernel=kernel, use_cuda_graph=True,
                                   max_visible_pages=num_pages + 1, max_query_tokens=T)
            bench(f"flashinfer {kernel} paged (graph)", lambda: fi.plan(visible, last, T), lambda kv: fi.run(kv, q), graph=True)
    print()
    print("| attention option | us/layer | TFLOP/s | rel. error vs fp32 | finite |")
    print("|---|---|---|---|---|")
    for name, us, tf, err, fin in results:
        print(f"| {name} | {us:.0f} | {tf:.0f} | {err:.2e} | {fin} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
