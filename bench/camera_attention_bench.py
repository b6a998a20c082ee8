"""The camera head's graph-step attention alone: masked SDPA against the Triton split-key decode (GPU).

One frame's 16 calls (4 iterations x 4 trunk blocks of the full model: 16 heads x d 128, fp32) over a
static ``CameraKVCache`` of the default capacity (321) holding ``--stored`` frames, captured in a CUDA
graph as the frame step does; prints µs per frame for each kernel and the largest relative difference
of their outputs.

    python3 bench/camera_attention_bench.py [--stored 208]
"""
from __future__ import annotations

import argparse

import torch

from lingbot_map_ros.core.cache import CameraKVCache

ITERATIONS, BLOCKS, HEADS, HEAD_DIM = 4, 4, 16, 128


def frame_graph(kernel: str, stored: int, capacity: int, inputs: list) -> tuple[float, list[torch.Tensor]]:
    cache = CameraKVCache(ITERATIONS, BLOCKS, HEADS, HEAD_DIM, capacity, torch.float32, "cuda", static=True,
                          decode_kernel=kernel)
    gen = torch.Generator(device="cuda").manual_seed(0)
    history = torch.randn(ITERATIONS, BLOCKS, 2, stored, HEADS, HEAD_DIM, device="cuda", generator=gen)
    cache.load_state({**cache.state_dict(), "length": stored}, history)
    cache.begin_step(1, store=False)

    def step() -> list[torch.Tensor]:
        return [cache(i, b, *inputs[i * BLOCKS + b]) for i in range(ITERATIONS) for b in range(BLOCKS)]

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = step()
    for _ in range(10):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(50):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return sorted(times)[len(times) // 2], [o.clone() for o in outs]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stored", type=int, default=208)
    p.add_argument("--capacity", type=int, default=321)
    args = p.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(1)
    qkv = [torch.randn(1, 3, HEADS, HEAD_DIM, device="cuda", generator=gen).unbind(1)
           for _ in range(ITERATIONS * BLOCKS)]  # strided [1, H, D] views, as the trunk's
    results = {kernel: frame_graph(kernel, args.stored, args.capacity, qkv) for kernel in ("sdpa", "triton")}
    diff = max(((a - b).norm() / b.norm()).item() for a, b in zip(results["triton"][1], results["sdpa"][1]))
    print(f"camera-head attention, one frame ({ITERATIONS * BLOCKS} calls, {args.stored} stored of "
          f"{args.capacity}), CUDA graph:")
    print("| kernel | µs per frame |\n|---|---|")
    for kernel, (us, _) in results.items():
        print(f"| {kernel} | {us:.1f} |")
    print(f"largest relative difference triton vs sdpa: {diff:.2e}")


if __name__ == "__main__":
    main()
