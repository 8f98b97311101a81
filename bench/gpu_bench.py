"""GPU benchmarks, side by side in one run; writes JSON (median of repeats) to argv[1].

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
    del tx, ty, tout
    torch.cuda.empty_cache()
    for variant in ("cuda13:fatbin", "cuda12:fatbin"):
        os.environ["CUPLUG_BACKEND"] = variant
        with cuplug.load() as b:
            bx, by, bo = b.buffer(x), b.buffer(x), b.empty(n)
            lib, h = b._lib, b._handle
            res[f"{variant}_add_GBs"] = gb(3 * 4 * n, median_ms(
                lambda: lib.run_resident(h, b"add", bx.id, by.id, bo.id, 1.0, 0.0, n), b.sync))
            res[f"{variant}_scale_add_GBs"] = gb(2 * 4 * n, median_ms(
                lambda: lib.run_resident(h, b"scale_add", bx.id, 0, bo.id, 2.0, 1.0, n), b.sync))
            for buf in (bx, by, bo):
                buf.free()
            out = np.empty_like(x)
            res[f"{variant}_host_add_GBs"] = gb(3 * 4 * n, median_ms(lambda: b.run("add", x, x, out=out), lambda: None, 3))
    os.environ.pop("CUPLUG_BACKEND")
    add = "import numpy as np, {m}; x=np.ones(1<<20,dtype=np.float32); {body}"
    res["cold_cuplug_ms"] = cold_start(add.format(m="cuplug", body="b=cuplug.load(); r=b.run('add',x,x); assert r[5]==2"))
    res["cold_torch_ms"] = cold_start(add.format(m="torch", body="t=torch.from_numpy(x).cuda(); r=torch.add(t,t).cpu(); assert r[5]==2"))
    res["cold_cupy_ms"] = cold_start(add.format(m="cupy", body="t=cupy.asarray(x); r=cupy.asnumpy(t+t); assert r[5]==2"))
    for variant, env in (("ptx_nocache", {"CUPLUG_BACKEND": "cuda13:ptx", "CUDA_CACHE_DISABLE": "1"}),
                         ("ptx_warm_cache", {"CUPLUG_BACKEND": "cuda13:ptx"}),
                         ("fatbin", {"CUPLUG_BACKEND": "cuda13:fatbin"})):
        res[f"cold_{variant}_ms"] = cold_start(add.format(m="cuplug", body="b=cuplug.load(); r=b.run('add',x,x); assert r[5]==2"), env)
    t = time.perf_counter()
    import importlib
    importlib.reload(cuplug)
    res["import_ms_reload"] = (time.perf_counter() - t) * 1e3
    t = time.perf_counter()
    cuplug.explain()
    res["decide_ms"] = (time.perf_counter() - t) * 1e3
    json.dump(res, open(sys.argv[1], "w"), indent=2)
    for k, v in res.items():
        print(f"{k:32} {v if isinstance(v, str) else round(v, 2)}")


if __name__ == "__main__":
    main()
