"""The benchmark suite's scenarios, in the order a run measures them (start costs first, on an idle device).

Each module ends with ``SCENARIO = suite.scenario.Scenario(...)``; importing one imports no GPU library.
"""

from __future__ import annotations

import importlib

from suite.scenario import Scenario

MODULES = (
    "decision",
    "cold_start",
    "per_call",
    "alloc_vs_out",
    "graphs",
    "torch_compile",
    "bandwidth",
    "sum_vs_torch",
    "host_path",
)


def all_scenarios() -> dict[str, Scenario]:
    """name -> scenario, in run order."""
    found = [importlib.import_module(f"scenarios.{m}").SCENARIO for m in MODULES]
    return {s.name: s for s in found}
