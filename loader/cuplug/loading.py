"""The decision and the load: policy -> probe -> rank -> verify -> dlopen -> create -> ping.

``explain()`` stops before any dlopen; ``load()`` walks the accepted
candidates in order, records why each one failed, and ends at the CPU backend
(unless CUPLUG_REQUIRE_CUDA=1).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
from pathlib import Path
from typing import Any

from . import abi, driver, manifest, policy, reasons, select, verify
from .api import Backend
from .errors import ArtifactError, BackendNotAvailable

log = logging.getLogger("cuplug")
_load_lock = threading.Lock()
CPU_DIR = Path(__file__).resolve().parent / "_cpu"
# When every CUDA artifact is rejected, the decision names the most actionable reason.
_REJECTION_PRIORITY = (
    reasons.CAPABILITY_TOO_LOW,
    reasons.DRIVER_TOO_OLD,
    reasons.NO_COMPATIBLE_ARTIFACT,
    reasons.ARTIFACT_CORRUPT,
)


@dataclasses.dataclass
class Attempt:
    variant: str
    cuda: str | None
    code: str
    reason: str


@dataclasses.dataclass
class Trace:
    """Everything that went into the decision, for ``explain()`` and ``cuplug doctor``."""

    backend: str
    policy: policy.Policy
    probe: driver.ProbeResult | None
    packages: tuple[manifest.InstalledPackage, ...]
    candidates: list[select.Candidate]
    decision: select.Candidate
    decision_code: str
    decision_reason: str
    env: dict[str, str]
    attempts: list[Attempt] = dataclasses.field(default_factory=list)
    loaded: Backend | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "driver": None if self.probe is None else self.probe.to_json(),
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
                "variant": self.decision.variant,
                "cuda": self.decision.cuda,
                "code": self.decision_code,
                "reason": self.decision_reason,
            },
            "attempts": [dataclasses.asdict(a) for a in self.attempts],
            "env": self.env,
        }

    def __str__(self) -> str:
        return self.text()

    def text(self) -> str:
        from .report import format_trace

        return format_trace(self)


def cpu_library_path(backend: str) -> Path | None:
    """The CPU twin of `backend`: cuplug's own for "vector", else the one an installed package
    registers in the entry-point group ``cuplug.cpu_backends`` (name: the backend, value: the
    module whose directory holds ``libcuplug_<backend>_cpu.so``)."""
    if backend == "vector":
        return CPU_DIR / f"libcuplug_{backend}_cpu.so"
    return manifest.cpu_twin_path(backend)


def _device_facts(probe: driver.ProbeResult, index: int) -> tuple[driver.Device | None, tuple[str, str] | None]:
    if probe.code != reasons.OK:
        return None, (probe.code, probe.reason)
    if index >= len(probe.devices):
        return None, (reasons.NO_DEVICE, f"CUPLUG_DEVICE={index} but the driver shows {len(probe.devices)} device(s)")
    return probe.devices[index], None


def decide(backend: str = "vector", device: int | str | None = None, env: dict[str, str] | None = None) -> Trace:
    """The whole decision without loading anything (no dlopen of any candidate)."""
    pol = policy.from_env(env, device)
    env_report = policy.relevant_env(env)
    if pol.disable_cuda:
        cpu = select.cpu_candidate(reasons.DISABLED, f"{pol.disabled_by}=1: CUDA disabled, libcuda.so.1 not opened")
        return Trace(backend, pol, None, (), [cpu], cpu, reasons.DISABLED, cpu.reason, env_report)
    packages = manifest.installed_packages()
    artifacts = [a for p in packages for a in p.artifacts if a.backend == backend]
    probe = None if pol.forced == "cpu" else driver.probe()
    dev, problem = (None, None) if probe is None else _device_facts(probe, pol.device)
    unusable = [(p.cuda, f"{p.module}: {p.error}") for p in packages if p.error]  # manifests that could not be read
    candidates = select.rank(
        artifacts,
        dev.capability if dev else None,
        probe.driver_version if probe else None,
        forced=pol.forced,
        forced_cuda=pol.forced_cuda,
        device_problem=problem,
        unusable_packages=unusable,
    )
    first = candidates[0]
    if first.accepted and (first.variant != "cpu" or first.code == reasons.FORCED):
        return Trace(backend, pol, probe, packages, candidates, first, first.code, first.reason, env_report)
    # Falling back to the CPU: say why in one code.
    if problem is not None:
        code, why = problem
    elif not artifacts and unusable:
        code, why = reasons.ARTIFACT_CORRUPT, "no usable manifest: " + "; ".join(why for _, why in unusable)
    elif not artifacts:
        hint = (
            "pip install 'cuplug[cuda12]' or 'cuplug[cuda13]'"
            if backend == "vector"
            else f"install the CUDA extra of the package that provides '{backend}'"
        )
        code, why = reasons.NO_BACKEND_INSTALLED, f"no CUDA artifact of backend '{backend}' installed ({hint})"
    else:
        codes = {c.code for c in candidates if not c.accepted}
        code = next((p for p in _REJECTION_PRIORITY if p in codes), reasons.NO_COMPATIBLE_ARTIFACT)
        why = next(c.reason for c in candidates if c.code == code)
        why = f"every installed artifact rejected; e.g. {why}"
    return Trace(backend, pol, probe, packages, candidates, candidates[-1], code, why, env_report)


def _try_load(path: Path, device: str | None) -> tuple[abi.BackendLibrary, int, dict[str, Any]]:
    lib = abi.BackendLibrary(path)
    handle = lib.create(device)
    rc, text = lib.ping(handle)
    if rc != abi.OK:
        lib.destroy(handle)
        code = reasons.KERNEL_IMAGE_MISSING if rc == abi.E_NO_KERNEL_IMAGE else reasons.LOAD_FAILED
        raise ArtifactError(f"ping: {text}", code)
    return lib, handle, json.loads(text)


def load(backend: str = "vector", device: int | str | None = None, env: dict[str, str] | None = None) -> Backend:
    """The best working backend for this machine; a CPU fallback says why in ``.trace``.

    ``env`` replaces ``os.environ`` as the source of the CUPLUG_* policy (e.g. for ``cuplug warmup``).
    """
    trace = decide(backend, device, env)
    dev_pref = str(trace.policy.device)
    with _load_lock:
        for cand in trace.candidates:
            if not cand.accepted or cand.artifact is None:
                continue
            try:
                path = verify.verify(cand.artifact)
                lib, handle, info = _try_load(path, dev_pref)
            except ArtifactError as exc:
                trace.attempts.append(Attempt(cand.variant, cand.cuda, exc.code, str(exc)))
                log.info("cuplug: %s rejected at load: %s (%s)", cand.label, exc, exc.code)
                continue
            trace.attempts.append(Attempt(cand.variant, cand.cuda, reasons.OK, "loaded"))
            trace.decision = cand
            if trace.decision_code != reasons.FORCED or cand.code != reasons.FORCED:
                trace.decision_code, trace.decision_reason = cand.code, cand.reason
            result = Backend(lib, handle, info, cuda=cand.cuda, trace=trace)
            trace.loaded = result
            return result
        if trace.attempts:  # every accepted CUDA candidate failed to load: the best one's failure is the reason
            first = trace.attempts[0]
            trace.decision_code = first.code
            label = f"{first.cuda}/{first.variant}" if first.cuda else first.variant
            trace.decision_reason = f"{label}: {first.reason}"
        cpu = trace.candidates[-1]
        trace.decision = cpu
        if trace.policy.require_cuda and trace.decision_code != reasons.FORCED:
            raise BackendNotAvailable(
                f"CUPLUG_REQUIRE_CUDA=1 but CUDA cannot serve: {trace.decision_code}: {trace.decision_reason}",
                trace.decision_code,
                trace,
            )
        log.info("cuplug: using the CPU backend: %s (%s)", trace.decision_reason, trace.decision_code)
        cpu_path = cpu_library_path(backend)
        if cpu_path is None:
            raise BackendNotAvailable(
                f"no CPU backend '{backend}': no installed package registers it in the entry-point group "
                f"{manifest.CPU_ENTRY_POINT_GROUP} (is the package that provides it installed?)",
                reasons.NO_BACKEND_INSTALLED,
                trace,
            )
        try:
            lib, handle, info = _try_load(cpu_path, "0")
        except ArtifactError as exc:
            raise BackendNotAvailable(f"the CPU backend of '{backend}' failed to load: {exc}", exc.code, trace) from exc
        trace.attempts.append(Attempt("cpu", None, reasons.OK, "loaded"))
        result = Backend(lib, handle, info, cuda=None, trace=trace)
        trace.loaded = result
        return result
