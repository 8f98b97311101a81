"""Allocating vs out= (issue 30): a 1 GiB float32 add that allocates its result, and the same into out=,
through run(), the cuplug.torch op and PyTorch, in one pytest-benchmark run.

The allocating cases are bench/bench_dispatch.py's `alloc_1gib` (target: >= 0.97x torch.add, dispatch_report's
table); the out= cases bench/bench_alloc_out.py's (>= 0.97x torch.add(out=), the add bandwidth target). What
allocating costs is reported as the allocating time over the out= time, for cuplug and for PyTorch.
"""

from __future__ import annotations

from suite import dispatch, pytest_bench
from suite.scenario import Measured, Scenario, Target

ALLOC, OUT = "alloc 1 GiB add", "out= 1 GiB add"
OUT_TABLE: dispatch.Table = {  # bench_alloc_out.py's cases, in dispatch_report.TARGETS's shape
    (OUT, "run(out=) torch"): ("torch.add(out=)", 0.97, "ratio"),
    (OUT, "torch op .out"): ("torch.add(out=)", 0.97, "ratio"),
}


def measure(quick: bool) -> Measured:
    files = ["bench_dispatch.py", "bench_alloc_out.py"]
    doc, cmd = pytest_bench.run(files, "alloc_1gib or out_1gib", {}, timeout_s=300)
    return dispatch.measured(doc, cmd, (ALLOC, OUT), OUT_TABLE)


SCENARIO = Scenario(
    name="alloc-vs-out",
    what="1 GiB float32 add, allocating its result and into out=, cuplug beside PyTorch (host wall, synchronized)",
    group="throughput (x the anchor)",
    runs_on="gpu",
    needs=("gpu", "torch", "pytest-benchmark"),
    anchors={
        "torch.add": "PyTorch's allocating add of the same tensors",
        "torch.add(out=)": "PyTorch's add into the same out= tensor",
    },
    targets=(
        *dispatch.targets((ALLOC, OUT), OUT_TABLE, source="issue 30 (out=: the add bandwidth target of ABI v2)"),
        Target(
            "what allocating costs cuplug (allocating / out=)",
            f"{ALLOC}: run torch",
            f"{OUT}: run(out=) torch",
            "ratio",
            "x",
            None,
            "reported, no target",
        ),
        Target(
            "what allocating costs PyTorch (allocating / out=)",
            f"{ALLOC}: torch.add",
            f"{OUT}: torch.add(out=)",
            "ratio",
            "x",
            None,
            "reported, no target",
        ),
    ),
    measure=measure,
    timeout_s=300,
)
