"""What the decision costs before any context exists: import, probe, select, verify (issue 5).

    python bench/decision_bench.py OUT.json [FAKE_DRIVER_DIR]

Each figure is the median over fresh processes (default 15). With FAKE_DRIVER_DIR the
probe opens the test suite's fake libcuda.so.1 (CC 9.0, driver 13.0), so the whole
path runs on a machine without a GPU; on a GPU machine leave it out to time the real
driver (its cuInit is then most of `probe`). Target: import + probe + select + verify
well under 20 ms.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time

RUNS = int(os.environ.get("CUPLUG_BENCH_RUNS", "15"))
# What an application has usually imported before cuplug (NumPy alone pulls in all of these):
# timing `import cuplug` after them gives cuplug's own share.
STDLIB_FIRST = "import typing, dataclasses, logging, pathlib, re, hashlib, ctypes, json, weakref, threading\n"
ONE = r"""
import json, time
t0 = time.perf_counter()
import cuplug
from cuplug import driver, loading, verify
t1 = time.perf_counter()
facts = driver.probe()
t2 = time.perf_counter()
real, loading.driver.probe = loading.driver.probe, lambda: facts
trace = loading.decide()
t3 = time.perf_counter()
chosen = next(c for c in trace.candidates if c.accepted and c.artifact is not None)
verify.verify(chosen.artifact)
t4 = time.perf_counter()
loading.driver.probe = real
t5 = time.perf_counter()
cuplug.explain()
t6 = time.perf_counter()
ms = lambda a, b: round((b - a) * 1e3, 3)
print(json.dumps({"import": ms(t0, t1), "probe": ms(t1, t2), "select": ms(t2, t3), "verify": ms(t3, t4),
                  "explain_again": ms(t5, t6), "chosen": chosen.label, "size": chosen.artifact.size}))
"""


def main(out: str, fake_dir: str | None) -> None:
    env = dict(os.environ)
    if fake_dir:
        env["LD_LIBRARY_PATH"] = fake_dir
    rows = []
    for _ in range(RUNS):
        t = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", ONE], env=env, capture_output=True, text=True, check=True)
        row = json.loads(proc.stdout)
        row["process"] = round((time.perf_counter() - t) * 1e3, 1)
        warm = subprocess.run(
            [sys.executable, "-c", STDLIB_FIRST + ONE], env=env, capture_output=True, text=True, check=True
        )
        row["import_after_stdlib"] = json.loads(warm.stdout)["import"]
        rows.append(row)
    steps = ("import", "import_after_stdlib", "probe", "select", "verify", "explain_again", "process")
    med = {k: statistics.median(r[k] for r in rows) for k in steps}
    med["decision_total"] = round(med["import"] + med["probe"] + med["select"] + med["verify"], 3)
    result = {
        "runs": RUNS,
        "median_ms": med,
        "chosen": rows[0]["chosen"],
        "chosen_bytes": rows[0]["size"],
        "driver": "fake libcuda.so.1 (tests/fake_cuda)" if fake_dir else "system libcuda.so.1",
        "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "command": " ".join(["python", "bench/decision_bench.py", out, *([fake_dir] if fake_dir else [])]),
    }
    with open(out, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    for k, v in med.items():
        print(f"{k:16} {v:8.2f} ms")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
