"""``cuplug warmup``: JIT the PTX variant for this GPU once, into the CUDA compute cache.

The driver compiles PTX at the first launch in a process and keeps the result
in its compute cache (``$CUDA_CACHE_PATH``, default ``~/.nv/ComputeCache``)
unless ``CUDA_CACHE_DISABLE=1``; later processes then skip the compile. Warmup
forces each accepted ``ptx`` artifact in turn (``CUPLUG_BACKEND=<cuda>:ptx``),
runs every op once, and reports the first and second launch times and what the
cache gained.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from ..contract import reasons
from ..contract.errors import CuplugError
from ..runtime import loading
from ..runtime.select import install_hint

EXIT_CACHE_UNUSABLE = 1


def cache_dir(env: dict[str, str] | None = None) -> Path:
    env = dict(os.environ) if env is None else env
    return Path(env.get("CUDA_CACHE_PATH") or Path.home() / ".nv" / "ComputeCache")


def cache_problem(env: dict[str, str] | None = None) -> str | None:
    """Why the driver cannot keep a JIT result, or None when it can."""
    env = dict(os.environ) if env is None else env
    if env.get("CUDA_CACHE_DISABLE", "0").strip() not in ("", "0"):
        return "CUDA_CACHE_DISABLE is set: the driver compiles the PTX again in every process"
    d = cache_dir(env)
    # Try a real write: os.access() says yes to root even on read-only mounts or /proc.
    try:
        d.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=d):
            pass
    except OSError as e:
        return (
            f"the JIT cache {d} is not writable ({e.strerror or e}): the driver compiles the PTX again in every process"
        )
    return None


def _cache_bytes(d: Path) -> int:
    return sum(p.stat().st_size for p in d.rglob("*") if p.is_file()) if d.is_dir() else 0


def _every_op(backend: Any) -> float:
    """Every op once, on the sample its signature declares (sizes that fit its size rules)."""
    from ..runtime import samples

    t0 = time.perf_counter()
    for sig in backend.ops.values():
        samples.run_sample(backend, sig)
    return (time.perf_counter() - t0) * 1e3


@dataclasses.dataclass
class WarmResult:
    label: str
    device: str | None
    first_ms: float  # load (create + smoke launch, where the JIT happens) + every op once
    second_ms: float  # every op again, in the same process
    error: str | None = None


def warm(env: dict[str, str] | None = None, backend: str = "vector") -> tuple[list[WarmResult], str | None, str | None]:
    """(results, why nothing could be warmed, decision code) for every accepted ptx artifact."""
    env = dict(os.environ) if env is None else env
    trace = loading.explain(backend, env=env)
    if trace.probe is None or trace.probe.code != reasons.OK:
        why = trace.decision_reason if trace.probe is None else trace.probe.reason
        return [], f"no GPU to compile for: {why}", trace.decision_code if trace.probe is None else trace.probe.code
    ptx = [c for c in trace.candidates if c.variant == "ptx" and c.accepted]
    if not ptx:
        rejected = [f"{c.label}: {c.reason}" for c in trace.candidates if c.variant == "ptx"]
        why = "; ".join(rejected) or f"no ptx artifact installed ({install_hint(trace.found)})"
        code = reasons.NO_BACKEND_INSTALLED if not rejected else reasons.NO_COMPATIBLE_ARTIFACT
        return [], f"no usable PTX variant: {why}", code
    results = []
    for cand in ptx:
        forced = {**env, "CUPLUG_BACKEND": f"{cand.cuda}:ptx", "CUPLUG_REQUIRE_CUDA": "1"}
        t0 = time.perf_counter()
        try:
            with loading.load(trace.backend, env=forced) as loaded:
                first = (time.perf_counter() - t0) * 1e3 + _every_op(loaded)
                second = _every_op(loaded)
                device = loaded.info().get("device", {}).get("name")
            results.append(WarmResult(cand.label, device, round(first, 2), round(second, 3)))
        except CuplugError as exc:
            results.append(WarmResult(cand.label, None, 0.0, 0.0, str(exc)))
    return results, None, reasons.OK


def run(env: dict[str, str] | None = None, backend: str = "vector") -> tuple[dict[str, Any], int]:
    """The warmup report and its exit code."""
    env = dict(os.environ) if env is None else env
    d = cache_dir(env)
    before = _cache_bytes(d)
    results, nothing, code = warm(env, backend)
    report: dict[str, Any] = {
        "cache_dir": str(d),
        "cache_problem": cache_problem(env),
        "results": [dataclasses.asdict(r) for r in results],
        "error": nothing,
        "code": code,
    }
    report["cache_bytes_added"] = _cache_bytes(d) - before
    if nothing is not None:
        return report, reasons.EXIT_CODES.get(code or "", 14)
    if any(r.error for r in results):
        return report, reasons.EXIT_CODES[reasons.LOAD_FAILED]
    return report, EXIT_CACHE_UNUSABLE if report["cache_problem"] else 0


def format_report(report: dict[str, Any]) -> str:
    if report["error"]:
        return f"cuplug warmup: {report['error']}"
    lines = []
    for r in report["results"]:
        if r["error"]:
            lines.append(f"cuplug warmup: {r['label']} FAILED: {r['error']}")
        else:
            lines.append(
                f"cuplug warmup: {r['label']} on {r['device']}: JIT + first launch {r['first_ms']:.1f} ms, "
                f"second launch {r['second_ms']:.3f} ms"
            )
    if report["cache_problem"]:
        lines.append(
            f"cuplug warmup: nothing cached: {report['cache_problem']} (results stay correct, first launches stay slow)"
        )
    else:
        added = report["cache_bytes_added"]
        lines.append(
            f"cuplug warmup: JIT cache {report['cache_dir']}: +{added / 1024:.0f} KiB"
            + (" (already held this PTX)" if added == 0 else "")
        )
    return "\n".join(lines)
