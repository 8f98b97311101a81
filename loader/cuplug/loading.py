"""The decision and the load: policy -> probe -> rank -> verify -> dlopen -> create -> ping.

``explain()`` stops before any dlopen; ``load()`` walks the accepted
candidates in order, records why each one failed, and ends at the CPU backend
(unless CUPLUG_REQUIRE_CUDA=1).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

from . import abi, driver, manifest, policy, reasons, select, verify
from .api import Backend
from .errors import ArtifactError, BackendNotAvailable, ConfigError

log = logging.getLogger("cuplug")
_load_lock = threading.Lock()
CPU_DIR = Path(__file__).resolve().parent / "_cpu"
MAX_PING_BYTES = 1 << 20


def _reset_after_fork() -> None:
    """A thread of the parent may have held the lock at fork(); the child's copy would stay locked."""
    global _load_lock
    _load_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)
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
    refused: tuple[manifest.Refused, ...] = ()  # registrations that were not trusted, and why
    cpu: manifest.Artifact | None = None  # the CPU twin, from its owner's RECORD
    cpu_problem: str | None = None  # why there is no CPU twin to verify

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
            "refused": [r.to_json() for r in self.refused],
        }

    def __str__(self) -> str:
        return self.text()

    def text(self) -> str:
        from .report import format_trace

        return format_trace(self)


def cpu_library_path(backend: str) -> Path | None:
    """The CPU twin of `backend`: cuplug's own for "vector", else the one the owner of the name (the
    one distribution registering it in ``cuplug.cpu_backends``; value: the module whose directory
    holds ``libcuplug_<backend>_cpu.so``) records in its RECORD. None: no trusted twin."""
    return manifest.cpu_twin_path(backend)


def _device_facts(probe: driver.ProbeResult, index: int) -> tuple[driver.Device | None, tuple[str, str] | None]:
    if probe.code != reasons.OK:
        return None, (probe.code, probe.reason)
    dev = next((d for d in probe.devices if d.index == index), None)
    if dev is None:
        return None, (reasons.NO_DEVICE, f"CUPLUG_DEVICE={index} but the driver shows {len(probe.devices)} device(s)")
    if dev.capability is None:  # a fact the driver failed to give is unknown, never 0.0
        return None, (reasons.DRIVER_INIT_FAILED, f"device {index}: {dev.problem or 'capability unknown'}")
    return dev, None


def _safe_probe() -> driver.ProbeResult:
    try:
        return driver.probe()
    except Exception as exc:  # a lying driver never makes load() raise
        return driver.ProbeResult(reasons.DRIVER_INIT_FAILED, f"driver probe failed: {type(exc).__name__}: {exc}")


def _safe_discover(backend: str) -> manifest.Discovery:
    try:
        return manifest.discover(backend)
    except Exception as exc:
        why = f"looking for installed backends failed: {type(exc).__name__}: {exc}"
        return manifest.Discovery(backend, None, (), (), None, why)


def _check_forced(pol: policy.Policy, backend: str, artifacts: list[manifest.Artifact], raw: str | None) -> None:
    """CUPLUG_BACKEND naming a variant no installed artifact has is a typo, not a wish for auto-selection."""
    if pol.forced is None or pol.forced == "cpu":
        return
    if any(a.variant == pol.forced and pol.forced_cuda in (None, a.cuda) for a in artifacts):
        return
    installed = sorted({f"{a.cuda}:{a.variant}" for a in artifacts})
    raise ConfigError(
        f"CUPLUG_BACKEND={raw!r}: no installed artifact of backend '{backend}' is "
        f"{pol.forced_cuda + ':' if pol.forced_cuda else ''}{pol.forced}; installed: "
        f"{', '.join(installed) or 'none'}; or cpu, auto (case does not matter)"
    )


class _DriverStart:
    """The driver's start on a thread of its own, begun first thing in load(): the probe (cuInit and the
    facts, which the decision reuses: one cuInit), then, once the decision picked a CUDA candidate, the
    primary context of the policy's device. ctypes releases the GIL during each driver call, so cuInit
    (~100 ms on the H200 machine) overlaps reading the manifests, and context creation (~110 ms) overlaps
    verification and dlopen; the backend's create() then finds the context made. The thread's context
    reference is released when load() ends (the backend's runtime holds its own; a CPU fallback never
    asked for one)."""

    def __init__(self, device: int) -> None:
        self.device = device
        self.result: driver.ProbeResult | None = None
        self.probed = threading.Event()
        self.decided = threading.Event()
        self.want_context = False
        self._retained: Any = None
        self._thread = threading.Thread(target=self._run, name="cuplug-driver-start", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.result = _safe_probe()
        finally:
            self.probed.set()
        self.decided.wait()
        if not self.want_context:
            return
        try:
            import ctypes

            lib = ctypes.CDLL(driver.LIBCUDA, mode=os.RTLD_NOW | os.RTLD_LOCAL)
            dev, ctx = ctypes.c_int(0), ctypes.c_void_p()
            if lib.cuDeviceGet(ctypes.byref(dev), self.device) == 0:
                if lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0:
                    self._retained = (lib, dev)
        except (OSError, AttributeError):  # no such entry point (an old or fake driver): create() makes it
            pass

    def probe(self) -> driver.ProbeResult:
        self.probed.wait()
        return self.result if self.result is not None else _safe_probe()

    def decision(self, trace: Trace) -> None:
        self.want_context = any(c.accepted and c.cuda is not None for c in trace.candidates)
        self.decided.set()

    def finish(self) -> None:
        self.decided.set()
        self._thread.join()
        if self._retained is not None:
            lib, dev = self._retained
            self._retained = None
            release = getattr(lib, "cuDevicePrimaryCtxRelease_v2", None) or getattr(
                lib, "cuDevicePrimaryCtxRelease", None
            )
            if release is not None:
                release(dev)


def decide(
    backend: str = "vector",
    device: int | str | None = None,
    env: dict[str, str] | None = None,
    _probe: Any = None,
) -> Trace:
    """The whole decision without loading anything (no dlopen of any candidate)."""
    pol = policy.from_env(env, device)
    env_report = policy.relevant_env(env)
    if pol.disable_cuda:
        cpu = select.cpu_candidate(reasons.DISABLED, f"{pol.disabled_by}=1: CUDA disabled, libcuda.so.1 not opened")
        found = _safe_discover(backend)
        return Trace(
            backend,
            pol,
            None,
            (),
            [cpu],
            cpu,
            reasons.DISABLED,
            cpu.reason,
            env_report,
            refused=found.refused,
            cpu=found.cpu,
            cpu_problem=found.cpu_problem,
        )
    found = _safe_discover(backend)
    packages = found.packages
    artifacts = [a for p in packages for a in p.artifacts if a.backend == backend]
    _check_forced(pol, backend, artifacts, (os.environ if env is None else env).get("CUPLUG_BACKEND"))
    probe = None if pol.forced == "cpu" else (_probe() if _probe is not None else _safe_probe())
    dev, problem = (None, None) if probe is None else _device_facts(probe, pol.device)
    # manifests that could not be read, and single entries of a manifest that were refused
    unusable = [(p.cuda, f"{p.module}: {p.error}") for p in packages if p.error]
    unusable += [(p.cuda, f"{p.module}: {why}") for p in packages for why in p.problems]

    def trace(decision: select.Candidate, code: str, why: str) -> Trace:
        return Trace(
            backend, pol, probe, packages, candidates, decision, code, why, env_report,
            refused=found.refused, cpu=found.cpu, cpu_problem=found.cpu_problem,
        )  # fmt: skip

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
        return trace(first, first.code, first.reason)
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
        if found.refused:
            why += "; not trusted: " + ", ".join(sorted({r.distribution for r in found.refused}))
    else:
        codes = {c.code for c in candidates if not c.accepted}
        code = next((p for p in _REJECTION_PRIORITY if p in codes), reasons.NO_COMPATIBLE_ARTIFACT)
        why = next(c.reason for c in candidates if c.code == code)
        why = f"every installed artifact rejected; e.g. {why}"
    return trace(candidates[-1], code, why)


def _parse_ping(text: str) -> dict[str, Any]:
    if len(text) > MAX_PING_BYTES:
        raise ValueError(f"{len(text)} bytes")
    info = json.loads(text, parse_constant=lambda c: None)
    if not isinstance(info, dict):
        raise ValueError(f"a JSON {type(info).__name__}, not an object")
    return info


def _shown(message: str, image: verify.Verified) -> str:
    """Messages name the real file, never the /proc/self/fd/N (or private copy) it was mapped from."""
    load = str(image.load_path)
    message = message.replace(load, str(image.path))
    if message.startswith(image.load_path.name + " "):
        message = image.path.name + message[len(image.load_path.name) :]
    return message


def _try_load(image: verify.Verified, device: str | None) -> tuple[abi.BackendLibrary, int, dict[str, Any]]:
    """dlopen of the verified bytes (never the path again), then create and ping."""
    try:
        lib = abi.BackendLibrary(image.load_path)
    except ArtifactError as exc:
        raise ArtifactError(_shown(str(exc), image), exc.code) from None
    lib.path = image.path  # what Backend.path and the reports show
    handle = lib.create(device)
    try:
        rc, text = lib.ping(handle)
        if rc != abi.OK:
            code = reasons.KERNEL_IMAGE_MISSING if rc == abi.E_NO_KERNEL_IMAGE else reasons.LOAD_FAILED
            raise ArtifactError(f"ping: {text}", code)
        try:
            info = _parse_ping(text)
        except (ValueError, RecursionError) as exc:
            raise ArtifactError(f"ping returned no usable JSON object: {exc}", reasons.LOAD_FAILED) from None
    except BaseException:
        lib.destroy(handle)
        raise
    return lib, handle, info


def _attempt(cand_label: str, image_of: Any, device: str | None, cuda: str | None, trace: Trace) -> Backend:
    """Verify + dlopen + create + ping + the Backend, every failure an ArtifactError with a code."""
    try:
        image = image_of()
        lib, handle, info = _try_load(image, device)
    except ArtifactError:
        raise
    except Exception as exc:  # anything unexpected is a rejected candidate, never an exception out of load()
        raise ArtifactError(f"{type(exc).__name__}: {exc}", reasons.LOAD_FAILED) from exc
    try:
        return Backend(lib, handle, info, cuda=cuda, trace=trace)
    except Exception as exc:
        lib.destroy(handle)
        raise ArtifactError(
            f"{cand_label}: unusable ping answer: {type(exc).__name__}: {exc}", reasons.LOAD_FAILED
        ) from exc


def load(backend: str = "vector", device: int | str | None = None, env: dict[str, str] | None = None) -> Backend:
    """The best working backend for this machine; a CPU fallback says why in ``.trace``.

    ``env`` replaces ``os.environ`` as the source of the CUPLUG_* policy (e.g. for ``cuplug warmup``).
    """
    start = None
    try:
        pol = policy.from_env(env, device)
        if not pol.disable_cuda and pol.forced != "cpu":
            start = _DriverStart(pol.device)
    except ConfigError:
        pass  # decide() raises it
    try:
        trace = decide(backend, device, env, start.probe if start is not None else None)
        if start is not None:
            start.decision(trace)
        return _load_decided(backend, trace)
    finally:
        if start is not None:
            start.finish()


def _load_decided(backend: str, trace: Trace) -> Backend:
    dev_pref = str(trace.policy.device)
    with _load_lock:
        for cand in trace.candidates:
            if not cand.accepted or cand.artifact is None:
                continue
            art = cand.artifact
            try:
                result = _attempt(cand.label, lambda art=art: verify.verified(art), dev_pref, cand.cuda, trace)
            except ArtifactError as exc:
                trace.attempts.append(Attempt(cand.variant, cand.cuda, exc.code, str(exc)))
                log.info("cuplug: %s rejected at load: %s (%s)", cand.label, exc, exc.code)
                continue
            trace.attempts.append(Attempt(cand.variant, cand.cuda, reasons.OK, "loaded"))
            trace.decision = cand
            if trace.decision_code != reasons.FORCED or cand.code != reasons.FORCED:
                trace.decision_code, trace.decision_reason = cand.code, cand.reason
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
        twin = trace.cpu
        if twin is None:
            why = trace.cpu_problem or (
                f"no installed package registers it in the entry-point group {manifest.CPU_ENTRY_POINT_GROUP} "
                "(is the package that provides it installed?)"
            )
            raise BackendNotAvailable(
                f"no CPU backend '{backend}': {why}",
                reasons.ARTIFACT_CORRUPT if trace.cpu_problem else reasons.NO_BACKEND_INSTALLED,
                trace,
            )
        try:
            result = _attempt("cpu", lambda: verify.verified(twin), "0", None, trace)
        except ArtifactError as exc:
            trace.attempts.append(Attempt("cpu", None, exc.code, str(exc)))
            raise BackendNotAvailable(f"the CPU backend of '{backend}' failed to load: {exc}", exc.code, trace) from exc
        trace.attempts.append(Attempt("cpu", None, reasons.OK, "loaded"))
        trace.loaded = result
        return result
