"""Issue 18, class 5: fork, copies and lifetimes.

fork() while another thread is inside load(), or inside a backend call; copies and pickles of a
Backend; a Backend dropped without close(); a failed call's outputs; resident slots reused.

The loader's locks (loading's load lock, verify's image lock) are replaced in the child
by os.register_at_fork handlers: a child forked while a thread of the parent holds one
loads at once instead of waiting forever.
"""

from __future__ import annotations

import copy
import gc
import json
import os
import pickle
import threading
import weakref

import numpy as np
import pytest

import cuplug
from conftest import clean_env, env_for, needs_wheels, run_py
from cuplug.runtime import dlpack


@pytest.fixture
def b(monkeypatch):
    monkeypatch.setenv("CUPLUG_BACKEND", "cpu")
    with cuplug.load() as backend:
        yield backend


FORK_DURING_LOAD = r"""
import json, os, signal, threading, time, cuplug
stop = False
def loader():
    while not stop:
        cuplug.load().close()
t = threading.Thread(target=loader, daemon=True)
t.start()
time.sleep(0.2)
results = []
for i in range(10):
    pid = os.fork()
    if pid == 0:
        signal.alarm(15)  # a deadlocked child dies of SIGALRM instead of hanging the test
        b = cuplug.load()
        r = b.run("sum", memoryview(bytearray(b"\0\0\x80?" * 4)).cast("f"))
        os._exit(0 if r == 4.0 else 3)
    deadline = time.monotonic() + 30
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            results.append(os.waitstatus_to_exitcode(status))
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            results.append("hung")
            break
        time.sleep(0.01)
stop = True
t.join(10)
print(json.dumps(results))
"""


@pytest.mark.reliability(
    case="fork() while another thread is inside load()",
    how="a thread calls cuplug.load() in a loop; the main thread forks 10 children, each of which loads and runs "
    "a sum (CPU only, and with the real artifacts on the fake driver)",
    expect="all 10 children load and answer (exit 0), none deadlocks on a lock copied in its locked state",
)
@pytest.mark.parametrize("where", ["cpu", pytest.param("artifacts", marks=needs_wheels)])
def test_fork_during_load_does_not_deadlock(where, request):
    if where == "artifacts":
        env = env_for(request.getfixturevalue("site"), request.getfixturevalue("fake_driver_dir"))
    else:
        env = clean_env()
    proc = run_py(FORK_DURING_LOAD, env, timeout=400)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) == [0] * 10


# ---- the Backend instance's part of class 5 (api.py and the C frameworks): copies, lifetimes,
# finalizers, failed calls, slot reuse, fork inside a call.


@pytest.mark.reliability(
    case="Backend.close() while a DLPack consumer holds a result",
    how="a resident result exported to NumPy (np.from_dlpack), the Tensor dropped, the Backend closed",
    expect="the consumer's array stays valid and right; the instance is destroyed once the consumer lets go",
)
def test_an_exported_tensor_outlives_close(b):
    """close() while a consumer holds a result: the memory stays valid until the consumer lets go."""
    x = np.arange(1 << 16, dtype=np.float32)
    r = b.run("scale_add", b.buffer(x), alpha=2.0, beta=1.0)
    held = np.from_dlpack(r)
    core = weakref.ref(r._core)
    del r
    b.close()
    gc.collect()
    np.testing.assert_array_equal(held, np.float32(2) * x + np.float32(1))  # no use after free
    assert core() is not None and core().handle is not None  # the instance waits for its consumer
    del held
    gc.collect()
    assert dlpack.live_exports() == 0
    assert core() is None or core().handle is None


def test_tensors_of_a_closed_backend_refuse_use(b):
    t = b.empty(8)
    b.close()
    with pytest.raises(cuplug.BackendClosedError):
        t.to_host()


@pytest.mark.reliability(
    case="a Backend dropped without close()",
    how="30 loads, each allocating a 16 MiB resident tensor, dropped without close()",
    expect="every instance is finalized (its C handle destroyed) and the memory comes back",
)
def test_an_unreachable_backend_is_finalized():
    cores = []
    for _ in range(30):
        be = cuplug.load()
        be.empty((1 << 22,), "float32")  # 16 MiB, dropped with its backend
        cores.append(weakref.ref(be._core))
        del be
    gc.collect()
    assert all(c() is None or c().handle is None for c in cores)


@pytest.mark.reliability(
    case="a failed resident op",
    how="scale_add on a resident int32 tensor with alpha=0.5 (the op refuses), 20 times",
    expect="each call raises the op's own message and frees the output it allocated (live tensors unchanged)",
)
def test_a_failed_call_frees_what_it_allocated(b):
    t = b.buffer(np.ones(1 << 16, np.int32))
    before = len(b._core.live)
    for _ in range(20):
        with pytest.raises(cuplug.InvalidInputError, match=r"integral|integer"):
            b.run("scale_add", t, alpha=0.5)
    assert len(b._core.live) == before


@pytest.mark.reliability(
    case="resident tensor slots reused",
    how="a tensor freed, a new one allocated (its slot may be reused), the old id used, and forged",
    expect="the new id differs (generation-checked); the old and the forged id are 'not a live' tensor",
)
def test_freed_and_reused_slots_never_alias(b):
    old = b.empty(4)
    old_id = old.id
    old.free()
    new = b.empty(4)
    assert new.id != old_id  # the slot may be reused, the id never is
    with pytest.raises(cuplug.BackendError, match=r"not a live (buffer|tensor)"):
        old.to_host()
    forged = cuplug.Buffer(b, old_id, 4)
    with pytest.raises(cuplug.BackendError, match=r"not a live (buffer|tensor)"):
        forged.to_host()


@pytest.mark.parametrize("what", [copy.copy, copy.deepcopy, pickle.dumps])
@pytest.mark.reliability(
    case="copy or pickle of a Backend or a Tensor",
    how="copy.copy, copy.deepcopy, pickle.dumps of a Backend and of a resident Tensor",
    expect="TypeError saying why (a copy would share the C handle); nothing shared, nothing closed twice",
)
def test_backends_and_tensors_cannot_be_copied(b, what):
    with pytest.raises(TypeError, match="cannot be copied"):
        what(b)
    with pytest.raises(TypeError, match="cannot be copied"):
        what(b.empty(2))


@pytest.mark.reliability(
    case="fork() while another thread is inside a CPU-backend call",
    how="a thread runs sum over 2^22 elements in a loop; the main thread forks 5 children that call the same "
    "instance and load a fresh one",
    expect="every child answers within 20 s (the C framework takes the instances' locks across fork)",
)
def test_fork_while_another_thread_is_inside_a_call(b):
    x = np.ones(1 << 22, np.float32)
    stop = threading.Event()

    def busy():
        while not stop.is_set():
            b.run("sum", x)

    worker = threading.Thread(target=busy)
    worker.start()
    try:
        for _ in range(5):
            pid = os.fork()
            if pid == 0:  # the child: the parent thread's lock must not hold us
                try:
                    ok = b.run("sum", np.ones(10, np.float32)) == 10.0
                    with cuplug.load() as fresh:
                        ok = ok and fresh.run("sum", np.ones(3, np.float32)) == 3.0
                finally:
                    os._exit(0 if ok else 3)
            deadline = 20
            for _ in range(deadline * 10):
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    break
                threading.Event().wait(0.1)
            else:
                os.kill(pid, 9)
                pytest.fail("the forked child deadlocked")
            assert os.waitstatus_to_exitcode(status) == 0
    finally:
        stop.set()
        worker.join()


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.reliability(
    case="memory of dropped Backends and failed calls",
    how="30 loads each allocating 64 MiB resident and dropped unclosed; 50 failing resident ops on 16 MiB",
    expect="resident memory grows by less than 64 MiB in all (before: +499 MiB and +784 MiB)",
)
def test_dropped_backends_and_failed_calls_give_their_memory_back(monkeypatch, record_property):
    monkeypatch.setenv("CUPLUG_BACKEND", "cpu")
    gc.collect()
    before = _rss_mib()
    for _ in range(30):
        be = cuplug.load()
        t = be.empty((1 << 24,), "float32")  # 64 MiB
        t.upload(np.ones(1 << 24, np.float32))  # touched, so it is resident
        del be, t
    with cuplug.load() as be:
        x = be.buffer(np.ones(1 << 22, np.int32))  # 16 MiB
        for _ in range(50):
            with pytest.raises(cuplug.InvalidInputError):
                be.run("scale_add", x, alpha=0.5)
    gc.collect()
    grown = _rss_mib() - before
    record_property("rss_growth_mib", round(grown, 1))
    assert grown < 64, f"{grown:.0f} MiB not given back"
