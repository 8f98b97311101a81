"""ABI v2 on the GPU, side by side in one run: cuplug's typed ops on PyTorch CUDA tensors against PyTorch.

    python bench/typed_bench.py OUT.json [quant]

- add on 1 GiB tensors (fp32, fp16, bf16) against torch.add(out=), both CUDA majors: CUDA-event time per
  call over batches of 20 calls queued back to back (so the host's per-call work overlaps the device's, for
  both sides alike), median of 10 batches with min and max; bytes moved = 3 x 1 GiB; target >= 0.97x
  torch.add. Also one call at a time (batch=1, host work included) and on cuplug's own stream.
- sum of 1 GiB float32 against torch.sum (target >= 1.0x).
- per-call overhead of a one-element op: median of 10,000 host-timed calls of b.run("add", x, y) on
  1-element CUDA tensors, beside torch.add's (no target; reported).
- with `quant`: quantkit's fused blockwise quantize against the same computation composed from PyTorch ops.
The device is warmed (one call each) before timing; the arrays are fresh random data.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

import torch

import cuplug

REPEATS = 10
GiB = 1 << 30


BATCH = 20  # calls queued back to back between two events: the device's time per call, host overhead overlapped


def timed(fn, repeats: int = REPEATS, batch: int = BATCH) -> dict[str, float]:
    """CUDA-event time per call on PyTorch's current stream: median (min, max) of `repeats` batches of
    `batch` calls each (batch=1: one call at a time, the host's per-call work included)."""
    fn()
    torch.cuda.synchronize()
    ms = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(batch):
            fn()
        b.record()
        torch.cuda.synchronize()
        ms.append(a.elapsed_time(b) / batch)
    return {"median_ms": statistics.median(ms), "min_ms": min(ms), "max_ms": max(ms), "batch": batch}


def bandwidth(nbytes: int, t: dict[str, float]) -> dict[str, float]:
    return {
        **t,
        "GBs": nbytes / t["median_ms"] / 1e6,
        "GBs_min": nbytes / t["max_ms"] / 1e6,
        "GBs_max": nbytes / t["min_ms"] / 1e6,
    }


def per_call_us(fn, calls: int = 10_000) -> dict[str, float]:
    for _ in range(100):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(calls):
        t = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - t) / 1e3)
    torch.cuda.synchronize()
    samples.sort()
    return {"median_us": samples[len(samples) // 2], "p10_us": samples[calls // 10], "p90_us": samples[9 * calls // 10]}


def main() -> None:
    res: dict = {"device": torch.cuda.get_device_name(0), "repeats": REPEATS, "torch": torch.__version__}
    for name, dtype in (("float32", torch.float32), ("float16", torch.float16), ("bfloat16", torch.bfloat16)):
        n = GiB // torch.tensor([], dtype=dtype).element_size()
        x = torch.randn(n, device="cuda", dtype=torch.float32).to(dtype)
        y = torch.randn(n, device="cuda", dtype=torch.float32).to(dtype)
        out = torch.empty_like(x)
        res[f"torch_add_{name}"] = bandwidth(3 * GiB, timed(lambda: torch.add(x, y, out=out)))
        res[f"torch_add_{name}_one_call"] = bandwidth(3 * GiB, timed(lambda: torch.add(x, y, out=out), batch=1))
        for major in ("cuda13", "cuda12"):
            os.environ["CUPLUG_BACKEND"] = f"{major}:fatbin"
            with cuplug.load() as b:
                res[f"{major}_add_{name}"] = bandwidth(
                    3 * GiB, timed(lambda: b.run("add", x, y, out=out, stream=torch.cuda.current_stream()))
                )
                res[f"{major}_add_{name}_default_stream"] = bandwidth(
                    3 * GiB, timed(lambda: b.run("add", x, y, out=out))
                )
                res[f"{major}_add_{name}_one_call"] = bandwidth(
                    3 * GiB, timed(lambda: b.run("add", x, y, out=out, stream=torch.cuda.current_stream()), batch=1)
                )
                assert torch.equal(out, x + y)
        res[f"ratio_add_{name}"] = {
            m: res[f"{m}_add_{name}"]["GBs"] / res[f"torch_add_{name}"]["GBs"] for m in ("cuda13", "cuda12")
        }
        x = y = out = None  # free the device memory before the next dtype
        torch.cuda.empty_cache()
    x = torch.randn(GiB // 4, device="cuda")
    s = torch.empty((), device="cuda")
    res["torch_sum_float32"] = bandwidth(GiB, timed(lambda: torch.sum(x, dim=0, out=s)))
    for major in ("cuda13", "cuda12"):
        os.environ["CUPLUG_BACKEND"] = f"{major}:fatbin"
        with cuplug.load() as b:
            res[f"{major}_sum_float32"] = bandwidth(
                GiB, timed(lambda: b.run("sum", x, out=s, stream=torch.cuda.current_stream()))
            )
    res["ratio_sum_float32"] = {
        m: res[f"{m}_sum_float32"]["GBs"] / res["torch_sum_float32"]["GBs"] for m in ("cuda13", "cuda12")
    }
    x = None
    torch.cuda.empty_cache()
    one, two = torch.ones(1, device="cuda"), torch.ones(1, device="cuda")
    res["per_call_torch_add"] = per_call_us(lambda: torch.add(one, two))
    os.environ["CUPLUG_BACKEND"] = "cuda13:fatbin"
    with cuplug.load() as b:
        res["per_call_cuplug_add"] = per_call_us(lambda: b.run("add", one, two))
        res["per_call_cuplug_add_out_stream"] = per_call_us(
            lambda: b.run("add", one, two, out=one, stream=torch.cuda.current_stream())
        )
    if "quant" in sys.argv[2:]:
        from quantkit import bench as quant_bench  # the example backend's own comparison

        res["quant"] = quant_bench.compare()
    os.environ.pop("CUPLUG_BACKEND", None)
    with open(sys.argv[1], "w") as f:
        json.dump(res, f, indent=2)
    for k, v in res.items():
        print(f"{k:34} {json.dumps(v) if isinstance(v, dict) else v}")


if __name__ == "__main__":
    main()
