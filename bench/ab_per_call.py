"""The CPU machine's A/B of the dispatcher's per-call cost (issue 30): one call on 1-element operands through the
CPU twin, median of 9 loops of 20,000 calls, beside np.add / torch.add in the same process. Run it once per build
to compare (the wheel installed in the interpreter that runs it); each process prints one JSON line.

    python bench/ab_per_call.py [--label NAME] >> results.jsonl
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import numpy as np
import torch

import cuplug

CALLS, LOOPS = 20000, 9


def per_call_us(fn) -> float:
    loops = []
    for _ in range(LOOPS):
        t0 = time.perf_counter()
        for _ in range(CALLS):
            fn()
        loops.append((time.perf_counter() - t0) / CALLS * 1e6)
    return round(statistics.median(loops), 3)


def main() -> int:
    label = sys.argv[sys.argv.index("--label") + 1] if "--label" in sys.argv else ""
    b = cuplug.load(env={"CUPLUG_BACKEND": "cpu"})
    x, y, o = (torch.ones(1) for _ in range(3))
    a, c, d = (np.ones(1, np.float32) for _ in range(3))
    for _ in range(3):  # the whole path teaches each call to the dispatcher
        b.run("add", x, y, out=o), b.run("add", x, y), b.run("add", a, c, out=d)
    rows = {
        "run(out=) numpy": per_call_us(lambda: b.run("add", a, c, out=d)),
        "np.add(out=)": per_call_us(lambda: np.add(a, c, out=d)),
        "run(out=) torch cpu": per_call_us(lambda: b.run("add", x, y, out=o)),
        "torch.add(out=) cpu": per_call_us(lambda: torch.add(x, y, out=o)),
        "run torch cpu (allocating)": per_call_us(lambda: b.run("add", x, y)),
        "torch.add cpu": per_call_us(lambda: torch.add(x, y)),
    }
    doc = {"label": label, "command": "python bench/ab_per_call.py", "median_of": LOOPS, "calls": CALLS, "us": rows}
    print(json.dumps({**doc, "fast_calls": b.run.stats()["fast_calls"]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
