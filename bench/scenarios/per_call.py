"""Per-call overhead (issue 30): one call on 1-element operands through every call path, beside its anchor.

The harness is bench/bench_dispatch.py (pytest-benchmark; its `per_call` cases), the targets and ratios are
bench/dispatch_report.py's. Where a GPU is: PyTorch (and CuPy) CUDA tensors, host wall time per call with a
synchronize between rounds; without one: the CPU twin's host paths beside np.add(out=).
"""

from __future__ import annotations

import importlib.util

from suite import dispatch, pytest_bench
from suite.scenario import Measured, Scenario

ROUNDS = {False: "2000", True: "200"}  # pytest-benchmark rounds per case: the measurement, --quick
GROUPS = ("per-call host", "per-call cuda")


def measure(quick: bool) -> Measured:
    env = {"BENCH_ROUNDS": ROUNDS[quick]}
    if importlib.util.find_spec("torch") is None:  # bench_dispatch.py's host cases need NumPy alone
        env["BENCH_NO_TORCH"] = "1"
    doc, cmd = pytest_bench.run(["bench_dispatch.py"], "per_call", env, timeout_s=600)
    return dispatch.measured(doc, cmd, GROUPS)


SCENARIO = Scenario(
    name="per-call",
    what="host time of one call on 1-element operands, every call path beside its anchor (pytest-benchmark)",
    group="per call (us, 1-element operands)",
    runs_on="both",
    needs=("pytest-benchmark", "numpy"),
    anchors={
        "np.add(out=)": "NumPy's own add into an out= array (the CPU twin's host paths)",
        "torch.add(out=), torch.add": "PyTorch's add on 1-element CUDA tensors, into out= / allocating",
        "cupy.add": "CuPy's add into out= (where CuPy is)",
    },
    targets=dispatch.targets(GROUPS),  # dispatch_report.TARGETS's rows
    measure=measure,
    timeout_s=400,
)
