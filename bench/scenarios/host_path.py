"""The host path (issue 22): run("add") on 1 GiB NumPy float32 arrays against a pinned H2D + D2H copy of 1 GiB.

In each of several fresh processes (the staging threads land differently in each): `b.run("add", x, y,
out=out)` (out touched first), wall time of each call after one warm-up, GB/s counting 3 GiB moved (2 in,
1 out); the anchor, in the same process before and after: PyTorch's pinned `H2D + D2H` of 1 GiB (2 GiB moved).
Target: >= 0.8x in every process. The first process also times a fresh output array per call (first touch).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script (one measuring process): the suite's modules beside it
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from suite.scenario import Measured, Scenario, Skip, Target
from suite.stats import summary

GiB = 1 << 30
N = GiB // 4
PROCESSES = {False: 3, True: 1}
CALLS = {False: 12, True: 4}
FRESH_CALLS = {False: 3, True: 0}


def _pinned_copy_gbs(torch: Any, calls: int) -> list[float]:
    """GB/s of `calls` pinned H2D + D2H round trips of 1 GiB (2 GiB moved each)."""
    pinned = torch.empty(N, dtype=torch.float32, pin_memory=True)
    dev = torch.empty(N, dtype=torch.float32, device="cuda")
    pinned.fill_(1.0)
    out = []
    for _ in range(calls):
        torch.cuda.synchronize()
        t = time.perf_counter()
        dev.copy_(pinned, non_blocking=True)
        pinned.copy_(dev, non_blocking=True)
        torch.cuda.synchronize()
        out.append(2 * 4 * N / (time.perf_counter() - t) / 1e9)
    del pinned, dev
    torch.cuda.empty_cache()
    return out


def one_process(calls: int, fresh_calls: int, seed: int) -> dict[str, Any]:
    """This process's measurement: pinned copies before, the adds, pinned copies after."""
    import numpy as np
    import torch

    import cuplug

    rng = np.random.default_rng(seed)
    x, y = rng.standard_normal(N, dtype=np.float32), rng.standard_normal(N, dtype=np.float32)
    out = np.zeros_like(x)  # touched: no page faults inside the timed calls
    idx = np.arange(0, N, 4099)
    pinned = _pinned_copy_gbs(torch, calls)
    with cuplug.load() as b:
        if b.device_type != 2:
            raise Skip(f"cuplug.load() chose the CPU: {b.trace.decision_reason}")
        b.run("add", x, y, out=out)  # staging allocated, kernels loaded
        adds = []
        for _ in range(calls):
            t = time.perf_counter()
            b.run("add", x, y, out=out)
            adds.append(3 * 4 * N / (time.perf_counter() - t) / 1e9)
        fresh = []
        for _ in range(fresh_calls):  # run() allocating its output: the page faults of its first touch
            t = time.perf_counter()
            r = b.run("add", x, y)
            fresh.append(3 * 4 * N / (time.perf_counter() - t) / 1e9)
            del r
        facts = {"correct": bool(np.array_equal(out[idx], x[idx] + y[idx])), "variant": f"{b.cuda}:{b.variant}"}
        facts["staging"] = getattr(b, "_info", {}).get("staging")
    pinned += _pinned_copy_gbs(torch, calls)
    return {"adds_GBs": adds, "fresh_output_GBs": fresh, "pinned_GBs": pinned, **facts}


def measure(quick: bool) -> Measured:
    import torch  # only to say why not, here; each process imports its own

    if not torch.cuda.is_available():
        raise Skip(f"PyTorch {torch.__version__} here sees no CUDA device")
    anchors: dict[str, Any] = {}
    results: dict[str, Any] = {}
    facts: dict[str, Any] = {}
    for i in range(1, PROCESSES[quick] + 1):
        fresh = FRESH_CALLS[quick] if i == 1 else 0
        cmd = [sys.executable, __file__, f"proc{i}.json", "--calls", str(CALLS[quick]), "--fresh-calls", str(fresh)]
        subprocess.run([*cmd, "--seed", str(i)], check=True, timeout=240)
        row = json.loads(Path(f"proc{i}.json").read_text())
        os.remove(f"proc{i}.json")
        anchors[f"pinned H2D+D2H, process {i}"] = summary(row.pop("pinned_GBs"), "GB/s")
        results[f"run add, process {i}"] = summary(row.pop("adds_GBs"), "GB/s")
        if row["fresh_output_GBs"]:
            results[f"run add, fresh output, process {i}"] = summary(row["fresh_output_GBs"], "GB/s")
        facts[f"process {i}"] = row
    return Measured(anchors, results, facts)


SCENARIO = Scenario(
    name="host-path",
    what="run('add') on 1 GiB host NumPy arrays against a pinned H2D + D2H copy of 1 GiB, in fresh processes (GB/s)",
    group="throughput (x the anchor)",
    runs_on="gpu",
    needs=("gpu", "torch", "numpy"),
    anchors={"pinned H2D+D2H": "PyTorch's pinned round trip of 1 GiB in the same process, before and after"},
    targets=(
        *(
            Target(
                f"run add, process {i}",
                f"run add, process {i}",
                f"pinned H2D+D2H, process {i}",
                "ratio",
                "x",
                (">=", 0.8),
                "issue 22 (in every process)",
            )
            for i in range(1, PROCESSES[False] + 1)
        ),
        Target(
            "run add, fresh output",
            "run add, fresh output, process 1",
            "pinned H2D+D2H, process 1",
            "ratio",
            "x",
            None,
            "reported: a fresh output array per call (first touch); pass out=",
        ),
    ),
    measure=measure,
    timeout_s=600,
)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="one measuring process of the host-path scenario")
    ap.add_argument("out", type=Path)
    ap.add_argument("--calls", type=int, default=CALLS[False])
    ap.add_argument("--fresh-calls", type=int, default=FRESH_CALLS[False])
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    a.out.write_text(json.dumps(one_process(a.calls, a.fresh_calls, a.seed)))
