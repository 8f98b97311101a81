"""scankit's own tests: they run against the installed package (CPU or GPU)."""

from __future__ import annotations

import array
import json
import subprocess
import sys

import pytest
import scankit

import cuplug
import cuplug.contract.dtypes


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
        assert set(b.ops) == {"prefix_sum", "segment_sum"}
        assert [r.multiple_of for r in b.ops["segment_sum"].size_rules] == [256]
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


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_segment_sum_from_float16_and_float32(dtype):
    from cuplug.runtime.hostbuf import HostBuffer  # cuplug's own host array: float16 without NumPy

    n, segment = 3 * 4096, 4096
    values = [float(i % 7 - 3) for i in range(n)]  # small integers: every order sums them exactly
    x = HostBuffer(cuplug.contract.dtypes.BY_NAME[dtype], (n,))
    x.fill(values)
    got = scankit.segment_sum(x, segment)
    assert list(got) == [sum(values[k * segment : (k + 1) * segment]) for k in range(3)]


def test_segment_sum_size_rule_is_checked_before_the_call():
    with pytest.raises(
        cuplug.InvalidInputError, match=r"segment_sum: x has 1000 elements; it must have a multiple of 256"
    ):
        scankit.segment_sum(array.array("f", [1.0] * 1000), 256)


def test_segment_sum_reports_its_own_message():
    with pytest.raises(
        cuplug.InvalidInputError, match=r"segment must be a positive multiple of 256 dividing n=1024, got 300"
    ):
        scankit.segment_sum(array.array("f", [1.0] * 1024), 300)
