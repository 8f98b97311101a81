"""What cuplug costs before any GPU work: `import cuplug`, `explain()`, `load()` to the CPU (issue 17's targets).

The harness is bench/decision_bench.py (also `nox -s decision_bench`): fresh processes interleaved round by
round with a bare interpreter, the fake driver of the test suite (tests/fake_cuda, built here with cc) so the
whole decision runs on a machine without a GPU. Its targets were set with both CUDA extras installed: where
they are not, their wheels from dist/ are installed into a temporary directory for the run.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from suite.scenario import Measured, Scenario, Skip, Target
from suite.stats import tidy

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import decision_bench  # its targets: one table, read here

BENCH = Path(__file__).resolve().parents[1]
ROOT = BENCH.parent

EXTRAS = ("cuplug-cuda12", "cuplug-cuda13")
WHEELS = Path(os.environ.get("CUPLUG_BENCH_WHEELS", ROOT / "dist"))  # where the extras' wheels are, if needed
ROUNDS = {False: 15, True: 5}  # fresh processes per case: the measurement, --quick
CASES = {
    "import": "`import cuplug`",
    "explain": "`cuplug.explain()`: driver probe, discovery, the decision",
    "load_cpu": "`cuplug.load()` to the CPU twin with no driver: verify, dlopen, create, ping",
    "load_fake": "`cuplug.load()` with the fake driver: the CUDA artifacts refused at create, then the CPU",
}


def _fake_driver(tmp: Path) -> Path:
    src = ROOT / "tests" / "fake_cuda" / "fake_libcuda.c"
    lib = tmp / "fake" / "libcuda.so.1"
    lib.parent.mkdir()
    cmd = ["cc", "-shared", "-fPIC", "-O1", "-o", str(lib), str(src), "-ldl"]
    p = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if p.returncode != 0:
        raise RuntimeError(f"building the fake driver failed: {' '.join(cmd)}\n{p.stderr[-1500:]}")
    return lib.parent


def _extras_site(tmp: Path) -> tuple[str | None, list[str]]:
    """A PYTHONPATH entry with both extras when they are not installed (None when they are), and the wheels."""
    try:
        for name in EXTRAS:
            importlib.metadata.version(name)
        return None, []
    except importlib.metadata.PackageNotFoundError:
        pass
    wheels = sorted(str(w) for extra in EXTRAS for w in WHEELS.glob(f"{extra.replace('-', '_')}-*.whl"))
    if len(wheels) != len(EXTRAS):
        raise Skip(
            f"needs {' and '.join(EXTRAS)} installed, or their wheels in {WHEELS} (python3 ci/nox.py -s wheels; "
            "CUPLUG_BENCH_WHEELS=DIR): the decision's targets are for both CUDA extras"
        )
    site = tmp / "extras"
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", str(site), *wheels]
    p = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if p.returncode != 0:
        raise RuntimeError(f"installing the extras' wheels failed: {' '.join(cmd)}\n{p.stderr[-1500:]}")
    return str(site), [Path(w).name for w in wheels]


def measure(quick: bool) -> Measured:
    with tempfile.TemporaryDirectory(prefix="cuplug-decision-") as tmp:
        fake = _fake_driver(Path(tmp))
        site, wheels = _extras_site(Path(tmp))
        env = dict(os.environ, CUPLUG_BENCH_RUNS=str(ROUNDS[quick]))
        if site:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [site, env.get("PYTHONPATH")]))
        out = Path(tmp) / "decision.json"
        cmd = [sys.executable, str(BENCH / "decision_bench.py"), str(out), str(fake)]
        p = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, check=False)
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed (rc {p.returncode}):\n{(p.stdout + p.stderr)[-2000:]}")
        doc = json.loads(out.read_text())
    bare = doc["bare_interpreter_ms"]
    anchors = {
        "bare interpreter": {
            "what": "`python -c pass`, wall ms",
            "unit": "ms",
            "median": bare["median"],
            "min": bare["spread"][0],
            "max": bare["spread"][1],
            "n": doc["runs"],
        }
    }
    results = {
        case: {
            "what": f"{CASES[case]}: wall ms over the bare interpreter's median",
            "unit": "ms",
            "median": row["median_ms"],
            "min": row["spread_ms"][0],
            "max": row["spread_ms"][1],
            "cpu_median": row["cpu_median_ms"],
            "n": doc["runs"],
        }
        for case, row in doc["over_bare_interpreter"].items()
    }
    details = {
        "harness": "bench/decision_bench.py (fresh processes, interleaved; min/max over the rounds)",
        "command": f"CUPLUG_BENCH_RUNS={ROUNDS[quick]} python bench/decision_bench.py OUT.json FAKE_DRIVER_DIR",
        "driver": doc["driver"],
        "extras_installed_for_the_run": wheels,
        "in_process_median_ms": {k: tidy(v) for k, v in doc["in_process_median_ms"].items()},
        "verified": doc["verified"],
    }
    return Measured(anchors, results, details)


SCENARIO = Scenario(
    name="decision",
    what="import cuplug, explain(), load() to the CPU: ms over a bare interpreter (fresh processes, fake driver)",
    group="import and decision (ms over a bare interpreter)",
    runs_on="cpu",
    needs=("cc",),
    anchors={"bare interpreter": "`python -c pass`, interleaved with every case"},
    targets=(
        *(
            Target(f"{case} over the bare interpreter", case, None, "value", "ms", ("<=", bound), "issue 17")
            for case, bound in decision_bench.TARGETS_MS.items()
        ),
        Target("load_fake over the bare interpreter", "load_fake", None, "value", "ms", None, "reported, no target"),
    ),
    measure=measure,
    timeout_s=240,
)
