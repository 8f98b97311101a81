"""The trace of one decision and load: the facts, the :class:`~.select.Decision`, the load attempts.

One type with its two forms: :meth:`Trace.text` (the diagnostic table of the reference
article, what ``cuplug doctor`` prints) and :meth:`Trace.to_json` (the object of
``cuplug doctor --json``, schema ``cuplug.doctor/1``, less the tool's own ``variants``
and ``loaded``).

What the trace says was decided (``decision``, ``decision_code``, ``decision_reason``)
follows from the decision and the attempts alone: before a load, the decision's own
choice; after it, the candidate that loaded, or the CPU with the first failure's reason.

Everything shown in the text that came from outside (device names from the driver,
reasons that quote manifests, paths, environment values) goes through
:func:`printable`: a newline, an escape sequence or any other non-printable character is
shown escaped, so a device name cannot move the cursor, recolour the terminal or forge
a line of the report. The JSON stays exact (JSON escapes what it must).
"""

from __future__ import annotations

from ..contract import reasons, targets
from ..contract.cuda import parse_target
from ..contract.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from .discovery import Discovery
    from .driver import ProbeResult
    from .policy import Policy
    from .select import Candidate, Decision

DOCTOR_SCHEMA = "cuplug.doctor/1"
TAG = "[backend-cuda]"  # cuplug's own backend, as DESIGN.md's doctor example shows it


class Attempt(Record):
    """One candidate tried by load(): ``ok`` and "loaded", or the code and reason it failed with."""

    __slots__ = ("variant", "cuda", "code", "reason")
    variant: str
    cuda: str | None
    code: str
    reason: str

    @property
    def label(self) -> str:
        return f"{self.cuda}/{self.variant}" if self.cuda else self.variant

    def to_json(self) -> dict[str, Any]:
        return self._asdict()


class Trace:
    """Everything that went into the decision, for ``explain()``, ``Backend.trace`` and ``cuplug doctor``."""

    __slots__ = (
        "attempts",
        "backend",
        "decided",
        "env",
        "found",
        "jitlink",
        "linkers",
        "loaded",
        "policy",
        "probe",
        "selftests",
        "served",
    )

    def __init__(
        self,
        backend: str,
        policy: Policy,
        probe: ProbeResult | None,
        found: Discovery,
        decided: Decision,
        env: dict[str, str],
        linkers: dict[int, Any] | None = None,
        jitlink: dict[int, Any] | None = None,
    ) -> None:
        self.backend = backend
        self.policy = policy
        self.probe = probe  # None: the driver was not asked (CUDA disabled, CUPLUG_BACKEND=cpu)
        self.found = found
        self.decided = decided
        self.env = env
        self.linkers = linkers or {}  # CUDA major -> the jitlink.Found the decision counted on (the one that links)
        self.jitlink = jitlink or {}  # CUDA major -> what the decision was told of it (select.judge's `jitlink`)
        self.attempts: list[Attempt] = []
        self.selftests: list[Any] = []  # selftest.Result of each CUDA candidate that loaded
        self.served: Candidate | None = None  # the candidate that loaded
        self.loaded: Any = None  # the Backend it gave

    # ---- what was decided, from the decision and the attempts ------------------------------------

    def _outcome(self) -> tuple[Candidate, str, str]:
        d = self.decided
        served = self.served
        if served is not None and served.cuda is not None:
            return served, served.code, served.reason
        failed = next((a for a in self.attempts if a.cuda is not None), None)  # CUDA attempts before the CPU failed
        if failed is not None:
            return d.cpu, failed.code, f"{failed.label}: {failed.reason}"
        if served is not None:
            return d.cpu, d.code, d.reason
        return d.chosen, d.code, d.reason

    @property
    def decision(self) -> Candidate:
        return self._outcome()[0]

    @property
    def decision_code(self) -> str:
        return self._outcome()[1]

    @property
    def decision_reason(self) -> str:
        return self._outcome()[2]

    @property
    def fell_through(self) -> Attempt | None:
        """The forced candidate's failed attempt, when CUPLUG_BACKEND forced one and another served."""
        forced = self.decided.forced
        if forced is None or forced.artifact is None:
            return None
        failed = next((a for a in self.attempts if (a.cuda, a.variant) == (forced.cuda, forced.variant)), None)
        return failed if failed is not None and failed.code != reasons.OK else None

    def per_device(self) -> list[tuple[Any, Decision]]:
        """(device, the decision for it) for every device the driver shows: the same pure function over the same
        facts, once per device (``load(device=i)`` / CUPLUG_DEVICE=i takes that one)."""
        from . import select

        p = self.probe
        if p is None:
            return []
        return [
            (d, select.decide(self.backend, self.policy._replace(device=d.index), p, self.found, self.jitlink))
            for d in p.devices
        ]

    # ---- the facts, as the reports name them -------------------------------------------------------

    @property
    def candidates(self) -> tuple[Candidate, ...]:
        return self.decided.candidates

    @property
    def packages(self) -> tuple[Any, ...]:
        return self.found.packages

    @property
    def refused(self) -> tuple[Any, ...]:
        return self.found.refused

    @property
    def cpu(self) -> Any:
        return self.found.cpu

    @property
    def cpu_problem(self) -> str | None:
        return self.found.cpu_problem

    def __str__(self) -> str:
        return self.text()

    def __repr__(self) -> str:
        return f"<Trace {self.backend}: {self.decision.label} ({self.decision_code})>"

    # ---- JSON ------------------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        from .. import __version__

        p = self.probe
        decision, code, reason = self._outcome()
        cpu = self.cpu
        return {
            "schema": DOCTOR_SCHEMA,
            "cuplug_version": __version__,
            "backend": self.backend,
            "driver": None
            if p is None
            else {
                "found": p.driver_found,
                "path": p.driver_path,
                "version": p.driver_version,
                "code": p.code,
                "reason": p.reason,
                "visible_devices": p.visible_devices,
            },
            "devices": [
                {
                    "index": d.index,
                    "name": d.name,
                    "capability": d.capability_str,
                    "memory_bytes": d.memory_bytes,
                    "uuid": d.uuid,
                    "problem": d.problem,
                }
                for d in (p.devices if p else ())
            ],
            "packages": [
                {
                    "cuda": pk.cuda,
                    "path": pk.directory,
                    "artifacts": len(pk.artifacts),
                    "error": pk.error,
                    "distribution": pk.distribution,
                    "problems": list(pk.problems),
                }
                for pk in self.packages
            ],
            "refused": [r.to_json() for r in self.refused],
            "cpu_backend": {"path": cpu.path if cpu else None, "problem": self.cpu_problem},
            "candidates": [
                {
                    "backend": self.backend,
                    "variant": c.variant,
                    "cuda": c.cuda,
                    "accepted": c.accepted,
                    "code": c.code,
                    "reason": c.reason,
                }
                for c in self.candidates
            ],
            "decision": {
                "backend": self.backend,
                "variant": decision.variant,
                "cuda": decision.cuda,
                "code": code,
                "reason": reason,
            },
            "env": self.env,
            "attempts": [a.to_json() for a in self.attempts],
            "selftests": [r.as_json() for r in self.selftests],
            "per_device": [
                {
                    "index": d.index,
                    "variant": c.chosen.variant,
                    "cuda": c.chosen.cuda,
                    "code": c.code,
                    "reason": c.reason,
                }
                for d, c in self.per_device()
            ],
        }

    # ---- text ------------------------------------------------------------------------------------

    def text(self) -> str:
        p = self.probe
        label = tag(self.backend)
        decision, code, reason = self._outcome()
        lines: list[str] = []

        def row(key: str, value: object) -> None:  # one line of this backend's report
            lines.append(f"{label} {printable(key):<20}: {printable(value)}")

        if p is None:
            row("driver", "not probed (" + reason + ")")
        else:
            row("driver", p.driver_path or ("not found" if not p.driver_found else "?"))
            row("driver version", p.driver_version_str or "unknown")
            if p.code != reasons.OK:
                row("driver status", f"{p.code}: {p.reason}")
            for d in p.devices:
                row(f"device {d.index}", _device_line(d))
        artifacts = [a for pkg in self.packages for a in pkg.artifacts]
        row("runtime version", ", ".join(sorted({a.cuda_version for a in artifacts})) or "no CUDA backend installed")
        from ..contract.abi import ABI_VERSION  # here: the decision itself never needs the ABI's ctypes types

        others = sorted({a.abi for a in artifacts} - {ABI_VERSION})  # what this loader speaks, and any other
        differ = f" (installed artifacts also: {', '.join(f'v{v}' for v in others)})" if others else ""
        row("backend ABI", f"v{ABI_VERSION}{differ}")
        # what the installed device code serves, in the words of the contract's rules (contract/targets.py)
        sass = sorted({t for a in artifacts for t in a.sass}, key=parse_target)
        ptx = sorted({t for a in artifacts for t in a.ptx}, key=parse_target)[:1]  # the lowest serves most
        lto = sorted({t for a in artifacts for t in a.lto}, key=parse_target)[:1]
        row("supported capability", targets.describe([*sass, *ptx, *lto]) or "-")
        for pkg in self.packages:
            row(f"package {pkg.cuda}", pkg.directory + (f" ({pkg.error})" if pkg.error else ""))
        for r in self.refused:
            row("not trusted", f"{r.distribution} ({r.registration}): {r.reason}")
        if self.cpu is None and self.cpu_problem:
            row("cpu backend", f"unavailable: {self.cpu_problem}")
        lines.append(f"{label} candidates:")
        for c in self.candidates:
            mark = "accepted" if c.accepted else "rejected"
            lines.append(f"  {printable(c.label):<16} {mark:<8} {c.code:<22} {printable(c.reason)}")
        if self.env:
            lines.append(f"{label} environment:")
            lines.extend(f"  {printable(k)}={printable(v)}" for k, v in self.env.items())
        if self.attempts:
            lines.append(f"{label} load attempts:")
            lines.extend(f"  {printable(a.label):<16} {a.code:<22} {printable(a.reason)}" for a in self.attempts)
        for r in self.selftests:
            row("self-test", printable(r.text()))
        row("decision", f"{decision.label} ({code}: {reason})")
        others = self.per_device()
        if len(others) > 1:  # several GPUs: each one's decision (the line above is CUPLUG_DEVICE's)
            for d, dec in others:
                cc = d.capability_str or "?"
                row(
                    f"decision device {d.index}",
                    f"{dec.chosen.label} for CC {cc} ({dec.code}: {printable(dec.reason)})",
                )
        return "\n".join(lines)


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


def _device_line(d: Any) -> str:
    parts = [
        d.name if d.name is not None else "name unknown",
        f"CC {d.capability_str}" if d.capability_str else "CC unknown",
        f"{d.memory_bytes / 2**30:.1f} GiB" if d.memory_bytes is not None else "memory unknown",
        d.uuid or "UUID unknown",
    ]
    return ", ".join(parts) + (f" ({d.problem})" if d.problem else "")
