"""The decision benchmark (bench/decision_bench.py's process) for two cuplug trees, interleaved.

    python bench/decision_ab.py OUT.json BEFORE_SITE AFTER_SITE BACKEND_SITE FAKE_DRIVER_DIR

BEFORE_SITE and AFTER_SITE each hold an installed ``cuplug`` (package + dist-info); BACKEND_SITE
the backend wheels (``pip install --target``). Each run starts one fresh process per tree, in
alternating order, so a machine shared with other work loads both alike; medians of RUNS.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from decision_bench import ONE, STDLIB_FIRST

RUNS = int(os.environ.get("CUPLUG_BENCH_RUNS", "31"))
STEPS = ("import", "probe", "select", "verify", "explain_again")


def main(out: str, before: str, after: str, backends: str, fake: str) -> None:
    rows: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    trees = [("before", before), ("after", after)]
    for i in range(RUNS):
        for label, site in trees if i % 2 == 0 else reversed(trees):
            env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{backends}", "LD_LIBRARY_PATH": fake}
            row = json.loads(
                subprocess.run([sys.executable, "-c", ONE], env=env, capture_output=True, text=True, check=True).stdout
            )
            warm = subprocess.run(
                [sys.executable, "-c", STDLIB_FIRST + ONE], env=env, capture_output=True, text=True, check=True
            )
            row["import_after_stdlib"] = json.loads(warm.stdout)["import"]
            rows[label].append(row)
    result: dict[str, object] = {"runs": RUNS}
    for label, rs in rows.items():
        med = {k: round(statistics.median(r[k] for r in rs), 3) for k in (*STEPS, "import_after_stdlib")}
        med["decision_total"] = round(sum(med[k] for k in ("import", "probe", "select", "verify")), 3)
        med["decision_after_stdlib"] = round(
            sum(med[k] for k in ("import_after_stdlib", "probe", "select", "verify")), 3
        )
        result[label] = med
    result["chosen"] = rows["after"][0]["chosen"]
    result["machine"] = (
        f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    )
    result["load_average_at_end"] = os.getloadavg()
    with open(out, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main(*sys.argv[1:6])
