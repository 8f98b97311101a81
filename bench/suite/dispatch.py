"""The cases of bench/bench_dispatch.py (and its companions) as a scenario's measurement.

bench/dispatch_report.py owns the table of issue 30's targets and computes each case's ratio to its anchor;
this module reads that table and those rows (by import, not a copy) and says them in the suite's terms:
anchors, results (summaries), targets. A companion file's cases come with a table of the same shape.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from suite import pytest_bench
from suite.scenario import Measured, Target
from suite.stats import scaled

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import dispatch_report

# (group, path) -> (the anchor's path in the same group, the bound or None, "us" (a bound on the time) or
# "ratio" (on anchor time / this time)): dispatch_report.TARGETS's shape.
Table = dict[tuple[str, str], tuple[str, float | None, str]]


def _target(group: str, path: str, spec: tuple[str, float | None, str], source: str) -> Target:
    anchor, bound, kind = spec
    reported = "reported, no target"
    if kind == "us":
        return Target(
            f"{path} ({group})", f"{group}: {path}", f"{group}: {anchor}", "value", "us",
            None if bound is None else ("<=", bound), source if bound is not None else reported,
        )  # fmt: skip
    return Target(
        f"{path} vs {anchor} ({group})", f"{group}: {path}", f"{group}: {anchor}", "speedup", "x",
        None if bound is None else (">=", bound), source if bound is not None else reported,
    )  # fmt: skip


def _table(groups: tuple[str, ...], extra: Table | None) -> Table:
    return {k: v for k, v in {**dispatch_report.TARGETS, **(extra or {})}.items() if k[0] in groups}


def targets(groups: tuple[str, ...], extra: Table | None = None, source: str = "issue 30") -> tuple[Target, ...]:
    """The targets of ``groups``: dispatch_report.TARGETS's rows (and ``extra``'s), in the suite's terms."""
    return tuple(_target(group, path, spec, source) for (group, path), spec in _table(groups, extra).items())


def measured(doc: dict[str, Any], cmd: list[str], groups: tuple[str, ...], extra: Table | None = None) -> Measured:
    """Anchors and results of ``groups`` from pytest-benchmark's document (an anchor: a path some row of the
    table compares with). A case whose extra_info has ``calls_per_replay`` is summarised per call."""
    anchor_keys = {f"{group}: {spec[0]}" for (group, _), spec in _table(groups, extra).items()}
    anchors, results = {}, {}
    for key, s in pytest_bench.summaries(doc).items():
        if key.split(": ", 1)[0] not in groups:
            continue
        calls = s.get("extra_info", {}).get("calls_per_replay")
        if calls:
            s = {**scaled(s, 1 / calls, "us"), "what": f"per call: one replay of {calls} captured calls / {calls}"}
        (anchors if key in anchor_keys else results)[key] = s
    rows = [r for r in dispatch_report.records(doc) if r["group"] in groups]  # its own ratios and verdicts
    details = {**pytest_bench.harness(doc, cmd), "dispatch_report_records": rows}
    return Measured(anchors, results, details)
