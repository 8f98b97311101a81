#!/usr/bin/env python3
"""Issue 22's measurements on a GPU machine: cold start, `sum` against torch.sum, the host path.

    python3 bench/perf22.py cold OUT.json [--rounds 7] [--cases python,floor,...] [--site NAME=DIR ...]
    python3 bench/perf22.py sum OUT.json [--repeats 10]
    python3 bench/perf22.py ncu OUT.json              # ncu's DRAM throughput of our sum vs torch.sum
    python3 bench/perf22.py host OUT.json [--configs default,threads=4,...] [--calls 12]
    python3 bench/perf22.py hostprocs OUT.json [--procs 3] [--configs ...]
    python3 bench/perf22.py summary DIR OUT.json       # the three ratios against their targets
    python3 bench/perf22.py all DIR [--runs 2]          # all of it, each run bundled in DIR/runN.json

Every subcommand writes one JSON file (with the command line and the machine) and prints a short
table. `cold` imports nothing of CUDA itself, so the device is idle between its fresh processes
(it checks with nvidia-smi that no other process holds the GPU). What each number means is in
docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
GiB = 1 << 30
TARGET_COLD = 1.10  # cuplug (array.array operands) / floor, at most
TARGET_SUM = 1.0  # cuplug sum / torch.sum throughput, at least
TARGET_HOST = 0.8  # host-path add / pinned H2D + D2H throughput, at least


def stats(xs: list[float]) -> dict[str, Any]:
    xs = [float(x) for x in xs]
    return {
        "median": statistics.median(xs),
        "min": min(xs),
        "max": max(xs),
        "n": len(xs),
        "samples": [round(x, 4) for x in xs],
    }


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {
        "host": platform.node(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "argv": sys.argv,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }
    for key, cmd in (
        ("gpu", ["nvidia-smi", "--query-gpu=name,driver_version,pstate,temperature.gpu", "--format=csv,noheader"]),
        ("gpu_processes", ["nvidia-smi", "--query-compute-apps=pid,process_name", "--format=csv,noheader"]),
    ):
        try:
            info[key] = subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError) as exc:
            info[key] = f"unavailable: {exc}"
    for key, path in (
        ("thp", "/sys/kernel/mm/transparent_hugepage/enabled"),
        ("thp_defrag", "/sys/kernel/mm/transparent_hugepage/defrag"),
    ):
        try:
            with open(path) as f:
                info[key] = f.read().strip()
        except OSError:
            pass
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu_model"] = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), None)
    except OSError:
        pass
    return info


def write(path: str, res: dict[str, Any]) -> None:
    res.setdefault("machine", machine())
    with open(path, "w") as f:
        json.dump(res, f, indent=1)


# ---- cold start ---------------------------------------------------------------------------

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
ADD_CHECK = "assert r[5] == 2.0 and r[(1 << 20) - 1] == 2.0"
CASES: dict[str, list[str]] = {
    "python": ["-c", "pass"],
    "floor": ["-c", FLOOR],
    "cuplug_load": ["-c", "import cuplug; b = cuplug.load(); assert b.cuda, b.trace.decision_reason"],
    "cuplug_array": [
        "-c",
        "import array, cuplug; b = cuplug.load(); assert b.cuda, b.trace.decision_reason; "
        f"x = array.array('f', [1.0]) * (1 << 20); r = b.run('add', x, x); {ADD_CHECK}",
    ],
    # What the loader could reach by starting cuInit on a thread before the Python work (import, manifests):
    # ctypes drops the GIL in the call, so the two overlap (measured, not what cuplug does unless noted).
    "overlap_array": [
        "-c",
        "import ctypes, threading; t = threading.Thread(target=lambda: ctypes.CDLL('libcuda.so.1').cuInit(0)); "
        "t.start(); import array, cuplug; b = cuplug.load(); assert b.cuda, b.trace.decision_reason; "
        f"x = array.array('f', [1.0]) * (1 << 20); r = b.run('add', x, x); {ADD_CHECK}",
    ],
    "overlap_ctx_array": [
        "-c",
        "import ctypes, threading\n"
        "def early():\n"
        "    c = ctypes.CDLL('libcuda.so.1'); c.cuInit(0); d = ctypes.c_int(); c.cuDeviceGet(ctypes.byref(d), 0)\n"
        "    ctx = ctypes.c_void_p(); c.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), d)\n"
        "t = threading.Thread(target=early); t.start()\n"
        "import array, cuplug; b = cuplug.load(); assert b.cuda, b.trace.decision_reason\n"
        f"x = array.array('f', [1.0]) * (1 << 20); r = b.run('add', x, x); {ADD_CHECK}",
    ],
    "cuplug_numpy": [
        "-c",
        "import numpy as np, cuplug; b = cuplug.load(); assert b.cuda, b.trace.decision_reason; "
        f"x = np.ones(1 << 20, dtype=np.float32); r = b.run('add', x, x); {ADD_CHECK}",
    ],
    "numpy": ["-c", "import numpy"],
    "cupy": [
        "-c",
        "import numpy as np, cupy; x = np.ones(1 << 20, dtype=np.float32); t = cupy.asarray(x); "
        f"r = cupy.asnumpy(t + t); {ADD_CHECK}",
    ],
    "torch": [
        "-c",
        "import numpy as np, torch; x = np.ones(1 << 20, dtype=np.float32); t = torch.from_numpy(x).cuda(); "
        f"r = torch.add(t, t).cpu(); {ADD_CHECK}",
    ],
    "breakdown": [os.path.join(HERE, "cold_start.py"), "array"],
    "breakdown_numpy": [os.path.join(HERE, "cold_start.py"), "numpy"],
}


def _case_env(case: str, sites: dict[str, str]) -> tuple[str, dict[str, str]]:
    """'cuplug_array@old' -> ('cuplug_array', env with PYTHONPATH=the 'old' site)."""
    base, _, site = case.partition("@")
    env = dict(os.environ)
    if site:
        env["PYTHONPATH"] = sites[site]
    return base, env


def cold(args: argparse.Namespace) -> None:
    sites = dict(s.split("=", 1) for s in args.site)
    cases = args.cases.split(",")
    res: dict[str, Any] = {"rounds": args.rounds, "cases": cases, "sites": sites, "machine": machine()}
    busy = res["machine"].get("gpu_processes", "")
    res["idle_device"] = None if busy.startswith("unavailable") else not busy.strip()
    walls: dict[str, list[float]] = {c: [] for c in cases}
    inner: dict[str, list[dict[str, Any]]] = {c: [] for c in cases}
    for r in range(args.rounds):
        order = cases[r % len(cases) :] + cases[: r % len(cases)]  # rotated: no case always first
        for case in order:
            base, env = _case_env(case, sites)
            t0 = time.monotonic()
            env["CUPLUG_BENCH_T0"] = repr(t0)
            try:
                p = subprocess.run(
                    [sys.executable, *CASES[base]], capture_output=True, text=True, env=env, timeout=args.case_timeout
                )
            except subprocess.TimeoutExpired as exc:
                res.setdefault("failures", {})[case] = f"timed out after {args.case_timeout} s: {exc.stderr!r}"[-1500:]
                print(f"cold case {case} timed out", file=sys.stderr)
                continue
            t1 = time.monotonic()
            if p.returncode != 0:
                res.setdefault("failures", {})[case] = f"rc {p.returncode}: {p.stdout[-500:]}\n{p.stderr[-1500:]}"
                print(f"cold case {case} failed (rc {p.returncode}): {p.stderr[-600:]}", file=sys.stderr)
                continue
            walls[case].append((t1 - t0) * 1e3)
            out = p.stdout.strip().splitlines()
            if out and out[-1].startswith("{"):
                row = json.loads(out[-1])
                row["exit"] = (t1 - row.pop("t_end")) * 1e3
                row["wall"] = (t1 - t0) * 1e3
                inner[case].append(row)
    walls = {c: v for c, v in walls.items() if v}
    res["wall_ms"] = {c: stats(v) for c, v in walls.items()}
    floor = walls.get("floor")
    if floor:
        res["ratio_to_floor"] = {
            c: {
                "of_medians": statistics.median(v) / statistics.median(floor),
                "per_round": stats([a / b for a, b in zip(v, floor, strict=True)]) if len(v) == len(floor) else None,
            }
            for c, v in walls.items()
        }
    res["steps_ms"] = {}
    for case, rows in inner.items():
        if not rows:
            continue
        keys = [k for k in rows[0] if isinstance(rows[0][k], (int, float))]
        res["steps_ms"][case] = {k: statistics.median(r.get(k, 0.0) for r in rows) for k in keys}
        res["steps_ms"][case]["variant"] = rows[0].get("variant")
        res["steps_ms"][case]["staging"] = rows[0].get("staging")
    res["steps_ms_all"] = inner
    write(args.out, res)
    f = statistics.median(floor) if floor else None
    print(f"{'case':28} {'median ms':>10} {'min':>8} {'max':>8} {'x floor':>8}")
    for c, v in walls.items():
        m = statistics.median(v)
        print(f"{c:28} {m:10.1f} {min(v):8.1f} {max(v):8.1f} {m / f if f else float('nan'):8.3f}")
    for case, steps in res["steps_ms"].items():
        print(f"-- {case}: " + ", ".join(f"{k} {v:.1f}" for k, v in steps.items() if isinstance(v, float)))


# ---- sum against torch.sum --------------------------------------------------------------------


def _event_timer(torch):
    def queued(fn, calls: int = 20, prime: int = 3) -> float:
        """Device time per call, the queue kept full: `prime` calls are queued first, so the host's per-call
        work overlaps the device's from the first timed call on (ms per call)."""
        for _ in range(prime):
            fn()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(calls):
            fn()
        b.record()
        torch.cuda.synchronize()
        return a.elapsed_time(b) / calls

    def batch(fn, calls: int = 20) -> float:
        """2026-12-03's method: an event, `calls` calls, an event: the first call's host work shows (ms/call)."""
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(calls):
            fn()
        b.record()
        torch.cuda.synchronize()
        return a.elapsed_time(b) / calls

    def single(fn) -> float:
        """One call at a time, host work included: wall time of the call and a synchronize (ms)."""
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - t) * 1e3

    return {"queued": queued, "batch20": batch, "single": single}


def _direct_call(b, op: str, ins, outs, stream: int):
    """The C entry point with prebuilt descriptors: what the backend and kernel cost without Python's per-call work."""
    import ctypes

    from cuplug.contract import abi

    def desc(t):
        shape = (ctypes.c_int64 * max(t.dim(), 1))(*t.shape)
        ct = abi.CTensor()
        ct.data, ct.device_type, ct.device_id, ct.ndim = t.data_ptr(), 2, t.device.index or 0, t.dim()
        code = {"float32": (2, 32), "float16": (2, 16), "bfloat16": (4, 16)}[str(t.dtype).split(".")[1]]
        ct.dtype = abi.CDtype(code[0], code[1], 1)
        ct.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
        ct.strides = None
        ct.byte_offset = 0
        return ct, shape

    keep = [desc(t) for t in (*ins, *outs)]
    c_in = (abi.CTensor * len(ins))(*(k[0] for k in keep[: len(ins)]))
    c_out = (abi.CTensor * len(outs))(*(k[0] for k in keep[len(ins) :]))
    c_attrs = (abi.CAttr * 1)()
    lib, handle, name = b._core.lib, b._core.handle, op.encode()

    def call() -> None:
        rc = lib.call(handle, name, c_in, len(ins), c_out, len(outs), c_attrs, 0, stream)
        if rc != 0:
            raise RuntimeError(f"call {op}: {rc}: {lib.last_error(handle)}")

    call.keep = (keep, c_in, c_out, c_attrs)  # type: ignore[attr-defined]
    return call


def sum_bench(args: argparse.Namespace) -> None:
    import torch

    import cuplug

    res: dict[str, Any] = {"torch": torch.__version__, "repeats": args.repeats, "machine": machine()}
    timers = _event_timer(torch)
    b = cuplug.load()
    res["variant"] = f"{b.cuda}:{b.variant}"
    res["staging_info"] = b._info.get("staging")
    cur = torch.cuda.current_stream()
    c_stream = cur.cuda_stream or 1  # 0 is the legacy stream: cudaStreamLegacy (1) in the C ABI
    dts = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
    for name in args.dtypes.split(","):
        dt = dts[name]
        n = GiB // torch.tensor([], dtype=dt).element_size()
        x = torch.randn(n, device="cuda", dtype=torch.float32).to(dt)
        s = torch.empty((), device="cuda", dtype=dt)
        s2 = torch.empty((), device="cuda", dtype=dt)
        bx = b.empty(n, name)
        torch.from_dlpack(bx).copy_(x)
        bs = b.empty((), name)
        fns = {
            "torch_out": lambda: torch.sum(x, dim=0, out=s2),
            "torch": lambda: torch.sum(x),
            "cuplug_out_stream": lambda: b.run("sum", x, out=s, stream=cur),
            "cuplug_out": lambda: b.run("sum", x, out=s),
            "cuplug": lambda: b.run("sum", x),
            # A resident input and output on the caller's stream (without stream= it would run on the instance
            # stream, which the events on PyTorch's stream do not see: 2026-12-03's first two runs timed that).
            "cuplug_resident_out": lambda: b.run("sum", bx, out=bs, stream=cur),
            "cuplug_direct": _direct_call(b, "sum", [x], [s], c_stream),
        }
        if name != "float32":
            fns.pop("cuplug_out")
            fns.pop("cuplug_resident_out")
        per: dict[str, dict[str, list[float]]] = {f: {m: [] for m in timers} for f in fns}
        for fn in fns.values():  # warm-up: kernels loaded, scratch allocated
            fn()
        torch.cuda.synchronize()
        for _ in range(args.repeats):
            for mode, timer in timers.items():
                for f, fn in fns.items():  # alternating: the same device state for every function
                    per[f][mode].append(timer(fn))
        row: dict[str, Any] = {}
        for f, modes in per.items():
            row[f] = {
                m: {**stats(v), "GBs": n * x.element_size() / statistics.median(v) / 1e6} for m, v in modes.items()
            }
        ratios = {}
        for mode in timers:
            t_torch = statistics.median(per["torch_out"][mode])
            ratios[mode] = {f: t_torch / statistics.median(per[f][mode]) for f in fns if f.startswith("cuplug")}
            t_torch_alloc = statistics.median(per["torch"][mode])
            ratios[mode]["cuplug_vs_torch_alloc"] = t_torch_alloc / statistics.median(per["cuplug"][mode])
        # Determinism: the same bits on every run (fixed grid, fixed order of every addition).
        bits = set()
        for _ in range(args.det_runs):
            b.run("sum", x, out=s, stream=cur)
            bits.add(s.reshape(1).view(torch.int16 if dt != torch.float32 else torch.int32)[0].item())
        tbits = set()
        for _ in range(args.det_runs):
            torch.sum(x, dim=0, out=s2)
            tbits.add(s2.reshape(1).view(torch.int16 if dt != torch.float32 else torch.int32)[0].item())
        ref = float(x.double().sum())
        scale = float(x.double().abs().sum())
        got = float(s.float())
        res[name] = {
            "n": n,
            "bytes": n * x.element_size(),
            "per_fn": row,
            "ratio_to_torch_out": ratios,
            "deterministic_runs": args.det_runs,
            "distinct_bit_patterns": len(bits),
            "torch_distinct_bit_patterns": len(tbits),
            "result": got,
            "torch_result": float(s2.float()),
            "float64_reference": ref,
            "rel_error_vs_sum_abs": abs(got - ref) / scale,
            "torch_rel_error_vs_sum_abs": abs(float(s2.float()) - ref) / scale,
        }
        fns = per = None  # type: ignore[assignment]  # the lambdas hold x: free it before the next dtype
        x = bx = bs = None  # type: ignore[assignment]
        torch.cuda.empty_cache()
    # Host time per call on one-element tensors: where run()'s own work goes.
    one = torch.ones(1, device="cuda")
    o1 = torch.empty((), device="cuda")
    res["per_call_us"] = {}

    def per_call(fn, calls: int = 5000) -> dict[str, float]:
        for _ in range(200):
            fn()
        torch.cuda.synchronize()
        ts = []
        for _ in range(calls):
            t = time.perf_counter_ns()
            fn()
            ts.append((time.perf_counter_ns() - t) / 1e3)
        torch.cuda.synchronize()
        ts.sort()
        return {"median": ts[len(ts) // 2], "p10": ts[len(ts) // 10], "p90": ts[9 * len(ts) // 10]}

    res["per_call_us"]["torch_sum_out"] = per_call(lambda: torch.sum(one, dim=0, out=o1))
    res["per_call_us"]["torch_sum"] = per_call(lambda: torch.sum(one))
    res["per_call_us"]["cuplug_sum_out_stream"] = per_call(lambda: b.run("sum", one, out=o1, stream=cur))
    res["per_call_us"]["cuplug_sum_out"] = per_call(lambda: b.run("sum", one, out=o1))
    res["per_call_us"]["cuplug_sum"] = per_call(lambda: b.run("sum", one), 2000)
    res["per_call_us"]["cuplug_direct_sum"] = per_call(_direct_call(b, "sum", [one], [o1], c_stream))
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(3000):
        b.run("sum", one, out=o1, stream=cur)
    prof.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(25)
    res["profile_run_sum_out_stream"] = text.getvalue()
    b.close()
    write(args.out, res)
    print(f"sum through Backend.run vs torch.sum ({res['variant']}), ratio = torch time / cuplug time")
    for name in args.dtypes.split(","):
        r = res[name]["ratio_to_torch_out"]
        print(
            f"  {name:9} queued {r['queued']['cuplug_out_stream']:.3f} (direct {r['queued']['cuplug_direct']:.3f}, "
            f"alloc {r['queued']['cuplug_vs_torch_alloc']:.3f})  batch20 {r['batch20']['cuplug_out_stream']:.3f}  "
            f"single {r['single']['cuplug_out_stream']:.3f}  bits {res[name]['distinct_bit_patterns']}"
        )
    print("  per call us: " + ", ".join(f"{k} {v['median']:.1f}" for k, v in res["per_call_us"].items()))


NCU_METRICS = (
    "gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,"
    "dram__bytes_read.sum.per_second,launch__grid_size,launch__block_size"
)


def ncu_target(args: argparse.Namespace) -> None:
    """What ncu profiles: two torch.sum and two cuplug sums of the same 1 GiB float32 tensor."""
    import torch

    import cuplug

    x = torch.randn(GiB // 4, device="cuda")
    s = torch.empty((), device="cuda")
    cur = torch.cuda.current_stream()
    with cuplug.load() as b:
        for _ in range(2):
            torch.sum(x, dim=0, out=s)
            b.run("sum", x, out=s, stream=cur)
        torch.cuda.synchronize()


def ncu(args: argparse.Namespace) -> None:
    import csv

    exe = args.ncu
    if exe == "ncu" and not any(os.path.exists(os.path.join(d, "ncu")) for d in os.environ["PATH"].split(":")):
        import glob

        found = sorted(glob.glob("/opt/nvidia/nsight-compute/*/ncu")) + sorted(glob.glob("/usr/local/cuda*/bin/ncu"))
        exe = found[-1] if found else exe
    cmd = [
        exe,
        "--clock-control",
        "none",
        "--kernel-name",
        "regex:sum_kernel|reduce_kernel",
        "--metrics",
        NCU_METRICS,
        "--csv",
        "--print-units",
        "base",
        sys.executable,
        os.path.abspath(__file__),
        "ncu-target",
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith('"')]
    rows = list(csv.DictReader(lines))
    kernels: dict[str, dict[str, list[float]]] = {}
    for row in rows:
        name = "cuplug sum_kernel" if "sum_kernel" in row.get("Kernel Name", "") else "torch reduce_kernel"
        try:
            value = float(row["Metric Value"].replace(",", ""))
        except (KeyError, ValueError):
            continue
        kernels.setdefault(name, {}).setdefault(row["Metric Name"], []).append(value)
    res = {
        "command": cmd,
        "returncode": p.returncode,
        "kernels": {k: {m: statistics.median(v) for m, v in ms.items()} for k, ms in kernels.items()},
        "raw_tail": p.stdout[-4000:] + p.stderr[-2000:],
        "machine": machine(),
    }
    write(args.out, res)
    print("ncu (median of the profiled launches):")
    for k, ms in res["kernels"].items():
        print(
            f"  {k:22} {ms.get('gpu__time_duration.sum', float('nan')) / 1e3:8.1f} us  "
            f"DRAM {ms.get('dram__throughput.avg.pct_of_peak_sustained_elapsed', float('nan')):5.1f} % of peak  "
            f"{ms.get('dram__bytes_read.sum.per_second', float('nan')) / 1e9:7.0f} GB/s read  "
            f"grid {ms.get('launch__grid_size', 0):.0f}"
        )
    if p.returncode != 0:
        print(p.stderr[-1500:])


# ---- the host path ------------------------------------------------------------------------------


def host(args: argparse.Namespace) -> None:
    import numpy as np
    import torch

    import cuplug

    n = GiB // 4
    rng = np.random.default_rng(int(args.seed))
    x = rng.standard_normal(n, dtype=np.float32)
    y = rng.standard_normal(n, dtype=np.float32)
    out = np.zeros_like(x)  # touched: no page faults inside the timed calls
    idx = np.arange(0, n, 4099)
    want = x[idx] + y[idx]
    res: dict[str, Any] = {"n": n, "calls": args.calls, "bytes_moved": 3 * 4 * n, "machine": machine()}

    def pinned_ref() -> dict[str, Any]:
        pinned = torch.empty(n, dtype=torch.float32, pin_memory=True)
        dev = torch.empty(n, dtype=torch.float32, device="cuda")
        pinned.fill_(1.0)
        ts = {"h2d_d2h": [], "h2d": [], "d2h": []}
        for _ in range(args.calls):
            torch.cuda.synchronize()
            t = time.perf_counter()
            dev.copy_(pinned, non_blocking=True)
            pinned.copy_(dev, non_blocking=True)
            torch.cuda.synchronize()
            ts["h2d_d2h"].append(time.perf_counter() - t)
        for _ in range(3):
            torch.cuda.synchronize()
            t = time.perf_counter()
            dev.copy_(pinned, non_blocking=True)
            torch.cuda.synchronize()
            ts["h2d"].append(time.perf_counter() - t)
            t = time.perf_counter()
            pinned.copy_(dev, non_blocking=True)
            torch.cuda.synchronize()
            ts["d2h"].append(time.perf_counter() - t)
        del pinned, dev
        torch.cuda.empty_cache()
        mult = {"h2d_d2h": 2, "h2d": 1, "d2h": 1}
        return {k: {**stats([mult[k] * 4 * n / t / 1e9 for t in v]), "unit": "GB/s"} for k, v in ts.items()}

    res["pinned_before"] = pinned_ref()
    configs = args.configs.split(";")
    res["configs"] = {}
    for cfg in configs:
        if cfg == "default":
            os.environ.pop("CUPLUG_STAGING", None)
        else:
            os.environ["CUPLUG_STAGING"] = cfg
        with cuplug.load() as b:
            b.run("add", x, y, out=out)  # staging allocated, kernels loaded
            ts = []
            for _ in range(args.calls):
                t = time.perf_counter()
                b.run("add", x, y, out=out)
                ts.append(time.perf_counter() - t)
            ok = bool(np.array_equal(out[idx], want))
            entry: dict[str, Any] = {
                "GBs": stats([3 * 4 * n / t / 1e9 for t in ts]),
                "correct": ok,
                "staging": b._info.get("staging"),
                "variant": f"{b.cuda}:{b.variant}",
            }
            if cfg == "default" and args.fresh_calls:
                # A fresh output array each call (run() allocating it): the page faults of its first touch.
                fresh = []
                for _ in range(args.fresh_calls):
                    t = time.perf_counter()
                    r = b.run("add", x, y)
                    fresh.append(time.perf_counter() - t)
                    del r
                entry["fresh_output_GBs"] = stats([3 * 4 * n / t / 1e9 for t in fresh])
            res["configs"][cfg] = entry
        os.environ.pop("CUPLUG_STAGING", None)
    res["pinned_after"] = pinned_ref()
    ref = statistics.median(res["pinned_before"]["h2d_d2h"]["samples"] + res["pinned_after"]["h2d_d2h"]["samples"])
    res["pinned_GBs"] = ref
    for entry in res["configs"].values():
        entry["ratio"] = entry["GBs"]["median"] / ref
        entry["ratio_min"] = entry["GBs"]["min"] / ref
    write(args.out, res)
    print(f"host path: run('add') on 1 GiB NumPy arrays vs pinned H2D+D2H {ref:.1f} GB/s (ratio = GB/s over that)")
    for cfg, e in res["configs"].items():
        g = e["GBs"]
        extra = f"  fresh out {e['fresh_output_GBs']['median']:.1f}" if "fresh_output_GBs" in e else ""
        print(
            f"  {cfg:44} {g['median']:6.1f} GB/s [{g['min']:5.1f}, {g['max']:5.1f}]  x{e['ratio']:.3f} "
            f"(min x{e['ratio_min']:.3f}){'' if e['correct'] else '  WRONG'}{extra}"
        )


def hostprocs(args: argparse.Namespace) -> None:
    runs = []
    for i in range(args.procs):
        path = f"{args.out}.proc{i}.json"
        cmd = [
            sys.executable,
            os.path.abspath(__file__),
            "host",
            path,
            "--configs",
            args.configs,
            "--calls",
            str(args.calls),
            "--fresh-calls",
            str(args.fresh_calls if i == 0 else 0),
            "--seed",
            str(i),
        ]
        subprocess.run(cmd, check=True)
        with open(path) as f:
            runs.append(json.load(f))
        os.remove(path)
    res: dict[str, Any] = {"procs": runs, "machine": machine()}
    cfgs = list(runs[0]["configs"])
    res["per_config"] = {
        c: {
            "ratio_per_process": [r["configs"][c]["ratio"] for r in runs],
            "ratio_min_call_per_process": [r["configs"][c]["ratio_min"] for r in runs],
            "GBs_median_per_process": [r["configs"][c]["GBs"]["median"] for r in runs],
            "pinned_GBs_per_process": [r["pinned_GBs"] for r in runs],
        }
        for c in cfgs
    }
    write(args.out, res)
    print(f"host path over {args.procs} processes (ratio to that process's pinned copy; per process: median of calls)")
    for c, e in res["per_config"].items():
        print(
            f"  {c:44} "
            + " ".join(f"x{v:.3f}" for v in e["ratio_per_process"])
            + "   slowest call: "
            + " ".join(f"x{v:.3f}" for v in e["ratio_min_call_per_process"])
        )


# ---- the three targets --------------------------------------------------------------------------


def summary(args: argparse.Namespace) -> None:
    d = args.dir

    def load(name: str) -> dict[str, Any] | None:
        p = os.path.join(d, name)
        return json.load(open(p)) if os.path.exists(p) else None

    cold_r, sum_r, host_r = load("cold.json"), load("sum.json"), load("host.json")
    cold_r = cold_r if cold_r and "ratio_to_floor" in cold_r and "cuplug_array" in cold_r["wall_ms"] else None
    host_r = host_r if host_r and "per_config" in host_r else None
    res: dict[str, Any] = {"dir": d, "targets": {}}
    if cold_r:
        rr = cold_r["ratio_to_floor"]
        res["targets"]["cold_start"] = {
            "value": rr["cuplug_array"]["of_medians"],
            "target": f"<= {TARGET_COLD}",
            "met": rr["cuplug_array"]["of_medians"] <= TARGET_COLD,
            "floor_ms": cold_r["wall_ms"]["floor"]["median"],
            "cuplug_array_ms": cold_r["wall_ms"]["cuplug_array"]["median"],
            "others_x_floor": {c: v["of_medians"] for c, v in rr.items()},
        }
    if sum_r:
        for dt in ("float32", "float16", "bfloat16"):
            if dt in sum_r:
                v = sum_r[dt]["ratio_to_torch_out"]["queued"]["cuplug_out_stream"]
                res["targets"][f"sum_{dt}"] = {
                    "value": v,
                    "target": f">= {TARGET_SUM}",
                    "met": v >= TARGET_SUM,
                    "deterministic": sum_r[dt]["distinct_bit_patterns"] == 1,
                    "batch20": sum_r[dt]["ratio_to_torch_out"]["batch20"]["cuplug_out_stream"],
                    "single": sum_r[dt]["ratio_to_torch_out"]["single"]["cuplug_out_stream"],
                }
    if host_r:
        e = host_r["per_config"]["default"]
        worst = min(e["ratio_per_process"])
        res["targets"]["host_path"] = {
            "value": worst,
            "target": f">= {TARGET_HOST} in every process",
            "met": worst >= TARGET_HOST,
            "per_process": e["ratio_per_process"],
            "slowest_call_per_process": e["ratio_min_call_per_process"],
        }
    write(args.out, res)
    for k, v in res["targets"].items():
        print(f"  {k:16} {v['value']:.3f} (target {v['target']}): {'met' if v['met'] else 'MISSED'}")


def run_all(args: argparse.Namespace) -> None:
    """Everything, `--runs` times, each step in a fresh process (this one imports nothing of CUDA, so the
    cold starts find an idle device); per run one JSON (cold, sum, host, summary), then ncu once."""
    os.makedirs(args.dir, exist_ok=True)
    me = [sys.executable, os.path.abspath(__file__)]
    sites = [f"--site={s}" for s in args.site]
    for run in range(1, args.runs + 1):
        tmp = os.path.join(args.dir, f".run{run}")
        os.makedirs(tmp, exist_ok=True)
        steps = [
            ["cold", os.path.join(tmp, "cold.json"), "--rounds", str(args.rounds), "--cases", args.cases, *sites],
            ["sum", os.path.join(tmp, "sum.json"), "--repeats", str(args.repeats)],
            ["hostprocs", os.path.join(tmp, "host.json"), "--procs", "3", "--calls", str(args.calls)],
            ["summary", tmp, os.path.join(tmp, "summary.json")],
        ]
        bundle: dict[str, Any] = {"run": run, "command": sys.argv}
        for step in steps:
            print(f"== run {run}: perf22.py {' '.join(step)}", flush=True)
            name = {"hostprocs": "host"}.get(step[0], step[0])
            path = step[1] if step[0] != "summary" else step[2]
            try:  # a failed step is recorded; the other steps and runs still come back
                subprocess.run([*me, *step], check=True, timeout=args.step_timeout)
                with open(path) as f:
                    bundle[name] = json.load(f)
            except (subprocess.SubprocessError, OSError, ValueError) as exc:
                bundle[name] = {"error": f"{type(exc).__name__}: {exc}"}
                print(f"   step {step[0]} failed: {exc}", flush=True)
        with open(os.path.join(args.dir, f"run{run}.json"), "w") as f:
            json.dump(bundle, f, indent=1)
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    if not args.no_ncu:
        print("== ncu", flush=True)
        subprocess.run([*me, "ncu", os.path.join(args.dir, "ncu.json")], check=False)
    plot = os.path.join(HERE, "plot22.py")
    runs = [os.path.join(args.dir, f"run{r}.json") for r in range(1, args.runs + 1)]
    subprocess.run([sys.executable, plot, os.path.join(args.dir, "targets.png"), *runs], check=False)
    print("== the three targets, per run")
    for path in runs:
        with open(path) as f:
            summ = json.load(f)["summary"].get("targets", {})
        print(
            f"  {os.path.basename(path)}: "
            + "; ".join(f"{k} {v['value']:.3f} {'met' if v['met'] else 'MISSED'}" for k, v in summ.items())
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("cold")
    p.add_argument("out")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument(
        "--cases",
        default="python,floor,cuplug_array,cuplug_load,cuplug_numpy,numpy,cupy,torch,breakdown,overlap_array,overlap_ctx_array",
    )
    p.add_argument("--site", action="append", default=[], help="NAME=DIR: case@NAME runs with PYTHONPATH=DIR")
    p.add_argument("--case-timeout", type=float, default=60.0, help="seconds one fresh process may take")
    p.set_defaults(fn=cold)
    p = sub.add_parser("sum")
    p.add_argument("out")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--dtypes", default="float32,float16,bfloat16")
    p.add_argument("--det-runs", type=int, default=20)
    p.set_defaults(fn=sum_bench)
    p = sub.add_parser("ncu-target")
    p.set_defaults(fn=ncu_target)
    p = sub.add_parser("ncu")
    p.add_argument("out")
    p.add_argument("--ncu", default="ncu")
    p.add_argument("--timeout", type=int, default=240)
    p.set_defaults(fn=ncu)
    for name, fn in (("host", host), ("hostprocs", hostprocs)):
        p = sub.add_parser(name)
        p.add_argument("out")
        p.add_argument("--configs", default="default", help="';'-separated CUPLUG_STAGING values, or 'default'")
        p.add_argument("--calls", type=int, default=12)
        p.add_argument("--fresh-calls", type=int, default=3)
        p.add_argument("--seed", default="0")
        p.add_argument("--procs", type=int, default=3)
        p.set_defaults(fn=fn)
    p = sub.add_parser("all")
    p.add_argument("dir")
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--calls", type=int, default=12)
    p.add_argument(
        "--cases",
        default="python,floor,cuplug_array,cuplug_load,cuplug_numpy,numpy,cupy,torch,breakdown,overlap_array,overlap_ctx_array",
    )
    p.add_argument("--site", action="append", default=[])
    p.add_argument("--no-ncu", action="store_true")
    p.add_argument("--step-timeout", type=float, default=300.0)
    p.set_defaults(fn=run_all)
    p = sub.add_parser("summary")
    p.add_argument("dir")
    p.add_argument("out")
    p.set_defaults(fn=summary)
    args = ap.parse_args()
    args.fn(args)


if __name__ == "__main__":
    main()
