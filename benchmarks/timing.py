"""The one way kcourse's benchmarks and experiments time a call (run from the repository root:
``python -m benchmarks.run ...``, ``python -m benchmarks.experiments.<name> ...``).

* ``bench_ms(fn)``: the median of ``triton.testing.do_bench`` (CUDA events around each call, the L2
  cache flushed before each call): what ``benchmarks/run.py`` reports.
* ``cpu_ms(fn)``: a ``time.perf_counter`` median, for the CPU smoke test (not a benchmark).
* ``graph_ms(fn)``: ``fn`` captured in a CUDA graph and replayed under ``bench_ms``: the kernels
  without the host's launch cost.
* ``host_us(fn)``: the host's microseconds per call (calls queued without synchronizing).
* ``interleaved(fns, rounds)``: every function timed once a round, the order rotated each round,
  the fastest median kept per function (the GPU's clocks drift between rounds, so candidates are
  compared only within one process, interleaved).
* ``copy_bandwidth()``: the memory-bound ceiling, ``dst.copy_(src)`` on 2^28 float32, bytes/s.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable

import torch

WARMUP_MS, REP_MS = 25, 100  # do_bench's defaults, as benchmarks/run.py's full sweep uses them


def bench_ms(fn: Callable, warmup: int = WARMUP_MS, rep: int = REP_MS) -> float:
    """Median ms of ``fn`` on CUDA: do_bench's L2 flush, then ``fn`` between two CUDA events."""
    from triton.testing import do_bench
    return do_bench(fn, warmup=warmup, rep=rep, return_mode="median")


def cpu_ms(fn: Callable, calls: int = 7) -> float:
    """Median wall time of ``calls`` calls, in ms, after one warm-up call."""
    fn()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def timer(device: str, warmup: int = WARMUP_MS, rep: int = REP_MS) -> Callable[[Callable], float]:
    """``bench_ms`` with these settings on CUDA, ``cpu_ms`` on the CPU."""
    if device == "cuda":
        return lambda fn: bench_ms(fn, warmup, rep)
    return cpu_ms


def graphed(fn: Callable) -> Callable:
    """``fn`` captured in a CUDA graph (after a warm-up call on a side stream): its replay."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def graph_ms(fn: Callable, warmup: int = WARMUP_MS, rep: int = REP_MS) -> float:
    """``bench_ms`` of ``fn`` captured in a CUDA graph: its kernels without the host."""
    return bench_ms(graphed(fn), warmup, rep)


def host_us(fn: Callable, calls: int = 200) -> float:
    """Host microseconds per call: ``calls`` calls queued without synchronizing (after a warm-up)."""
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return round(elapsed / calls * 1e6, 1)


def interleaved(fns: dict[str, Callable], rounds: int = 3, warmup: int = WARMUP_MS, rep: int = REP_MS,
                keep_all: bool = False) -> dict:
    """Each of ``fns`` timed once per round with ``bench_ms``, the order rotated every round. The
    fastest median per name (``keep_all``: the list of every round's, in round order)."""
    names = list(fns)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            times[name].append(bench_ms(fns[name], warmup, rep))
    return times if keep_all else {name: min(t) for name, t in times.items()}


def copy_bandwidth(device: str = "cuda", time_ms: Callable | None = None, elements: int = 2**28) -> tuple[float, int]:
    """(bytes/s read + written by ``dst.copy_(src)`` on ``elements`` float32, elements), timed with
    ``time_ms`` (``timer(device)`` by default)."""
    src = torch.randn(elements, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    ms = (time_ms or timer(device))(lambda: dst.copy_(src))
    return 2 * elements * 4 / (ms * 1e-3), elements
