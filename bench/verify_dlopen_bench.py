"""What issue 18's verified mapping costs: verify + dlopen of one ~1 MB artifact, before and after.

    python bench/verify_dlopen_bench.py OUT.json [BACKEND_SITE]

``before``: the loader as it was (sha256 of the file by path, then dlopen of the path:
two opens, a window between them). ``after``: ``cuplug.runtime.verify.verified`` (one open, the
bytes copied into a memfd while hashed, sealed) and dlopen of ``/proc/self/fd/N``. Each
measurement is a fresh process (the dynamic linker would hand back a library it already
has), alternating before/after so both see the same page cache; medians of RUNS.
BACKEND_SITE is a directory with the backend wheels installed (``pip install --target``);
without it the installed cuplug-cuda13 is used.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys

RUNS = int(os.environ.get("CUPLUG_BENCH_RUNS", "21"))
ONE = r"""
import ctypes, hashlib, json, os, sys, time
from pathlib import Path
import cuplug.runtime.discovery as d, cuplug.runtime.verify as v
pkg = next(p for p in d.discover().packages if p.cuda == "cuda13" and p.artifacts)
art = next(a for a in pkg.artifacts if a.variant == "fatbin")
mode = sys.argv[1]
t0 = time.perf_counter()
if mode == "before":
    path = Path(v.resolve_inside(art.package_dir, art.file))
    assert hashlib.sha256(path.read_bytes()).hexdigest() == art.sha256
    t1 = time.perf_counter()
    ctypes.CDLL(str(path), mode=os.RTLD_NOW | os.RTLD_LOCAL)
else:
    image = v.verified(art)
    t1 = time.perf_counter()
    ctypes.CDLL(str(image.load_path), mode=os.RTLD_NOW | os.RTLD_LOCAL)
t2 = time.perf_counter()
print(json.dumps({"verify": (t1 - t0) * 1e3, "dlopen": (t2 - t1) * 1e3, "size": art.size, "label": f"{pkg.cuda}/{art.variant}"}))
"""


def main(out: str, site: str | None) -> None:
    env = dict(os.environ)
    if site:
        env["PYTHONPATH"] = site + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    rows: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    for _ in range(RUNS):
        for mode in ("before", "after"):
            proc = subprocess.run(
                [sys.executable, "-c", ONE, mode], env=env, capture_output=True, text=True, check=True
            )
            rows[mode].append(json.loads(proc.stdout))
    med = {
        mode: {k: round(statistics.median(r[k] for r in rs), 3) for k in ("verify", "dlopen")}
        for mode, rs in rows.items()
    }
    for mode in med:
        med[mode]["total"] = round(med[mode]["verify"] + med[mode]["dlopen"], 3)
    result = {
        "runs": RUNS,
        "median_ms": med,
        "added_ms": round(med["after"]["total"] - med["before"]["total"], 3),
        "artifact": rows["after"][0]["label"],
        "artifact_bytes": rows["after"][0]["size"],
        "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "command": " ".join(["python", "bench/verify_dlopen_bench.py", out, *([site] if site else [])]),
    }
    with open(out, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
