"""The numerical self-test of a CUDA candidate (issue 33): before load() accepts it, each op's sample (derived from
its signature: runtime/samples.py) runs on the candidate and on the CPU twin, and the results must agree (integers
bit for bit, floats within 1e-3 of the largest magnitude). A candidate that loads but disagrees is rejected with
``self-test-mismatch``, naming the op, the element and both values, and the next candidate is tried.

``CUPLUG_SELFTEST``: ``1`` (the default) remembers a pass on disk, keyed by the device's UUID, the driver's version,
the artifact's sha256 and this cuplug's version (a new GPU, driver, build or cuplug tests again); ``always`` tests
on every load; ``0`` never. A pass is a file ``<cache>/selftest/<key>``; nothing else is kept.
"""

from __future__ import annotations

import hashlib
import os
import time

from .. import __version__
from ..contract.cache import cache_root

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

VERSION = __version__  # cuplug's, a part of the key (the samples or the comparison may change with it)


class Result:
    """What the self-test did for one candidate: ``outcome`` "passed", "passed (remembered)", "mismatch",
    "skipped"; ``why`` (the mismatch, or why it was skipped); ``ms`` (its whole time: loading the CPU twin, when
    this test loaded it, and the samples; or the look-up of a remembered pass; 0 when skipped); ``twin_ms`` (of
    that, loading the twin); ``ops_ms`` (op -> [the twin's sample ms, the candidate's], where they ran)."""

    __slots__ = ("label", "ms", "ops_ms", "outcome", "twin_ms", "why")

    def __init__(self, label: str, outcome: str, why: str = "", ms: float = 0.0) -> None:
        self.label, self.outcome, self.why, self.ms = label, outcome, why, ms
        self.twin_ms = 0.0
        self.ops_ms: dict[str, list[float]] = {}

    def text(self) -> str:
        took = f" in {self.ms:.2f} ms" if self.ms else ""
        return f"{self.label}: {self.outcome}{took}" + (f" ({self.why})" if self.why else "")

    def as_json(self) -> dict[str, Any]:
        ops = {op: [round(t, 3) for t in ts] for op, ts in self.ops_ms.items()}
        return (
            {"candidate": self.label, "outcome": self.outcome, "why": self.why or None, "ms": round(self.ms, 3)}
            | ({"twin_ms": round(self.twin_ms, 3)} if self.twin_ms else {})
            | ({"ops_ms": ops} if ops else {})
        )


def key(uuid: str | None, driver: int | None, sha256: str | None) -> str | None:
    """The pass's name: None when a fact is unknown (nothing is remembered then)."""
    if not (uuid and driver and sha256):
        return None
    return hashlib.sha256(f"{uuid}|{driver}|{sha256}|{VERSION}".encode()).hexdigest()[:32]


def _marker(k: str) -> str:
    return os.path.join(cache_root(), "selftest", k)


def remembered(k: str | None) -> bool:
    return k is not None and os.path.isfile(_marker(k))


def remember(k: str | None) -> None:
    if k is None:
        return
    path = _marker(k)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + f".{os.getpid()}", "w") as fh:  # atomic: a concurrent load sees a whole marker or none
            fh.write("passed\n")
        os.replace(path + f".{os.getpid()}", path)
    except OSError:  # a read-only cache: the test runs again next time, nothing else changes
        pass


def compare(candidate: Any, twin: Any, times: dict[str, list[float]] | None = None) -> tuple[str | None, list[str]]:
    """Every op of ``candidate`` on its sample against ``twin``'s result: (the first disagreement or None, the ops
    not compared); ``times`` gets each op's [twin ms, candidate ms] (where the self-test's time goes). The twin
    runs first: a sample the twin cannot run says nothing about the candidate (a fault of the sampler or of the
    twin), so that op is left out and named, never held against the candidate; one the twin runs and the
    candidate cannot is the candidate's failure."""
    from . import samples

    inconclusive: list[str] = []
    for sig in candidate.ops.values():
        twin_sig = twin.ops.get(sig.name)
        if twin_sig is None:
            return f"{sig.name}: the CPU twin has no such op", inconclusive
        t0 = time.perf_counter()
        try:
            want = samples.run_sample(twin, twin_sig)
        except Exception as exc:
            inconclusive.append(f"{sig.name} (the CPU twin's sample failed: {type(exc).__name__}: {exc})")
            continue
        t1 = time.perf_counter()
        try:
            got = samples.run_sample(candidate, sig)
        except Exception as exc:
            return f"{sig.name}: the sample failed here but not on the CPU twin: {type(exc).__name__}: {exc}", []
        if times is not None:
            times[sig.name] = [(t1 - t0) * 1e3, (time.perf_counter() - t1) * 1e3]
        why = samples.compare(got, want)
        if why:
            return f"{sig.name}: {why}", inconclusive
    return None, inconclusive


def run(candidate: Any, twin_of: Any, label: str, k: str | None, mode: str) -> Result:
    """The self-test of ``candidate``; ``twin_of()`` gives the CPU twin (or None: nothing to compare with) and the
    ms its load took now (0 when an earlier candidate's test loaded it)."""
    if mode == "0":
        return Result(label, "skipped", "CUPLUG_SELFTEST=0")
    t0 = time.perf_counter()
    if mode != "always" and remembered(k):  # its cost is the look-up: timed too
        return Result(label, "passed (remembered)", "", (time.perf_counter() - t0) * 1e3)
    twin, twin_ms = twin_of()  # loaded once per load(), by the first candidate tested (0 ms for the others)
    if twin is None:
        return Result(label, "skipped", "no CPU twin to compare with")
    times: dict[str, list[float]] = {}
    why, inconclusive = compare(candidate, twin, times)
    ms = (time.perf_counter() - t0) * 1e3
    if why:
        result = Result(label, "mismatch", why, ms)
    elif inconclusive:  # not remembered: a fixed sampler or twin compares them next time
        result = Result(label, "passed", "not compared: " + "; ".join(inconclusive), ms)
    else:
        remember(k)
        result = Result(label, "passed", "", ms)
    result.ops_ms, result.twin_ms = times, twin_ms
    return result
