"""Host time of a one-frame step's plan upload: per-call ``torch.tensor`` uploads (before) against one
NumPy build + pinned ``StagedUpload`` (now), in one process on the same device (GPU only for times).

Reproduces what ``PagedKVCache.begin_step`` and the split backend's run table upload for one frame at
518x378 (999 patch slots + 6 specials, four runs), with the device idle as it is between two frames;
then the camera cache's mask: rebuilt on every step (before) against opened by one fill (now).

    python3 scripts/upload_bench.py [--calls 2000] [--device cuda]
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from lingbot_map_ros.core.cache.camera_cache import CameraKVCache
from lingbot_map_ros.core.cache.staged_upload import StagedUpload

PAGE, SPECIALS, RUNS = 999, 6, 4


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--device", default="cuda")
    args = p.parse_args()
    dev = torch.device(args.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    offsets = torch.arange(PAGE, dtype=torch.long, device=dev)  # [page]
    host_offsets = np.arange(PAGE, dtype=np.int64)  # [page]
    slots_dev = torch.zeros(PAGE + SPECIALS, dtype=torch.long, device=dev)  # [T]
    runs_dev = torch.zeros(RUNS, 2, dtype=torch.int32, device=dev)  # [4, 2]
    slot_upload, runs_upload = StagedUpload(slots_dev), StagedUpload(runs_dev)
    rng = np.random.default_rng()

    def plan() -> tuple[list[int], list[int], list[list[int]]]:
        page = int(rng.integers(0, 72))
        specials = [int(s) for s in rng.integers(0, 1 << 20, SPECIALS)]
        runs = [[int(a), int(b)] for a, b in rng.integers(0, 1 << 16, (RUNS, 2))]
        return [page], specials, runs

    def before(pages: list[int], specials: list[int], runs: list[list[int]]) -> None:
        patch = torch.tensor(pages, dtype=torch.long, device=dev)[:, None] * PAGE + offsets  # [1, page]
        special = torch.tensor(specials, dtype=torch.long, device=dev).view(1, SPECIALS)  # [1, 6]
        slots_dev.copy_(torch.cat((special, patch), dim=1).reshape(-1))
        table = torch.zeros(RUNS, 2, dtype=torch.int32)
        table[:] = torch.tensor(runs, dtype=torch.int32)
        runs_dev.copy_(table)

    def now(pages: list[int], specials: list[int], runs: list[list[int]]) -> None:
        patch = np.asarray(pages, dtype=np.int64)[:, None] * PAGE + host_offsets  # [1, page]
        special = np.asarray(specials, dtype=np.int64).reshape(1, SPECIALS)  # [1, 6]
        slot_upload.upload(np.concatenate((special, patch), axis=1).reshape(-1))
        table = np.zeros((RUNS, 2), dtype=np.int32)
        table[:] = runs
        runs_upload.upload(table)

    times: dict[str, list[float]] = {"before": [], "now": []}
    for i in range(args.calls):
        for name, fn in (("before", before), ("now", now)) if i % 2 else (("now", now), ("before", before)):
            pages, specials, runs = plan()
            sync()  # the device is idle between two frames
            t0 = time.perf_counter()
            fn(pages, specials, runs)
            times[name].append((time.perf_counter() - t0) * 1e3)
            sync()
            expected = np.concatenate((np.asarray(specials), pages[0] * PAGE + host_offsets))
            if i % 100 == 0 and not (np.array_equal(slots_dev.cpu().numpy(), expected)
                                     and np.array_equal(runs_dev.cpu().numpy(), np.asarray(runs))):
                raise SystemExit(f"{name}: the uploaded plan differs from the host's")
    camera = CameraKVCache(1, 1, 1, 4, 1024, torch.bfloat16, dev, static=True)
    positions = torch.arange(1024, device=dev)  # [capacity]
    mask = torch.zeros(1, 1, 1, 1024, dtype=torch.bfloat16, device=dev)
    slot = torch.zeros(1, dtype=torch.long, device=dev)  # [1]
    for name in ("camera mask before", "camera mask now"):
        times[name] = []
    for i in range(min(args.calls, 1000)):
        sync()
        t0 = time.perf_counter()
        slot.fill_(i)
        visible = positions <= i  # [capacity]
        mask.copy_(torch.where(visible, 0.0, float("-inf")).to(mask.dtype).view_as(mask))
        times["camera mask before"].append((time.perf_counter() - t0) * 1e3)
        sync()
        t0 = time.perf_counter()
        camera.begin_step(1, store=True)
        times["camera mask now"].append((time.perf_counter() - t0) * 1e3)
        camera.end_step()
        sync()
    b, n = statistics.median(times["before"]), statistics.median(times["now"])
    print(f"plan upload, host ms per one-frame step, {args.calls} calls each, interleaved, {dev}")
    print("| path | median ms | p90 ms |\n|---|---|---|")
    for name in ("before", "now"):
        ts = sorted(times[name])
        print(f"| {name} | {statistics.median(ts):.4f} | {ts[int(0.9 * len(ts))]:.4f} |")
    print(f"| ratio before / now | {b / n:.2f} | |")
    for name in ("camera mask before", "camera mask now"):  # each: the slot fill + the mask
        ts = sorted(times[name])
        print(f"| {name} | {statistics.median(ts):.4f} | {ts[int(0.9 * len(ts))]:.4f} |")


if __name__ == "__main__":
    main()
