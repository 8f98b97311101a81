"""pytest-benchmark as the harness of the per-call, allocation, graph and compile scenarios.

The scenario runs benchmark files of bench/ through pytest from a directory outside the tree (the installed
cuplug, never the checkout's), reads pytest-benchmark's JSON and turns each case into a summary.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from suite.scenario import Skip
from suite.stats import from_pytest_benchmark

BENCH = Path(__file__).resolve().parents[1]
ROOT = BENCH.parent


def run(files: list[str], select: str, env: dict[str, str], timeout_s: float) -> tuple[dict[str, Any], list[str]]:
    """pytest-benchmark's JSON document of ``files`` (names in bench/) limited to ``-k select``, and the command.

    Raises Skip when every case skipped (pytest's reasons quoted), RuntimeError when pytest failed."""
    with tempfile.TemporaryDirectory(prefix="cuplug-bench-") as tmp:
        raw = Path(tmp) / "benchmark.json"
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            *(str(BENCH / f) for f in files),
            "-k",
            select,
            "-p",
            "no:cacheprovider",
            f"--rootdir={ROOT}",
            "-c",
            str(ROOT / "pyproject.toml"),
            "-o",
            "addopts=",
            "-q",
            "-rs",
            f"--benchmark-json={raw}",
            "--benchmark-columns=median,iqr,min,rounds",
        ]
        p = subprocess.run(
            cmd, cwd=tmp, env={**os.environ, **env}, capture_output=True, text=True, timeout=timeout_s, check=False
        )
        tail = (p.stdout + p.stderr)[-3000:]
        if p.returncode not in (0, 5):  # 5: nothing collected (every case deselected)
            raise RuntimeError(f"pytest {' '.join(files)} -k {select!r} failed (rc {p.returncode}):\n{tail}")
        text = raw.read_text().strip() if raw.exists() else ""  # pytest-benchmark leaves it empty when none ran
        doc = json.loads(text) if text else {"benchmarks": []}
    if not doc["benchmarks"]:
        reasons = sorted(set(re.findall(r"SKIPPED \[\d+\] [^:]+:\d+: (.*)", p.stdout)))
        raise Skip("; ".join(reasons) or f"no benchmark ran: {tail[-500:]}")
    return doc, cmd


def case(name: str) -> str:
    """'test_per_call_host[run numpy]' -> 'run numpy' (the path a case times)."""
    m = re.search(r"\[(.*)\]$", name)
    return m.group(1) if m else name


def summaries(doc: dict[str, Any], unit: str = "us") -> dict[str, dict[str, Any]]:
    """'<group>: <case>' -> summary of its per-round time (each round is one call unless its extra_info says)."""
    out = {}
    for b in doc["benchmarks"]:
        s = from_pytest_benchmark(b["stats"], unit)
        if b.get("extra_info"):
            s["extra_info"] = b["extra_info"]
        out[f"{b['group']}: {case(b['name'])}"] = s
    return out


def harness(doc: dict[str, Any], cmd: list[str]) -> dict[str, Any]:
    """What the record keeps of pytest-benchmark's run: the command, its version, its view of the machine."""
    info = doc.get("machine_info", {})
    return {
        "harness": f"pytest-benchmark {doc.get('version', '?')}",
        "pytest_command": cmd,
        "pytest_benchmark_machine": {k: info.get(k) for k in ("node", "python_version", "release")},
        "pytest_benchmark_cpu": info.get("cpu", {}).get("brand_raw"),
    }
