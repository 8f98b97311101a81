"""Backend.run's C dispatcher (loader/fastcall/fastcall.c, runtime/fastpath.py) on the CPU twin.

The fast path repeats a call the whole path (``Backend.run``) has made once. What these tests hold it to:
it is really used (its counters move); it gives the whole path's results, of the same kinds; and every
check that can change between two calls with one key still raises the whole path's error after the call
was learned (a fast path that skipped one would pass a lying or changed operand to C). The per-call checks
are exercised on NumPy arrays, PyTorch CPU tensors and resident tensors, the three kinds it reads.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import cuplug
from cuplug.contract.errors import BackendClosedError, BufferError_, ConfigError, InvalidInputError
from cuplug.runtime import api

torch = pytest.importorskip("torch")
fastcall = pytest.importorskip("cuplug.runtime._fastcall", reason="the wheel's C dispatcher is not built")


@pytest.fixture(autouse=True)
def cpu_only(monkeypatch):
    for var in (
        "CUPLUG_DISABLE_CUDA",
        "BACKEND_CUDA_DISABLE",
        "CUPLUG_REQUIRE_CUDA",
        "CUPLUG_DEVICE",
        "CUPLUG_FASTPATH",
    ):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("CUPLUG_BACKEND", "cpu")


@pytest.fixture(autouse=True, params=["dlpack-c", "accessors"])
def torch_reader(request):
    """Every test with each of the two readers of PyTorch tensors: DLPack's C exchange table (PyTorch >= 2.10) and
    PyTorch's accessors alone (an older PyTorch)."""
    from cuplug.runtime import fastpath

    fastpath._module(api.Tensor)  # configured and taught first: what is set below stays so for the test
    fastpath._teach_frameworks(fastcall)
    table = fastpath.torch_exchange_table(torch)
    if request.param == "dlpack-c" and table is None:
        pytest.skip(f"PyTorch {torch.__version__} has no DLPack C exchange table")
    assert fastcall.set_torch_exchange(table if request.param == "dlpack-c" else None) == (request.param == "dlpack-c")
    yield request.param
    fastcall.set_torch_exchange(table)


@pytest.fixture
def b():
    with cuplug.load() as backend:
        yield backend


def fast_calls(b) -> int:
    return b.run.stats()["fast_calls"]


def learned(b, *args, fast=True, **kwargs):
    """Calls run() twice: the whole path (which teaches the dispatcher), then the C path (``fast``; False: a call
    the C path leaves to the whole path, as results the backend allocates); returns both results."""
    before = fast_calls(b)
    first = b.run(*args, **kwargs)
    second = b.run(*args, **kwargs)
    assert fast_calls(b) == before + fast, f"the second call of {args[0]}: fast {fast_calls(b) > before}, not {fast}"
    return first, second


def test_run_is_the_c_dispatcher_and_backend_run_the_whole_path(b):
    assert type(b.run) is fastcall.Dispatcher
    x = np.arange(4, dtype=np.float32)
    api.Backend.run(b, "add", x, x)  # the whole path, called directly, teaches it too
    n = fast_calls(b)
    np.testing.assert_array_equal(b.run("add", x, x), x + x)
    assert fast_calls(b) == n + 1


def test_fastpath_0_turns_it_off_and_a_bad_value_is_named(monkeypatch):
    monkeypatch.setenv("CUPLUG_FASTPATH", "0")
    with cuplug.load() as b:
        assert not isinstance(b.run, fastcall.Dispatcher)
        x = np.ones(3, np.float32)
        np.testing.assert_array_equal(b.run("add", x, x), x + x)
    monkeypatch.setenv("CUPLUG_FASTPATH", "sometimes")
    with pytest.raises(ConfigError, match="CUPLUG_FASTPATH='sometimes'"):
        cuplug.load()
    monkeypatch.setenv("CUPLUG_FASTPATH", "")  # set but empty: the default (on)
    with cuplug.load() as b:
        assert isinstance(b.run, fastcall.Dispatcher)


def _operands(kind: str, dtype: str, shape: tuple[int, ...], b):
    rng = np.random.default_rng(7)
    xs = [np.asarray(rng.standard_normal(shape) * 4).astype(dtype) for _ in range(3)]
    if kind == "torch":
        return [torch.from_numpy(x.copy()) for x in xs]
    if kind == "resident":
        return [b.buffer(x) for x in xs]
    return xs


def _host(v):
    if isinstance(v, api.Tensor):
        return v.to_host()
    return v.numpy() if isinstance(v, torch.Tensor) else np.asarray(v)


@pytest.mark.parametrize("kind", ["numpy", "torch", "resident"])
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int8", "uint8", "int32", "int64"])
@pytest.mark.parametrize("shape", [(1,), (3, 5), (), (0,)])
def test_the_fast_path_gives_the_whole_paths_results(b, kind, dtype, shape):
    x, y, o = _operands(kind, dtype, shape, b)
    expect = _host(api.Backend.run(b, "add", x, y, out=o)).copy()
    zeros = np.zeros(shape, dtype)
    o.upload(zeros) if kind == "resident" else _host(o).__setitem__(..., 0)
    assert b.run("add", x, y, out=o) is o
    np.testing.assert_array_equal(_host(o), expect)
    # results the backend allocates (resident inputs) are left to the whole path
    first, second = learned(b, "scale_add", x, alpha=3, beta=-1.0, fast=kind != "resident")
    assert type(first) is type(second)
    np.testing.assert_array_equal(_host(first), _host(second))
    if shape != (0,):  # (the sum of nothing is 0 either way)
        # a float16 sum on the host is read through cuplug's own host buffer: the whole path's
        s1, s2 = learned(b, "sum", x, fast=kind != "resident" and dtype != "float16")
        assert type(s1) is type(s2) and s1 == s2


def test_allocated_results_are_the_callers_kind(b):
    x = np.ones((2, 3), np.float32)
    first, second = learned(b, "add", x, x)
    assert type(second) is np.ndarray and second.shape == (2, 3) and second.dtype == np.float32
    assert second is not first  # a new array each call, never the same buffer twice
    tx = torch.ones(2, 3, dtype=torch.float16)
    _, t2 = learned(b, "add", tx, tx)
    assert type(t2) is torch.Tensor and t2.dtype == torch.float16 and tuple(t2.shape) == (2, 3)
    s1, s2 = learned(b, "sum", tx.float())
    assert type(s2) is float and s1 == s2 == 6.0
    _, i2 = learned(b, "sum", np.arange(5, dtype=np.int32))
    assert type(i2) is int and i2 == 10


def test_an_output_made_in_c_is_a_plain_tensor_whatever_its_input_is(b):
    """The dispatcher reads the outputs it has just made without asking their layout, negative bit or grad
    (torch.empty_like gives a strided tensor without either): an input that requires grad gives an output that
    does not, as on the whole path."""
    x = torch.ones(3, requires_grad=True)
    first, second = learned(b, "add", x, x)
    for r in (first, second):
        assert type(r) is torch.Tensor and not r.requires_grad and r.layout == torch.strided and not r.is_neg()
        assert r.tolist() == [2.0, 2.0, 2.0]
    assert second.data_ptr() != x.data_ptr()


def test_attributes_are_converted_as_value_of_converts_them(b):
    x = np.arange(6, dtype=np.float32)
    learned(b, "scale_add", x, alpha=2.0, beta=1.0)
    np.testing.assert_array_equal(b.run("scale_add", x, alpha=3.0, beta=0.5), x * 3 + 0.5)  # new values, fast
    np.testing.assert_array_equal(b.run("scale_add", x, alpha=3, beta=2), x * 3 + 2)  # ints for float64 ones
    for bad in (True, "2", None, 10**400, complex(1, 1)):
        with pytest.raises(InvalidInputError, match="alpha"):
            b.run("scale_add", x, alpha=bad, beta=1.0)
    with pytest.raises(InvalidInputError, match="unknown attribute"):
        b.run("scale_add", x, alpha=2.0, gamma=1.0)


def test_a_torch_tensor_that_changed_since_it_was_learned_is_checked_again(b):
    x, y, o = (torch.ones(4) for _ in range(3))
    learned(b, "add", x, y, out=o)
    o.requires_grad_(True)
    with pytest.raises(InvalidInputError, match="requires grad"):
        b.run("add", x, y, out=o)
    o.requires_grad_(False)
    strided = torch.ones(4, 2)[:, 0]  # same dtype and shape, not contiguous
    with pytest.raises(InvalidInputError, match="not C-contiguous"):
        b.run("add", strided, y, out=o)
    with pytest.raises(InvalidInputError, match="negated"):
        b.run("add", torch._neg_view(x), y, out=o)
    x.resize_(5)  # another shape now: another key, and the whole path's size check
    with pytest.raises(InvalidInputError):
        b.run("add", x, y, out=o)
    assert b.run("add", x[:4], y, out=o) is o


def test_a_numpy_array_that_changed_since_it_was_learned_is_checked_again(b):
    x, y, o = (np.ones(4, np.float32) for _ in range(3))
    learned(b, "add", x, y, out=o)
    o.setflags(write=False)
    with pytest.raises(InvalidInputError, match="read-only"):
        b.run("add", x, y, out=o)
    with pytest.raises(InvalidInputError, match="not C-contiguous"):
        b.run("add", np.ones(8, np.float32)[::2], y, out=np.ones(4, np.float32))
    with pytest.raises(InvalidInputError, match="float32"):
        b.run("add", x.view(np.int32), y, out=np.ones(4, np.float32))


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_overlaps_are_refused_after_the_call_was_learned(b, kind):
    base = np.arange(8, dtype=np.float32) if kind == "numpy" else torch.arange(8, dtype=torch.float32)
    x, y, o = base[0:4], base[4:8], (np.zeros(4, np.float32) if kind == "numpy" else torch.zeros(4))
    learned(b, "add", x, y, out=o)
    with pytest.raises(InvalidInputError, match="partly overlaps"):
        b.run("add", x, y, out=base[2:6])
    assert b.run("add", x, y, out=x) is x  # the exact in-place write of an elementwise op stays allowed
    big = base[0:4] if kind == "numpy" else torch.arange(4, dtype=torch.float32)
    learned(b, "sum", big, out=(np.zeros((), np.float32) if kind == "numpy" else torch.zeros(())))


def test_a_resident_tensor_freed_or_of_a_closed_backend_is_refused(b):
    t, u, r = b.empty(3), b.empty(3), b.empty(3)
    learned(b, "add", t, u, out=r)
    u.free()
    with pytest.raises(BufferError_, match="freed"):
        b.run("add", t, u, out=r)
    u = b.empty(3)
    learned(b, "add", t, u, out=r)
    with cuplug.load() as other:
        with pytest.raises(InvalidInputError, match="another backend instance"):
            b.run("add", t, other.empty(3), out=r)
    b.close()
    with pytest.raises(BackendClosedError):
        b.run("add", t, u, out=r)
    with pytest.raises(BackendClosedError):
        b.run("add", np.ones(3, np.float32), np.ones(3, np.float32))


def test_a_backend_dropped_is_closed_as_before():
    b = cuplug.load()
    x = np.ones(2, np.float32)
    learned(b, "add", x, x)
    core = b._core
    del b
    gc.collect()
    assert core.closed  # the dispatcher holds no reference back to its Backend


def test_a_small_call_holds_the_gil_and_a_large_one_waits_for_a_busy_lock(b):
    """A small call runs under the GIL alone (close, free and fork change the instance's state under the GIL first);
    a host call over 256 KiB releases the GIL, so it takes the instance's lock, and a busy lock sends it to the
    whole path, which waits for it."""
    small = np.ones(3, np.float32)
    large = np.ones(1 << 17, np.float32)  # 3 x 512 KiB with its output
    learned(b, "add", small, small)
    learned(b, "add", large, large)
    done = threading.Event()
    held = threading.Event()

    def hold():
        with b._core.lock:
            held.set()
            done.wait(5)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(5)
    try:
        n = fast_calls(b)
        np.testing.assert_array_equal(b.run("add", small, small), small + small)
        assert fast_calls(b) == n + 1  # no lock needed
        threading.Timer(0.2, done.set).start()
        np.testing.assert_array_equal(b.run("add", large, large), large + large)  # waits in Backend.run, not in C
        assert fast_calls(b) == n + 1
    finally:
        done.set()
        holder.join()


def test_many_threads_and_a_close_meet_no_crash_only_closed_errors(b):
    x = np.ones(64, np.float32)
    learned(b, "add", x, x)
    errors: list[BaseException] = []

    def work():
        o = np.empty(64, np.float32)
        for _ in range(2000):
            try:
                b.run("add", x, x, out=o)
            except BackendClosedError:
                return
            except BaseException as exc:  # anything else is a failure of the test
                errors.append(exc)
                return

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    b.close()
    for t in threads:
        t.join()
    assert not errors, errors


def test_the_table_is_bounded(b):
    for n in range(1, fastcall.MAX_PLANS + 40):
        b.run("add", np.ones(n, np.float32), np.ones(n, np.float32))
    assert b.run.stats()["plans"] <= fastcall.MAX_PLANS


def test_no_reference_or_buffer_is_leaked(b):
    x, y, o = (np.ones(8, np.float32) for _ in range(3))
    tx, to = torch.ones(8), torch.ones(8)
    learned(b, "add", x, y, out=o)
    learned(b, "add", tx, tx, out=to)
    learned(b, "add", x, y)
    counts = [sys.getrefcount(v) for v in (x, y, o, tx, to)]
    for _ in range(1000):
        b.run("add", x, y, out=o)
        b.run("add", tx, tx, out=to)
        b.run("add", x, y)
    assert [sys.getrefcount(v) for v in (x, y, o, tx, to)] == counts
    o.resize(16, refcheck=True)  # NumPy refuses to resize an array whose buffer is still exported


def test_operands_it_does_not_read_go_to_the_whole_path(b):
    import array

    a = array.array("f", [1.0, 2.0])
    learned_before = fast_calls(b)
    for _ in range(3):
        assert list(b.run("add", a, a)) == [2.0, 4.0]
    sub = np.ones(2, np.float32).view(np.matrix)  # a subclass: the whole path reads it
    b.run("add", sub, sub)
    assert fast_calls(b) == learned_before


def test_in_a_forked_child_a_learned_call_goes_through_the_whole_path(tmp_path):
    code = (
        "import os, numpy as np, cuplug\n"
        "b = cuplug.load()\n"
        "x = np.ones(3, np.float32)\n"
        "b.run('add', x, x); b.run('add', x, x)\n"
        "assert b.run.stats()['fast_calls'] == 1\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    r = b.run('add', x, x)\n"  # the CPU twin has no context to lose: it still serves
        "    os._exit(0 if list(r) == [2.0, 2.0, 2.0] else 3)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "print(os.waitstatus_to_exitcode(status))\n"
    )
    env = {**os.environ, "CUPLUG_BACKEND": "cpu"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "0", out.stderr
