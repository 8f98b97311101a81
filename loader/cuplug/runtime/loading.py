"""``explain()`` and ``load()``: gather the facts, let ``select`` decide, then execute the decision.

policy -> (driver probe | discovery of the installed packages) -> ``select.decide`` ->
for each candidate in the decision's order: verify -> dlopen -> create -> ping; the CPU
twin last. ``explain()`` stops after the decision (no dlopen of anything); ``load()``
records every attempt in the trace and never re-decides.

Cold start. ``load()`` starts the driver on a thread of its own before it imports or
reads anything else: ``cuInit`` (about 100 ms on an H200 host) runs beside the import
of the rest of the runtime and the reading of the manifests, and once the decision
names a CUDA candidate, the device's primary context is created beside verification
and dlopen. ctypes releases the GIL during each driver call. The probe's facts are the
decision's (one ``cuInit``). The thread is joined, and its context reference released,
before ``load()`` returns.

Imports here are the standard library's cheapest (``_thread``, not ``threading``; no
``logging``: a message goes to the ``cuplug`` logger only when the application has
imported ``logging``, which is the only way a handler could exist to read it).
"""

from __future__ import annotations

import _thread
import os
import sys

from ..contract import reasons
from ..contract.errors import ArtifactError, BackendNotAvailable
from . import driver, policy

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from pathlib import Path
    from typing import Any

    from ..contract.manifest import Artifact
    from .api import Backend
    from .discovery import Discovery
    from .select import Candidate
    from .trace import Trace
    from .verify import Verified

_load_lock = _thread.allocate_lock()


def _reset_after_fork() -> None:
    """A thread of the parent may have held the lock at fork(); the child's copy would stay locked."""
    global _load_lock
    _load_lock = _thread.allocate_lock()


os.register_at_fork(after_in_child=_reset_after_fork)


def _log(message: str, *args: object) -> None:
    logging = sys.modules.get("logging")
    if logging is not None:
        logging.getLogger("cuplug").info(message, *args)


def _safe_probe() -> driver.ProbeResult:
    try:
        return driver.probe()
    except Exception as exc:  # a lying driver never makes load() raise
        return driver.ProbeResult(reasons.DRIVER_INIT_FAILED, f"driver probe failed: {type(exc).__name__}: {exc}")


def _safe_discover(backend: str) -> Discovery:
    from . import discovery

    try:
        return discovery.discover(backend)
    except Exception as exc:
        why = f"looking for installed backends failed: {type(exc).__name__}: {exc}"
        return discovery.Discovery(backend, None, (), (), None, why)


class _DriverStart:
    """The driver's start on a thread of its own (see the module docstring): the probe, then, once the
    decision names a CUDA candidate, one reference to the device's primary context, so the backend's
    create() finds the context made. ``finish()`` joins the thread and drops that reference (the
    backend's runtime holds its own; a CPU fallback never asked for one)."""

    def __init__(self, device: int) -> None:
        self.device = device
        self.result: driver.ProbeResult | None = None
        self.want_context = False
        self._retained: tuple[Any, Any] | None = None
        self._probed, self._decided, self._done = (_thread.allocate_lock() for _ in range(3))
        for lock in (self._probed, self._decided, self._done):
            lock.acquire()
        self._decision_told = False
        _thread.start_new_thread(self._run, ())

    def _run(self) -> None:
        try:
            try:
                self.result = _safe_probe()
            finally:
                self._probed.release()
            with self._decided:
                pass
            if self.want_context:
                self._retain()
        finally:
            self._done.release()

    def _retain(self) -> None:
        import ctypes

        try:
            lib = ctypes.CDLL(driver.LIBCUDA, mode=os.RTLD_NOW | os.RTLD_LOCAL)
            dev, ctx = ctypes.c_int(0), ctypes.c_void_p()
            if lib.cuDeviceGet(ctypes.byref(dev), self.device) == 0:
                if lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0:
                    self._retained = (lib, dev)
        except (OSError, AttributeError):  # no such entry point (an old or fake driver): create() makes it
            pass

    def probe(self) -> driver.ProbeResult:
        with self._probed:
            pass
        return self.result if self.result is not None else _safe_probe()

    def decided(self, want_context: bool) -> None:
        if not self._decision_told:
            self._decision_told = True
            self.want_context = want_context
            self._decided.release()

    def finish(self) -> None:
        self.decided(False)
        with self._done:
            pass
        if self._retained is not None:
            lib, dev = self._retained
            self._retained = None
            release = getattr(lib, "cuDevicePrimaryCtxRelease_v2", None) or getattr(
                lib, "cuDevicePrimaryCtxRelease", None
            )
            if release is not None:
                release(dev)


def _decide(
    backend: str, pol: policy.Policy, env: Mapping[str, str] | None, probe: Callable[[], driver.ProbeResult]
) -> Trace:
    """The facts, then the decision. The driver is not asked when CUDA is disabled or the CPU forced."""
    from . import select
    from .trace import Trace

    found = _safe_discover(backend)
    facts = None if pol.disable_cuda or pol.forced == "cpu" else probe()
    linkers = _safe_jitlinks(found) if facts is not None else {}
    judged: dict[int, Any] = {major: lib.version for major, lib in linkers.items()}
    if judged:  # an nvJitLink: is there what reads the LTO-IR out of the library too?
        from ..contract import fatbin

        if missing := fatbin.reader_missing():
            judged = dict.fromkeys(judged, missing)
    decision = select.decide(backend, pol, facts, found, judged)
    return Trace(backend, pol, facts, found, decision, policy.relevant_env(env), linkers, judged)


def _safe_jitlinks(found: Discovery) -> dict[int, Any]:
    """The nvJitLink (jitlink.Found) installed for each CUDA major an LTO variant needs (nothing is looked for
    without one): the decision judges it and the link uses it. A look that fails finds none (the LTO candidate is
    then skipped with the reason), never an exception."""
    try:
        return _jitlinks(found)
    except Exception:
        return {}


def _jitlinks(found: Discovery) -> dict[int, Any]:
    majors = {a.cuda_major for a in found.artifacts if a.lto}
    if not majors:
        return {}
    from . import jitlink

    libs = {major: jitlink.find(major) for major in majors}
    return {major: lib for major, lib in libs.items() if lib is not None}


def explain(backend: str = "vector", device: int | str | None = None, env: Mapping[str, str] | None = None) -> Trace:
    """The whole decision without loading anything (no dlopen of any candidate)."""
    return _decide(backend, policy.from_env(env, device), env, _safe_probe)


decide = explain  # cuplug.decide, the name explain() had first; the same function


def cpu_library_path(backend: str) -> Path | None:
    """The CPU twin of ``backend`` (see ``discovery``); None: no trusted twin."""
    from pathlib import Path

    from .discovery import cpu_twin_path

    path = cpu_twin_path(backend)
    return None if path is None else Path(path)


def load(backend: str = "vector", device: int | str | None = None, env: Mapping[str, str] | None = None) -> Backend:
    """The best working backend for this machine; a CPU fallback says why in ``.trace``.

    ``env`` replaces ``os.environ`` as the source of the CUPLUG_* policy (e.g. for ``cuplug warmup``).
    """
    pol = policy.from_env(env, device)
    start = None if pol.disable_cuda or pol.forced == "cpu" else _DriverStart(pol.device)
    try:
        trace = _decide(backend, pol, env, start.probe if start is not None else _safe_probe)
        if start is not None:
            start.decided(want_context=bool(trace.decided.to_try))
        return _execute(trace)
    finally:
        if start is not None:
            start.finish()


def _execute(trace: Trace) -> Backend:
    """Tries the decision's candidates in order, then the CPU twin; every step recorded in ``trace``."""
    from . import verify
    from .trace import Attempt

    dev_pref = str(trace.policy.device)
    twins: list[Any] = []  # the CPU twin the self-tests compare with, loaded once (closed after the loop)
    links: dict[str, Any] = {}  # label -> jitlink.Linked: the image an LTO candidate registered
    with _load_lock:
        try:
            for cand in trace.decided.to_try:
                art = cand.artifact

                def image_of(art: Artifact | None = art) -> Verified:
                    assert art is not None  # to_try holds candidates with an artifact
                    return verify.verified(art)

                try:
                    result = _attempt(cand.label, image_of, dev_pref, cand, trace, links)
                except ArtifactError as exc:
                    trace.attempts.append(Attempt(cand.variant, cand.cuda, exc.code, str(exc)))
                    _log("cuplug: %s rejected at load: %s (%s)", cand.label, exc, exc.code)
                    continue
                mismatch = _self_test(result, cand, trace, twins, links.get(cand.label))
                if mismatch:
                    result.close()
                    trace.attempts.append(Attempt(cand.variant, cand.cuda, reasons.SELF_TEST_MISMATCH, mismatch))
                    _log("cuplug: %s rejected by its self-test: %s", cand.label, mismatch)
                    continue
                linked = links.get(cand.label)
                loaded = "loaded" if linked is None else f"loaded; {linked.text()}"
                trace.attempts.append(Attempt(cand.variant, cand.cuda, reasons.OK, loaded))
                trace.served, trace.loaded = cand, result
                return result
        finally:
            for twin in twins:
                if twin is not None:
                    twin.close()
        cpu = trace.decided.cpu
        if trace.policy.require_cuda and trace.decision_code != reasons.FORCED:
            raise BackendNotAvailable(
                f"CUPLUG_REQUIRE_CUDA=1 but CUDA cannot serve: {trace.decision_code}: {trace.decision_reason}",
                trace.decision_code,
                trace,
            )
        _log("cuplug: using the CPU backend: %s (%s)", trace.decision_reason, trace.decision_code)
        twin = trace.cpu
        if twin is None:
            why = trace.cpu_problem or (
                "no installed package registers it in the entry-point group cuplug.cpu_backends "
                "(is the package that provides it installed?)"
            )
            code = reasons.ARTIFACT_CORRUPT if trace.cpu_problem else reasons.NO_BACKEND_INSTALLED
            raise BackendNotAvailable(f"no CPU backend '{trace.backend}': {why}", code, trace)
        try:
            result = _attempt("cpu", lambda: verify.verified(twin), "0", cpu, trace)
        except ArtifactError as exc:
            trace.attempts.append(Attempt("cpu", None, exc.code, str(exc)))
            msg = f"the CPU backend of '{trace.backend}' failed to load: {exc}"
            raise BackendNotAvailable(msg, exc.code, trace) from exc
        trace.attempts.append(Attempt("cpu", None, reasons.OK, "loaded"))
        trace.served, trace.loaded = cpu, result
        return result


def _self_test(result: Backend, cand: Candidate, trace: Trace, twins: list[Any], linked: Any = None) -> str | None:
    """The candidate's numerical self-test (selftest.py) against the CPU twin; the mismatch, or None."""
    import time

    from . import selftest, verify

    if cand.cuda is None:
        return None

    def twin_of() -> tuple[Any, float]:
        if twins:
            return twins[0], 0.0
        t0, twin = time.perf_counter(), None
        if trace.cpu is not None:
            try:
                twin = _attempt("cpu", lambda: verify.verified(trace.cpu), "0", trace.decided.cpu, trace)
            except ArtifactError as exc:
                _log("cuplug: the CPU twin did not load for the self-test: %s", exc)
        twins.append(twin)
        return twin, (time.perf_counter() - t0) * 1e3

    uuid, driver = _device_facts(trace)
    k = selftest.key(
        uuid,
        driver,
        # an LTO candidate's code is the image linked for this GPU: its digest is part of what passed
        (cand.artifact.sha256 + (f"+{linked.sha256}" if linked is not None else "")) if cand.artifact else None,
    )
    try:
        outcome = selftest.run(result, twin_of, cand.label, k, trace.policy.selftest)
    except Exception as exc:  # a sample that cannot run here is a failed self-test, never an exception out of load()
        outcome = selftest.Result(cand.label, "mismatch", f"the sample failed: {type(exc).__name__}: {exc}")
    trace.selftests.append(outcome)
    return outcome.why if outcome.outcome == "mismatch" else None


def _device_facts(trace: Trace) -> tuple[str | None, int | None]:
    """The UUID of the device the policy names and the driver's version (None: unknown): what a self-test pass and
    a linked image are remembered under."""
    probe = trace.probe
    device = next((d for d in (probe.devices if probe is not None else ()) if d.index == trace.policy.device), None)
    return (device.uuid if device is not None else None), (probe.driver_version if probe is not None else None)


def _attempt(
    label: str,
    image_of: Callable[[], Verified],
    device: str,
    cand: Candidate,
    trace: Trace,
    links: dict[str, Any] | None = None,
) -> Backend:
    """Verify + (an LTO candidate: link for the GPU) + dlopen + create + ping + the Backend, every failure an
    ArtifactError with a code."""
    from . import library
    from .api import Backend

    try:
        image = image_of()
        if cand.link_for is None or cand.artifact is None:
            lib, handle, info = library.open_backend(image.load_path, image.path, device)
        else:
            linked, data = _link(image, cand, trace)
            if links is not None:
                links[label] = linked
            lib, handle, info = _open_linked(image, device, linked, data)
    except ArtifactError:
        raise
    except Exception as exc:  # anything unexpected is a rejected candidate, never an exception out of load()
        raise ArtifactError(f"{type(exc).__name__}: {exc}", reasons.LOAD_FAILED) from exc
    try:
        return Backend(lib, handle, info, cuda=cand.cuda, trace=trace)
    except Exception as exc:
        lib.destroy(handle)
        raise ArtifactError(f"{label}: unusable ping answer: {type(exc).__name__}: {exc}", reasons.LOAD_FAILED) from exc


def _open_linked(image: Verified, device: str, linked: Any, data: bytes) -> Any:
    """The library opened with its linked image, handed over as a sealed in-memory file (the bytes checked are the
    bytes registered); without memfd, the cache's file."""
    from . import library, verify

    sealed = verify.sealed_copy(data, f"lto-sm_{linked.arch}")
    path = sealed[1] if sealed is not None else linked.path
    if not path:
        raise ArtifactError(
            "the linked image can be neither sealed in memory nor kept in the cache", reasons.LOAD_FAILED
        )
    try:
        return library.open_backend(image.load_path, image.path, device, (path, linked.arch))
    finally:
        if sealed is not None:
            os.close(sealed[0])


def _link(image: Verified, cand: Candidate, trace: Trace) -> Any:
    """The image of an LTO candidate linked for its GPU and its bytes (runtime/jitlink.py): cached, or linked now."""
    from . import jitlink

    art, arch = cand.artifact, cand.link_for
    assert art is not None and arch is not None
    found = trace.linkers.get(art.cuda_major)  # the one the decision judged, not a second look
    if found is None:
        raise ArtifactError(
            f"no nvJitLink {art.cuda_major}.x found to link lto for sm_{arch}", reasons.NVJITLINK_UNAVAILABLE
        )
    key = jitlink.cache_key(*_device_facts(trace), art.sha256, arch, found)
    try:
        return jitlink.image_for(image.load_path, key, arch, found)
    except (jitlink.JitLinkError, OSError, ValueError) as exc:
        raise ArtifactError(f"linking its LTO-IR for sm_{arch} failed: {exc}", reasons.LOAD_FAILED) from exc
