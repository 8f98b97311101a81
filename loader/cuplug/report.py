"""The human-readable diagnostic table of a decision trace (reference article format).

Everything shown here that came from outside (device names from the driver, reasons that
quote manifests, paths, environment values) goes through :func:`printable`: a newline, an
escape sequence or any other non-printable character is shown escaped, so a device name
cannot move the cursor, recolour the terminal or forge a line of the report. ``--json``
output stays exact (JSON escapes what it must).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import select

if TYPE_CHECKING:
    from .loading import Trace

TAG = "[backend-cuda]"  # cuplug's own backend, as DESIGN.md's doctor example shows it


def tag(backend: str) -> str:
    """The label of a report's lines: it names the backend (``[scan-cuda]``); ``vector`` is cuplug's own."""
    return TAG if backend == "vector" else f"[{printable(backend)}-cuda]"


def printable(value: object) -> str:
    """``value`` as text with every non-printable character escaped (\\n, \\x1b, \\u2028, ...)."""
    text = str(value)
    if text.isprintable():
        return text
    out = []
    for ch in text:
        if ch.isprintable():
            out.append(ch)
        elif ch in "\n\r\t":
            out.append({"\n": "\\n", "\r": "\\r", "\t": "\\t"}[ch])
        elif ord(ch) < 0x100:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(f"\\u{ord(ch):04x}" if ord(ch) < 0x10000 else f"\\U{ord(ch):08x}")
    return "".join(out)


def _device_line(d: object) -> str:
    name = getattr(d, "name", None)
    cap = getattr(d, "capability_str", None)
    mem = getattr(d, "memory_bytes", None)
    parts = [
        name if name is not None else "name unknown",
        f"CC {cap}" if cap else "CC unknown",
        f"{mem / 2**30:.1f} GiB" if mem is not None else "memory unknown",
        getattr(d, "uuid", None) or "UUID unknown",
    ]
    problem = getattr(d, "problem", None)
    return ", ".join(parts) + (f" ({problem})" if problem else "")


def format_trace(trace: Trace) -> str:
    p = trace.probe
    lines: list[str] = []
    label = tag(trace.backend)

    def _row(key: str, value: object) -> str:  # one line of this backend's report
        return f"{label} {printable(key):<20}: {printable(value)}"

    if p is None:
        lines.append(_row("driver", "not probed (" + trace.decision_reason + ")"))
    else:
        lines.append(_row("driver", p.driver_path or ("not found" if not p.driver_found else "?")))
        lines.append(_row("driver version", p.driver_version_str or "unknown"))
        if p.code != "ok":
            lines.append(_row("driver status", f"{p.code}: {p.reason}"))
        for d in p.devices:
            lines.append(_row(f"device {d.index}", _device_line(d)))
    runtimes = sorted({a.cuda_version for pkg in trace.packages for a in pkg.artifacts})
    lines.append(_row("runtime version", ", ".join(runtimes) or "no CUDA backend installed"))
    from .abi import ABI_VERSION  # what this loader speaks; the artifacts' own versions if any differ

    others = sorted({a.abi for pkg in trace.packages for a in pkg.artifacts} - {ABI_VERSION})
    differ = f" (installed artifacts also: {', '.join(f'v{v}' for v in others)})" if others else ""
    lines.append(_row("backend ABI", f"v{ABI_VERSION}{differ}"))
    caps = sorted(
        {t for pkg in trace.packages for a in pkg.artifacts for t in a.sass}, key=lambda t: select._arch(t)[:2]
    )
    lines.append(
        _row("supported capability", ", ".join(f"{select._arch(t)[0]}.{select._arch(t)[1]}" for t in caps) or "-")
    )
    for pkg in trace.packages:
        lines.append(_row(f"package {pkg.cuda}", f"{pkg.directory}" + (f" ({pkg.error})" if pkg.error else "")))
    for r in trace.refused:
        lines.append(_row("not trusted", f"{r.distribution} ({r.registration}): {r.reason}"))
    if trace.cpu is None and trace.cpu_problem:
        lines.append(_row("cpu backend", f"unavailable: {trace.cpu_problem}"))
    lines.append(f"{label} candidates:")
    for c in trace.candidates:
        mark = "accepted" if c.accepted else "rejected"
        lines.append(f"  {printable(c.label):<16} {mark:<8} {c.code:<22} {printable(c.reason)}")
    if trace.env:
        lines.append(f"{label} environment:")
        for k, v in trace.env.items():
            lines.append(f"  {printable(k)}={printable(v)}")
    if trace.attempts:
        lines.append(f"{label} load attempts:")
        for a in trace.attempts:
            label = f"{a.cuda}/{a.variant}" if a.cuda else a.variant
            lines.append(f"  {printable(label):<16} {a.code:<22} {printable(a.reason)}")
    lines.append(_row("decision", f"{trace.decision.label} ({trace.decision_code}: {trace.decision_reason})"))
    return "\n".join(lines)
