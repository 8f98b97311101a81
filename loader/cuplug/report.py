"""The human-readable diagnostic table of a decision trace (reference article format)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import select

if TYPE_CHECKING:
    from .loading import Trace

TAG = "[backend-cuda]"


def _row(key: str, value: object) -> str:
    return f"{TAG} {key:<20}: {value}"


def format_trace(trace: Trace) -> str:
    p = trace.probe
    lines = []
    if p is None:
        lines.append(_row("driver", "not probed (" + trace.decision_reason + ")"))
    else:
        lines.append(_row("driver", p.driver_path or ("not found" if not p.driver_found else "?")))
        lines.append(_row("driver version", p.driver_version_str or "unknown"))
        if p.code != "ok":
            lines.append(_row("driver status", f"{p.code}: {p.reason}"))
        for d in p.devices:
            lines.append(
                _row(
                    f"device {d.index}", f"{d.name}, CC {d.capability_str}, {d.memory_bytes / 2**30:.1f} GiB, {d.uuid}"
                )
            )
    runtimes = sorted({a.cuda_version for pkg in trace.packages for a in pkg.artifacts})
    lines.append(_row("runtime version", ", ".join(runtimes) or "no CUDA backend installed"))
    lines.append(_row("backend ABI", "v1"))
    caps = sorted(
        {t for pkg in trace.packages for a in pkg.artifacts for t in a.sass}, key=lambda t: select._arch(t)[:2]
    )
    lines.append(
        _row("supported capability", ", ".join(f"{select._arch(t)[0]}.{select._arch(t)[1]}" for t in caps) or "-")
    )
    for pkg in trace.packages:
        lines.append(_row(f"package {pkg.cuda}", f"{pkg.directory}" + (f" ({pkg.error})" if pkg.error else "")))
    lines.append(f"{TAG} candidates:")
    for c in trace.candidates:
        mark = "accepted" if c.accepted else "rejected"
        lines.append(f"  {c.label:<16} {mark:<8} {c.code:<22} {c.reason}")
    if trace.env:
        lines.append(f"{TAG} environment:")
        for k, v in trace.env.items():
            lines.append(f"  {k}={v}")
    if trace.attempts:
        lines.append(f"{TAG} load attempts:")
        for a in trace.attempts:
            label = f"{a.cuda}/{a.variant}" if a.cuda else a.variant
            lines.append(f"  {label:<16} {a.code:<22} {a.reason}")
    lines.append(_row("decision", f"{trace.decision.label} ({trace.decision_code}: {trace.decision_reason})"))
    return "\n".join(lines)
