"""A target's value from the measured medians, and whether it is met: one rule for every scenario."""

from __future__ import annotations

import operator
from typing import Any

from suite.scenario import HOW, Target
from suite.stats import tidy

COMBINE = {
    "ratio": lambda result, anchor: result / anchor,
    "speedup": lambda result, anchor: anchor / result,
    "value": lambda result, anchor: result,
}
COMPARE = {"<=": operator.le, ">=": operator.ge}


def evaluate(target: Target, measured: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One row of the record's "targets": the value, the bound and "met" (True/False; None when only reported
    or when a case it needs was not measured here: "verdict" says which, "missing" names the cases)."""
    row: dict[str, Any] = {
        "name": target.name,
        "result": target.result,
        "anchor": target.anchor,
        "how": HOW[target.how],
        "unit": target.unit,
        "bound": None if target.bound is None else f"{target.bound[0]} {target.bound[1]:g}",
        "source": target.source,
    }
    result = measured.get(target.result)
    anchor = measured.get(target.anchor) if target.anchor else None
    missing = [k for k, v in ((target.result, result), (target.anchor, anchor)) if k and v is None]
    if missing:
        return {**row, "value": None, "met": None, "verdict": "not measured", "missing": missing}
    assert result is not None
    value = COMBINE[target.how](result["median"], anchor["median"] if anchor else None)
    row["value"] = tidy(value)
    if anchor is not None:
        row["anchor_median"] = anchor["median"]
    if target.bound is None:
        return {**row, "met": None, "verdict": "reported"}
    met = COMPARE[target.bound[0]](value, target.bound[1])
    return {**row, "met": met, "verdict": "met" if met else "missed"}
