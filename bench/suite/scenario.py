"""What a scenario declares (its name, needs, anchors, targets) and what its measurement hands back.

A scenario module of bench/scenarios/ ends with ``SCENARIO = Scenario(...)``. Its ``measure(quick)`` runs in a
fresh process of its own (the runner's child) and returns a ``Measured``: summaries (suite.stats) of its anchors
and results, keyed by name; the runner turns the targets into ratios, met or missed (suite.targets).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

RUNS_ON = {
    "gpu": "needs a CUDA GPU",
    "cpu": "CPU only (the GPU machine runs it too, but it measures nothing of the GPU)",
    "both": "the CUDA paths where a GPU is, else the CPU twin",
}
HOW = {  # how a target's value is made from its result and anchor summaries (their medians)
    "ratio": "result / anchor",
    "speedup": "anchor / result (times: > 1 is faster than the anchor)",
    "value": "the result itself",
}


class Skip(Exception):
    """The scenario cannot run here; the message says why and what would make it run."""


@dataclasses.dataclass(frozen=True)
class Target:
    name: str  # what the row is about, as the table and the plot show it
    result: str  # a key of the measured results (or anchors)
    anchor: str | None  # a key of the measured anchors (or results); None with how="value" and no anchor
    how: str  # a key of HOW
    unit: str  # of the value: "x" for ratios, else the results' unit
    bound: tuple[str, float] | None = None  # ("<=", 1.10) or (">=", 0.97); None: reported, no target
    source: str = ""  # where the target comes from (an issue), or why it is only reported

    def __post_init__(self) -> None:
        if self.how not in HOW:
            raise ValueError(f"target {self.name!r}: how={self.how!r}; choose from {sorted(HOW)}")
        if self.bound is not None and self.bound[0] not in ("<=", ">="):
            raise ValueError(f"target {self.name!r}: bound {self.bound!r} must start with '<=' or '>='")


@dataclasses.dataclass
class Measured:
    anchors: dict[str, dict[str, Any]]  # name -> summary (suite.stats.summary) and "what"
    results: dict[str, dict[str, Any]]
    details: dict[str, Any] = dataclasses.field(default_factory=dict)  # what explains the figures

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Scenario:
    name: str  # the command-line name
    what: str  # one line: what is measured
    group: str  # the plot's panel
    runs_on: str  # a key of RUNS_ON
    needs: tuple[str, ...]  # keys of suite.needs.NEEDS, checked before the scenario's process starts
    anchors: dict[str, str]  # anchor -> what it is (the measured ones are in the record)
    targets: tuple[Target, ...]
    measure: Callable[[bool], Measured]
    timeout_s: int = 300  # the scenario's process is stopped after this long (an error record says so)

    def __post_init__(self) -> None:
        if self.runs_on not in RUNS_ON:
            raise ValueError(f"scenario {self.name}: runs_on={self.runs_on!r}; choose from {sorted(RUNS_ON)}")
