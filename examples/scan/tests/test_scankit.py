"""scankit's own tests: they run against the installed package (CPU or GPU)."""

from __future__ import annotations

import array
import json
import subprocess
import sys

import pytest
import scankit

import cuplug


@pytest.mark.parametrize("n", [1, 7, 2048, 2049, 1 << 20])
def test_prefix_sum_matches_a_float64_reference(n):
    x = array.array("f", [float((i * 7) % 13 - 6) for i in range(n)])
    got = scankit.prefix_sum(x)
    running = 0.0
    for i, v in enumerate(x):
        running += v
        assert abs(got[i] - running) <= 1e-5 * max(1.0, abs(running)) + 1e-3, (i, got[i], running)


def test_the_backend_says_what_it_is():
    with scankit.load() as b:
        assert b.ops == {"prefix_sum": (1, False)}
        assert b.info()["backend"] == "scan"
        assert "decision" in b.trace.text() or b.trace.decision_reason


def test_unknown_op_names_the_ones_it_has():
    with scankit.load() as b, pytest.raises(cuplug.UnknownOpError, match="prefix_sum"):
        b.run("add", array.array("f", [1.0]), array.array("f", [1.0]))


def test_doctor_knows_the_backend(tmp_path):
    # Run outside the project: `python -m` puts the working directory first on sys.path.
    proc = subprocess.run(
        [sys.executable, "-m", "cuplug", "doctor", "--json", "--backend", "scan"],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    )
    doc = json.loads(proc.stdout)
    assert doc["decision"]["backend"] == "scan" and doc["loaded"]["ok"], doc
