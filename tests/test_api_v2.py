"""ABI v2 through the Python API on the real CPU twin: every dtype x op against NumPy/PyTorch, signature
checks, DLPack import/export (NumPy, PyTorch CPU), lifetimes, copies, fork."""

from __future__ import annotations

import gc
import weakref
from typing import ClassVar

import numpy as np
import pytest

import cuplug
import cuplug.contract.dtypes
from cuplug.runtime import dlpack, signature

torch = pytest.importorskip("torch")

FLOATS = ["float16", "float32", "float64"]
INTS = ["int8", "uint8", "int32", "int64"]


@pytest.fixture(autouse=True)
def cpu_only(monkeypatch):
    for var in ("CUPLUG_DISABLE_CUDA", "BACKEND_CUDA_DISABLE", "CUPLUG_REQUIRE_CUDA", "CUPLUG_DEVICE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("CUPLUG_BACKEND", "cpu")


@pytest.fixture
def b():
    with cuplug.load() as backend:
        yield backend


def _random(dtype: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype in INTS:
        info = np.iinfo(dtype)
        return np.asarray(rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True))
    return np.asarray(rng.standard_normal(shape) * 8).astype(dtype)


def _scale_add_ref(x: np.ndarray, alpha: float, beta: float) -> np.ndarray:
    """PyTorch's x * alpha + beta: two roundings in the op's math type (float32 for float16)."""
    if x.dtype.kind in "iu":
        return (x.astype(np.int64) * int(alpha) + int(beta)).astype(x.dtype)
    math = np.float64 if x.dtype == np.float64 else np.float32
    t = (x.astype(math) * math(alpha)).astype(x.dtype)
    return (t.astype(math) + math(beta)).astype(x.dtype)


@pytest.mark.parametrize("dtype", FLOATS + INTS)
@pytest.mark.parametrize("shape", [(1,), (1000,), (3, 5, 7), ()])
def test_every_dtype_and_op_matches_numpy(b, dtype, shape):
    x, y = _random(dtype, shape, 1), _random(dtype, shape, 2)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(b.run("add", x, y), (x + y).astype(dtype))
        alpha, beta = (3, -7) if dtype in INTS else (1.7, -0.3)
        got = b.run("scale_add", x, alpha=alpha, beta=beta)
        assert got.dtype == np.dtype(dtype) and got.shape == shape
        np.testing.assert_array_equal(got, _scale_add_ref(x, alpha, beta))
    total = b.run("sum", x)
    if dtype in INTS:
        assert isinstance(total, int)
        assert total == int(np.sum(x.astype(np.int64)))  # int64 accumulation, wrapping like NumPy's
    else:
        ref = float(np.sum(x.astype(np.float64)))
        tol = {"float16": 2e-3, "float32": 1e-6, "float64": 1e-12}[dtype]
        assert total == pytest.approx(ref, rel=tol, abs=tol * float(np.sum(np.abs(x.astype(np.float64)))))


def test_integer_add_wraps_like_numpy(b):
    x = np.array([127, -128, 100], dtype=np.int8)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(b.run("add", x, x), x + x)
    assert b.run("sum", np.full(3, 2**62, dtype=np.int64)) == int(np.sum(np.full(3, 2**62, dtype=np.int64)))


def _bf16_round(x32: torch.Tensor) -> torch.Tensor:
    return x32.to(torch.bfloat16)


def test_bfloat16_via_pytorch_cpu_tensors(b):
    """bfloat16 has no buffer-protocol format: PyTorch CPU tensors come in through DLPack and results are
    PyTorch tensors, bit-exact against PyTorch's own float32-then-round arithmetic."""
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(4097, generator=g) * 8).to(torch.bfloat16)
    y = (torch.randn(4097, generator=g) * 8).to(torch.bfloat16)
    got = b.run("add", x, y)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.bfloat16
    assert torch.equal(got, x + y)
    ref = _bf16_round(_bf16_round(x.float() * 1.5).float() + 0.25)
    assert torch.equal(b.run("scale_add", x, alpha=1.5, beta=0.25), ref)
    assert b.run("sum", x) == pytest.approx(float(x.double().sum()), rel=1e-2)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64, torch.int8, torch.int32])
def test_pytorch_cpu_tensors_match_pytorch(b, dtype):
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(2, 300, generator=g) * 50).to(dtype)
    y = (torch.randn(2, 300, generator=g) * 50).to(dtype)
    assert torch.equal(b.run("add", x, y), x + y)


# ---- signature checks: each a clear error before anything reaches C


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        (("add", np.ones(3, np.float32), np.ones(3, np.float64)), {}, r"y must match x.*float64"),
        (("add", np.ones((4, 4), np.float32)[:, ::2], np.ones((4, 2), np.float32)), {}, "C-contiguous"),
        (("add", np.ones(3, np.float32), np.ones(4, np.float32)), {}, "lengths differ"),
        (("add", np.ones(3, np.float32)), {}, "takes 2"),
        (("sum", [1.0, 2.0]), {}, "expected an array"),
        (("sum", np.ones(3, np.complex64)), {}, "not a dtype cuplug knows"),
        (("sum", np.ones(3, bool)), {}, "not a dtype cuplug knows"),
        (("add", np.ones(3, np.float32), np.ones(3, np.float32)), {"out": np.ones(2, np.float32)}, "out has 2"),
        (("add", np.ones(3, np.float32), np.ones(3, np.float32)), {"out": np.ones(3, np.float64)}, "must be float32"),
        (("scale_add", np.ones(3, np.float32)), {"gamma": 1.0}, r"unknown attribute.*gamma.*alpha, beta"),
        (("scale_add", np.ones(3, np.float32)), {"alpha": "2"}, "must be a number"),
        (("scale_add", np.ones(3, np.int32)), {"alpha": 0.5}, r"integral|integer"),
        (("add", np.ones(3, np.float32), np.ones(3, np.float32)), {"out": (np.ones(3), np.ones(3))}, "1 output"),
    ],
)
def test_bad_input_is_a_clear_error(b, args, kwargs, match):
    with pytest.raises(cuplug.InvalidInputError, match=match):
        b.run(*args, **kwargs)


def test_read_only_out_is_refused(b):
    out = np.zeros(3, np.float32)
    out.flags.writeable = False
    with pytest.raises(cuplug.InvalidInputError, match="read-only"):
        b.run("add", np.ones(3, np.float32), np.ones(3, np.float32), out=out)


def test_out_is_written_and_returned(b):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = np.empty_like(x)
    assert b.run("add", x, x, out=out) is out
    np.testing.assert_array_equal(out, x + x)


def test_sum_honours_out(b):
    out = np.zeros((), np.float32)
    assert b.run("sum", np.ones(5, np.float32), out=out) is out and float(out) == 5.0


def test_non_contiguous_pytorch_tensor_names_the_fix(b):
    x = torch.ones(4, 4).t()
    with pytest.raises(cuplug.InvalidInputError, match=r"contiguous\(\)"):
        b.run("sum", x)


class _FakeCudaArray:
    """A CUDA array as CuPy/Numba present it; its pointer is never touched by the CPU backend."""

    __cuda_array_interface__: ClassVar[dict] = {
        "shape": (4,),
        "typestr": "<f4",
        "data": (0xDEAD0000, False),
        "version": 3,
    }


class _FakeDLPackCuda:
    def __dlpack_device__(self):
        return (2, 0)

    def __dlpack__(self, stream=None):
        raise AssertionError("the CPU backend must refuse before asking for the capsule")


@pytest.mark.parametrize("operand", [_FakeCudaArray(), _FakeDLPackCuda()])
def test_cuda_tensor_to_the_cpu_backend_is_refused_naming_both_sides(b, operand):
    with pytest.raises(cuplug.InvalidInputError, match=r"(?is)cuda.*CPU backend.*x\.cpu\(\)"):
        b.run("sum", operand)


def test_signatures_are_data(b):
    add = b.ops["add"]
    assert [i.name for i in add.inputs] == ["x", "y"] and add.elementwise
    assert {d.name for d in add.inputs[0].dtypes} >= {"float16", "bfloat16", "float32", "int8", "int64"}
    assert [a.name for a in b.ops["scale_add"].attrs] == ["alpha", "beta"]
    assert not b.ops["sum"].elementwise
    assert "add(" in repr(add)


def test_size_rules_are_checked_in_python_naming_op_and_rule():
    sig = signature.OpSignature(
        "layernorm",
        {
            "inputs": [{"name": "x", "dtypes": ["float32"]}],
            "outputs": [{"name": "y", "dtype": {"like": 0}, "shape": {"like": 0}}],
            "size_rules": [{"input": 0, "multiple_of": 4096, "min": 4096, "max": None}],
        },
    )
    f32 = cuplug.contract.dtypes.BY_NAME["float32"]
    sig.check_inputs([(f32, (8192,))])
    for n in (1000, 0, 4097):
        with pytest.raises(cuplug.InvalidInputError, match=rf"layernorm: x has {n} elements.*multiple of 4096"):
            sig.check_inputs([(f32, (n,))])


def test_output_rules_from_attributes():
    sig = signature.OpSignature(
        "quant",
        {
            "inputs": [{"name": "x", "dtypes": ["float16", "float32"]}],
            "outputs": [
                {"name": "q", "dtype": {"fixed": "int8"}, "shape": {"like": 0}},
                {"name": "absmax", "dtype": {"fixed": "float32"}, "shape": {"blocks_of": 0, "attr": "blocksize"}},
                {"name": "s", "dtype": {"accum_of": 0}, "shape": {"scalar": True}},
            ],
            "attrs": [{"name": "blocksize", "kind": "int64", "default": 256}],
        },
    )
    f16 = cuplug.contract.dtypes.BY_NAME["float16"]
    attrs = sig.attr_values({"blocksize": 64})
    got = sig.output_specs([(f16, (10, 13))], attrs)
    assert [(d.name, s) for d, s in got] == [("int8", (10, 13)), ("float32", (3,)), ("float16", ())]


# ---- zero copy: DLPack and the buffer protocol


def test_resident_tensor_exports_without_a_copy(b):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = b.buffer(x)
    r = b.run("add", t, t)
    assert isinstance(r, cuplug.Tensor) and r.shape == (3, 4) and r.dtype.name == "float32"
    a = np.from_dlpack(r)
    assert a.ctypes.data == r.data_ptr and a.shape == (3, 4)
    np.testing.assert_array_equal(a, x + x)
    pt = torch.from_dlpack(r)
    assert pt.data_ptr() == r.data_ptr
    pt += 1  # the same memory, seen by every consumer
    np.testing.assert_array_equal(a, x + x + 1)
    np.testing.assert_array_equal(r.to_host(), x + x + 1)


def test_dlpack_capsule_import_reads_in_place(b):
    class OnlyDLPack:  # no buffer protocol: the capsule path
        def __init__(self, a):
            self.a = a

        def __dlpack__(self, stream=None):
            return self.a.__dlpack__()

        def __dlpack_device__(self):
            return self.a.__dlpack_device__()

    x = np.arange(10, dtype=np.int32)
    out = np.empty_like(x)
    b.run("add", OnlyDLPack(x), OnlyDLPack(x), out=OnlyDLPack(out))
    np.testing.assert_array_equal(out, x + x)


def test_stream_arguments(b):
    class WithProtocol:
        def __cuda_stream__(self):
            return (0, 1234)

    class TorchLike:
        cuda_stream = 77

    from cuplug.runtime.api import stream_handle

    assert stream_handle(5) == 5 and stream_handle(WithProtocol()) == 1234 and stream_handle(TorchLike()) == 77
    for bad in (-1, "s", 1.5, True):
        with pytest.raises(cuplug.InvalidInputError, match="stream"):
            stream_handle(bad)
    np.testing.assert_array_equal(b.run("add", np.ones(2, np.float32), np.ones(2, np.float32), stream=0), [2, 2])


def test_the_tensor_descriptor_is_dlpacks_dltensor():
    import ctypes

    from cuplug.contract import abi

    assert ctypes.sizeof(abi.CTensor) == 48 and abi.CTensor.shape.offset == 24 and abi.CTensor.byte_offset.offset == 40
    assert ctypes.sizeof(abi.CDtype) == 4 and abi.CTensor.dtype.offset == 20


def test_an_input_can_take_its_shape_from_another_and_an_attribute():
    """Per-block scales of a dequantize: checked before the call, and samples follow the rule."""
    from cuplug.tools import samples

    sig = signature.OpSignature(
        "dequantize",
        {
            "inputs": [
                {"name": "q", "dtypes": ["int8"]},
                {"name": "absmax", "dtypes": ["float32"], "shape": {"blocks_of": 0, "attr": "blocksize"}},
            ],
            "outputs": [{"name": "out", "dtype": {"fixed": "float32"}, "shape": {"like": 0}}],
            "attrs": [{"name": "blocksize", "kind": "int64", "default": 256}],
            "sample_n": 4096,
        },
    )
    i8, f32 = cuplug.contract.dtypes.BY_NAME["int8"], cuplug.contract.dtypes.BY_NAME["float32"]
    sig.check_inputs([(i8, (300,)), (f32, (2,))])
    with pytest.raises(cuplug.InvalidInputError, match=r"dequantize: absmax has shape \[3\]; it must be \[2\]"):
        sig.check_inputs([(i8, (300,)), (f32, (3,))])
    sig.check_inputs([(i8, (300,)), (f32, (5,))], sig.attr_values({"blocksize": 64}))
    inputs, _ = samples.sample_inputs(sig)
    assert [b.shape for b in inputs] == [(4096,), (16,)]


# ---- found by a hostile review of the v2 API (each a behaviour a caller relies on)


def test_a_freed_tensor_never_hands_out_its_address(b):
    t = b.buffer(np.ones(8, np.float32))
    assert t.data_ptr
    t.free()
    with pytest.raises(cuplug.BackendError, match="not a live"):
        t.data_ptr  # noqa: B018 - the property is the call under test


def test_a_producer_byte_offset_is_honoured_everywhere(b):
    """A DLPack producer may export a view as (base pointer, byte_offset): every path reads the view."""
    from cuplug.contract import abi

    base = np.arange(8, dtype=np.float32)

    class OffsetView:  # base[4:], exported as base's address + 16 bytes
        def __dlpack_device__(self):
            return (1, 0)

        def __dlpack__(self, stream=None, **_):
            cap = dlpack.export(base, base.ctypes.data, (1, 0), abi.CDtype(2, 32, 1), (4,), False)
            ptr = dlpack._obj_api.PyCapsule_GetPointer(cap, b"dltensor")
            dlpack.DLManagedTensor.from_address(ptr).dl_tensor.byte_offset = 16
            return cap

    v = OffsetView()
    np.testing.assert_array_equal(b.run("add", v, np.zeros(4, np.float32)), [4, 5, 6, 7])
    np.testing.assert_array_equal(b.buffer(v).to_host(), [4, 5, 6, 7])
    b.buffer(np.full(4, 9, np.float32)).to_host(out=v)
    np.testing.assert_array_equal(base, [0, 1, 2, 3, 9, 9, 9, 9])  # the view was written, not the base


def test_a_resident_tensor_does_not_keep_its_host_source_alive(b):
    x = np.ones(1 << 20, np.float32)
    watch = weakref.ref(x)
    t = b.buffer(x)
    y = b.run("add", t, t)
    del x
    gc.collect()
    assert watch() is None
    assert isinstance(y.to_host(), np.ndarray)  # still of the caller's kind


def test_a_resident_float16_scalar_needs_no_numpy():
    code = (
        "import cuplug; from cuplug.runtime.hostbuf import HostBuffer; b = cuplug.load(); "
        "h = HostBuffer(cuplug.contract.dtypes.BY_NAME['float16'], (4,)); h.fill([1.5, 2.0, 0.25, 4.0]); "
        "print(b.run('sum', b.buffer(h)), b.run('sum', b.empty((0,), 'int32')))"
    )
    from conftest import clean_env, run_py

    proc = run_py(code, clean_env(CUPLUG_BACKEND="cpu"))
    assert proc.stdout.split() == ["7.75", "0"], proc.stderr


def test_empty_tensors_are_contiguous_whatever_their_strides(b):
    x = torch.empty(3, 0).t()  # shape (0, 3), strides (1, 1): PyTorch calls it contiguous
    assert b.run("sum", x) == 0.0


@pytest.mark.parametrize("bad", [np.True_, torch.tensor(True), 10**400, "2"])
def test_attributes_that_are_not_numbers(b, bad):
    with pytest.raises(cuplug.InvalidInputError, match=r"attribute alpha must be a number"):
        b.run("scale_add", np.ones(3, np.float32), alpha=bad)


def test_integer_attributes_take_integral_values_of_any_kind():
    sig = signature.OpSignature(
        "q", {"inputs": [], "attrs": [{"name": "blocksize", "kind": "int64", "default": 9223372036854775807}]}
    )
    assert sig.attr_values({}) == [("blocksize", "int64", (1 << 63) - 1)]  # the default survives the double
    assert sig.attr_values({"blocksize": torch.tensor(64.0)}) == [("blocksize", "int64", 64)]
    assert sig.attr_values({"blocksize": np.int16(128)}) == [("blocksize", "int64", 128)]
    for bad in (torch.tensor(2.5), 2.5):
        with pytest.raises(cuplug.InvalidInputError, match="blocksize is an integer"):
            sig.attr_values({"blocksize": bad})
    with pytest.raises(cuplug.InvalidInputError, match="does not fit in int64"):
        sig.attr_values({"blocksize": 1 << 63})


def test_numpy_scalar_types_name_dtypes(b):
    assert b.empty(2, np.float16).dtype.name == "float16" and b.empty(2, np.int64).dtype.name == "int64"
    with pytest.raises(cuplug.InvalidInputError, match="byte order"):
        b.empty(2, np.dtype(">f4"))


def test_an_exported_tensor_can_still_be_read_after_close(b):
    t = b.buffer(np.arange(4, dtype=np.float32))
    first = np.from_dlpack(t)
    b.close()
    np.testing.assert_array_equal(t.to_host(), [0, 1, 2, 3])
    np.testing.assert_array_equal(np.from_dlpack(t), first)
