#!/usr/bin/env python3
"""Where one run(out=) call's time goes (docs/performance.md, "Where the time goes"), on the CPU twin:
each part of Backend.run timed alone, median of 5 loops of N calls, microseconds.

    CUPLUG_BACKEND=cpu python bench/dispatch_parts.py [N]
    python bench/dispatch_parts.py [N] --cuda      # the same parts on PyTorch CUDA tensors (a GPU machine)

Prints one JSON object. Parts: the whole run(out=) and np.add(out=) beside it; one NumPy operand's import;
the prepared call found again; its addresses written; the out= overlap check; cuplug_backend_call through
ctypes with argtypes bound, and without them handed ctypes objects (what run() uses).
"""

from __future__ import annotations

import ctypes
import json
import statistics
import sys
import time

import numpy as np

import cuplug
from cuplug.runtime.api import Backend, _refuse_overlap


def med(f, n: int) -> float:
    res = []
    for _ in range(5):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            f()
        res.append((time.perf_counter_ns() - t0) / n / 1000)
    return round(statistics.median(res), 3)


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    b = cuplug.load()
    x, y, o = (np.ones(1, np.float32) for _ in range(3))
    sig = b.ops["add"]
    args = [b._arg(x, "x", False, 0), b._arg(y, "y", False, 0)]
    outs = [b._arg(o, "o", True, 0)]
    p = b._plan(sig, args, outs, (x, y), {})
    p.fill(args, outs, {}, "add")
    core = b._core
    call, fast = core.lib.call, core.lib.call_fast
    u64 = ctypes.c_uint64(0)
    print(
        json.dumps(
            {
                "calls_per_loop": n,
                "np.add(out=)": med(lambda: np.add(x, y, out=o), n),
                "run(out=) numpy": med(lambda: b.run("add", x, y, out=o), n),
                "one NumPy operand imported": med(lambda: b._arg(x, "x", False, 0), n),
                "prepared call found": med(lambda: b._plan(sig, args, outs, (x, y), {}), n),
                "addresses written": med(lambda: p.fill(args, outs, {}, "add"), n),
                "out= overlap check": med(lambda: _refuse_overlap(sig, args, outs), n),
                "ctypes call, argtypes bound": med(
                    lambda: call(core.handle, p.op, p.c_in, 2, p.c_out, 1, p.c_attrs, 0, 0), n
                ),
                "ctypes call, no argtypes (run's)": med(
                    lambda: fast(core.c_handle, p.c_op, p.c_in, 2, p.c_out, 1, p.c_attrs, 0, u64), n
                ),
            }
        )
    )


def main_cuda() -> None:
    """The parts of run(out=) on 1-element PyTorch CUDA tensors, beside torch.add and PyTorch's own accessors
    (what any import of a torch.Tensor must read)."""
    import torch

    n = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 20000
    b = cuplug.load()
    x, y, o = (torch.ones(1, device="cuda") for _ in range(3))
    sig = b.ops["add"]
    args = [b._arg(x, "x", False, 0), b._arg(y, "y", False, 0)]
    outs = [b._arg(o, "o", True, 0)]
    p = b._plan(sig, args, outs, (x, y), {})
    p.fill(args, outs, {}, "add")
    core = b._core
    fast = core.lib.call_fast
    stream = torch.cuda.current_stream().cuda_stream
    u64 = ctypes.c_uint64(stream or 1)
    raw_stream = torch._C._cuda_getCurrentRawStream
    parts = {
        "calls_per_loop": n,
        "torch.add(out=)": lambda: torch.add(x, y, out=o),
        "torch.add": lambda: torch.add(x, y),
        "torch.empty(1)": lambda: torch.empty(1, device=x.device),
        "torch.empty_like": lambda: torch.empty_like(x),
        "x.new_empty((1,))": lambda: x.new_empty((1,)),
        "run(out=) torch": lambda: b.run("add", x, y, out=o),
        "run torch": lambda: b.run("add", x, y),
        "Backend.run(out=) torch, the whole path (+ learn)": lambda: Backend.run(b, "add", x, y, out=o),
        "one torch operand imported": lambda: b._arg(x, "x", False, 0),
        "framework stream found": lambda: b._framework_launch((x, y), o),
        "raw current stream": lambda: raw_stream(0),
        "prepared call found": lambda: b._plan(sig, args, outs, (x, y), {}),
        "addresses written": lambda: p.fill(args, outs, {}, "add"),
        "out= overlap check": lambda: _refuse_overlap(sig, args, outs),
        "C call (launch), no argtypes": lambda: fast(core.c_handle, p.c_op, p.c_in, 2, p.c_out, 1, p.c_attrs, 0, u64),
        "x.data_ptr()": lambda: x.data_ptr(),
        "x.dtype": lambda: x.dtype,
        "tuple(x.shape)": lambda: tuple(x.shape),
        "x.is_contiguous()": lambda: x.is_contiguous(),
        "x.device": lambda: x.device,
        "x.is_cuda": lambda: x.is_cuda,
        "x.get_device()": lambda: x.get_device(),
        "x.is_neg()": lambda: x.is_neg(),
        "x.requires_grad": lambda: x.requires_grad,
        "x.numel()": lambda: x.numel(),
        "x.layout": lambda: x.layout,
        "x.__dlpack__()": lambda: x.__dlpack__(),
    }
    found = {}
    for name, f in parts.items():
        if callable(f):
            f()
            torch.cuda.synchronize()
            found[name] = med(f, n)
            torch.cuda.synchronize()
        else:
            found[name] = f
    print(json.dumps(found))


if __name__ == "__main__":
    main_cuda() if "--cuda" in sys.argv else main()
