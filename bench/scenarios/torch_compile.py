"""torch.compile (issue 30): a function of cuplug ops under torch.compile(fullgraph=True), against the same
function eager and against the same computation in plain PyTorch ops (eager and compiled).

The harness is bench/bench_compile.py (pytest-benchmark). Issue 30 sets no target here: every ratio is
reported (anchor time / this time: above 1 is faster than the anchor).
"""

from __future__ import annotations

import tempfile

from suite import pytest_bench
from suite.scenario import Measured, Scenario, Target

ROUNDS = {False: "1000", True: "100"}  # per case: the measurement, --quick
ANCHORS = ("compile: torch eager", "compile: torch compiled")
REPORTED = "reported, no target (issue 30 sets none)"


def measure(quick: bool) -> Measured:
    env = {"BENCH_ROUNDS": ROUNDS[quick]}
    with tempfile.TemporaryDirectory(prefix="cuplug-inductor-") as cache:
        if not quick:  # a cold compile in every run (comparable first calls); --quick keeps the user's cache
            env["TORCHINDUCTOR_CACHE_DIR"] = cache
        doc, cmd = pytest_bench.run(["bench_compile.py"], "test_compile", env, 900)
    cases = pytest_bench.summaries(doc)
    anchors = {k: v for k, v in cases.items() if k in ANCHORS}
    results = {k: v for k, v in cases.items() if k not in ANCHORS}
    first_call_s = {
        k: v["extra_info"]["first_call_s"] for k, v in cases.items() if "first_call_s" in v.get("extra_info", {})
    }
    details = {
        **pytest_bench.harness(doc, cmd),
        "first_call_s (the compilation)": first_call_s,
        "inductor_cache": "the user's (may be warm)" if quick else "a fresh one (a cold compile)",
    }
    return Measured(anchors, results, details)


SCENARIO = Scenario(
    name="compile",
    what="f = sum(scale_add(add(a, c))) of cuplug ops, torch.compile(fullgraph=True) vs eager vs plain torch ops",
    group="graphs and torch.compile (x the anchor)",
    runs_on="both",
    needs=("torch", "pytest-benchmark"),
    anchors={
        "torch eager": "the same computation in PyTorch ops, eager",
        "torch compiled": "the same in PyTorch ops under torch.compile(fullgraph=True) (inductor fuses it)",
    },
    targets=(
        Target(
            "cuplug compiled vs cuplug eager",
            "compile: cuplug compiled",
            "compile: cuplug eager",
            "speedup",
            "x",
            None,
            REPORTED,
        ),
        Target(
            "cuplug eager vs torch eager",
            "compile: cuplug eager",
            "compile: torch eager",
            "speedup",
            "x",
            None,
            REPORTED,
        ),
        Target(
            "cuplug compiled vs torch compiled",
            "compile: cuplug compiled",
            "compile: torch compiled",
            "speedup",
            "x",
            None,
            REPORTED,
        ),
    ),
    measure=measure,
    timeout_s=900,
)
