"""GPU benchmarks, side by side in one run; writes JSON (median of repeats) to argv[1].

Superseded for issue 22 by bench/perf22.py (nox -s bench, bench/bench_h200.sh); kept for the
2026-12-02/03 results it produced.

Run on the GPU machine from the installed wheels:  python bench/gpu_bench.py results.json
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

REPEATS = 7


def median_ms(fn, sync, repeats=REPEATS):
    fn()
    sync()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def cold_start(code, env=None):
    out = []
    for _ in range(5):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, **(env or {})})
        out.append((time.perf_counter() - t) * 1e3)
    return statistics.median(out)


HERE = os.path.dirname(os.path.abspath(__file__))


def breakdown(env=None, runs=5):
    """Median per step of bench/cold_start.py over `runs` fresh processes."""
    rows = []
    for _ in range(runs):
        t = time.perf_counter()
        out = subprocess.run(
            [sys.executable, os.path.join(HERE, "cold_start.py")],
            check=True,
            capture_output=True,
            text=True,
            env={**os.environ, **(env or {})},
        ).stdout
        row = json.loads(out.strip().splitlines()[-1])
        row["process_total"] = (time.perf_counter() - t) * 1e3
        rows.append(row)
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0] if isinstance(rows[0][k], (int, float))}
    med["variant"] = rows[0]["variant"]
    return med


def main() -> None:
    import torch

    import cuplug

    res: dict = {"device": torch.cuda.get_device_name(0), "repeats": REPEATS}
    n = 1 << 28  # 1 GiB of float32 per array
    gb = lambda nbytes, ms: nbytes / ms / 1e6  # noqa: E731
    x = np.random.default_rng(0).standard_normal(n, dtype=np.float32)
    tx, ty = torch.from_numpy(x).cuda(), torch.from_numpy(x).cuda()
    tout = torch.empty_like(tx)
    tsync = torch.cuda.synchronize
    res["torch_add_GBs"] = gb(3 * 4 * n, median_ms(lambda: torch.add(tx, ty, out=tout), tsync))
    res["d2d_copy_GBs"] = gb(2 * 4 * n, median_ms(lambda: tout.copy_(tx), tsync))
    pinned = torch.empty(n, dtype=torch.float32, pin_memory=True)
    res["pinned_h2d_d2h_GBs"] = gb(2 * 4 * n, median_ms(lambda: (tout.copy_(pinned), pinned.copy_(tout)), tsync))
    tx = ty = tout = None  # free the device arrays before cuplug's
    torch.cuda.empty_cache()
    for variant in ("cuda13:fatbin", "cuda12:fatbin"):
        os.environ["CUPLUG_BACKEND"] = variant
        with cuplug.load() as b:
            bx, by, bo = b.buffer(x), b.buffer(x), b.empty(n)
            lib, h = b._lib, b._handle
            res[f"{variant}_add_GBs"] = gb(
                3 * 4 * n, median_ms(lambda: lib.run_resident(h, b"add", bx.id, by.id, bo.id, 1.0, 0.0, n), b.sync)
            )
            res[f"{variant}_scale_add_GBs"] = gb(
                2 * 4 * n, median_ms(lambda: lib.run_resident(h, b"scale_add", bx.id, 0, bo.id, 2.0, 1.0, n), b.sync)
            )
            for buf in (bx, by, bo):
                buf.free()
            out = np.empty_like(x)
            res[f"{variant}_host_add_GBs"] = gb(
                3 * 4 * n, median_ms(lambda: b.run("add", x, x, out=out), lambda: None, 3)
            )
    # The host path with one staging thread (the old design), same run, same arrays.
    os.environ.update(CUPLUG_BACKEND="cuda13:fatbin", CUPLUG_STAGING_THREADS="1")
    with cuplug.load() as b:
        out = np.empty_like(x)
        res["cuda13:fatbin_host_add_1thread_GBs"] = gb(
            3 * 4 * n, median_ms(lambda: b.run("add", x, x, out=out), lambda: None, 3)
        )
    os.environ.pop("CUPLUG_STAGING_THREADS")
    tdev = torch.empty(n, dtype=torch.float32, device="cuda")
    host = torch.from_numpy(x)
    res["torch_pageable_h2d_d2h_GBs"] = gb(2 * 4 * n, median_ms(lambda: (tdev.copy_(host), host.copy_(tdev)), tsync, 3))
    tdev = None
    os.environ.pop("CUPLUG_BACKEND")
    add = "import numpy as np, {m}; x=np.ones(1<<20,dtype=np.float32); {body}"
    res["cold_cuplug_ms"] = cold_start(
        add.format(m="cuplug", body="b=cuplug.load(); r=b.run('add',x,x); assert r[5]==2")
    )
    res["cold_torch_ms"] = cold_start(
        add.format(m="torch", body="t=torch.from_numpy(x).cuda(); r=torch.add(t,t).cpu(); assert r[5]==2")
    )
    res["cold_cupy_ms"] = cold_start(
        add.format(m="cupy", body="t=cupy.asarray(x); r=cupy.asnumpy(t+t); assert r[5]==2")
    )
    for variant, env in (
        ("ptx_nocache", {"CUPLUG_BACKEND": "cuda13:ptx", "CUDA_CACHE_DISABLE": "1"}),
        ("ptx_warm_cache", {"CUPLUG_BACKEND": "cuda13:ptx"}),
        ("fatbin", {"CUPLUG_BACKEND": "cuda13:fatbin"}),
    ):
        res[f"cold_{variant}_ms"] = cold_start(
            add.format(m="cuplug", body="b=cuplug.load(); r=b.run('add',x,x); assert r[5]==2"), env
        )
    # Where a cold start goes (fresh processes, one step at a time), and the JIT's share.
    res["breakdown_auto"] = breakdown()
    res["breakdown_fatbin"] = breakdown({"CUPLUG_BACKEND": "cuda13:fatbin"})
    res["breakdown_ptx_nocache"] = breakdown({"CUPLUG_BACKEND": "cuda13:ptx", "CUDA_CACHE_DISABLE": "1"})
    import tempfile

    with tempfile.TemporaryDirectory() as cache:
        jit = {"CUDA_CACHE_PATH": cache}
        subprocess.run([sys.executable, "-m", "cuplug", "warmup"], check=True, env={**os.environ, **jit})
        res["breakdown_ptx_after_warmup"] = breakdown({"CUPLUG_BACKEND": "cuda13:ptx", **jit})
    res["breakdown_cuda12_ptx_nocache"] = breakdown({"CUPLUG_BACKEND": "cuda12:ptx", "CUDA_CACHE_DISABLE": "1"})
    t = time.perf_counter()
    import importlib

    importlib.reload(cuplug)
    res["import_ms_reload"] = (time.perf_counter() - t) * 1e3
    t = time.perf_counter()
    cuplug.explain()
    res["decide_ms"] = (time.perf_counter() - t) * 1e3
    json.dump(res, open(sys.argv[1], "w"), indent=2)
    for k, v in res.items():
        print(f"{k:32} {v if isinstance(v, (str, dict)) else round(v, 2)}")


if __name__ == "__main__":
    main()
