"""A hostile review of run(), its prepared-call cache and the framework adapters (2026-12-04).

Tests marked ``# FINDING n`` state the behaviour the code should have and fail on the code reviewed
(e830933); the others are variations that were handled correctly, kept as regression tests. A case that
might crash the interpreter runs in a subprocess.
"""

from __future__ import annotations

import array
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import cuplug
from cuplug.contract.errors import InvalidInputError
from test_api_v2 import _over
from test_hostile_operands import b, cpu_only, gpu, spy  # noqa: F401  (the same fixtures: CPU twin, spy, CUDA face)

torch = pytest.importorskip("torch")


SIZED = {
    "iota": {
        "inputs": [{"name": "like", "dtypes": ["float32"]}],
        "outputs": [{"name": "out", "dtype": {"fixed": "float32"}, "shape": {"attr": "n"}}],
        "attrs": [{"name": "n", "kind": "int64", "default": 4}],
    },
    "fiota": {  # a float64 attribute sizing an output: the op-table validation lets it through
        "inputs": [{"name": "like", "dtypes": ["float32"]}],
        "outputs": [{"name": "out", "dtype": {"fixed": "float32"}, "shape": {"attr": "n"}}],
        "attrs": [{"name": "n", "kind": "float64", "default": 4}],
    },
}


@pytest.fixture
def sized(b, spy):
    spy.answers["call"] = 0
    with _over(b, spy, ops=SIZED) as be:
        yield be


def _in_subprocess(code: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CUPLUG_BACKEND": "cpu"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)


# ---- findings -----------------------------------------------------------------------------------------------


class _Flip:
    """An attribute value that says 3 twice, then 5 (a 0-d array another thread writes reads the same)."""

    def __init__(self):
        self.reads = 0

    def __index__(self):
        self.reads += 1
        return 3 if self.reads <= 2 else 5

    def __float__(self):
        return float(self.__index__())


# FINDING 1: a plan is keyed on the sizing attribute's value read once, and built from a second read: a later,
# honest call with n=3 is served the plan of n=5 (5 elements, C told n=5).
def test_a_plan_is_never_served_for_attribute_values_it_was_not_built_for(sized, spy):
    sized.run("iota", np.ones(1, np.float32), n=_Flip())
    spy.log.clear()
    r = sized.run("iota", np.ones(1, np.float32), n=3)
    assert r.shape == (3,)
    (call,) = spy.entries("call")
    assert call[3] == {"n": (0, 3)} and call[2][0]["shape"] == [3]


class _FloatRaises:
    def __init__(self, exc):
        self.exc = exc

    def __float__(self):
        raise self.exc


class _DtypeRaises:
    @property
    def dtype(self):
        raise RuntimeError("dtype property")

    def __float__(self):
        return 1.0


# FINDING 2: an attribute whose __float__ (or dtype property) raises anything but TypeError/ValueError/
# OverflowError escapes as that exception, on the first call and on a planned one.
@pytest.mark.parametrize(
    "value", [_FloatRaises(RuntimeError("boom")), _FloatRaises(ZeroDivisionError()), _DtypeRaises()]
)
def test_an_attribute_whose_conversion_raises_is_an_invalid_input(b, value):
    x = np.ones(3, np.float32)
    b.run("scale_add", x, alpha=2.0)  # the plan exists: the value is converted in fill()
    with pytest.raises(InvalidInputError, match="attribute alpha must be a number"):
        b.run("scale_add", x, alpha=value)
    with pytest.raises(InvalidInputError, match="attribute beta must be a number"):
        b.run("scale_add", x, beta=value)


# FINDING 3: a float64 attribute that sizes an output, given nan or inf: int() in _rule_shape raises
# ValueError / OverflowError.
@pytest.mark.parametrize("n", [float("nan"), float("inf"), float("-inf")])
def test_a_sizing_attribute_that_is_not_finite_is_an_invalid_input(sized, n):
    with pytest.raises(InvalidInputError, match="attribute n"):
        sized.run("fiota", np.ones(1, np.float32), n=n)


class _Sub(np.ndarray):
    pass


# FINDING 4: NumPy arrays whose memoryview() raises ValueError (datetime64, timedelta64), as ndarray or as a
# subclass (the DLPack path): the ValueError escapes.
@pytest.mark.parametrize("dtype", ["M8[s]", "m8[s]"])
@pytest.mark.parametrize("subclass", [False, True])
def test_numpy_arrays_without_a_buffer_format_are_refused(b, dtype, subclass):
    x = np.zeros(3, dtype)
    if subclass:
        x = x.view(_Sub)
    with pytest.raises(InvalidInputError, match="sum: x"):
        b.run("sum", x)


# FINDING 5: PyTorch tensors of a non-strided layout: is_contiguous()/data_ptr() raise RuntimeError.
@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.ones(1, 3).to_sparse_csr(),
        lambda: torch.ones(3).to_mkldnn(),
        lambda: torch.nested.nested_tensor([torch.ones(3), torch.ones(2)]),
    ],
    ids=["sparse_csr", "mkldnn", "nested"],
)
def test_pytorch_tensors_of_another_layout_are_refused(b, make):
    with pytest.raises(InvalidInputError, match="sum: x"):
        b.run("sum", make())


LYING_SUBCLASS = r"""
import sys, torch, cuplug
class DataPtr(torch.Tensor):
    def data_ptr(self): return 0x1000
class Shape(torch.Tensor):
    @property
    def shape(self): return torch.Size([1 << 30])
b = cuplug.load()
x = torch.ones(1024).as_subclass({"data_ptr": DataPtr, "shape": Shape}[sys.argv[1]])
try:
    print("sum", float(b.run("sum", x)))
except cuplug.InvalidInputError as e:
    print("refused", e)
"""


# FINDING 6: a torch.Tensor subclass is read through its own (overridable) data_ptr() and shape: a lying one
# reaches C with an address or a shape that is not its memory, and the process segfaults. Fixed: only
# torch.Tensor and torch.nn.Parameter are read through their accessors; a subclass goes through DLPack,
# whose export describes the tensor's real memory: refused, or the sum of what the tensor really holds.
@pytest.mark.parametrize("lie", ["data_ptr", "shape"])
def test_a_tensor_subclass_that_lies_is_refused_not_a_crash(lie):
    proc = subprocess.run(
        [sys.executable, "-c", LYING_SUBCLASS, lie],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "CUPLUG_BACKEND": "cpu"},
    )
    assert proc.returncode == 0, f"rc {proc.returncode}: {proc.stderr[-1000:]}"
    assert "refused" in proc.stdout or "sum 1024.0" in proc.stdout, proc.stdout


class _NumelLiar(torch.Tensor):
    def numel(self):
        return 1


# FINDING 6 (same root): a subclass whose numel() lies small hides an overlap of out= with an input.
def test_a_tensor_subclass_cannot_hide_an_overlap(b):
    base = torch.zeros(5)
    x = base[0:4].as_subclass(_NumelLiar)
    with pytest.raises(InvalidInputError, match="overlaps"):
        b.run("add", x, x, out=base[1:5])


class _Stream:
    def __init__(self, proto):
        self.proto = proto

    @property
    def __cuda_stream__(self):
        return self.proto()


# FINDING 7: a stream object whose __cuda_stream__ raises or answers no (version, int) pair lets its exception
# (ZeroDivisionError, ValueError) out.
@pytest.mark.parametrize(
    "proto", [lambda: 1 / 0, lambda: lambda: (0,), lambda: lambda: (0, "x")], ids=["raises", "short", "str"]
)
def test_a_stream_object_that_lies_is_an_invalid_input(b, proto):
    with pytest.raises(InvalidInputError, match="stream"):
        b.run("sum", np.ones(2, np.float32), stream=_Stream(proto))


# FINDING 7: a stream handle of 2^64 or more is wrapped by ctypes' c_uint64 (2^64 -> 0, the instance stream;
# 2^64 + 5 -> stream 5): the call runs on a stream nobody named.
@pytest.mark.parametrize("handle", [1 << 64, (1 << 64) + 5, 1 << 70])
def test_a_stream_handle_past_64_bits_is_refused(gpu, spy, handle):
    t = gpu.empty(4)
    spy.log.clear()
    with pytest.raises(InvalidInputError, match="stream"):
        gpu.run("add", t, t, stream=handle)
    assert not spy.entries("call")


class _NoModule(bytearray):
    pass


_NoModule.__module__ = None


# FINDING 10: an operand whose type's __module__ is not a string: AttributeError in _HostKind.of.
def test_an_operand_type_without_a_module_name_still_works(b):
    assert b.run("sum", _NoModule(8)) == 0


# FINDING 11: an op name that is not hashable: TypeError from the op-table lookup.
def test_an_unhashable_op_name_is_an_unknown_op(b):
    with pytest.raises(cuplug.UnknownOpError):
        b.run(["add"], np.ones(2, np.float32))


# FINDING 12: a NumPy masked array is read without its mask (the CAI path refuses masks): its sum counts the
# masked elements.
def test_a_masked_array_is_refused_as_on_the_cai_path(b):
    m = np.ma.masked_array(np.ones(3, np.float32), mask=[0, 1, 0])
    with pytest.raises(InvalidInputError, match="mask"):
        b.run("sum", m)


JAX_AFTER_CLOSE = r"""
import cuplug, cuplug.jax, jax, jax.numpy as jnp
b = cuplug.load()
ops = cuplug.jax.register(b)
f = jax.jit(lambda a: ops.add(a, a))
x = jnp.ones(4)
f(x).block_until_ready()
b.close()
try:
    print("ran", f(x))
except Exception as e:
    print("refused", type(e).__name__, e)
"""


# FINDING 8: a function jax.jit compiled keeps the instance handle as a constant and calls it after
# Backend.close() freed the instance (use after free in C): it must fail, naming the closed backend.
def test_a_compiled_jax_function_does_not_call_a_closed_backend():
    pytest.importorskip("jax")
    proc = _in_subprocess(JAX_AFTER_CLOSE)
    assert proc.returncode == 0, proc.stderr[-1000:]
    assert "refused" in proc.stdout and "closed" in proc.stdout


# FINDING 9: cuplug.jax ops given a dtype cuplug does not know (ValueError from dtypes.from_name) or a Python
# scalar (AttributeError: no .shape).
@pytest.mark.parametrize("make", ["bool", "complex64", "scalar"])
def test_jax_ops_refuse_what_they_cannot_take(b, make):
    jax = pytest.importorskip("jax")
    import cuplug.jax

    ops = cuplug.jax.register(b)
    x = 1.0 if make == "scalar" else jax.numpy.ones(3, make)
    with pytest.raises(InvalidInputError):
        ops.sum(x)


# ---- variations handled correctly (regression tests) --------------------------------------------------------


@pytest.mark.parametrize("value", [np.bool_(True), torch.tensor(True), True, None, 1j, "1", np.array([1.0, 2.0])])
def test_attributes_that_are_no_number_are_refused(b, value):
    with pytest.raises(InvalidInputError, match="attribute alpha must be a number"):
        b.run("scale_add", np.ones(2, np.float32), alpha=value)


def test_attribute_values_of_other_numeric_types(b):
    x = np.ones(2, np.float32)
    assert b.run("scale_add", x, alpha=torch.tensor(2.0)).tolist() == [2.0, 2.0]
    assert b.run("scale_add", x, alpha=np.float16(3)).tolist() == [3.0, 3.0]
    import fractions

    assert b.run("scale_add", x, alpha=fractions.Fraction(1, 2)).tolist() == [0.5, 0.5]


def test_sizing_attributes_key_their_plans(sized, spy):
    x = np.ones(1, np.float32)
    for n in (3, 7, 3, 0):
        assert sized.run("iota", x, n=n).shape == (n,)
    assert sized.run("iota", x, n=3.0).shape == (3,)
    assert sized.run("iota", x).shape == (4,)
    with pytest.raises(InvalidInputError, match="must be >= 0"):
        sized.run("iota", x, n=-1)
    with pytest.raises(InvalidInputError, match="does not fit in int64"):
        sized.run("iota", x, n=np.uint64(2**64 - 1))
    with pytest.raises(cuplug.OutOfMemoryError):
        sized.run("iota", x, n=1 << 62)


def test_a_plan_serves_only_its_own_dtypes_shapes_and_out(b):
    x, y = np.arange(4, dtype=np.float32), np.ones(4, np.float32)
    o = np.zeros(4, np.float32)
    assert b.run("add", x, y, out=o) is o and o.tolist() == [1, 2, 3, 4]
    ro = np.zeros(4, np.float32)
    ro.setflags(write=False)
    with pytest.raises(InvalidInputError, match="read-only"):
        b.run("add", x, y, out=ro)
    r = b.run("add", x.astype(np.int32), y.astype(np.int32))
    assert r.dtype == np.int32 and r.tolist() == [1, 2, 3, 4]
    assert b.run("add", x, y).tolist() == [1, 2, 3, 4]
    a = np.ones(4, np.float32)
    assert b.run("sum", a) == 4
    a.resize(8, refcheck=False)
    a[4:] = 1
    assert b.run("sum", a) == 8
    a.shape = (2, 4)
    assert b.run("sum", a) == 8


def test_concurrent_calls_over_more_shapes_than_the_cache_holds(b):
    wrong, errors = [], []

    def work(seed):
        import random

        r = random.Random(seed)
        for _ in range(600):
            n = r.randint(1, 700)
            dt = r.choice([np.float32, np.int32, np.float64])
            x, y = np.full(n, 2, dt), np.full(n, 3, dt)
            try:
                z = b.run("add", x, y) if r.random() < 0.5 else b.run("add", x, y, out=np.empty(n, dt))
                if z.shape != (n,) or not (z == 5).all():
                    wrong.append((n, dt))
            except Exception as e:
                errors.append(repr(e))

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong and not errors


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.arange(6, dtype=torch.bfloat16)[2:],  # storage offset
        lambda: torch.ones(3, 1).as_strided((3, 1), (1, 77)),  # contiguous by its size-1 dim
        lambda: torch.ones(3, requires_grad=True),  # an input that requires grad
        lambda: torch.tensor(2.0),
        lambda: torch.ones(0),
        lambda: torch.nn.Parameter(torch.ones(3)),
    ],
    ids=["offset_bf16", "size1_stride", "requires_grad", "0d", "empty", "parameter"],
)
def test_pytorch_tensors_read_in_place(b, make):
    t = make()
    assert float(b.run("sum", t)) == float(t.detach().float().sum())


def test_pytorch_refusals(b):
    with pytest.raises(InvalidInputError, match="requires grad"):
        b.run("add", torch.ones(3), torch.ones(3), out=torch.zeros(3, requires_grad=True))
    with pytest.raises(InvalidInputError, match="not C-contiguous"):
        b.run("sum", torch.ones(1, 3, 2, 2).to(memory_format=torch.channels_last))
    with pytest.raises(InvalidInputError, match="not C-contiguous"):
        b.run("sum", torch.ones(1).expand(3))
    with pytest.raises(InvalidInputError, match="lazily negated"):
        b.run("sum", torch.ones(3)._neg_view())
    with pytest.raises(InvalidInputError, match="meta"):
        b.run("sum", torch.ones(3, device="meta"))
    s = torch.zeros(4)
    with pytest.raises(InvalidInputError, match="partly overlaps"):
        b.run("add", s[0:3], s[0:3], out=s[1:4])
    s = torch.ones(4)
    b.run("add", s, s, out=s)
    assert s.tolist() == [2, 2, 2, 2]


@pytest.mark.parametrize(
    ("make", "expect"),
    [
        (lambda: np.array(2.0, np.float32), 2.0),
        (lambda: np.zeros(0, np.float32), 0.0),
        (lambda: np.zeros((0, 3), np.float32), 0.0),
        (lambda: np.lib.stride_tricks.as_strided(np.ones(3, np.float32), (3, 1), (4, 1000)), 3.0),
        (lambda: np.matrix([[1.0, 2.0, 3.0]], dtype=np.float32), 6.0),
        (lambda: array.array("l", [1, 1, 1]), 3),
        (lambda: memoryview(bytearray(12)).cast("f", (1, 3)), 0.0),
    ],
)
def test_host_operands_read_in_place(b, make, expect):
    assert b.run("sum", make()) == expect


@pytest.mark.parametrize(
    "make",
    [
        lambda: np.array([1, "a", None], dtype=object),
        lambda: np.zeros(3, dtype=[("a", "f4")]),
        lambda: np.ones(3, ">f4"),
        lambda: np.ones(3, np.longdouble),
        lambda: np.ones((2, 3), np.float32, order="F"),
        lambda: np.arange(3, dtype=np.float32)[::-1],
        lambda: memoryview(np.arange(6, dtype=np.float32))[::2],
        lambda: array.array("L", [1]),
        lambda: [1.0, 2.0],
    ],
)
def test_host_operands_refused(b, make):
    with pytest.raises(InvalidInputError, match="sum: x"):
        b.run("sum", make())


def test_out_arguments_refused_or_taken(b):
    x, y = np.arange(4, dtype=np.float32), np.ones(4, np.float32)
    o = np.zeros(4, np.float32)
    assert b.run("add", x, y, out=[o]) is o
    for bad in ((o, o), (i for i in [o]), {0: o}, bytes(16)):
        with pytest.raises(InvalidInputError):
            b.run("add", x, y, out=bad)
    s = np.ones(4, np.float32)
    with pytest.raises(InvalidInputError, match="only an elementwise op"):
        b.run("sum", s[:1].reshape(()), out=s[:1].reshape(()))
    with pytest.raises(InvalidInputError, match=r"out must be float32\[\]"):
        b.run("sum", x, out=np.zeros(1, np.float32))


class _DeviceRaises:
    def __dlpack__(self, stream=None):
        raise AssertionError("never reached")

    @property
    def __dlpack_device__(self):
        raise KeyError("device")


class _DeviceFlips:
    """Says the host first, then CUDA: the capsule (of a NumPy array on the host) is checked against the first."""

    def __init__(self):
        self.a, self.reads = np.ones(3, np.float32), 0

    def __dlpack_device__(self):
        self.reads += 1
        return (1, 0) if self.reads == 1 else (2, 0)

    def __dlpack__(self, stream=None, **_):
        return self.a.__dlpack__()


def test_dlpack_producers_that_raise_or_change(b):
    with pytest.raises(InvalidInputError, match="__dlpack_device__"):
        b.run("sum", _DeviceRaises())
    p = _DeviceFlips()
    assert b.run("sum", p) == 3 and p.reads == 1
