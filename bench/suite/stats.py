"""One summary shape for every measurement: median with its spread (IQR and min/max) over the repeats."""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import Any

KEEP_SAMPLES = 64  # up to this many samples are kept in the record beside their summary


def tidy(x: float) -> float:
    """Six significant digits: enough for any figure here, short enough to read in the JSON."""
    return float(f"{x:.6g}")


def summary(samples: Iterable[float], unit: str) -> dict[str, Any]:
    xs = sorted(float(x) for x in samples)
    if not xs:
        raise ValueError("summary of no samples: the measurement produced nothing")
    q1, _, q3 = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else (xs[0], xs[0], xs[0])
    out: dict[str, Any] = {
        "unit": unit,
        "median": tidy(statistics.median(xs)),
        "q1": tidy(q1),
        "q3": tidy(q3),
        "min": tidy(xs[0]),
        "max": tidy(xs[-1]),
        "n": len(xs),
    }
    if len(xs) <= KEEP_SAMPLES:
        out["samples"] = [tidy(x) for x in xs]
    return out


def from_pytest_benchmark(stats: dict[str, Any], unit: str = "us") -> dict[str, Any]:
    """pytest-benchmark's per-case stats (seconds) as a summary; its own median, quartiles and extremes."""
    scale = {"us": 1e6, "ms": 1e3, "s": 1.0}[unit]
    return {
        "unit": unit,
        "median": tidy(stats["median"] * scale),
        "q1": tidy(stats["q1"] * scale),
        "q3": tidy(stats["q3"] * scale),
        "min": tidy(stats["min"] * scale),
        "max": tidy(stats["max"] * scale),
        "n": stats["rounds"],
    }


def scaled(s: dict[str, Any], factor: float, unit: str) -> dict[str, Any]:
    """The same summary times a positive ``factor`` (e.g. per call from per replay of 100 calls)."""
    keys = ("median", "q1", "q3", "min", "max")
    out = {**s, "unit": unit, **{k: tidy(s[k] * factor) for k in keys}}
    if "samples" in s:
        out["samples"] = [tidy(x * factor) for x in s["samples"]]
    return out
