"""What the numerical self-test (issue 33, part 2) adds to load(): fresh processes, interleaved by mode, on an
idle device (this parent never touches CUDA).

    python bench/selftest_cost.py [ROUNDS] > selftest-cost.json

Modes: CUPLUG_SELFTEST=0 (no self-test), =always (the samples run on every load), =1 (the default: run once, then
remembered per device UUID, driver, artifact sha256 and cuplug version; its rounds after the first are the cached
case). Each process reports load()'s wall time and the self-test's own time from the trace (loading the CPU twin
included: `twin_ms`), then calls each op's sample twice (its first call against its second: where the time goes).
The JSON gives, per mode, the median and the spread (IQR, min-max) of each, the difference of the medians against
CUPLUG_SELFTEST=0, and `load_and_first_use_ms`: load() plus the first call of every op, what a user's first step
pays. The self-test makes the ops' first launches (lazy module loading), which a user would otherwise make at the
first calls, so that difference is what the self-test adds net. A process served by the CPU (no ops timed) is left
out of the per-op medians.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile

from suite import stats  # bench/suite: the one summary shape (median, IQR, min-max) of every measurement

CHILD = r"""
import json, os, time
t0 = time.perf_counter()
import cuplug
b = cuplug.load()
ms = (time.perf_counter() - t0) * 1e3
st = [r.as_json() for r in b.trace.selftests]
ops = {}
if b.cuda:  # each op's sample called twice after load(): its first call (lazy module loading + the host path,
    from cuplug.runtime import samples  # unless the self-test already paid them) against its second
    for sig in b.ops.values():
        times = []
        for _ in range(2):
            t0 = time.perf_counter()
            samples.run_sample(b, sig)
            times.append((time.perf_counter() - t0) * 1e3)
        ops[sig.name] = times
print(json.dumps({"load_ms": ms, "variant": f"{b.cuda}/{b.variant}", "selftest_ms": sum(r["ms"] for r in st),
                  "twin_ms": sum(r.get("twin_ms", 0) for r in st),
                  "selftests": st, "ops_first_second_ms": ops,
                  "load_and_first_use_ms": ms + sum(t[0] for t in ops.values())}))
"""
MODES = ("0", "always", "1")


def _op_medians(per_process: list[dict[str, list[float]]]) -> dict[str, list[float]]:
    """op -> the median of each of its two figures ([first call, second call], or the self-test's [twin, candidate])
    over the processes that timed it."""
    ops = {op for timed in per_process for op in timed}
    return {
        op: [round(statistics.median(t[op][k] for t in per_process if op in t), 3) for k in (0, 1)]
        for op in sorted(ops)
    }


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 15
    runs: dict[str, list[dict]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory() as cache:  # the default mode's cache starts empty: its first round pays
        for _ in range(rounds):
            for mode in MODES:
                env = {**os.environ, "CUPLUG_SELFTEST": mode, "CUPLUG_CACHE_DIR": cache}
                out = subprocess.run(
                    [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=False
                )
                if out.returncode != 0:
                    print(json.dumps({"error": out.stderr[-2000:], "mode": mode}))
                    return 1
                runs[mode].append(json.loads(out.stdout.strip().splitlines()[-1]))

    def summary(rows: list[dict], key: str) -> dict:
        return stats.summary((r[key] for r in rows), "ms")

    def minus_0(rows: list[dict], key: str) -> float:  # the median's difference against CUPLUG_SELFTEST=0's
        return round(statistics.median(r[key] for r in rows) - statistics.median(r[key] for r in runs["0"]), 3)

    doc = {
        "command": f"python bench/selftest_cost.py {rounds}",
        "rounds": rounds,
        "variant": runs["always"][0]["variant"],
        "modes": {
            m: {
                "load_ms": summary(rows, "load_ms"),
                "selftest_ms": summary(rows, "selftest_ms"),  # its whole time, loading the CPU twin included
                "twin_ms": summary(rows, "twin_ms"),
                "load_ms_minus_selftest_0": minus_0(rows, "load_ms"),
                "load_and_first_use_ms": summary(rows, "load_and_first_use_ms"),
                "load_and_first_use_ms_minus_selftest_0": minus_0(rows, "load_and_first_use_ms"),
            }
            for m, rows in runs.items()
        },
        "first_default_round": runs["1"][0]["selftests"],
        # CUPLUG_SELFTEST=always's processes: each op's sample inside the self-test, the medians (twin, candidate)
        "always_ops_ms": _op_medians([(r["selftests"] or [{}])[0].get("ops_ms", {}) for r in runs["always"]]),
        # each mode's processes, after load(): each op's sample called twice, the medians (first, second)
        "ops_first_second_ms": {m: _op_medians([r["ops_first_second_ms"] for r in rows]) for m, rows in runs.items()},
    }
    print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
