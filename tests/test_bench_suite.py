"""The benchmark suite (bench/run.py) on the CPU machine: every scenario is listed with its anchor and targets, a
quick run writes one record per scenario with the command that made it, and a scenario this machine cannot run
writes a record saying skipped and why, never a number."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import ROOT, clean_env, needs_wheels

pytest.importorskip("pytest_benchmark")
RUN = ROOT / "bench" / "run.py"
pytestmark = needs_wheels


def _run(*args: str, timeout: int = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(RUN), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=clean_env(CUPLUG_BACKEND="cpu"),
    )


def test_every_scenario_is_listed_with_its_anchor():
    out = _run("--list")
    assert out.returncode == 0, out.stderr
    for name in (
        "decision",
        "cold-start",
        "per-call",
        "alloc-vs-out",
        "graphs",
        "compile",
        "bandwidth",
        "sum",
        "host-path",
    ):
        assert f"\n{name} [" in "\n" + out.stdout, name
    assert out.stdout.count("anchor ") >= 9


def test_a_quick_run_writes_records_with_their_command_and_skips_what_needs_a_gpu(tmp_path):
    out = _run("--quick", "per-call", "bandwidth", "--out", str(tmp_path))
    assert out.returncode == 0, out.stdout + out.stderr
    per_call = json.loads((tmp_path / "run1" / "per-call.json").read_text())
    assert per_call["scenario"] == "per-call" and "bench/run.py --quick per-call" in per_call["command"]
    assert "bench_dispatch.py" in json.dumps(per_call["details"])  # the harness's own command beside it
    rows = {t["name"]: t for t in per_call["targets"]}
    assert rows["run(out=) numpy (per-call host)"]["value"] > 0 and rows["run(out=) numpy (per-call host)"]["verdict"]
    assert per_call["machine"]["python"]
    bandwidth = json.loads((tmp_path / "run1" / "bandwidth.json").read_text())
    assert "GPU" in bandwidth["skipped"] and not bandwidth["results"] and not bandwidth["targets"]


def test_an_unknown_scenario_is_named():
    out = _run("no-such-scenario", "--out", "/tmp/never")
    assert out.returncode != 0 and "no-such-scenario" in out.stdout + out.stderr
