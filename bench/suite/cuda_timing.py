"""CUDA-event timers on PyTorch's current stream, for the device-bound scenarios (bandwidth, sum).

Hand-written on purpose: pytest-benchmark times the host, and what these scenarios compare is the device's
time per call; nvbench would time our kernels alone, not the call through run() beside PyTorch's. The three
modes are issue 22's (docs/performance.md, "`sum` against `torch.sum`"):

  queued   device time per call with the queue kept full: `prime` calls queued, then an event, `calls` calls,
           an event (the host's per-call work overlaps the device's from the first timed call on)
  batch20  an event, 20 calls, an event: the first call's host work shows, 1/20 of it per call
  single   one call and a synchronize, host wall time: the host's work included
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

Timer = Callable[[Callable[[], Any]], float]


def timers(torch: Any) -> dict[str, Timer]:
    """Mode -> timer returning milliseconds per call."""

    def events(fn: Callable[[], Any], calls: int) -> float:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(calls):
            fn()
        b.record()
        torch.cuda.synchronize()
        return a.elapsed_time(b) / calls

    def queued(fn: Callable[[], Any], calls: int = 20, prime: int = 3) -> float:
        for _ in range(prime):
            fn()
        return events(fn, calls)

    def batch20(fn: Callable[[], Any]) -> float:
        torch.cuda.synchronize()
        return events(fn, 20)

    def single(fn: Callable[[], Any]) -> float:
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - t) * 1e3

    return {"queued": queued, "batch20": batch20, "single": single}


def alternating(fns: dict[str, Callable[[], Any]], timer: Timer, repeats: int) -> dict[str, list[float]]:
    """ms per call of each function, ``repeats`` times, the functions alternating within each repeat (the same
    device state, clocks and neighbours for all of them); one warm-up call each first."""
    for fn in fns.values():
        fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            samples[name].append(timer(fn))
    return samples
