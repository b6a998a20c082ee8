"""µs per call of GPU work timed as the frame step runs it: the calls captured back to back into one CUDA graph
(no host launch in the figure), the replay timed with CUDA events, the median over replays. Shared by the
scripts that time single kernels (gemv_bench.py, gemm_bench.py, frame_attention_bench.py)."""
from __future__ import annotations

from typing import Callable, Sequence

import torch

REPLAYS = 50


def graphed_us(calls: Sequence[Callable[[], object]], replays: int = REPLAYS) -> float:
    """Median µs per call of ``calls`` (closures, each warmed up and compiled outside the capture)."""
    for fn in calls:
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn in calls:
            fn()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(calls))
    return sorted(times)[len(times) // 2]
