"""explain() and load() (runtime.loading) in process: the decision executed in its order, every attempt
recorded, the CPU last, and what the trace then says; with no driver, with the kill switch, and with the
fake driver and the real backend packages (create fails on it: each CUDA candidate is load-failed).
"""

from __future__ import annotations

import logging
import sys

import pytest

from cuplug.contract import reasons
from cuplug.contract.errors import BackendNotAvailable, ConfigError
from cuplug.runtime import api, discovery, driver, loading, verify

KNOBS = ("CUPLUG_DISABLE_CUDA", "BACKEND_CUDA_DISABLE", "CUPLUG_REQUIRE_CUDA", "CUPLUG_BACKEND", "CUPLUG_DEVICE")


@pytest.fixture
def no_driver(monkeypatch):
    for name in KNOBS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(driver, "LIBCUDA", "/nonexistent/libcuda.so.1")
    return monkeypatch


@pytest.fixture
def fake(no_driver, site, fake_driver_dir):
    """The fake driver (CC 9.0, driver 13.0) and cuplug's two CUDA packages on this process's path."""
    no_driver.setattr(driver, "LIBCUDA", str(fake_driver_dir / "libcuda.so.1"))
    no_driver.setattr(sys, "path", [*sys.path, str(site)])
    for name in ("FAKE_CUDA_DEVICES", "FAKE_CUDA_DRIVER_VERSION", "FAKE_CUDA_INIT_ERROR", "CUDA_VISIBLE_DEVICES"):
        no_driver.delenv(name, raising=False)
    return no_driver


def test_no_driver_ends_at_the_cpu_with_its_reason(no_driver):
    with loading.load() as b:
        t = b.trace
        assert b.variant == "cpu" and t.served.label == "cpu" and t.loaded is b
        assert (t.decision.label, t.decision_code) == ("cpu", reasons.NO_DRIVER) and "not found" in t.decision_reason
        assert [(a.label, a.code, a.reason) for a in t.attempts] == [("cpu", "ok", "loaded")]
        assert t.probe is not None and t.probe.code == reasons.NO_DRIVER


@pytest.mark.parametrize(
    ("env", "code"), [({"CUPLUG_DISABLE_CUDA": "1"}, reasons.DISABLED), ({"CUPLUG_BACKEND": "cpu"}, reasons.FORCED)]
)
def test_the_driver_is_not_asked_when_cuda_is_off_or_the_cpu_forced(no_driver, env, code):
    asked = []
    no_driver.setattr(driver, "probe", lambda: asked.append(1))
    for k, v in env.items():
        no_driver.setenv(k, v)
    with loading.load() as b:
        assert b.trace.decision_code == code and b.trace.probe is None and not asked
    assert loading.explain().probe is None and not asked


def test_require_cuda_turns_the_fallback_into_an_error(no_driver):
    no_driver.setenv("CUPLUG_REQUIRE_CUDA", "1")
    with pytest.raises(BackendNotAvailable) as err:
        loading.load()
    assert err.value.code == reasons.NO_DRIVER and "CUPLUG_REQUIRE_CUDA=1 but CUDA cannot serve: no-driver" in str(
        err.value
    )
    assert err.value.trace is not None and err.value.trace.attempts == []
    no_driver.setenv("CUPLUG_BACKEND", "cpu")  # forcing the CPU is what was asked: no error
    with loading.load() as b:
        assert b.variant == "cpu"


def test_a_backend_nobody_provides(no_driver):
    with pytest.raises(BackendNotAvailable) as err:
        loading.load("nosuch")
    assert err.value.code == reasons.NO_BACKEND_INSTALLED and "cuplug.cpu_backends" in str(err.value)
    assert loading.cpu_library_path("nosuch") is None and loading.cpu_library_path("vector").is_file()


def test_env_and_device_arguments_replace_the_environment(no_driver):
    t = loading.explain(env={"CUPLUG_DISABLE_CUDA": "1"})
    assert t.decision_code == reasons.DISABLED and t.env == {"CUPLUG_DISABLE_CUDA": "1"}
    assert loading.explain(device=3).policy.device == 3
    with pytest.raises(ConfigError):
        loading.explain(env={"CUPLUG_DEVICE": "x"})
    assert loading.decide is loading.explain


def test_cuda_candidates_are_tried_in_the_decisions_order_then_the_cpu(fake):
    before = loading.explain()
    assert before.decision.label == "cuda13/fatbin" and before.decision_code == reasons.OK and before.attempts == []
    with loading.load() as b:
        t = b.trace
        tried = [a.label for a in t.attempts]
        assert tried == [c.label for c in t.decided.to_try] + ["cpu"]
        assert tried[:2] == ["cuda13/fatbin", "cuda12/fatbin"] and all(a.code == "load-failed" for a in t.attempts[:-1])
        assert b.variant == "cpu" and t.decision.label == "cpu" and t.decision_code == reasons.LOAD_FAILED
        assert t.decision_reason.startswith("cuda13/fatbin: ") and t.fell_through is None


def test_a_forced_variant_that_fails_falls_through_and_says_so(fake):
    fake.setenv("CUPLUG_BACKEND", "cuda13:sm80")
    with loading.load() as b:
        t = b.trace
        assert t.decided.forced.label == "cuda13/sm80" and t.attempts[0].label == "cuda13/sm80"
        assert t.fell_through is t.attempts[0] and t.fell_through.code == reasons.LOAD_FAILED
        assert t.decision_code == reasons.LOAD_FAILED  # not `forced`: the forced one did not serve
    fake.setenv("CUPLUG_REQUIRE_CUDA", "1")
    with pytest.raises(BackendNotAvailable) as err:
        loading.load()
    assert err.value.code == reasons.LOAD_FAILED


def test_no_cuda_candidate_left_to_try_is_the_decisions_own_reason(fake):
    fake.setenv("FAKE_CUDA_DEVICES", "7.0")
    with loading.load() as b:
        assert b.trace.attempts[0].label == "cpu" and b.trace.decision_code == reasons.CAPABILITY_TOO_LOW


def test_anything_unexpected_is_a_rejected_candidate(fake):
    real = verify.verified

    def verified(art):
        if art.cuda:
            raise RuntimeError("disk on fire")
        return real(art)

    fake.setattr(verify, "verified", verified)
    with loading.load() as b:
        first = b.trace.attempts[0]
        assert (first.code, first.reason) == (reasons.LOAD_FAILED, "RuntimeError: disk on fire") and b.variant == "cpu"


def test_a_ping_answer_the_backend_class_refuses_is_load_failed(no_driver):
    def refuse(*_a, **_k):
        raise KeyError("ops")

    no_driver.setattr(api, "Backend", refuse)
    with pytest.raises(BackendNotAvailable) as err:
        loading.load()
    assert err.value.code == reasons.LOAD_FAILED and "cpu: unusable ping answer: KeyError" in str(err.value)
    assert err.value.trace.attempts[-1].code == reasons.LOAD_FAILED


def test_a_failing_probe_or_discovery_never_raises(no_driver):
    def boom():
        raise OSError("ioctl")

    no_driver.setattr(driver, "probe", boom)
    t = loading.explain()
    assert t.decision_code == reasons.DRIVER_INIT_FAILED and "driver probe failed: OSError: ioctl" in t.decision_reason

    def lost(_backend):
        raise PermissionError("site-packages")

    no_driver.setattr(discovery, "discover", lost)
    t = loading.explain()
    assert t.cpu is None and "looking for installed backends failed: PermissionError" in t.cpu_problem


def test_the_cuplug_logger_hears_the_fallback(no_driver, caplog):
    with caplog.at_level(logging.INFO, logger="cuplug"):
        loading.load().close()
    assert any("using the CPU backend" in r.getMessage() and "no-driver" in r.getMessage() for r in caplog.records)


def test_a_fork_gets_a_free_load_lock():
    """A parent thread may hold the lock at fork(): the child's load() must not wait for it forever."""
    old = loading._load_lock
    old.acquire()
    loading._reset_after_fork()
    assert loading._load_lock is not old and loading._load_lock.acquire(blocking=False)
    loading._load_lock.release()
    old.release()


def test_the_driver_thread_is_joined_and_reports_the_probe(fake):
    start = loading._DriverStart(0)
    r = start.probe()
    assert r.code == reasons.OK and r.devices[0].capability == (9, 0)
    start.decided(True)  # the fake answers "not supported" to cuDevicePrimaryCtxRetain: nothing retained or raised
    start.finish()
    assert start._retained is None
    again = loading._DriverStart(0)
    again.finish()  # without a decision: it ends all the same
    assert again.probe().code == reasons.OK


# ---- the driver thread's primary-context reference (issue 22's cold start), counted by the fake driver

INIT, REFS, RETAINS, RELEASE_V2, RELEASE, DEV = range(6)


@pytest.fixture
def counted(fake):
    """The fake driver with working primary-context calls; returns its counters as deltas from now."""
    import ctypes

    fake.setenv("FAKE_CUDA_PRIMARY_CTX", "1")
    lib = ctypes.CDLL(driver.LIBCUDA)  # the same library the probe loads: the same counters
    base = [lib.fake_cuda_count(i) for i in range(6)]
    return lambda: [lib.fake_cuda_count(i) - (base[i] if i != DEV else 0) for i in range(6)]


def test_a_cuda_decision_retains_the_primary_context_once_and_finish_releases_it(counted):
    start = loading._DriverStart(0)
    assert start.probe().code == reasons.OK
    start.decided(True)
    with start._done:  # the thread has done its part
        pass
    assert counted()[REFS : RELEASE + 1] == [1, 1, 0, 0]  # held while the backend is created
    start.finish()
    assert counted()[INIT : RELEASE + 1] == [1, 0, 1, 1, 0]  # one cuInit; released through the _v2 entry point


def test_the_context_is_retained_on_the_device_that_was_asked(counted, fake):
    fake.setenv("FAKE_CUDA_DEVICES", "9.0,8.0")
    start = loading._DriverStart(1)
    start.probe()
    start.decided(True)
    start.finish()
    assert counted()[RETAINS] == 1 and counted()[DEV] == 1


@pytest.mark.parametrize("decided", [False, None])  # a CPU decision, or none told before finish()
def test_no_cuda_decision_retains_nothing(counted, decided):
    start = loading._DriverStart(0)
    start.probe()
    if decided is not None:
        start.decided(decided)
    start.finish()
    assert counted()[INIT : RELEASE + 1] == [1, 0, 0, 0, 0]


@pytest.mark.parametrize("rc", ["2", "-2"])  # a negative status is a failure too
@pytest.mark.parametrize("knob", ["FAKE_CUDA_RETAIN_ERROR", "FAKE_CUDA_DEVICE_GET_ERROR"])
def test_a_retain_that_fails_is_never_released(counted, fake, knob, rc):
    fake.setenv(knob, rc)
    start = loading._DriverStart(0)
    start.probe()
    start.decided(True)
    start.finish()
    assert start._retained is None and counted()[RETAINS : RELEASE + 1] == [0, 0, 0]


def test_the_probe_is_asked_of_the_thread_once(counted):
    start = loading._DriverStart(0)
    first, second = start.probe(), start.probe()
    start.finish()
    assert first is second and counted()[INIT] == 1


@pytest.fixture
def unraisable(monkeypatch):
    """What escapes a thread started with _thread (sys.unraisablehook hears it)."""
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)
    return seen


@pytest.mark.parametrize("which", ["missing", "no-entry-points"])
def test_a_driver_that_cannot_retain_never_breaks_the_thread(no_driver, tmp_path, unraisable, which):
    """No driver file (OSError), or one without the entry points (AttributeError): nothing is retained,
    nothing escapes the thread, finish() returns."""
    from conftest import HERE, build_shared_library

    if which == "no-entry-points":
        path = build_shared_library(
            HERE / "fake_cuda" / "fake_libcuda.c", tmp_path / "libcuda.so.1", "-ldl", "-DFAKE_NO_SYMBOLS"
        )
        no_driver.setattr(driver, "LIBCUDA", str(path))
    start = loading._DriverStart(0)
    start.probe()
    start.decided(True)
    start.finish()
    assert start._retained is None and unraisable == []


@pytest.mark.parametrize(
    ("env", "threads"),
    [
        ({}, 1),
        ({"CUPLUG_BACKEND": "cpu"}, 0),
        ({"CUPLUG_DISABLE_CUDA": "1"}, 0),
        ({"CUPLUG_BACKEND": "cuda13:sm80"}, 1),
    ],
)
def test_load_starts_the_driver_on_its_own_thread_unless_cuda_is_off(fake, env, threads):
    """The cold start's overlap (issue 22): the probe runs beside discovery and verification."""
    started = []

    class Recorded(loading._DriverStart):
        def __init__(self, device):
            started.append(device)
            super().__init__(device)

    fake.setattr(loading, "_DriverStart", Recorded)
    for name, value in env.items():
        fake.setenv(name, value)
    loading.load("vector").close()
    assert started == [0] * threads
