"""The Python API on the real CPU backend (CUPLUG_BACKEND=cpu keeps any host driver out)."""

from __future__ import annotations

import array
import sys
import threading

import numpy as np
import pytest

import cuplug
from conftest import clean_env, run_py


@pytest.fixture(autouse=True)
def cpu_only(monkeypatch):
    for var in ("CUPLUG_DISABLE_CUDA", "BACKEND_CUDA_DISABLE", "CUPLUG_REQUIRE_CUDA", "CUPLUG_DEVICE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("CUPLUG_BACKEND", "cpu")


@pytest.fixture
def b():
    with cuplug.load() as backend:
        yield backend


def test_load_gives_the_cpu_backend_via_absolute_dlopen(b, cpu_lib_path):
    assert b.variant == "cpu" and b.path == cpu_lib_path and b.path.is_absolute()
    assert b.trace.decision_code == "forced"
    assert b.info()["backend"] == "vector"


@pytest.mark.parametrize("n", [1, 5, 1023, 1 << 16])
def test_run_matches_numpy(b, n):
    rng = np.random.default_rng(n)
    x, y = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)
    np.testing.assert_array_equal(b.run("add", x, y), x + y)
    np.testing.assert_array_equal(b.run("scale_add", x, alpha=2.0, beta=1.0), np.float32(2) * x + np.float32(1))
    assert b.run("sum", x) == pytest.approx(float(x.astype(np.float64).sum()), rel=1e-5, abs=1e-3)


def test_any_float32_buffer_works_and_keeps_its_kind(b):
    x = array.array("f", [1.0, 2.0, 3.0])
    got = b.run("add", x, memoryview(x))
    assert isinstance(got, array.array) and list(got) == [2.0, 4.0, 6.0]
    two_d = np.ones((3, 4), dtype=np.float32)
    assert b.run("add", two_d, two_d).shape == (3, 4)
    assert b.run("sum", memoryview(array.array("f", [1.5, 2.5])).toreadonly()) == 4.0  # read-only input


def test_resident_buffers(b):
    x = np.arange(1000, dtype=np.float32)
    bx = b.buffer(x)
    by = b.run("scale_add", bx, alpha=3.0, beta=0.5)
    bz = b.run("add", bx, by)
    np.testing.assert_array_equal(bz.to_host(), x + (np.float32(3) * x + np.float32(0.5)))
    assert b.run("sum", bx) == float(x.sum())
    bx.free()
    with pytest.raises(cuplug.BackendError, match=r"not a live (buffer|tensor)"):
        bx.to_host()


@pytest.mark.reliability(
    case="bad input to Backend.run",
    how="mixed dtypes, non-contiguous, lengths that differ, wrong operand count, a list, a short out",
    expect="InvalidInputError naming the problem; nothing reaches the C ABI",
)
@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        (("add", np.ones(3, dtype=np.float32), np.ones(3, dtype=np.float64)), {}, "float64"),
        (("add", np.ones((4, 4), dtype=np.float32)[:, ::2], np.ones(8, dtype=np.float32)), {}, "C-contiguous"),
        (("add", np.ones(3, dtype=np.float32), np.ones(4, dtype=np.float32)), {}, "lengths differ"),
        (("add", np.ones(3, dtype=np.float32)), {}, "takes 2"),
        (("sum", [1.0, 2.0]), {}, "expected an array"),
        (
            ("add", np.ones(3, dtype=np.float32), np.ones(3, dtype=np.float32)),
            {"out": np.ones(2, dtype=np.float32)},
            "out has 2",
        ),
    ],
)
def test_bad_input_is_a_clear_error(b, args, kwargs, match):
    with pytest.raises(cuplug.InvalidInputError, match=match):
        b.run(*args, **kwargs)


def test_unknown_op(b):
    with pytest.raises(cuplug.UnknownOpError, match="mul"):
        b.run("mul", np.ones(2, dtype=np.float32))


@pytest.mark.reliability(
    case="use after close, double close",
    how="run() and close() on a closed backend",
    expect="BackendClosedError, no crash",
)
def test_use_after_close_and_double_close():
    b = cuplug.load()
    b.close()
    with pytest.raises(cuplug.BackendClosedError):
        b.run("sum", np.ones(2, dtype=np.float32))
    with pytest.raises(cuplug.BackendClosedError):
        b.close()


@pytest.mark.reliability(
    case="buffer ids of another instance",
    how="a Buffer of one backend passed to another, and a forged Buffer",
    expect="InvalidInputError / BackendError naming the id",
)
def test_buffers_of_another_instance_are_refused(b):
    with cuplug.load() as other:
        foreign = other.buffer(np.ones(4, dtype=np.float32))
        with pytest.raises(cuplug.InvalidInputError, match="another backend"):
            b.run("add", foreign, foreign)
        b_own = b.buffer(np.ones(4, dtype=np.float32))
        stale = cuplug.Buffer(b, foreign.id, 4)  # another instance's id presented to b
        with pytest.raises(cuplug.BackendError, match=r"not a live (buffer|tensor)"):
            b.run("add", b_own, stale)


def test_two_instances_from_many_threads_do_not_cross_talk():
    backends = [cuplug.load(), cuplug.load()]
    errors: list[str] = []

    def work(k: int) -> None:
        rng = np.random.default_rng(k)
        be = backends[k % 2]
        for _ in range(50):
            x = rng.standard_normal(4096, dtype=np.float32)
            y = rng.standard_normal(4096, dtype=np.float32)
            if not np.array_equal(be.run("add", x, y), x + y):
                errors.append(f"thread {k}: wrong add")
            bx = be.buffer(x)
            if not np.array_equal(
                be.run("scale_add", bx, alpha=2.0, beta=float(k)).to_host(), np.float32(2) * x + np.float32(k)
            ):
                errors.append(f"thread {k}: wrong resident scale_add")
            bx.free()

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for be in backends:
        be.close()
    assert errors == []


def test_import_opens_no_cuda_and_no_numpy():
    code = "import sys, cuplug; maps = open('/proc/self/maps').read();print('numpy' in sys.modules, 'libcuda' in maps)"
    proc = run_py(code, clean_env())
    assert proc.stdout.split() == ["False", "False"], proc.stderr


def test_bad_knob_values_name_the_variable(monkeypatch):
    for var, value in (("CUPLUG_BACKEND", "no such/variant"), ("CUPLUG_DEVICE", "x"), ("CUPLUG_REQUIRE_CUDA", "maybe")):
        monkeypatch.setenv(var, value)
        with pytest.raises(cuplug.ConfigError, match=var):
            cuplug.load()
        monkeypatch.setenv(var, "cpu" if var == "CUPLUG_BACKEND" else "0")


def test_numpy_not_needed_for_results():
    code = "import cuplug, array; b = cuplug.load(); print(list(b.run('add', array.array('f',[1,2]), array.array('f',[3,4]))))"
    proc = run_py(code, clean_env(CUPLUG_BACKEND="cpu"))
    assert proc.stdout.strip() == "[4.0, 6.0]", proc.stderr
    assert sys.modules.get("numpy") is not None  # (this process imported it; the child did not need it)
