"""What cuplug costs an application before any GPU work: fresh processes against a bare interpreter.

    python bench/decision_bench.py OUT.json [FAKE_DRIVER_DIR]

Every case is a fresh ``python -c`` process, run round by round interleaved with the others
(default 15 rounds); a case's figure is its median wall time minus the median of the bare
interpreter (``python -c pass``) of the same run, with the spread (min-max over the rounds)
beside it. The installed cuplug must have both CUDA extras (``nox -s decision_bench``).

  import      ``import cuplug``
  explain     ``import cuplug; cuplug.explain()``: driver probe, discovery, the decision
  load_cpu    ``cuplug.load()`` to the CPU fallback with no driver (no-driver): the decision,
              verification and dlopen of the CPU twin, create, ping
  load_fake   ``cuplug.load()`` with the fake driver: every accepted CUDA artifact verified and
              refused at create (load-failed), then the CPU (reported; no target)
  cuinit      ``ctypes`` dlopen of libcuda.so.1 + ``cuInit(0)`` alone (only with a real driver)

With FAKE_DRIVER_DIR the driver is the test suite's fake libcuda.so.1 (CC 9.0, driver 13.0), so
the whole path runs on a machine without a GPU; without it, the system's driver (on a GPU
machine: its cuInit is then most of ``explain``, shown beside it as ``cuinit``).

Targets (issue 17, 2-core CPU machine, fake driver): import <= 5 ms, explain <= 15 ms,
load_cpu <= 20 ms over the bare interpreter.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time

RUNS = int(os.environ.get("CUPLUG_BENCH_RUNS", "15"))
TARGETS_MS = {"import": 5.0, "explain": 15.0, "load_cpu": 20.0}
CASES = {
    "bare": "pass",
    "import": "import cuplug",
    "explain": "import cuplug; cuplug.explain()",
    "load_cpu": "import cuplug; cuplug.load()",
    "load_fake": "import cuplug; cuplug.load()",
    "cuinit": "import ctypes; ctypes.CDLL('libcuda.so.1').cuInit(0)",
}
# The decision's steps inside one process, for the breakdown (not part of the targets).
STEPS = r"""
import json, time
t0 = time.perf_counter()
import cuplug
from cuplug.runtime import discovery, driver, loading, policy, select, verify
t1 = time.perf_counter()
facts = driver.probe()
t2 = time.perf_counter()
found = discovery.discover("vector")
t3 = time.perf_counter()
decided = select.decide("vector", policy.from_env(), facts, found)
t4 = time.perf_counter()
chosen = decided.to_try[0].artifact if decided.to_try else found.cpu
verify.verified(chosen)
t5 = time.perf_counter()
ms = lambda a, b: round((b - a) * 1e3, 3)
print(json.dumps({"import": ms(t0, t1), "probe": ms(t1, t2), "discover": ms(t2, t3), "select": ms(t3, t4),
                  "verify": ms(t4, t5), "chosen": f"{chosen.cuda or 'cpu'}/{chosen.variant}", "size": chosen.size}))
"""


def _env(driver_dir: str | None) -> dict[str, str]:
    """The environment with no cuplug knob; LD_LIBRARY_PATH the fake driver's directory when given (else as
    it is: the system's driver may be found through it, as on the H200 machine)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUPLUG_", "FAKE_CUDA_"))}
    if driver_dir is not None:
        env["LD_LIBRARY_PATH"] = driver_dir
    return env


def _cpu_env(tmp: str, real_driver: bool) -> dict[str, str]:
    """load() to the CPU: no libcuda.so.1 on LD_LIBRARY_PATH (an empty directory) and none in the system
    (no-driver); on a GPU machine, the kill switch CUPLUG_DISABLE_CUDA=1 instead (disabled)."""
    env = _env(tmp)
    if real_driver:
        env = _env(None)
        env["CUPLUG_DISABLE_CUDA"] = "1"
    return env


def _wall(code: str, env: dict[str, str]) -> tuple[float, float]:
    """(wall ms, CPU ms: user + system of the child) of one fresh process. The CPU time is the steadier
    figure on a shared VM (another tenant's load stretches the wall clock, less so the CPU time)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True)
    wall = (time.perf_counter() - t) * 1e3
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) * 1e3
    return wall, cpu


def main(out: str, fake_dir: str | None) -> None:
    real_driver = fake_dir is None  # without the fake driver this runs where the real one is
    with tempfile.TemporaryDirectory() as empty:
        envs = {
            "bare": _env(fake_dir),
            "import": _env(fake_dir),
            "explain": _env(fake_dir),
            "load_cpu": _cpu_env(empty, real_driver),
            "load_fake": _env(fake_dir),
            "cuinit": _env(None),  # the real driver only
        }
        cases = [c for c in CASES if c != "cuinit" or real_driver]
        if fake_dir is None:
            cases.remove("load_fake")
        walls: dict[str, list[float]] = {c: [] for c in cases}
        cpus: dict[str, list[float]] = {c: [] for c in cases}
        steps = []
        for _ in range(RUNS):
            for case in cases:
                wall, cpu = _wall(CASES[case], envs[case])
                walls[case].append(wall)
                cpus[case].append(cpu)
            proc = subprocess.run(
                [sys.executable, "-c", STEPS], env=_env(fake_dir), capture_output=True, text=True, check=True
            )
            steps.append(json.loads(proc.stdout))
    bare = statistics.median(walls["bare"])
    bare_cpu = statistics.median(cpus["bare"])
    over = {}
    for case in cases:
        if case == "bare":
            continue
        med = statistics.median(walls[case])
        over[case] = {
            "median_ms": round(med - bare, 2),
            "spread_ms": [round(min(walls[case]) - bare, 2), round(max(walls[case]) - bare, 2)],
            "cpu_median_ms": round(statistics.median(cpus[case]) - bare_cpu, 2),
            "target_ms": TARGETS_MS.get(case),
            "met": None if case not in TARGETS_MS else med - bare <= TARGETS_MS[case],
        }
    keys = ("import", "probe", "discover", "select", "verify")
    result = {
        "runs": RUNS,
        "bare_interpreter_ms": {
            "median": round(bare, 2),
            "spread": [round(min(walls["bare"]), 2), round(max(walls["bare"]), 2)],
        },
        "over_bare_interpreter": over,
        "in_process_median_ms": {k: round(statistics.median(s[k] for s in steps), 3) for k in keys},
        "verified": f"{steps[0]['chosen']} ({steps[0]['size']} B)",
        "driver": "fake libcuda.so.1 (tests/fake_cuda, CC 9.0, driver 13.0)" if fake_dir else "system libcuda.so.1",
        "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "command": " ".join(["python", "bench/decision_bench.py", out, *([fake_dir] if fake_dir else [])]),
    }
    with open(out, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    print(f"bare interpreter: {bare:.1f} ms (median of {RUNS})")
    for case, row in over.items():
        target = f" (target <= {row['target_ms']:g}: {'met' if row['met'] else 'MISSED'})" if row["target_ms"] else ""
        spread = f"[{row['spread_ms'][0]:.2f}, {row['spread_ms'][1]:.2f}]"
        print(f"{case:10} +{row['median_ms']:7.2f} ms {spread:16} CPU +{row['cpu_median_ms']:6.2f} ms{target}")
    print("in process:", result["in_process_median_ms"], result["verified"])


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
