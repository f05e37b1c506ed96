"""GPU time of a piece of work the way the serving loop runs it: captured in a CUDA graph, replayed, timed with CUDA
events (launch cost excluded). One copy for every benchmark here that times kernels."""
from __future__ import annotations

import statistics
from typing import Callable


def graph_us(fn: Callable[[], object], *, reps: int = 1, replays: int = 10, windows: int = 5, warmup: int = 2) -> float:
    """Median GPU µs of one ``fn`` call: ``reps`` calls captured in one CUDA graph (after ``warmup`` calls on a side
    stream, so allocators and libraries pick their kernels outside the capture), ``replays`` replays per window,
    the median over ``windows``."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(windows):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / (replays * reps))
    del graph
    return statistics.median(times)
