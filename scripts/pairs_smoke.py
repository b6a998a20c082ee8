"""Smoke check of the warp-specialised Gluon kernel (gluon_runs.py, ``pairs``) before longer GPU runs:
one small call against the one-warpgroup kernel and float64; exits 1 on a mismatch (a hang is caught
by the caller's timeout).

    python3 scripts/pairs_smoke.py
"""
from __future__ import annotations

import sys

import torch

from lingbot_map_ros.core.cache import gluon_runs


def main() -> int:
    gen = torch.Generator(device="cuda").manual_seed(3)
    t, n, h, d = 300, 5000, 4, 64
    q, k, v = (torch.randn(size, h, d, device="cuda", generator=gen).to(torch.bfloat16) for size in (t, n, n))
    runs = torch.tensor([[0, 2000], [2500, 1777]], dtype=torch.int32, device="cuda")
    keys = torch.cat([torch.arange(0, 2000), torch.arange(2500, 4277)]).cuda()
    scores = torch.einsum("thd,nhd->htn", q.double(), k[keys].double()) / d ** 0.5  # [H, T, N]
    ref = torch.einsum("htn,nhd->thd", scores.softmax(-1), v[keys].double())  # [T, H, D]
    ok = True
    for pairs in (False, True):
        out, lse = gluon_runs.runs_attention(q, k, v, runs, pairs=pairs)
        torch.cuda.synchronize()
        err = ((out[0].double() - ref).norm() / ref.norm()).item()
        lse_err = (lse[0].double() - scores.logsumexp(-1)).abs().max().item()
        print(f"pairs={pairs}: rel err {err:.2e}, lse err {lse_err:.2e}")
        ok &= err < 1e-2 and lse_err < 1e-4
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
