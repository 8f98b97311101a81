"""An LTO variant against SASS and PTX on one GPU (issue 33 part 3, docs/lto.md): what load() costs in fresh
processes, interleaved, on an idle device (this parent never touches CUDA), and how fast the kernels then run.

    python bench/lto_cost.py [ROUNDS] > lto-cost.json

Each variant is forced (CUPLUG_BACKEND=cuda13:<variant>, CUPLUG_SELFTEST=0: the link or JIT alone):
  sass        cuda13/sm90 (exact SASS: nothing compiled at load)
  ptx-cold    cuda13/ptx with the driver's JIT cache off (CUDA_CACHE_DISABLE=1): every load JIT-compiles
  ptx-cached  cuda13/ptx with one JIT cache directory for every round (its first round pays)
  lto-cold    cuda13/lto with an empty cuplug cache each round: every load links with nvJitLink
  lto-cached  cuda13/lto with one cuplug cache for every round (its first round pays)
Speed: 1 GiB float32 ``add`` (out=) and ``sum`` on PyTorch CUDA tensors per variant, timed with CUDA events
(median of 7 repetitions of 10 calls), beside ``torch.add``/``torch.sum`` in the same process.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile

from suite import stats  # bench/suite: the one summary shape (median, IQR, min-max) of every measurement

LOAD = r"""
import json, time
t0 = time.perf_counter()
import cuplug
b = cuplug.load()
ms = (time.perf_counter() - t0) * 1e3
a = b.trace.attempts[-1]
print(json.dumps({"load_ms": ms, "variant": f"{b.cuda}/{b.variant}", "attempt": a.reason}))
"""
SPEED = r"""
import json, statistics, cuplug, torch
b = cuplug.load()
n = 1 << 28
x, y = torch.rand(n, device="cuda"), torch.rand(n, device="cuda")
out = torch.empty_like(x)

def timed(fn):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn(); torch.cuda.synchronize()
    reps = []
    for _ in range(7):
        start.record()
        for _ in range(10):
            fn()
        end.record(); end.synchronize()
        reps.append(start.elapsed_time(end) / 10)
    return {"ms": statistics.median(reps), "min": min(reps), "max": max(reps)}

rows = {"add": timed(lambda: b.run("add", x, y, out=out)), "torch.add": timed(lambda: torch.add(x, y, out=out)),
        "sum": timed(lambda: b.run("sum", x)), "torch.sum": timed(lambda: torch.sum(x))}
ref = torch.add(x, y); b.run("add", x, y, out=out)
print(json.dumps({"variant": f"{b.cuda}/{b.variant}", "exact": bool(torch.equal(out, ref)), **rows}))
"""
FORCED = {"sass": "sm90", "ptx-cold": "ptx", "ptx-cached": "ptx", "lto-cold": "lto", "lto-cached": "lto"}
LINKED_MS = re.compile(r"in (\d+) ms")


def _child(code: str, env: dict[str, str]) -> dict:
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(json.dumps({"error": out.stderr[-3000:], "env": {k: env[k] for k in env if "CU" in k}}))
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    base = {**os.environ, "CUPLUG_SELFTEST": "0"}
    runs: dict[str, list[dict]] = {m: [] for m in FORCED}
    with tempfile.TemporaryDirectory() as tmp:
        shared_jit, shared_lto = os.path.join(tmp, "jit"), os.path.join(tmp, "lto")
        for r in range(rounds):
            for mode, variant in FORCED.items():
                env = {**base, "CUPLUG_BACKEND": f"cuda13:{variant}", "CUPLUG_CACHE_DIR": os.path.join(tmp, f"c{r}")}
                if mode == "ptx-cold":
                    env["CUDA_CACHE_DISABLE"] = "1"
                if mode == "ptx-cached":
                    env["CUDA_CACHE_PATH"] = shared_jit
                if mode == "lto-cold":
                    env["CUPLUG_CACHE_DIR"] = os.path.join(tmp, f"lto{r}")
                if mode == "lto-cached":
                    env["CUPLUG_CACHE_DIR"] = shared_lto
                row = _child(LOAD, env)
                linked = LINKED_MS.search(row["attempt"])
                row["link_ms"] = float(linked[1]) if linked else 0.0
                runs[mode].append(row)
        speed = {
            variant: _child(SPEED, {**base, "CUPLUG_BACKEND": f"cuda13:{variant}", "CUPLUG_CACHE_DIR": shared_lto})
            for variant in ("sm90", "ptx", "lto")
        }

    def summary(rows: list[dict], key: str) -> dict:
        return stats.summary((r[key] for r in rows), "ms")

    doc = {
        "command": f"python bench/lto_cost.py {rounds}",
        "rounds": rounds,
        "load": {
            m: {
                "variant": rows[0]["variant"],
                "load_ms": summary(rows, "load_ms"),
                "link_ms": summary(rows, "link_ms"),
                "first_round": rows[0]["attempt"],
                "later_rounds": rows[-1]["attempt"],
            }
            for m, rows in runs.items()
        },
        "speed_ms_per_call": speed,
    }
    print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
