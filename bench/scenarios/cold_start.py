"""Cold start (issue 22): a fresh process to a verified add, against the context floor, interleaved.

Each case is a fresh `python -c` (or bench/cold_start.py, the step-by-step breakdown), timed from its spawn to
its exit by this process, which imports nothing of CUDA (no process holds a context: `idle_device` in the
details); the cases run round by round, rotated each round, and their medians are compared. The floor is the
least any CUDA program pays: dlopen libcuda, cuInit, retain and set the primary context. Target:
cuplug_array (array.array operands) <= 1.10x the floor. docs/performance.md, "Cold start", explains the rest.
"""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from suite import machine
from suite.scenario import Measured, Scenario, Skip, Target
from suite.stats import summary

BREAKDOWN = Path(__file__).resolve().parents[1] / "cold_start.py"
ROUNDS = {False: 7, True: 3}
CASE_TIMEOUT_S = 60
FLOOR = """
import time, json, os
t0 = time.monotonic()
import ctypes
t1 = time.monotonic()
c = ctypes.CDLL("libcuda.so.1")
assert c.cuInit(0) == 0
t2 = time.monotonic()
d = ctypes.c_int()
assert c.cuDeviceGet(ctypes.byref(d), 0) == 0
ctx = ctypes.c_void_p()
assert c.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), d) == 0
assert c.cuCtxSetCurrent(ctx) == 0
t3 = time.monotonic()
print(json.dumps({"interpreter": (t0 - float(os.environ["CUPLUG_BENCH_T0"])) * 1e3, "import_ctypes": (t1 - t0) * 1e3,
                  "cuinit": (t2 - t1) * 1e3, "context": (t3 - t2) * 1e3, "total": (t3 - t0) * 1e3, "t_end": t3}))
"""
CHECK = "assert r[5] == 2.0 and r[(1 << 20) - 1] == 2.0"
LOADED = "b = cuplug.load(); assert b.cuda, b.trace.decision_reason"
# case -> (argv after the interpreter, the module it needs beyond cuplug, what it is)
CASES: dict[str, tuple[list[str], str | None, str]] = {
    "python": (["-c", "pass"], None, "`python -c pass`: the interpreter alone"),
    "floor": (["-c", FLOOR], None, "the context floor (the anchor)"),
    "cuplug_array": (
        ["-c", f"import array, cuplug; {LOADED}; x = array.array('f', [1.0]) * (1 << 20); r = b.run('add', x, x); {CHECK}"],
        None,
        "import cuplug, load(), run('add') of two 2^20-element array.array, checked (the target)",
    ),
    "cuplug_load": (["-c", f"import cuplug; {LOADED}"], None, "cuplug.load() only"),
    "breakdown": ([str(BREAKDOWN), "array"], None, "bench/cold_start.py: cuplug_array's path, each step timed inside"),
    "cuplug_numpy": (
        ["-c", f"import numpy as np, cuplug; {LOADED}; x = np.ones(1 << 20, dtype=np.float32); r = b.run('add', x, x); {CHECK}"],
        "numpy",
        "the same add with NumPy operands (NumPy's import included)",
    ),
    "numpy": (["-c", "import numpy"], "numpy", "`import numpy` alone"),
    "cupy": (
        ["-c", f"import numpy as np, cupy; x = np.ones(1 << 20, dtype=np.float32); t = cupy.asarray(x); r = cupy.asnumpy(t + t); {CHECK}"],
        "cupy",
        "the same add through CuPy from a NumPy array",
    ),
    "torch": (
        ["-c", f"import numpy as np, torch; x = np.ones(1 << 20, dtype=np.float32); t = torch.from_numpy(x).cuda(); r = torch.add(t, t).cpu(); {CHECK}"],
        "torch",
        "the same add through PyTorch from a NumPy array",
    ),
}  # fmt: skip
QUICK_CASES = ("python", "floor", "cuplug_array", "breakdown")


def _once(case: str) -> tuple[float | None, dict[str, Any] | None, str | None]:
    """(wall ms, the process's own JSON line if it printed one, the failure) of one fresh process."""
    t0 = time.monotonic()
    env = dict(os.environ, CUPLUG_BENCH_T0=repr(t0))
    try:
        p = subprocess.run(
            [sys.executable, *CASES[case][0]], capture_output=True, text=True, env=env, timeout=CASE_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        return None, None, f"timed out after {CASE_TIMEOUT_S} s"
    t1 = time.monotonic()
    if p.returncode != 0:
        return None, None, f"rc {p.returncode}: {p.stderr[-1500:]}"
    lines = p.stdout.strip().splitlines()
    row = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else None
    if row is not None:
        row["exit"] = (t1 - row.pop("t_end")) * 1e3  # the script's last line to the parent seeing it end
    return (t1 - t0) * 1e3, row, None


def _steps(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of each numeric step over the processes that printed their steps."""
    keys = [k for k in rows[0] if isinstance(rows[0][k], (int, float))]
    med: dict[str, Any] = {k: round(statistics.median(r.get(k, 0.0) for r in rows), 3) for k in keys}
    med["variant"], med["staging"] = rows[0].get("variant"), rows[0].get("staging")
    return med


def measure(quick: bool) -> Measured:
    cases = [
        c for c in (QUICK_CASES if quick else CASES) if CASES[c][1] is None or importlib.util.find_spec(CASES[c][1])
    ]
    gpu = machine.gpu()
    if gpu is None:
        raise Skip("nvidia-smi answers nothing here: no GPU to start")
    walls: dict[str, list[float]] = {c: [] for c in cases}
    inner: dict[str, list[dict[str, Any]]] = {c: [] for c in cases}
    failures: dict[str, str] = {}
    for r in range(ROUNDS[quick]):
        for case in cases[r % len(cases) :] + cases[: r % len(cases)]:  # rotated: no case always first
            wall, row, failed = _once(case)
            if failed:
                failures[case] = failed
                continue
            walls[case].append(wall)
            if row is not None:
                inner[case].append(row)
    if not walls["floor"]:
        raise RuntimeError(f"the floor process failed in every round: {failures.get('floor')}")
    floor = walls["floor"]
    per_round = {
        c: summary([a / f for a, f in zip(v, floor, strict=True)], "x")
        for c, v in walls.items()
        if v and len(v) == len(floor) and c != "floor"
    }
    anchors = {"floor": {**summary(floor, "ms"), "what": CASES["floor"][2]}}
    results = {c: {**summary(v, "ms"), "what": CASES[c][2]} for c, v in walls.items() if v and c != "floor"}
    details = {
        "rounds": ROUNDS[quick],
        "idle_device": not gpu["processes"],
        "gpu_processes_before": gpu["processes"],
        "ratio_to_floor_per_round": per_round,
        "steps_ms": {c: _steps(rows) for c, rows in inner.items() if rows},
        "failures": failures,
    }
    return Measured(anchors, results, details)


SCENARIO = Scenario(
    name="cold-start",
    what="a fresh process to a verified add, against the context floor (fresh processes, interleaved, ms)",
    group="cold start (x the context floor)",
    runs_on="gpu",
    needs=("gpu",),
    anchors={"floor": "a fresh process that dlopens libcuda, cuInit, retains and sets the primary context (ctypes)"},
    targets=(
        Target("cuplug_array", "cuplug_array", "floor", "ratio", "x", ("<=", 1.10), "issue 22"),
        *(
            Target(c, c, "floor", "ratio", "x", None, "reported, no target")
            for c in ("cuplug_load", "breakdown", "cuplug_numpy", "cupy", "torch", "python")
        ),
    ),
    measure=measure,
    timeout_s=420,
)
