#!/usr/bin/env python3
"""The v2 vector kernels against PyTorch on 1 GiB CUDA tensors, through ctypes alone (no cuplug loader).

    python3 bench/abi2_kernel_bench.py build/backends/cuda13/fatbin/libcuplug_vector.so [more.so ...]

add (float32, float16, bfloat16) against torch.add(out=), sum (float32) against torch.sum(out=), and
scale_add float32 against torch's x * a + b (two kernels there): CUDA-event time on PyTorch's current
stream (passed to cuplug_backend_call), median of 10 after a warm-up; GB/s counts bytes read + written.
Checks each result against PyTorch (bit-exact for add). Targets: add >= 0.97x, sum >= 1.0x torch.
"""

from __future__ import annotations

import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import abi2_selftest as st

GiB = 1 << 30
NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


def once(fn) -> float:
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b)


def timed_pair(mine, theirs, repeats: int = 10) -> tuple[float, float]:
    """Medians of `repeats` CUDA-event timings each, the two alternating (same tensors, same state)."""
    mine(), theirs()
    torch.cuda.synchronize()
    a, b = [], []
    for _ in range(repeats):
        a.append(once(mine))
        b.append(once(theirs))
    return statistics.median(a), statistics.median(b)


def desc(b: st.Backend, t: torch.Tensor) -> st.CTensor:
    return st.CTensor(
        t.data_ptr(),
        st.CUDA,
        t.device.index or 0,
        t.dim(),
        st.cdtype(NAMES[t.dtype]),
        b.shape_of(tuple(t.shape)),
        None,
        0,
    )


def main(paths: list[str]) -> int:
    bad = 0
    for path in paths:
        b = st.Backend(path)
        b.ping()
        stream = torch.cuda.current_stream().cuda_stream or 1  # 0 is the legacy default stream: cudaStreamLegacy (1)
        print(f"\n=== {path} (torch {torch.__version__}, {torch.cuda.get_device_name(0)})")
        print(f"{'case':28} {'cuplug ms':>10} {'torch ms':>10} {'cuplug GB/s':>12} {'ratio':>7}")

        def row(case, nbytes, mine, theirs, target):
            nonlocal bad
            r = theirs / mine
            flag = "" if r >= target else f"  < {target}"
            bad += r < target
            print(f"{case:28} {mine:10.3f} {theirs:10.3f} {nbytes / mine / 1e6:12.0f} {r:7.3f}{flag}")

        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            n = GiB // torch.tensor([], dtype=dtype).element_size()
            x = torch.randn(n, device="cuda").to(dtype)
            y = torch.randn(n, device="cuda").to(dtype)
            out = torch.empty_like(x)
            dx, dy, do = desc(b, x), desc(b, y), desc(b, out)
            b.call("add", [dx, dy], [do], stream=stream)
            ok = torch.equal(out, x + y)
            mine, theirs = timed_pair(
                lambda: b.call("add", [dx, dy], [do], stream=stream), lambda: torch.add(x, y, out=out)
            )
            row(f"add {NAMES[dtype]}{'' if ok else ' MISMATCH'}", 3 * GiB, mine, theirs, 0.97)
            bad += not ok
            if dtype == torch.float32:
                b.call("scale_add", [dx], [do], {"alpha": 1.7, "beta": -0.3}, stream=stream)
                ok = torch.equal(out, x * 1.7 - 0.3)
                mine, theirs = timed_pair(
                    lambda: b.call("scale_add", [dx], [do], {"alpha": 1.7, "beta": -0.3}, stream=stream),
                    lambda: torch.add(torch.mul(x, 1.7), -0.3, out=out),
                )
                row(f"scale_add float32{'' if ok else ' MISMATCH'}", 2 * GiB, mine, theirs, 0.0)
                bad += not ok
            x = y = out = None
            torch.cuda.empty_cache()
        for dtype in (torch.float32, torch.float16):
            n = GiB // torch.tensor([], dtype=dtype).element_size()
            x = torch.randn(n, device="cuda").to(dtype)
            s = torch.empty((), device="cuda", dtype=dtype)
            dx, ds = desc(b, x), desc(b, s)
            b.call("sum", [dx], [ds], stream=stream)
            got = float(s)
            b.call("sum", [dx], [ds], stream=stream)
            same = float(s) == got
            ref = float(x.double().sum())
            ok = same and abs(got - ref) <= st.SUM_RTOL[NAMES[dtype]] * float(x.double().abs().sum())
            mine, theirs = timed_pair(
                lambda: b.call("sum", [dx], [ds], stream=stream), lambda: torch.sum(x, dim=0, out=s)
            )
            row(
                f"sum {NAMES[dtype]}{'' if ok else ' MISMATCH'}",
                GiB,
                mine,
                theirs,
                1.0 if dtype == torch.float32 else 0.0,
            )
            bad += not ok
            x = None
            torch.cuda.empty_cache()
        b.close()
    print(f"\n{bad} below target or mismatched")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
