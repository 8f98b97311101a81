"""CUDA graphs (issue 30): allocating calls captured in a graph and replayed, per call, beside torch.add's.

The harness is bench/bench_dispatch.py's `graph_replay` cases (pytest-benchmark; each round replays 100
captured calls and synchronizes; the case checks the replayed result first).
"""

from __future__ import annotations

from suite import dispatch, pytest_bench
from suite.scenario import Measured, Scenario

GROUPS = ("graph replay (100 calls)",)


def measure(quick: bool) -> Measured:
    doc, cmd = pytest_bench.run(["bench_dispatch.py"], "graph_replay", {}, timeout_s=300)
    return dispatch.measured(doc, cmd, GROUPS)


SCENARIO = Scenario(
    name="graphs",
    what="one replay of 100 captured allocating adds (1024 float32), per call, beside torch.add captured alike",
    group="graphs and torch.compile (x the anchor)",
    runs_on="gpu",
    needs=("gpu", "torch", "pytest-benchmark"),
    anchors={"torch.add": "the same 100 allocating torch.add calls captured and replayed"},
    targets=dispatch.targets(GROUPS),  # dispatch_report.TARGETS's rows (reported ratios)
    measure=measure,
    timeout_s=300,
)
