"""The CPU backend's C ABI v2, driven directly through ctypes with this file's own structs.

Runs on the installed CPU .so (the ``cpu_lib_path`` fixture), or on the library that
``$CUPLUG_TEST_CPU_LIB`` names (a .so built straight from the checkout, before the
wheels exist). Test backends with other op tables (size rules, 40 ops, failing ops)
are compiled here from backends/common/cuplug_cpu_backend.h.

Reference semantics checked:
  add, scale_add   bit-exact: float16 via NumPy float16 computed in float32; bfloat16
                   via a float32 reference rounded to bfloat16 bits (RNE) here; float32
                   and float64 in their own precision, two roundings for x * alpha + beta;
                   integers wrap. NaN results are compared as "both NaN" (payloads not).
  sum              floats against a float64 NumPy sum: within one ulp of the output dtype
                   at the reference, plus 1e-12 of sum(|x|) for the summation order;
                   integers exactly (int64, wrapping).
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT, build_shared_library

SYMBOLS = {
    f"cuplug_backend_{name}"
    for name in (
        "abi_version create last_create_error ping call stream_wait alloc upload download tensor free sync "
        "last_error destroy"
    ).split()
}
ABI_VERSION = 2
OK, E_INVALID_ARGUMENT, E_UNKNOWN_OP, E_BAD_BUFFER, E_OUT_OF_MEMORY, E_DEVICE = 0, -1, -2, -3, -4, -5
E_NO_KERNEL_IMAGE, E_BUFFER_TOO_SMALL, E_WRONG_DEVICE = -6, -7, -8
CODES = {0, -1, -2, -3, -4, -5, -6, -7, -8}
DEVICE_CPU, DEVICE_CUDA, DEVICE_CUDA_HOST = 1, 2, 3
ATTR_INT64, ATTR_FLOAT64 = 0, 1


# ---- the ABI's structs --------------------------------------------------------------------------


class Dtype(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class Tensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device_type", ctypes.c_int32),
        ("device_id", ctypes.c_int32),
        ("ndim", ctypes.c_int32),
        ("dtype", Dtype),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class AttrValue(ctypes.Union):
    _fields_ = [("i", ctypes.c_int64), ("f", ctypes.c_double)]


class Attr(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("kind", ctypes.c_int32), ("value", AttrValue)]


# name -> (DLPack code, bits, NumPy storage dtype)
DTYPES = {
    "float16": (2, 16, np.float16),
    "bfloat16": (4, 16, np.uint16),  # NumPy has no bfloat16: raw bits
    "float32": (2, 32, np.float32),
    "float64": (2, 64, np.float64),
    "int8": (0, 8, np.int8),
    "uint8": (1, 8, np.uint8),
    "int32": (0, 32, np.int32),
    "int64": (0, 64, np.int64),
}
FLOATS = ["float16", "bfloat16", "float32", "float64"]
INTS = ["int8", "uint8", "int32", "int64"]


def dtype_of(name: str) -> Dtype:
    code, bits, _ = DTYPES[name]
    return Dtype(code, bits, 1)


def tensor(a, dtype: str | None = None, *, device=DEVICE_CPU, strides=None, byte_offset=0, shape=None, data=None):
    """A descriptor of NumPy array ``a`` (kept alive by the descriptor)."""
    if dtype is None:
        dtype = next(k for k, v in DTYPES.items() if v[2] == a.dtype.type and k != "bfloat16")
    shp = tuple(a.shape) if shape is None else tuple(shape)
    t = Tensor()
    t.data = a.ctypes.data if data is None else data
    t.device_type, t.device_id, t.ndim, t.dtype = device, 0, len(shp), dtype_of(dtype)
    t._keep = [a, (ctypes.c_int64 * max(1, len(shp)))(*shp)]
    t.shape = ctypes.cast(t._keep[1], ctypes.POINTER(ctypes.c_int64))
    if strides is not None:
        t._keep.append((ctypes.c_int64 * max(1, len(strides)))(*strides))
        t.strides = ctypes.cast(t._keep[2], ctypes.POINTER(ctypes.c_int64))
    t.byte_offset = byte_offset
    return t


def attr(name: str, value) -> Attr:
    a = Attr()
    a.name = name.encode()
    if isinstance(value, float):
        a.kind, a.value.f = ATTR_FLOAT64, value
    else:
        a.kind, a.value.i = ATTR_INT64, value
    return a


class Lib:
    """The 14 entry points with their v2 signatures."""

    def __init__(self, path):
        self.path = Path(path)
        L = self.lib = ctypes.CDLL(str(path))
        vp, ll, i, cp = ctypes.c_void_p, ctypes.c_longlong, ctypes.c_int, ctypes.c_char_p
        L.cuplug_backend_abi_version.restype = i
        L.cuplug_backend_create.restype, L.cuplug_backend_create.argtypes = vp, [cp]
        L.cuplug_backend_last_create_error.argtypes = [cp, i]
        L.cuplug_backend_ping.argtypes = [vp, cp, i]
        L.cuplug_backend_call.argtypes = [
            vp,
            cp,
            ctypes.POINTER(Tensor),
            i,
            ctypes.POINTER(Tensor),
            i,
            ctypes.POINTER(Attr),
            i,
            ctypes.c_uint64,
        ]
        L.cuplug_backend_stream_wait.argtypes = [vp, ctypes.c_uint64, ctypes.c_uint64]
        L.cuplug_backend_alloc.restype = ll
        L.cuplug_backend_alloc.argtypes = [vp, Dtype, i, ctypes.POINTER(ctypes.c_int64)]
        L.cuplug_backend_upload.argtypes = [vp, ll, vp, ll]
        L.cuplug_backend_download.argtypes = [vp, ll, vp, ll]
        L.cuplug_backend_tensor.argtypes = [vp, ll, ctypes.POINTER(Tensor)]
        L.cuplug_backend_free.argtypes = [vp, ll]
        L.cuplug_backend_sync.argtypes = [vp]
        L.cuplug_backend_last_error.argtypes = [vp, cp, i]
        L.cuplug_backend_destroy.argtypes = [vp]
        L.cuplug_backend_destroy.restype = None

    def create(self, pref: str | None = None) -> int:
        h = self.lib.cuplug_backend_create(None if pref is None else pref.encode())
        if not h:
            buf = ctypes.create_string_buffer(512)
            self.lib.cuplug_backend_last_create_error(buf, len(buf))
            raise RuntimeError(buf.value.decode())
        return h

    def destroy(self, h) -> None:
        self.lib.cuplug_backend_destroy(h)

    def error(self, h) -> str:
        need = self.lib.cuplug_backend_last_error(h, None, 0)
        buf = ctypes.create_string_buffer(need + 1)
        self.lib.cuplug_backend_last_error(h, buf, len(buf))
        return buf.value.decode()

    def ping(self, h) -> dict:
        need = self.lib.cuplug_backend_ping(h, None, 0)
        assert need > 0, need
        buf = ctypes.create_string_buffer(need + 1)
        assert self.lib.cuplug_backend_ping(h, buf, len(buf)) == need
        return json.loads(buf.value.decode())

    def call(self, h, op, ins=(), outs=(), attrs=(), stream=0, n_in=None, n_out=None) -> int:
        tin = (Tensor * max(1, len(ins)))(*ins)
        tout = (Tensor * max(1, len(outs)))(*outs)
        ta = (Attr * max(1, len(attrs)))(*attrs)
        return self.lib.cuplug_backend_call(
            h,
            None if op is None else op.encode(),
            tin,
            len(ins) if n_in is None else n_in,
            tout,
            len(outs) if n_out is None else n_out,
            ta,
            len(attrs),
            stream,
        )

    def alloc(self, h, dtype: str | Dtype, shape) -> int:
        d = dtype_of(dtype) if isinstance(dtype, str) else dtype
        arr = (ctypes.c_int64 * max(1, len(shape)))(*shape)
        return self.lib.cuplug_backend_alloc(h, d, len(shape), arr)

    def descriptor(self, h, rid) -> tuple[int, Tensor]:
        t = Tensor()
        return self.lib.cuplug_backend_tensor(h, rid, ctypes.byref(t)), t


@pytest.fixture(scope="module")
def lib_path(request) -> Path:
    override = os.environ.get("CUPLUG_TEST_CPU_LIB")
    return Path(override) if override else request.getfixturevalue("cpu_lib_path")


@pytest.fixture(scope="module")
def lib(lib_path) -> Lib:
    return Lib(lib_path)


@pytest.fixture
def handle(lib):
    h = lib.create()
    yield h
    lib.destroy(h)


def build_test_backend(tmp_path: Path, name: str, source: str) -> Lib:
    """A CPU backend with its own op table, built from the checkout's framework."""
    src = tmp_path / f"{name}.c"
    src.write_text(source)
    out = tmp_path / f"lib{name}.so"
    build_shared_library(
        src,
        out,
        "-std=c11",
        "-ffp-contract=off",
        "-fvisibility=hidden",
        "-Wno-missing-field-initializers",
        f'-DCUPLUG_BACKEND_NAME="{name}"',
        f"-I{ROOT / 'backends' / 'include'}",
        f"-I{ROOT / 'backends' / 'common'}",
        f"-Wl,--version-script={ROOT / 'backends' / 'cmake' / 'cuplug_exports.map'}",
        "-Wl,--no-undefined",
        "-lpthread",
        "-lm",
    )
    return Lib(out)


# ---- reference arithmetic -----------------------------------------------------------------------


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    f = np.array(x, dtype=np.float32).reshape(-1)
    u = f.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(f)
    r[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return r.reshape(np.shape(x))


def as_float(a: np.ndarray, dtype: str) -> np.ndarray:
    """The values of storage array a (bfloat16: bits) as float64."""
    return bf16_to_f32(a).astype(np.float64) if dtype == "bfloat16" else a.astype(np.float64)


def random_array(dtype: str, shape, rng) -> np.ndarray:
    """Every bit pattern is fair game: subnormals, infinities and NaNs included."""
    storage = DTYPES[dtype][2]
    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(storage).itemsize
    return np.frombuffer(rng.bytes(nbytes), dtype=storage).reshape(shape).copy()


def assert_same_bits(got: np.ndarray, want: np.ndarray, dtype: str) -> None:
    want = np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype
    if got.size == 0:
        return
    if dtype in FLOATS:
        g, w = as_float(got, dtype).ravel(), as_float(want, dtype).ravel()
        nan = np.isnan(w)
        assert np.array_equal(np.isnan(g), nan), "NaN positions differ"
        gb, wb = (
            got.reshape(-1).view(np.uint8).reshape(got.size, -1),
            want.reshape(-1).view(np.uint8).reshape(want.size, -1),
        )
        bad = np.flatnonzero((gb != wb).any(1) & ~nan)
        assert bad.size == 0, f"{bad.size} elements differ, first at {bad[0]}: got {g[bad[0]]!r}, want {w[bad[0]]!r}"
    else:
        np.testing.assert_array_equal(got, want)


def ref_add(x, y, dtype):
    with np.errstate(all="ignore"):
        return _ref_add(x, y, dtype)


def _ref_add(x, y, dtype):
    if dtype == "float16":
        return (x.astype(np.float32) + y.astype(np.float32)).astype(np.float16)
    if dtype == "bfloat16":
        return f32_to_bf16(bf16_to_f32(x) + bf16_to_f32(y))
    return x + y  # float32/float64 in their precision; integers wrap


def ref_scale_add(x, alpha, beta, dtype):
    with np.errstate(all="ignore"):
        return _ref_scale_add(x, alpha, beta, dtype)


def _ref_scale_add(x, alpha, beta, dtype):
    if dtype == "float16":
        t = (x.astype(np.float32) * np.float32(alpha)).astype(np.float16)
        return (t.astype(np.float32) + np.float32(beta)).astype(np.float16)
    if dtype == "bfloat16":
        t = f32_to_bf16(bf16_to_f32(x) * np.float32(alpha))
        return f32_to_bf16(bf16_to_f32(t) + np.float32(beta))
    if dtype == "float32":
        return (x * np.float32(alpha)) + np.float32(beta)
    if dtype == "float64":
        return (x * np.float64(alpha)) + np.float64(beta)
    m = (1 << 64) - 1
    u = x.astype(np.uint64) * np.uint64(int(alpha) & m) + np.uint64(int(beta) & m)
    return u.astype(DTYPES[dtype][2])


def ulp(dtype: str, v: float) -> float:
    storage = {"float16": np.float16, "float32": np.float32, "float64": np.float64}.get(dtype)
    if storage is None:  # bfloat16: 8 significant bits
        return 2.0 ** (np.floor(np.log2(max(abs(v), 2.0**-126))) - 7)
    return float(np.spacing(storage(abs(v))))


# ---- symbols, version, ping ---------------------------------------------------------------------


def test_exports_exactly_the_v2_abi(lib_path):
    out = subprocess.run(
        ["nm", "-D", "--defined-only", str(lib_path)], capture_output=True, text=True, check=True
    ).stdout
    names = {line.split()[-1] for line in out.splitlines() if line.strip()}
    assert names == SYMBOLS and len(SYMBOLS) == 14


def test_abi_version_and_ping(lib, handle):
    assert lib.lib.cuplug_backend_abi_version() == ABI_VERSION
    info = lib.ping(handle)
    assert info["abi"] == ABI_VERSION and info["variant"] == "cpu" and info["backend"] == "vector"
    assert info["stream"] == 0
    assert info["device"]["type"] == "cpu" and info["device"]["index"] == 0 and info["device"]["name"] == "cpu"
    assert list(info["ops"]) == ["add", "scale_add", "sum"]
    numeric = ["float16", "bfloat16", "float32", "float64", "int8", "uint8", "int32", "int64"]
    assert info["ops"]["add"] == {
        "inputs": [{"name": "x", "dtypes": numeric}, {"name": "y", "like": 0}],
        "outputs": [{"name": "out", "dtype": {"like": 0}, "shape": {"like": 0}}],
        "attrs": [],
        "size_rules": [],
        "elementwise": True,
        "sample_n": 1024,
    }
    assert info["ops"]["scale_add"]["attrs"] == [
        {"name": "alpha", "kind": "float64", "default": 1.0},
        {"name": "beta", "kind": "float64", "default": 0.0},
    ]
    assert info["ops"]["sum"]["outputs"] == [{"name": "out", "dtype": {"accum_of": 0}, "shape": {"scalar": True}}]
    assert info["ops"]["sum"]["elementwise"] is False


def test_ping_returns_the_length_it_needs(lib, handle):
    need = lib.lib.cuplug_backend_ping(handle, None, 0)
    small = ctypes.create_string_buffer(16)
    assert lib.lib.cuplug_backend_ping(handle, small, len(small)) == need
    assert len(small.value) == 15  # truncated, NUL-terminated
    exact = ctypes.create_string_buffer(need + 1)
    assert lib.lib.cuplug_backend_ping(handle, exact, len(exact)) == need
    assert len(exact.value) == need
    json.loads(exact.value)


# ---- ops against NumPy --------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("shape", [(1000,), (3, 5, 7), (), (4097,)])
def test_add_is_bit_exact(lib, handle, dtype, shape):
    rng = np.random.default_rng(zlib.crc32(f"{dtype}{shape}".encode()))
    x, y = random_array(dtype, shape, rng), random_array(dtype, shape, rng)
    out = np.zeros_like(x)
    assert lib.call(handle, "add", [tensor(x, dtype), tensor(y, dtype)], [tensor(out, dtype)]) == OK, lib.error(handle)
    with np.errstate(all="ignore"):
        assert_same_bits(out, ref_add(x, y, dtype), dtype)


FLOAT_ATTRS = [(2.5, -1.0), (1.0, 0.0), (0.1, 3.0e-3), (-3.0, 7.0), (1e30, 1e-30), (1e-3, 65519.0)]
INT_ATTRS = [(2.0, -1.0), (1.0, 0.0), (-3.0, 7.0), (float(2**40), float(-(2**50))), (-(2.0**63), 2.0**62)]


@pytest.mark.parametrize(
    "dtype,alpha,beta",
    [(d, a, b) for d in FLOATS for a, b in FLOAT_ATTRS] + [(d, a, b) for d in INTS for a, b in INT_ATTRS],
)
def test_scale_add_is_bit_exact(lib, handle, dtype, alpha, beta):
    rng = np.random.default_rng(7)
    x = random_array(dtype, (2049,), rng)
    out = np.zeros_like(x)
    rc = lib.call(
        handle, "scale_add", [tensor(x, dtype)], [tensor(out, dtype)], [attr("alpha", alpha), attr("beta", beta)]
    )
    assert rc == OK, lib.error(handle)
    with np.errstate(all="ignore"):
        assert_same_bits(out, ref_scale_add(x, alpha, beta, dtype), dtype)


def test_scale_add_defaults_and_int_attribute_kinds(lib, handle):
    x = np.arange(10, dtype=np.float32) - 3
    out = np.zeros_like(x)
    assert lib.call(handle, "scale_add", [tensor(x)], [tensor(out)]) == OK  # alpha 1, beta 0
    np.testing.assert_array_equal(out, x)
    # a float64 attribute given as an int64 is converted
    assert lib.call(handle, "scale_add", [tensor(x)], [tensor(out)], [attr("alpha", 3), attr("beta", -2)]) == OK
    np.testing.assert_array_equal(out, x * 3 - 2)


def test_scale_add_on_integers_needs_integral_alpha_and_beta(lib, handle):
    x = np.arange(8, dtype=np.int32)
    out = np.zeros_like(x)
    rc = lib.call(handle, "scale_add", [tensor(x)], [tensor(out)], [attr("alpha", 2.5)])
    assert rc == E_INVALID_ARGUMENT
    msg = lib.error(handle)
    assert "int32" in msg and "alpha=2.5" in msg and "beta=0" in msg, msg  # the op's own message


@pytest.mark.parametrize("dtype", INTS)
def test_scale_add_on_integers_refuses_a_fractional_beta_too(lib, handle, dtype):
    """beta is checked like alpha: an integer tensor's scale_add with beta 0.5 (or -2.25) is refused with the
    op's message, never truncated silently; the output is left as it was."""
    x = np.arange(8, dtype=DTYPES[dtype][2])
    out = np.full_like(x, 9)
    for beta in (0.5, -2.25):
        rc = lib.call(handle, "scale_add", [tensor(x, dtype)], [tensor(out, dtype)], [attr("beta", beta)])
        expect_error(lib, handle, rc, E_INVALID_ARGUMENT, f"must be integers for an {dtype} tensor", f"beta={beta}")
    assert (out == 9).all()


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("n", [0, 1, 3, 4, 1000, 1 << 16])
def test_sum_of_floats_is_float64_accurate(lib, handle, dtype, n):
    rng = np.random.default_rng(n + 11)
    v = rng.standard_normal(n)
    x = f32_to_bf16(v.astype(np.float32)) if dtype == "bfloat16" else v.astype(DTYPES[dtype][2])
    out = np.full((), 77, dtype=x.dtype)
    assert lib.call(handle, "sum", [tensor(x, dtype)], [tensor(out, dtype)]) == OK, lib.error(handle)
    ref = float(as_float(x, dtype).sum())
    got = float(as_float(out.reshape(1), dtype)[0])
    tol = ulp(dtype, ref) + 1e-12 * float(np.abs(as_float(x, dtype)).sum())
    assert abs(got - ref) <= tol, (got, ref, tol)
    if n == 0:
        assert got == 0.0


def test_sum_of_1e8_float32_is_float64_accurate(lib, handle):
    n = 100_000_000
    x = np.full(n, 0.1, dtype=np.float32)  # float32 naive summation drifts far off here
    out = np.zeros((), dtype=np.float32)
    assert lib.call(handle, "sum", [tensor(x)], [tensor(out)]) == OK
    ref = float(x.astype(np.float64).sum())
    assert abs(float(out) - ref) / ref < 1e-7


@pytest.mark.parametrize("dtype", INTS)
def test_sum_of_integers_is_exact_int64(lib, handle, dtype):
    rng = np.random.default_rng(3)
    x = random_array(dtype, (10001,), rng)
    out = np.zeros((), dtype=np.int64)
    assert lib.call(handle, "sum", [tensor(x, dtype)], [tensor(out, "int64")]) == OK, lib.error(handle)
    assert int(out) == int(x.astype(np.int64).sum(dtype=np.int64))
    # the output dtype is int64, not the input's
    small = np.zeros((), dtype=x.dtype)
    if dtype != "int64":
        assert lib.call(handle, "sum", [tensor(x, dtype)], [tensor(small, dtype)]) == E_INVALID_ARGUMENT
        assert "expected int64" in lib.error(handle)


def test_special_values(lib, handle):
    inf, nan = np.inf, np.nan
    for dtype in ("float16", "float32", "float64"):
        st = DTYPES[dtype][2]
        x = np.array([inf, -inf, nan, 1.0], dtype=st)
        y = np.array([1.0, -inf, 0.0, -1.0], dtype=st)
        out = np.zeros_like(x)
        assert lib.call(handle, "add", [tensor(x), tensor(y)], [tensor(out)]) == OK
        assert out[0] == inf and out[1] == -inf and np.isnan(out[2]) and out[3] == 0 and not np.signbit(out[3])
        s = np.zeros((), dtype=st)
        assert lib.call(handle, "sum", [tensor(x[:2])], [tensor(s)]) == OK and np.isnan(s)
        assert lib.call(handle, "sum", [tensor(x[:1])], [tensor(s)]) == OK and s == inf
    # float16: overflow to inf, subnormals, RNE ties
    x = np.array([65504, 2.0**-24, 2.0**-24, 1.0], dtype=np.float16)
    y = np.array([16, 2.0**-25, -(2.0**-24), 2.0**-11], dtype=np.float16)
    out = np.zeros_like(x)
    assert lib.call(handle, "add", [tensor(x), tensor(y)], [tensor(out)]) == OK
    assert_same_bits(out, ref_add(x, y, "float16"), "float16")
    assert out[0] == np.inf and out[3] == 1.0  # 65504 + 16 rounds up (tie to even); 1 + 2^-11 ties down to 1
    # bfloat16: 1 + 2^-8 is a tie, stays 1; 1 + 3 * 2^-9 rounds up
    b = f32_to_bf16(np.array([1.0, 1.0], dtype=np.float32))
    c = f32_to_bf16(np.array([2.0**-8, 3 * 2.0**-9], dtype=np.float32))
    out = np.zeros_like(b)
    assert lib.call(handle, "add", [tensor(b, "bfloat16"), tensor(c, "bfloat16")], [tensor(out, "bfloat16")]) == OK
    assert list(bf16_to_f32(out)) == [1.0, 1.0 + 2.0**-7]


def test_integers_wrap(lib, handle):
    cases = {
        np.int8: ([127, -128], [1, -1], [-128, 127]),
        np.uint8: ([255, 0], [1, 255], [0, 255]),
        np.int32: ([2**31 - 1, -(2**31)], [1, -1], [-(2**31), 2**31 - 1]),
        np.int64: ([2**63 - 1, -(2**63)], [1, -1], [-(2**63), 2**63 - 1]),
    }
    for st, (a, b, want) in cases.items():
        x, y = np.array(a, dtype=st), np.array(b, dtype=st)
        out = np.zeros_like(x)
        assert lib.call(handle, "add", [tensor(x), tensor(y)], [tensor(out)]) == OK
        assert out.tolist() == want, st
    x = np.array([2**62, 2**62, 2**62], dtype=np.int64)
    s = np.zeros((), dtype=np.int64)
    assert lib.call(handle, "sum", [tensor(x)], [tensor(s)]) == OK and int(s) == -(2**62)
    x = np.array([100, -100], dtype=np.int8)
    out = np.zeros_like(x)
    assert lib.call(handle, "scale_add", [tensor(x)], [tensor(out)], [attr("alpha", 3.0), attr("beta", 1.0)]) == OK
    assert out.tolist() == [(301 + 128) % 256 - 128, (-299 + 128) % 256 - 128]


def test_zero_element_and_zero_dim_tensors(lib, handle):
    for shape in [(0,), (3, 0), (0, 5, 2)]:
        x = np.zeros(shape, dtype=np.float32)
        # a NULL data pointer is fine when there is nothing to read
        t = tensor(x, data=0)
        assert lib.call(handle, "add", [t, tensor(x, data=0)], [tensor(x, data=0)]) == OK, lib.error(handle)
        assert lib.call(handle, "scale_add", [t], [tensor(x)], [attr("alpha", 2.0)]) == OK
        for dtype in ("float32", "float16", "int8"):
            z = np.zeros(shape, dtype=DTYPES[dtype][2])
            s = np.full((), 9, dtype=np.int64 if dtype == "int8" else z.dtype)
            assert lib.call(handle, "sum", [tensor(z, dtype)], [tensor(s)]) == OK and s == 0, dtype
    # 0-d: one element
    x, y, out = np.array(1.5, dtype=np.float64), np.array(2.25, dtype=np.float64), np.zeros((), dtype=np.float64)
    assert lib.call(handle, "add", [tensor(x), tensor(y)], [tensor(out)]) == OK and out == 3.75
    assert lib.call(handle, "sum", [tensor(x)], [tensor(out)]) == OK and out == 1.5
    # misaligned elements are refused (UB on the host, a sticky CUDA error on a GPU)
    b = np.zeros(64, dtype=np.uint8)
    m = tensor(b, "float32", shape=(4,), byte_offset=2)
    assert lib.call(handle, "sum", [m], [tensor(np.zeros((), dtype=np.float32))]) == E_INVALID_ARGUMENT
    assert "not aligned to its 4-byte elements" in lib.error(handle)
    # a NULL data pointer with elements is refused
    x = np.ones(4, dtype=np.float32)
    assert lib.call(handle, "add", [tensor(x, data=0), tensor(x)], [tensor(x)]) == E_INVALID_ARGUMENT
    assert "NULL data pointer" in lib.error(handle)


def test_a_one_element_tensor_with_a_null_data_pointer_is_refused(lib, handle):
    """Only a tensor of 0 elements may have a NULL data pointer: a 0-d scalar or a (1,) tensor has one
    element to read or write, so NULL is refused (not dereferenced), naming the operand."""
    one = np.array(2.0, dtype=np.float32)
    out = np.zeros((), dtype=np.float32)
    for shape in [(), (1,), (1, 1)]:
        expect_error(
            lib,
            handle,
            lib.call(handle, "sum", [tensor(one, shape=shape, data=0)], [tensor(out)]),
            E_INVALID_ARGUMENT,
            "sum: x has a NULL data pointer",
        )
        expect_error(
            lib,
            handle,
            lib.call(
                handle, "add", [tensor(one, shape=shape), tensor(one, shape=shape)], [tensor(one, shape=shape, data=0)]
            ),
            E_INVALID_ARGUMENT,
            "add: out has a NULL data pointer",
        )
    assert one == 2.0 and out == 0


@pytest.mark.parametrize(
    ("data", "offset"),
    [(0x1000, (1 << 64) - 8), ((1 << 64) - 8, 0), ((1 << 64) - 64, 60), ((1 << 64) - 4, 2)],
    ids=["offset-wraps", "bytes-wrap-the-data", "bytes-wrap-after-the-offset", "offset-and-bytes"],
)
def test_a_descriptor_whose_bytes_wrap_the_address_space_is_refused(lib, handle, data, offset):
    """data + byte_offset + numel * itemsize must not wrap around 2^64: such a descriptor is no memory, and the
    twin refuses it naming the operand (a C caller that skips the Python checks meets the same bound)."""
    x = np.ones(4, dtype=np.float32)
    out = np.zeros((), dtype=np.float32)
    expect_error(
        lib,
        handle,
        lib.call(handle, "sum", [tensor(x, data=data, byte_offset=offset)], [tensor(out)]),
        E_INVALID_ARGUMENT,
        "run past the end of the address space",
    )
    assert out == 0


def test_ndim_bounds_are_0_to_32_inclusive(lib, handle):
    """cuplug accepts 0..32 dimensions: 32 (the documented maximum) works in calls and resident tensors; a
    negative ndim is refused as such, never read as a scalar."""
    x = np.arange(1, 3, dtype=np.float64)
    s = np.zeros((), dtype=np.float64)
    shape32 = (2,) + (1,) * 31
    assert lib.call(handle, "sum", [tensor(x, shape=shape32)], [tensor(s)]) == OK, lib.error(handle)
    assert s == 3.0
    out = np.zeros_like(x)
    assert lib.call(handle, "add", [tensor(x, shape=shape32)] * 2, [tensor(out, shape=shape32)]) == OK
    assert out.tolist() == [2.0, 4.0]
    rid = lib.alloc(handle, "float64", shape32)
    assert rid > 0, lib.error(handle)
    rc, t = lib.descriptor(handle, rid)
    assert rc == OK and t.ndim == 32 and [t.shape[k] for k in range(32)] == list(shape32)
    assert lib.lib.cuplug_backend_free(handle, rid) == OK
    # negative ndim: calls and alloc
    neg = tensor(x, shape=(2,))
    neg.ndim = -1
    expect_error(
        lib,
        handle,
        lib.call(handle, "sum", [neg], [tensor(s)]),
        E_INVALID_ARGUMENT,
        "sum: x: ndim must be in 0..32, got -1",
    )
    neg_out = tensor(s)
    neg_out.ndim = -3
    expect_error(
        lib,
        handle,
        lib.call(handle, "sum", [tensor(x)], [neg_out]),
        E_INVALID_ARGUMENT,
        "ndim must be in 0..32, got -3",
    )
    dims = (ctypes.c_int64 * 1)(2)
    assert lib.lib.cuplug_backend_alloc(handle, dtype_of("float32"), -1, dims) == E_INVALID_ARGUMENT
    assert "alloc: ndim must be in 0..32, got -1" in lib.error(handle)


def test_byte_offset_and_strides_of_contiguous_layouts(lib, handle):
    base = np.arange(16, dtype=np.float32)
    out = np.zeros(4, dtype=np.float32)
    x = tensor(base, shape=(4,), byte_offset=8 * 4)  # elements 8..11
    assert lib.call(handle, "add", [x, tensor(base, shape=(4,))], [tensor(out)]) == OK
    assert out.tolist() == [8.0, 10.0, 12.0, 14.0]
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    o = np.zeros_like(a)
    # explicit C-contiguous strides, and any stride on an extent-1 dimension
    assert lib.call(handle, "add", [tensor(a, strides=(4, 1)), tensor(a)], [tensor(o)]) == OK
    np.testing.assert_array_equal(o, 2 * a)
    b = np.arange(4, dtype=np.float32).reshape(1, 4, 1)
    ob = np.zeros_like(b)
    assert lib.call(handle, "add", [tensor(b, strides=(99, 1, 7)), tensor(b)], [tensor(ob)]) == OK
    np.testing.assert_array_equal(ob, 2 * b)


def test_cuda_host_tensors_are_accepted(lib, handle):
    x = np.arange(5, dtype=np.float32)
    out = np.zeros_like(x)
    t = tensor(x, device=DEVICE_CUDA_HOST)
    assert lib.call(handle, "add", [t, t], [tensor(out, device=DEVICE_CUDA_HOST)]) == OK
    np.testing.assert_array_equal(out, 2 * x)


def test_many_calls_from_threads_on_one_handle(lib, handle):
    import threading

    x = np.arange(1 << 16, dtype=np.float64)
    errors = []

    def work():
        out = np.zeros_like(x)
        for _ in range(50):
            if lib.call(handle, "add", [tensor(x), tensor(x)], [tensor(out)]) != OK or not np.array_equal(out, 2 * x):
                errors.append(lib.error(handle))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


# ---- validation errors --------------------------------------------------------------------------


def expect_error(lib, h, rc, code, *fragments):
    msg = lib.error(h)
    assert rc == code, (rc, msg)
    for f in fragments:
        assert f in msg, (f, msg)
    return msg


@pytest.mark.reliability(
    case="bad arguments to the C ABI",
    how="NULL handle, unknown or NULL op, wrong counts, unknown dtypes, mismatched or non-contiguous tensors, "
    "wrong output dtype/shape, unknown or duplicate attributes, ndim 33, negative extents, int64 overflow",
    expect="the documented negative status and a message from last_error naming the op and the operand",
)
def test_bad_arguments_are_error_codes(lib, handle):
    x = np.ones((3, 4), dtype=np.float32)
    out = np.zeros_like(x)
    T_X, T_OUT = tensor(x), tensor(out)
    assert lib.call(None, "add", [T_X, T_X], [T_OUT]) == E_INVALID_ARGUMENT
    expect_error(
        lib,
        handle,
        lib.call(handle, "mul", [T_X, T_X], [T_OUT]),
        E_UNKNOWN_OP,
        "unknown op 'mul'",
        "add, scale_add or sum",
    )
    expect_error(lib, handle, lib.call(handle, None, [T_X, T_X], [T_OUT]), E_UNKNOWN_OP)
    expect_error(lib, handle, lib.call(handle, "add", [T_X], [T_OUT]), E_INVALID_ARGUMENT, "add: takes 2 inputs, got 1")
    expect_error(
        lib, handle, lib.call(handle, "add", [T_X, T_X], [T_OUT, T_OUT]), E_INVALID_ARGUMENT, "takes 1 output, got 2"
    )
    # an unsupported dtype (complex64)
    c = tensor(x)
    c.dtype = Dtype(5, 64, 1)
    expect_error(
        lib,
        handle,
        lib.call(handle, "add", [c, c], [T_OUT]),
        E_INVALID_ARGUMENT,
        "add: x has dtype {code=5",
        "not support",
    )
    v = tensor(x)
    v.dtype = Dtype(2, 32, 4)  # lanes 4
    expect_error(lib, handle, lib.call(handle, "sum", [v], [T_OUT]), E_INVALID_ARGUMENT, "lanes=4")
    # y like x: dtype and shape
    y64 = np.ones((3, 4), dtype=np.float64)
    expect_error(
        lib,
        handle,
        lib.call(handle, "add", [T_X, tensor(y64)], [T_OUT]),
        E_INVALID_ARGUMENT,
        "add: y has dtype float64, must match x (float32)",
    )
    yt = np.ones((4, 3), dtype=np.float32)
    expect_error(
        lib,
        handle,
        lib.call(handle, "add", [T_X, tensor(yt)], [T_OUT]),
        E_INVALID_ARGUMENT,
        "add: y has shape (4, 3), must match x's shape (3, 4)",
    )
    # non-contiguous
    expect_error(
        lib,
        handle,
        lib.call(handle, "add", [tensor(x, strides=(1, 3)), T_X], [T_OUT]),
        E_INVALID_ARGUMENT,
        "add: x is not C-contiguous (shape (3, 4), strides (1, 3))",
    )
    expect_error(
        lib,
        handle,
        lib.call(handle, "add", [T_X, T_X], [tensor(out, strides=(8, 1))]),
        E_INVALID_ARGUMENT,
        "add: out is not C-contiguous",
    )
    # outputs
    expect_error(
        lib,
        handle,
        lib.call(handle, "add", [T_X, T_X], [tensor(y64)]),
        E_INVALID_ARGUMENT,
        "add: out has dtype float64, expected float32",
    )
    expect_error(
        lib,
        handle,
        lib.call(handle, "add", [T_X, T_X], [tensor(out, shape=(12,))]),
        E_INVALID_ARGUMENT,
        "add: out has shape (12,), expected (3, 4)",
    )
    expect_error(
        lib,
        handle,
        lib.call(handle, "sum", [T_X], [tensor(out, shape=(1,))]),
        E_INVALID_ARGUMENT,
        "sum: out has shape (1,), expected ()",
    )
    # attributes
    expect_error(
        lib,
        handle,
        lib.call(handle, "scale_add", [T_X], [T_OUT], [attr("gamma", 1.0)]),
        E_INVALID_ARGUMENT,
        "scale_add: unknown attribute 'gamma' (scale_add takes alpha, beta)",
    )
    expect_error(
        lib,
        handle,
        lib.call(handle, "add", [T_X, T_X], [T_OUT], [attr("alpha", 1.0)]),
        E_INVALID_ARGUMENT,
        "add: unknown attribute 'alpha' (add takes no attributes)",
    )
    expect_error(
        lib,
        handle,
        lib.call(handle, "scale_add", [T_X], [T_OUT], [attr("alpha", 1.0), attr("alpha", 2.0)]),
        E_INVALID_ARGUMENT,
        "attribute 'alpha' given twice",
    )
    bad_kind = attr("alpha", 1.0)
    bad_kind.kind = 7
    expect_error(lib, handle, lib.call(handle, "scale_add", [T_X], [T_OUT], [bad_kind]), E_INVALID_ARGUMENT, "kind 7")
    # shapes
    expect_error(
        lib,
        handle,
        lib.call(handle, "sum", [tensor(x, shape=(1,) * 33)], [tensor(out, shape=())]),
        E_INVALID_ARGUMENT,
        "ndim must be in 0..32, got 33",
    )
    expect_error(
        lib,
        handle,
        lib.call(handle, "sum", [tensor(x, shape=(3, -4))], [tensor(out, shape=())]),
        E_INVALID_ARGUMENT,
        "extent -4 of dimension 1 is negative",
    )
    expect_error(
        lib,
        handle,
        lib.call(handle, "sum", [tensor(x, shape=(2**31, 2**31))], [tensor(out, shape=())]),
        E_INVALID_ARGUMENT,
        "too many elements",
    )
    expect_error(
        lib,
        handle,
        lib.call(handle, "sum", [tensor(x, shape=(2**61,))], [tensor(out, shape=())]),
        E_INVALID_ARGUMENT,
        "too many elements",
    )
    # NULL arrays
    assert lib.lib.cuplug_backend_call(handle, b"add", None, 2, None, 1, None, 0, 0) == E_INVALID_ARGUMENT
    assert (
        lib.lib.cuplug_backend_call(handle, b"scale_add", ctypes.byref(T_X), 1, ctypes.byref(T_OUT), 1, None, 1, 0)
        == E_INVALID_ARGUMENT
    )
    assert lib.lib.cuplug_backend_stream_wait(None, 0, 0) == E_INVALID_ARGUMENT
    assert lib.lib.cuplug_backend_stream_wait(handle, 0, 0) == OK
    assert lib.lib.cuplug_backend_sync(None) == E_INVALID_ARGUMENT and lib.lib.cuplug_backend_sync(handle) == OK
    # after all that, a good call still works
    assert lib.call(handle, "add", [T_X, T_X], [T_OUT]) == OK and (out == 2).all()


@pytest.mark.parametrize(
    "x_dtype,y_dtype",
    [("float32", "int32"), ("int32", "float32"), ("float16", "bfloat16"), ("int8", "uint8"), ("int64", "float64")],
)
def test_an_input_declared_like_another_needs_the_same_dtype_not_just_the_same_itemsize(lib, handle, x_dtype, y_dtype):
    """add's y is declared like x: a y of another dtype of the same width is refused, naming both, and nothing
    is written (its bits would otherwise be read as x's type)."""
    x = np.ones(6, dtype=DTYPES[x_dtype][2])
    y = np.ones(6, dtype=DTYPES[y_dtype][2])
    out = np.full_like(x, 7)
    rc = lib.call(handle, "add", [tensor(x, x_dtype), tensor(y, y_dtype)], [tensor(out, x_dtype)])
    expect_error(lib, handle, rc, E_INVALID_ARGUMENT, f"add: y has dtype {y_dtype}, must match x ({x_dtype})")
    assert (out == 7).all()


@pytest.mark.parametrize(
    "op,x_dtype,out_dtype,want",
    [
        ("add", "float32", "int32", "float32"),
        ("add", "float16", "bfloat16", "float16"),
        ("add", "uint8", "int8", "uint8"),
        ("sum", "int32", "float64", "int64"),
        ("sum", "float64", "int64", "float64"),
    ],
)
def test_an_output_of_the_same_width_but_another_dtype_is_refused(lib, handle, op, x_dtype, out_dtype, want):
    """The output's dtype is the one its rule gives (like x; sum: int64 for integers): an output of another
    dtype of the same itemsize is refused naming both, and left unwritten."""
    x = np.ones(4, dtype=DTYPES[x_dtype][2])
    out = np.full((4,) if op == "add" else (), 7, dtype=DTYPES[out_dtype][2])
    ins = [tensor(x, x_dtype)] * (2 if op == "add" else 1)
    rc = lib.call(handle, op, ins, [tensor(out, out_dtype)])
    expect_error(lib, handle, rc, E_INVALID_ARGUMENT, f"{op}: out has dtype {out_dtype}, expected {want}")
    assert (out == 7).all()


def test_an_input_declared_like_another_needs_the_same_number_of_dimensions(lib, handle):
    """add's y must have x's whole shape: a y whose extents are a prefix of x's ((3,) beside (3, 4)) is refused
    (add would read 12 elements of a 3-element buffer), and so is one with an extra dimension."""
    x = np.ones((3, 4), dtype=np.float32)
    out = np.zeros_like(x)
    y = np.ones(3, dtype=np.float32)
    expect_error(
        lib,
        handle,
        lib.call(handle, "add", [tensor(x), tensor(y)], [tensor(out)]),
        E_INVALID_ARGUMENT,
        "add: y has shape (3,), must match x's shape (3, 4)",
    )
    y3 = np.ones((3, 4, 1), dtype=np.float32)
    expect_error(
        lib,
        handle,
        lib.call(handle, "add", [tensor(x), tensor(y3)], [tensor(out)]),
        E_INVALID_ARGUMENT,
        "add: y has shape (3, 4, 1), must match x's shape (3, 4)",
    )
    assert (out == 0).all()


def test_cuda_tensor_is_refused_with_wrong_device(lib, handle):
    x = np.ones(4, dtype=np.float32)
    out = np.zeros_like(x)
    d = tensor(x, device=DEVICE_CUDA)
    msg = expect_error(
        lib, handle, lib.call(handle, "add", [tensor(x), d], [tensor(out)]), E_WRONG_DEVICE, "add: y is a CUDA tensor"
    )
    assert "this is the CPU backend; move the tensor to the host (.cpu()) or load a CUDA backend" in msg
    expect_error(
        lib,
        handle,
        lib.call(handle, "sum", [tensor(x)], [tensor(out[:1], shape=(), device=DEVICE_CUDA)]),
        E_WRONG_DEVICE,
        "sum: out is a CUDA tensor",
    )
    expect_error(
        lib,
        handle,
        lib.call(handle, "sum", [tensor(x, device=7)], [tensor(out, shape=())]),
        E_WRONG_DEVICE,
        "device type 7",
    )
    assert (out == 0).all()


def test_create_rejects_a_device_it_does_not_have(lib):
    assert not lib.lib.cuplug_backend_create(b"3")
    with pytest.raises(RuntimeError, match="one device"):
        lib.create("3")
    for pref in (None, "", "auto", "0", "cpu"):
        lib.destroy(lib.create(pref))


def test_null_destroy_is_a_noop(lib):
    lib.destroy(None)
    assert lib.lib.cuplug_backend_ping(None, None, 0) == E_INVALID_ARGUMENT
    assert lib.lib.cuplug_backend_last_error(None, None, 0) > 0


# ---- resident tensors ---------------------------------------------------------------------------


def test_resident_tensors_round_trip_and_run(lib, handle):
    a = lib.alloc(handle, "float32", (3, 4))
    assert a > 0, lib.error(handle)
    host = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert lib.lib.cuplug_backend_upload(handle, a, host.ctypes.data, host.nbytes) == OK
    rc, t = lib.descriptor(handle, a)
    assert rc == OK and t.ndim == 2 and [t.shape[0], t.shape[1]] == [3, 4]
    assert (t.dtype.code, t.dtype.bits, t.dtype.lanes) == (2, 32, 1)
    assert t.device_type == DEVICE_CPU and t.device_id == 0 and not t.strides and t.byte_offset == 0 and t.data
    # the descriptor goes straight into call(): in place, out = x + x
    assert lib.call(handle, "add", [t, t], [t]) == OK, lib.error(handle)
    back = np.zeros_like(host)
    assert lib.lib.cuplug_backend_download(handle, a, back.ctypes.data, back.nbytes) == OK
    np.testing.assert_array_equal(back, 2 * host)
    s = lib.alloc(handle, "float32", ())
    rc, ts = lib.descriptor(handle, s)
    assert rc == OK and ts.ndim == 0
    assert lib.call(handle, "sum", [t], [ts]) == OK
    one = np.zeros(1, dtype=np.float32)
    assert lib.lib.cuplug_backend_download(handle, s, one.ctypes.data, 4) == OK and one[0] == 132.0
    # nbytes must be the whole size
    expect_error(
        lib,
        handle,
        lib.lib.cuplug_backend_upload(handle, a, host.ctypes.data, 47),
        E_BUFFER_TOO_SMALL,
        "upload: nbytes must be the tensor's whole size, 48 bytes (float32 (3, 4)), got 47",
    )
    expect_error(
        lib, handle, lib.lib.cuplug_backend_download(handle, a, back.ctypes.data, 49), E_INVALID_ARGUMENT, "got 49"
    )
    expect_error(lib, handle, lib.lib.cuplug_backend_download(handle, a, back.ctypes.data, -1), E_INVALID_ARGUMENT)
    expect_error(lib, handle, lib.lib.cuplug_backend_upload(handle, a, None, 48), E_INVALID_ARGUMENT, "NULL host")
    assert lib.lib.cuplug_backend_tensor(handle, a, None) == E_INVALID_ARGUMENT
    assert lib.lib.cuplug_backend_free(handle, a) == OK and lib.lib.cuplug_backend_free(handle, s) == OK


def test_resident_alloc_arguments(lib, handle):
    for dtype in DTYPES:
        rid = lib.alloc(handle, dtype, (2, 3))
        assert rid > 0
        rc, t = lib.descriptor(handle, rid)
        assert rc == OK and (t.dtype.code, t.dtype.bits) == DTYPES[dtype][:2]
        assert lib.lib.cuplug_backend_free(handle, rid) == OK
    z = lib.alloc(handle, "int8", (0, 7))  # zero elements: a valid tensor
    assert z > 0 and lib.lib.cuplug_backend_upload(handle, z, None, 0) == OK
    assert lib.alloc(handle, Dtype(5, 64, 1), (2,)) == E_INVALID_ARGUMENT and "dtype" in lib.error(handle)
    assert lib.alloc(handle, "float32", (1,) * 33) == E_INVALID_ARGUMENT and "ndim" in lib.error(handle)
    assert lib.alloc(handle, "float32", (-1,)) == E_INVALID_ARGUMENT and "negative" in lib.error(handle)
    assert lib.alloc(handle, "float64", (2**60, 2**10)) == E_INVALID_ARGUMENT and "too many" in lib.error(handle)
    assert lib.lib.cuplug_backend_alloc(handle, dtype_of("float32"), 1, None) == E_INVALID_ARGUMENT
    assert lib.alloc(handle, "float64", (2**59,)) == E_OUT_OF_MEMORY  # 4 EiB: fits int64, not in memory
    assert lib.alloc(None, "float32", (4,)) == E_INVALID_ARGUMENT


@pytest.mark.reliability(
    case="resident tensor ids freed, stale, foreign or made up",
    how="double free, use after free, a freed id after its slot is reused, another live instance's id "
    "(same slot index), 0, -5, made-up ids",
    expect="CUPLUG_E_BAD_BUFFER and a message, no crash; the slot's new tensor unaffected",
)
def test_resident_ids_are_generation_checked(lib, handle):
    other = lib.create()
    try:
        buf = np.zeros(8, dtype=np.float32)
        a = lib.alloc(handle, "float32", (8,))
        b = lib.alloc(other, "float32", (8,))
        assert a > 0 and b > 0 and a != b
        assert a & 0xFFFFFFFF == b & 0xFFFFFFFF == 1  # both slot 0: only the generation tells them apart
        for fn in ("upload", "download"):
            rc = getattr(lib.lib, f"cuplug_backend_{fn}")(handle, b, buf.ctypes.data, 32)
            expect_error(lib, handle, rc, E_BAD_BUFFER, f"{fn}: id {b} is not a live tensor of this instance")
        assert lib.descriptor(handle, b)[0] == E_BAD_BUFFER and lib.lib.cuplug_backend_free(handle, b) == E_BAD_BUFFER
        assert lib.lib.cuplug_backend_free(handle, a) == OK
        assert lib.lib.cuplug_backend_free(handle, a) == E_BAD_BUFFER  # double free
        c = lib.alloc(handle, "float32", (8,))
        assert c & 0xFFFFFFFF == a & 0xFFFFFFFF and c != a  # the slot is reused, with a new generation
        for stale in (a, b):
            assert lib.lib.cuplug_backend_download(handle, stale, buf.ctypes.data, 32) == E_BAD_BUFFER
            assert lib.descriptor(handle, stale)[0] == E_BAD_BUFFER
            assert lib.lib.cuplug_backend_free(handle, stale) == E_BAD_BUFFER
        assert lib.descriptor(handle, c)[0] == OK and lib.descriptor(other, b)[0] == OK  # untouched
        for bogus in (0, -5, 12345, (1 << 40) + 1, c + 1, c ^ (1 << 32), 2**63 - 1):
            assert lib.lib.cuplug_backend_free(handle, bogus) == E_BAD_BUFFER, bogus
        # many reuses of one slot: every id differs, only the newest is live
        ids = [c]
        for _ in range(200):
            assert lib.lib.cuplug_backend_free(handle, ids[-1]) == OK
            ids.append(lib.alloc(handle, "float32", (8,)))
        assert len(set(ids)) == len(ids) and len({i & 0xFFFFFFFF for i in ids}) == 1
        assert [lib.descriptor(handle, i)[0] for i in ids[:-1]] == [E_BAD_BUFFER] * (len(ids) - 1)
        assert lib.descriptor(handle, ids[-1])[0] == OK
    finally:
        lib.destroy(other)


def test_descriptor_shape_stays_valid_while_the_table_grows(lib, handle):
    a = lib.alloc(handle, "int32", (5, 6, 7))
    rc, t = lib.descriptor(handle, a)
    assert rc == OK
    ids = [lib.alloc(handle, "uint8", (i + 1,)) for i in range(1000)]  # several table blocks
    assert all(i > 0 for i in ids)
    assert [t.shape[k] for k in range(3)] == [5, 6, 7]
    rc, t2 = lib.descriptor(handle, ids[-1])
    assert rc == OK and t2.shape[0] == 1000
    lib.destroy(lib.create())  # destroy with live tensors of another instance: no effect here
    # destroy(handle) in the fixture frees them all


# ---- test backends: size rules, attributes, failing ops, 40 ops ----------------------------------

RULES_BACKEND = textwrap.dedent(
    r"""
    #include "cuplug_ops.h"
    static int blocks(const cuplug_call* c) {
        long long bs = cuplug_attr_int(c, "blocksize");
        float* o = (float*)c->out[0].data;
        const float* x = (const float*)c->in[0].data;
        long long nb = (c->n + bs - 1) / bs;
        for (long long b = 0; b < nb; ++b) {
            double s = 0;
            for (long long i = b * bs; i < c->n && i < (b + 1) * bs; ++i) s += x[i];
            o[b] = (float)(s * cuplug_attr_float(c, "scale"));
        }
        return CUPLUG_OK;
    }
    static int iota(const cuplug_call* c) {
        long long* o = (long long*)c->out[0].data;
        for (long long i = 0; i < c->out[0].shape[0]; ++i) o[i] = i;
        return CUPLUG_OK;
    }
    static int ones(const cuplug_call* c) {
        float* o = (float*)c->out[0].data;
        for (long long i = 0; i < c->out[0].shape[0]; ++i) o[i] = 1.0f;
        return CUPLUG_OK;
    }
    static int picky(const cuplug_call* c) { return cuplug_op_fail(c, "picky: I do not like %lld elements", c->n); }
    static int broken(const cuplug_call* c) { (void)c; return CUPLUG_E_DEVICE; }
    static const cuplug_op cuplug_ops[] = {
        {"layernorm", blocks, 0,
         {CUPLUG_IN("x", CUPLUG_F32)},
         {CUPLUG_OUT("out", CUPLUG_DT_LIKE, 0, CUPLUG_SHAPE_BLOCKS, 0, "blocksize")},
         {CUPLUG_ATTR_INT("blocksize", 1024), CUPLUG_ATTR_FLOAT("scale", 1.0)},
         {CUPLUG_SIZE(0, 4096, 0, 0), CUPLUG_SIZE(0, 0, 8192, 1 << 20)}},
        {"iota", iota, 0, {{0}},
         {CUPLUG_OUT("out", CUPLUG_DT_FIXED, CUPLUG_I64, CUPLUG_SHAPE_ATTR, 0, "n")},
         {CUPLUG_ATTR_INT("n", 4)}, {{0}}, 16},
        {"ones", ones, CUPLUG_ELEMENTWISE, {{0}},
         {CUPLUG_OUT("out", CUPLUG_DT_FIXED, CUPLUG_F32, CUPLUG_SHAPE_ATTR, 0, "n")}, {CUPLUG_ATTR_INT("n", 3)}},
        {"picky", picky, CUPLUG_ELEMENTWISE, {CUPLUG_IN("x", CUPLUG_FLOATS)}, {CUPLUG_OUT_LIKE("out", 0)}},
        {"broken", broken, CUPLUG_ELEMENTWISE, {CUPLUG_IN("x", CUPLUG_INTS)}, {CUPLUG_OUT_LIKE("out", 0)},
         {{0}}, {CUPLUG_SIZE(0, 0, 0, 100)}},
    };
    #include "cuplug_cpu_backend.h"
    """
)


LIMITS_BACKEND = textwrap.dedent(
    r"""
    #include <stdint.h>
    #include "cuplug_ops.h"
    static int limits(const cuplug_call* c) {
        long long* o = (long long*)c->out[0].data;
        o[0] = cuplug_attr_int(c, "hi");
        o[1] = cuplug_attr_int(c, "lo");
        return CUPLUG_OK;
    }
    static const cuplug_op cuplug_ops[] = {
        {"limits", limits, 0, {{0}},
         {CUPLUG_OUT("out", CUPLUG_DT_FIXED, CUPLUG_I64, CUPLUG_SHAPE_ATTR, 0, "n")},
         {CUPLUG_ATTR_INT("hi", INT64_MAX), CUPLUG_ATTR_INT("lo", INT64_MIN), CUPLUG_ATTR_INT("n", 2)}, {{0}}, 2},
    };
    #include "cuplug_cpu_backend.h"
    """
)


def test_int64_extremes_as_defaults_are_what_the_author_wrote(tmp_path):
    """CUPLUG_ATTR_INT stores its default as a double, where INT64_MAX becomes 2^63: the ping advertises, and the
    op receives, INT64_MAX and INT64_MIN as written (not a wrapped INT64_MIN for INT64_MAX)."""
    lim = build_test_backend(tmp_path, "limits", LIMITS_BACKEND)
    h = lim.create()
    try:
        attrs = {a["name"]: a["default"] for a in lim.ping(h)["ops"]["limits"]["attrs"]}
        assert attrs == {"hi": 2**63 - 1, "lo": -(2**63), "n": 2}
        out = np.zeros(2, dtype=np.int64)
        assert lim.call(h, "limits", [], [tensor(out)]) == 0, lim.error(h)
        assert out.tolist() == [2**63 - 1, -(2**63)]
    finally:
        lim.destroy(h)


@pytest.fixture(scope="module")
def rules(tmp_path_factory) -> Lib:
    return build_test_backend(tmp_path_factory.mktemp("rules"), "rules", RULES_BACKEND)


def test_size_rules_attributes_and_op_messages(rules):
    h = rules.create()
    try:
        ops = rules.ping(h)["ops"]
        assert ops["layernorm"]["size_rules"] == [
            {"input": 0, "multiple_of": 4096, "min": 0, "max": None},
            {"input": 0, "multiple_of": 0, "min": 8192, "max": 1048576},
        ]
        assert ops["layernorm"]["sample_n"] == 8192  # the smallest n the rules allow
        assert ops["layernorm"]["outputs"][0]["shape"] == {"blocks_of": 0, "attr": "blocksize"}
        assert ops["layernorm"]["attrs"][0] == {"name": "blocksize", "kind": "int64", "default": 1024}
        assert ops["iota"] == {
            "inputs": [],
            "outputs": [{"name": "out", "dtype": {"fixed": "int64"}, "shape": {"attr": "n"}}],
            "attrs": [{"name": "n", "kind": "int64", "default": 4}],
            "size_rules": [],
            "elementwise": False,
            "sample_n": 16,
        }
        assert ops["broken"]["sample_n"] == 100  # 1024 clamped by max
        e = lambda rc, code, *f: expect_error(rules, h, rc, code, *f)  # noqa: E731
        x = np.ones(1000, dtype=np.float32)
        out = np.zeros(1, dtype=np.float32)
        e(
            rules.call(h, "layernorm", [tensor(x)], [tensor(out)]),
            E_INVALID_ARGUMENT,
            "layernorm: x has 1000 elements, must be a multiple of 4096",
        )
        x = np.ones(4096, dtype=np.float32)
        e(
            rules.call(h, "layernorm", [tensor(x)], [tensor(out)]),
            E_INVALID_ARGUMENT,
            "layernorm: x has 4096 elements, must be at least 8192",
        )
        e(
            rules.call(h, "layernorm", [tensor(x, shape=(2**20 + 4096,))], [tensor(out)]),
            E_INVALID_ARGUMENT,
            "must be at most 1048576",
        )
        x = np.ones(8192, dtype=np.float32)
        e(
            rules.call(h, "layernorm", [tensor(x.astype(np.float64))], [tensor(out)]),
            E_INVALID_ARGUMENT,
            "layernorm: x has dtype float64; allowed: float32",
        )
        # out: ceil(8192 / blocksize) elements; blocksize defaults to 1024
        out = np.zeros(8, dtype=np.float32)
        assert rules.call(h, "layernorm", [tensor(x)], [tensor(out)]) == OK and (out == 1024).all()
        e(
            rules.call(h, "layernorm", [tensor(x)], [tensor(out)], [attr("blocksize", 4096)]),
            E_INVALID_ARGUMENT,
            "layernorm: out has shape (8,), expected (2,)",
        )
        out3 = np.zeros(3, dtype=np.float32)
        assert (
            rules.call(h, "layernorm", [tensor(x)], [tensor(out3)], [attr("blocksize", 3000.0)]) == OK
        )  # integral float
        assert out3.tolist() == [3000.0, 3000.0, 2192.0]
        e(
            rules.call(h, "layernorm", [tensor(x)], [tensor(out3)], [attr("blocksize", 3000.5)]),
            E_INVALID_ARGUMENT,
            "layernorm: attribute 'blocksize' is an int64, got the non-integral 3000.5",
        )
        e(
            rules.call(h, "layernorm", [tensor(x)], [tensor(out3)], [attr("blocksize", 2.0**70)]),
            E_INVALID_ARGUMENT,
            "non-integral",
        )
        e(
            rules.call(h, "layernorm", [tensor(x)], [tensor(out3)], [attr("blocksize", 0)]),
            E_INVALID_ARGUMENT,
            "attribute 'blocksize' must be positive",
        )
        assert (
            rules.call(h, "layernorm", [tensor(x)], [tensor(out3)], [attr("blocksize", 3000), attr("scale", 2)]) == OK
        )
        assert out3.tolist() == [6000.0, 6000.0, 4384.0]
        # no inputs; output shape from an attribute; fixed dtype
        o = np.full(4, -1, dtype=np.int64)
        assert rules.call(h, "iota", [], [tensor(o)]) == OK and o.tolist() == [0, 1, 2, 3]
        o6 = np.zeros(6, dtype=np.int64)
        assert rules.call(h, "iota", [], [tensor(o6)], [attr("n", 6)]) == OK and o6.tolist() == list(range(6))
        e(
            rules.call(h, "iota", [], [tensor(o6.astype(np.int32))], [attr("n", 6)]),
            E_INVALID_ARGUMENT,
            "iota: out has dtype int32, expected int64",
        )
        e(rules.call(h, "iota", [], [tensor(o6)], [attr("n", -1)]), E_INVALID_ARGUMENT, "must be >= 0, got -1")
        # an elementwise op without inputs (n == 0) still runs when its output has elements
        f3 = np.zeros(3, dtype=np.float32)
        assert rules.call(h, "ones", [], [tensor(f3)]) == OK and f3.tolist() == [1.0, 1.0, 1.0]
        assert rules.call(h, "ones", [], [tensor(f3[:0])], [attr("n", 0)]) == OK
        # the op's own message, and a bare failing status
        f = np.ones(5, dtype=np.float32)
        msg = e(rules.call(h, "picky", [tensor(f)], [tensor(f)]), E_INVALID_ARGUMENT)
        assert msg == "picky: I do not like 5 elements"
        i = np.ones(5, dtype=np.int32)
        msg = e(rules.call(h, "broken", [tensor(i)], [tensor(i)]), E_DEVICE)
        assert msg == "broken failed (status -5)"
        e(
            rules.call(h, "broken", [tensor(f)], [tensor(f)]),
            E_INVALID_ARGUMENT,
            "broken: x has dtype float32; allowed: int8, uint8, int32 or int64",
        )
    finally:
        rules.destroy(h)


def test_a_size_rules_max_is_inclusive(rules):
    """A size rule's max is the largest element count allowed: exactly max elements reach the op (broken's
    max is 100; the op then fails on its own), max + 1 is refused before it."""
    h = rules.create()
    try:
        i = np.ones(100, dtype=np.int32)
        expect_error(rules, h, rules.call(h, "broken", [tensor(i)], [tensor(i)]), E_DEVICE, "broken failed")
        i = np.ones(101, dtype=np.int32)
        expect_error(
            rules,
            h,
            rules.call(h, "broken", [tensor(i)], [tensor(i)]),
            E_INVALID_ARGUMENT,
            "broken: x has 101 elements, must be at most 100",
        )
    finally:
        rules.destroy(h)


BOUNDS_BACKEND = textwrap.dedent(
    r"""
    #include <string.h>
    #include "cuplug_ops.h"
    static int copy(const cuplug_call* c) {
        memcpy(c->out[0].data, c->in[0].data, (size_t)c->n * sizeof(float));
        return CUPLUG_OK;
    }
    static const cuplug_op cuplug_ops[] = {
        {"atleast", copy, CUPLUG_ELEMENTWISE, {CUPLUG_IN("x", CUPLUG_F32)}, {CUPLUG_OUT_LIKE("out", 0)},
         {{0}}, {CUPLUG_SIZE(0, 0, 10, 0)}},
        {"shaped", copy, 0, {CUPLUG_IN("x", CUPLUG_F32), CUPLUG_IN_SHAPED("w", CUPLUG_I32, CUPLUG_SHAPE_LIKE, 0, NULL)},
         {CUPLUG_OUT_LIKE("out", 0)}},
    };
    #include "cuplug_cpu_backend.h"
    """
)


@pytest.fixture(scope="module")
def bounds(tmp_path_factory) -> Lib:
    return build_test_backend(tmp_path_factory.mktemp("bounds"), "bounds", BOUNDS_BACKEND)


def test_a_size_rules_min_is_inclusive(bounds):
    """A size rule's min is the smallest element count allowed: exactly min elements reach the op, min - 1 is
    refused naming the input, whatever its shape (atleast's min is 10)."""
    h = bounds.create()
    try:
        for shape in ((10,), (2, 5)):
            x = np.arange(10, dtype=np.float32).reshape(shape)
            out = np.zeros_like(x)
            assert bounds.call(h, "atleast", [tensor(x)], [tensor(out)]) == OK, bounds.error(h)
            assert (out == x).all()
        for shape in ((9,), (3, 3)):
            x = np.ones(shape, dtype=np.float32)
            out = np.zeros_like(x)
            rc = bounds.call(h, "atleast", [tensor(x)], [tensor(out)])
            expect_error(bounds, h, rc, E_INVALID_ARGUMENT, "atleast: x has 9 elements, must be at least 10")
            assert (out == 0).all()
    finally:
        bounds.destroy(h)


def test_an_inputs_shape_rule_checks_every_extent_the_last_one_too(bounds):
    """An input whose shape rule says "like x" (w: int32, x's shape) must have every extent of x's: one that
    differs in the last dimension only ((2, 5) for (2, 4)), or in the first, is refused before the op."""
    h = bounds.create()
    try:
        x = np.ones((2, 4), dtype=np.float32)
        out = np.zeros_like(x)
        w = np.zeros((2, 4), dtype=np.int32)
        assert bounds.call(h, "shaped", [tensor(x), tensor(w)], [tensor(out)]) == OK, bounds.error(h)
        for bad in ((2, 5), (3, 4), (2, 4, 1), (8,)):
            w = np.zeros(bad, dtype=np.int32)
            rc = bounds.call(h, "shaped", [tensor(x), tensor(w)], [tensor(out)])
            shown = "(" + ", ".join(map(str, bad)) + ("," if len(bad) == 1 else "") + ")"
            expect_error(bounds, h, rc, E_INVALID_ARGUMENT, f"shaped: w has shape {shown}; it must be (2, 4)")
    finally:
        bounds.destroy(h)


def test_an_input_declared_like_another_needs_every_extent_equal_the_last_one_too(lib, handle):
    """add's y must have x's every extent: a y that differs in the last one only ((3, 2) beside (3, 4), as many
    dimensions, fewer elements) is refused; add would read 12 elements of a 6-element buffer."""
    x = np.ones((3, 4), dtype=np.float32)
    out = np.zeros_like(x)
    for bad in ((3, 2), (3, 5), (2, 4)):
        y = np.ones(bad, dtype=np.float32)
        rc = lib.call(handle, "add", [tensor(x), tensor(y)], [tensor(out)])
        expect_error(
            lib, handle, rc, E_INVALID_ARGUMENT, f"add: y has shape ({bad[0]}, {bad[1]}), must match x's shape (3, 4)"
        )
    assert (out == 0).all()


STATUS_BACKEND = textwrap.dedent(
    r"""
    #include "cuplug_ops.h"
    static int answer(const cuplug_call* c) { return (int)cuplug_attr_int(c, "rc"); }
    static int copy_or_refuse(const cuplug_call* c) {
        if (c->n == 0) return cuplug_op_fail(c, "%s: nothing to work on", c->op->name);
        memcpy(c->out[0].data, c->in[0].data, (size_t)c->n * sizeof(float));
        return CUPLUG_OK;
    }
    static const cuplug_op cuplug_ops[] = {
        {"answer", answer, 0, {CUPLUG_IN("x", CUPLUG_F32)}, {CUPLUG_OUT_LIKE("out", 0)}, {CUPLUG_ATTR_INT("rc", 0)}},
        {"reduce", copy_or_refuse, 0, {CUPLUG_IN("x", CUPLUG_F32)}, {CUPLUG_OUT_LIKE("out", 0)}},
        {"map", copy_or_refuse, CUPLUG_ELEMENTWISE, {CUPLUG_IN("x", CUPLUG_F32)}, {CUPLUG_OUT_LIKE("out", 0)}},
    };
    #include "cuplug_cpu_backend.h"
    """
)


@pytest.fixture(scope="module")
def statuses(tmp_path_factory) -> Lib:
    return build_test_backend(tmp_path_factory.mktemp("statuses"), "statuses", STATUS_BACKEND)


def test_an_ops_status_reaches_the_caller_only_as_a_cuplug_status(statuses):
    """Whatever an op returns, the caller gets a documented status: cuplug's own codes pass through as they
    are; anything else (positive, or below the last code) becomes CUPLUG_E_INVALID_ARGUMENT with a message
    naming the op."""
    h = statuses.create()
    try:
        x = np.ones(1, dtype=np.float32)
        for rc in sorted(CODES):
            got = statuses.call(h, "answer", [tensor(x)], [tensor(x)], [attr("rc", rc)])
            assert got == rc, (rc, got, statuses.error(h))
        for rc in (1, 7, 2**31 - 1, -9, -42, -(2**31)):
            got = statuses.call(h, "answer", [tensor(x)], [tensor(x)], [attr("rc", rc)])
            expect_error(statuses, h, got, E_INVALID_ARGUMENT, "answer failed (status")
    finally:
        statuses.destroy(h)


def test_a_non_elementwise_op_is_called_even_when_every_operand_is_empty(statuses):
    """An elementwise op whose tensors are all empty has nothing to do and is not called (OK); any other op is
    called with n == 0, so it decides: here it refuses, and the caller sees its message."""
    h = statuses.create()
    try:
        e = np.zeros(0, dtype=np.float32)
        assert statuses.call(h, "map", [tensor(e)], [tensor(e)]) == OK, statuses.error(h)
        expect_error(
            statuses,
            h,
            statuses.call(h, "reduce", [tensor(e)], [tensor(e)]),
            E_INVALID_ARGUMENT,
            "reduce: nothing to work on",
        )
        x, out = np.arange(3, dtype=np.float32), np.zeros(3, dtype=np.float32)
        assert statuses.call(h, "reduce", [tensor(x)], [tensor(out)]) == OK and out.tolist() == [0.0, 1.0, 2.0]
    finally:
        statuses.destroy(h)


def many_ops_backend(count: int) -> str:
    fns = "static int op_fn(const cuplug_call* c) { (void)c; return CUPLUG_OK; }\n"
    rows = []
    for k in range(count):
        rows.append(
            f'    {{"operation_number_{k:03d}_with_a_rather_long_name", op_fn, {k % 2},\n'
            f'     {{CUPLUG_IN("input_tensor_x", CUPLUG_NUMERIC), CUPLUG_IN_LIKE("input_tensor_y", 0)}},\n'
            f'     {{CUPLUG_OUT_LIKE("output_tensor", 0)}},\n'
            f'     {{CUPLUG_ATTR_FLOAT("alpha_{k}", 0.{k + 1}), CUPLUG_ATTR_INT("count_{k}", {k})}},\n'
            f"     {{CUPLUG_SIZE(0, {k + 1}, 0, 0)}}}},"
        )
    rows.append(
        '    {"quote\\"back\\\\slash\\ttab", op_fn, 0, {CUPLUG_IN("x", CUPLUG_F32)}, {CUPLUG_OUT_LIKE("out", 0)}},'
    )
    return (
        '#include "cuplug_ops.h"\n'
        + fns
        + "static const cuplug_op cuplug_ops[] = {\n"
        + "\n".join(rows)
        + '\n};\n#include "cuplug_cpu_backend.h"\n'
    )


def test_ping_of_40_ops_is_never_truncated(tmp_path):
    big = build_test_backend(tmp_path, "many", many_ops_backend(40))
    h = big.create()
    try:
        need = big.lib.cuplug_backend_ping(h, None, 0)
        assert need > 15_000  # v1's fixed 1024-byte buffer would have cut this
        small = ctypes.create_string_buffer(1024)
        assert big.lib.cuplug_backend_ping(h, small, len(small)) == need and len(small.value) == 1023
        info = big.ping(h)
        ops = info["ops"]
        assert len(ops) == 41
        names = list(ops)
        assert names[:40] == [f"operation_number_{k:03d}_with_a_rather_long_name" for k in range(40)]
        assert names[40] == 'quote"back\\slash\ttab'  # JSON-escaped, read back intact
        op7 = ops[names[7]]
        assert op7["attrs"] == [
            {"name": "alpha_7", "kind": "float64", "default": 0.8},
            {"name": "count_7", "kind": "int64", "default": 7},
        ]
        assert op7["size_rules"] == [{"input": 0, "multiple_of": 8, "min": 0, "max": None}]
        assert op7["sample_n"] == 8 and op7["elementwise"] is True and ops[names[8]]["elementwise"] is False
        x = np.zeros(4, dtype=np.float32)
        assert big.call(h, "nope", [tensor(x)], [tensor(x)]) == E_UNKNOWN_OP
        assert big.error(h) == "unknown op 'nope' (this backend has 41 ops; its ping lists them)"
        err = ctypes.create_string_buffer(8)
        assert big.lib.cuplug_backend_last_error(h, err, len(err)) == len(big.error(h)) and err.value == b"unknown"
    finally:
        big.destroy(h)


# ---- fork ---------------------------------------------------------------------------------------

FORK_SCRIPT = r"""
import ctypes, os, sys, threading, time, types
sys.path.insert(0, sys.argv[2])
sys.modules["conftest"] = types.SimpleNamespace(ROOT=None, build_shared_library=None)  # only the ctypes parts
from test_cpu_abi_v2 import Lib, tensor, OK
import numpy as np

lib = Lib(sys.argv[1])
h = lib.create()
x = np.ones(4 << 20, dtype=np.float64)
out = np.zeros((), dtype=np.float64)
stop = False
calls = [0]

def busy():
    while not stop:
        assert lib.call(h, "sum", [tensor(x)], [tensor(out)]) == OK
        calls[0] += 1

t = threading.Thread(target=busy, daemon=True)
t.start()
while calls[0] < 2:
    time.sleep(0.001)
for k in range(8):
    time.sleep(0.003 * k)
    pid = os.fork()
    if pid == 0:
        # the child: the busy thread is gone; the handle it was using must work
        o = np.zeros((), dtype=np.float64)
        y = np.ones(1000, dtype=np.float64)
        rc = lib.call(h, "sum", [tensor(y)], [tensor(o)])
        h2 = lib.create()
        lib.destroy(h2)
        os._exit(0 if rc == OK and o == 1000.0 else 3)
    deadline = time.time() + 20
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.time() > deadline:
            os.kill(pid, 9)
            print("child deadlocked", flush=True); os._exit(1)
        time.sleep(0.01)
    if os.waitstatus_to_exitcode(status) != 0:
        print("child failed", status, flush=True); os._exit(2)
stop = True
t.join()
lib.destroy(h)
print("ok", calls[0])
"""


@pytest.mark.reliability(
    case="fork() while another thread is inside a call",
    how="a thread loops sum() on a handle while the main thread forks 8 times; each child calls on the same handle",
    expect="every child completes its call and exits 0 (pthread_atfork quiesces and reinitializes the locks)",
)
def test_fork_during_a_call_does_not_deadlock(lib_path, tmp_path):
    script = tmp_path / "fork_child.py"
    script.write_text(FORK_SCRIPT)
    proc = subprocess.run(
        [sys.executable, "-W", "ignore", str(script), str(lib_path), str(Path(__file__).parent)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("ok")


LIFECYCLE_FORK_SCRIPT = r"""
import ctypes, os, sys, types
sys.path.insert(0, sys.argv[2])
sys.modules["conftest"] = types.SimpleNamespace(ROOT=None, build_shared_library=None)  # only the ctypes parts
from test_cpu_abi_v2 import Lib, tensor, OK
import numpy as np

lib = Lib(sys.argv[1])

def works(h):
    x, o = np.ones(10, dtype=np.float64), np.zeros((), dtype=np.float64)
    return lib.call(h, "sum", [tensor(x)], [tensor(o)]) == OK and o == 10.0

handles = [lib.create() for _ in range(5)]
for k in (2, 1, 4):  # a middle one, then its neighbour, then the newest: the live list is relinked each time
    lib.destroy(handles[k])
alive = [handles[0], handles[3]]
# the application reuses what destroy freed (buffers of every size near an instance's, all bytes 0xff): the
# fork handlers must never look there
reuse = [ctypes.create_string_buffer(b"\xff" * n, n) for n in range(256, 2048, 8) for _ in range(8)]
for _ in range(3):
    pid = os.fork()
    if pid == 0:
        h = lib.create()
        ok = all(works(a) for a in alive) and works(h)
        lib.destroy(h)
        os._exit(0 if ok else 3)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        print("child failed", status, flush=True)
        os._exit(2)
    if not all(works(a) for a in alive):
        print("parent's handles broken", flush=True)
        os._exit(4)
    alive.append(lib.create())
for a in alive:
    lib.destroy(a)
print("ok")
"""


def test_fork_after_creates_and_destroys_in_any_order(lib_path, tmp_path):
    """fork() waits only for the live instances: its handlers are registered once per library, however many
    instances were created (so fork never blocks on itself), and never touch a destroyed instance's memory,
    whatever the application put there since; destroying instances in any order leaves the rest usable on both
    sides of the fork."""
    script = tmp_path / "fork_lifecycle.py"
    script.write_text(LIFECYCLE_FORK_SCRIPT)
    try:
        proc = subprocess.run(
            [sys.executable, "-W", "ignore", str(script), str(lib_path), str(Path(__file__).parent)],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("fork() or a call after it hung")
    assert proc.returncode == 0 and proc.stdout.startswith("ok"), proc.stdout + proc.stderr


# ---- the C ABI, fuzzed --------------------------------------------------------------------------

try:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
except ImportError:  # hypothesis is a test dependency; without it only the fuzz test is skipped
    given = None

SHAPES = [(), (0,), (1,), (5,), (2, 3), (3, 0, 2), (1, 4, 1)]
OPS = ["add", "scale_add", "sum", "", "mul", None]
BAD_DTYPE = "complex64"


def _fuzz_expect(op, dtype, shape, device, null_data, layout, out_kind, attrs_kind):
    """True if the call is valid (then it must succeed and be right)."""
    numel = int(np.prod(shape, dtype=np.int64))
    if op not in ("add", "scale_add", "sum") or dtype == BAD_DTYPE or device not in (DEVICE_CPU, DEVICE_CUDA_HOST):
        return False
    if null_data and numel > 0:
        return False
    if layout == "transposed" and numel > 0 and sum(1 for s in shape if s != 1) >= 2:
        return False
    if out_kind != "good":
        return False
    if op == "scale_add":
        return attrs_kind in ("none", "good")
    return attrs_kind == "none"


if given is not None:
    call_st = st.tuples(
        st.just("call"),
        st.sampled_from(OPS),
        st.sampled_from([*DTYPES, BAD_DTYPE]),
        st.sampled_from(SHAPES),
        st.sampled_from([DEVICE_CPU, DEVICE_CUDA_HOST, DEVICE_CUDA, 9]),
        st.booleans(),  # NULL data
        st.sampled_from(["none", "c", "transposed"]),  # strides
        st.sampled_from(["good", "dtype", "shape"]),  # output
        st.sampled_from(["none", "good", "unknown", "twice", "kind", "fraction"]),  # attributes
    )
    slot_st = st.integers(0, 7)  # 0..5: a known id (0: another instance's), 6..7: made up
    fuzz_st = st.one_of(
        call_st,
        st.tuples(
            st.just("alloc"),
            st.sampled_from([*DTYPES, BAD_DTYPE]),
            st.sampled_from([*SHAPES, (-1,), (2**62, 2**3), (1,) * 33]),
        ),
        st.tuples(st.just("copy"), st.sampled_from(["upload", "download"]), slot_st, st.sampled_from([0, -1, 1, None])),
        st.tuples(st.just("tensor"), slot_st),
        st.tuples(st.just("free"), slot_st),
        st.tuples(st.just("resident"), st.sampled_from(OPS), slot_st, slot_st),
        st.tuples(st.just("null-handle"), st.sampled_from(["call", "alloc", "free", "sync", "ping", "tensor"])),
    )

    @pytest.mark.reliability(
        case="bad input to the C ABI, fuzzed",
        how="hypothesis: 300 random call sequences on the CPU backend (unknown ops and dtypes, CUDA or unknown "
        "devices, NULL data, non-contiguous strides, wrong outputs, bad attributes, bad shapes, ids freed, "
        "of another instance or made up, wrong byte counts, NULL handle)",
        expect="every call returns a documented status and, on error, a message; no crash; valid calls stay correct",
    )
    @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(fuzz_st, min_size=1, max_size=25))
    def test_c_abi_fuzz(lib, calls):
        h, other = lib.create(), lib.create()
        rng = np.random.default_rng(1)
        try:
            ids = [(lib.alloc(other, "float32", (4,)), 16)]  # (id, nbytes); ids[0] is another instance's
            live: set[int] = set()  # ids of h not freed yet

            def pick(k):
                """(id, nbytes, live) for slot choice k."""
                rid, nbytes = ids[k % len(ids)] if k < 6 else ((k << 40) | 12345, 16)
                return rid, nbytes, rid in live

            host = np.zeros(1 << 12, dtype=np.uint8)
            for c in calls:
                kind = c[0]
                if kind == "call":
                    _, op, dtype, shape, device, null_data, layout, out_kind, attrs_kind = c
                    dt = "float32" if dtype == BAD_DTYPE else dtype
                    x = random_array(dt, shape, rng)
                    y = random_array(dt, shape, rng)
                    strides = None
                    if layout != "none":
                        strides = [int(np.prod(shape[i + 1 :], dtype=np.int64)) for i in range(len(shape))]
                        if layout == "transposed":
                            strides = strides[::-1]
                    tx = tensor(x, dt, device=device, strides=strides, data=0 if null_data else None)
                    if dtype == BAD_DTYPE:
                        tx.dtype = Dtype(5, 64, 1)
                    ty = tensor(y, dt, device=device, strides=strides)
                    is_int = dt in INTS
                    out_dt = ("int64" if is_int else dt) if op == "sum" else dt
                    out_shape = () if op == "sum" else shape
                    if out_kind == "shape":
                        out_shape = (*out_shape, 2)
                    if out_kind == "dtype":
                        out_dt = "int32" if out_dt != "int32" else "int8"
                    out = np.zeros(out_shape, dtype=DTYPES[out_dt][2])
                    attrs = {
                        "none": [],
                        "good": [attr("alpha", 3.0), attr("beta", -2)],
                        "unknown": [attr("gamma", 1.0)],
                        "twice": [attr("alpha", 1.0), attr("alpha", 1.0)],
                        "kind": [Attr(b"alpha", 5, AttrValue(0))],
                        "fraction": [attr("alpha", 0.5)] if is_int else [attr("beta", 1), attr("zeta", 2)],
                    }[attrs_kind]
                    ins = [tx, ty] if op == "add" else [tx]
                    rc = lib.call(h, op, ins, [tensor(out, out_dt, device=device)], attrs)
                    valid = _fuzz_expect(op, dtype, shape, device, null_data, layout, out_kind, attrs_kind)
                    assert rc in CODES and (rc == OK) == valid, (c, rc, lib.error(h))
                    if rc != OK:
                        assert lib.error(h), c
                    elif op == "add":
                        assert_same_bits(out, ref_add(x, y, dt), dt)
                    elif op == "scale_add":
                        a, b = (3.0, -2.0) if attrs_kind == "good" else (1.0, 0.0)
                        assert_same_bits(out, ref_scale_add(x, a, b, dt), dt)
                    elif is_int:
                        assert int(out) == int(x.astype(np.int64).sum(dtype=np.int64))
                elif kind == "alloc":
                    _, dtype, shape = c
                    d = Dtype(5, 64, 1) if dtype == BAD_DTYPE else dtype_of(dtype)
                    rid = lib.alloc(h, d, shape)
                    valid = dtype != BAD_DTYPE and len(shape) <= 32 and all(s >= 0 for s in shape)
                    valid = valid and int(np.prod(shape, dtype=object)) * 8 < 2**40
                    assert (rid > 0) == valid and (rid > 0 or rid in CODES), (c, rid)
                    if rid > 0:
                        live.add(rid)
                        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(DTYPES[dtype][2]).itemsize
                        ids.append((rid, nbytes))
                elif kind == "copy":
                    _, which, k, delta = c
                    rid, nbytes, alive = pick(k)
                    n = nbytes + delta if delta is not None else nbytes
                    fn = getattr(lib.lib, f"cuplug_backend_{which}")
                    rc = fn(h, rid, host.ctypes.data if delta is not None else None, n)
                    ok = alive and (delta == 0 or (delta is None and nbytes == 0))
                    assert rc in CODES and (rc == OK) == ok, (c, rc, lib.error(h))
                    if not alive:
                        assert rc == E_BAD_BUFFER, (c, rc)
                elif kind == "tensor":
                    rid, _, alive = pick(c[1])
                    assert lib.descriptor(h, rid)[0] == (OK if alive else E_BAD_BUFFER), c
                elif kind == "free":
                    rid, _, alive = pick(c[1])
                    assert lib.lib.cuplug_backend_free(h, rid) == (OK if alive else E_BAD_BUFFER), c
                    live.discard(rid)
                elif kind == "resident":
                    _, op, a, b = c
                    ta, tb = lib.descriptor(h, ids[a % len(ids)][0])[1], lib.descriptor(h, ids[b % len(ids)][0])[1]
                    ins = [ta, tb] if op == "add" else [ta]
                    rc = lib.call(h, op, ins, [tb])
                    assert rc in CODES, (c, rc)
                else:
                    rc = {
                        "call": lambda: lib.lib.cuplug_backend_call(None, b"add", None, 0, None, 0, None, 0, 0),
                        "alloc": lambda: lib.alloc(None, "float32", (4,)),
                        "free": lambda: lib.lib.cuplug_backend_free(None, 1),
                        "sync": lambda: lib.lib.cuplug_backend_sync(None),
                        "ping": lambda: lib.lib.cuplug_backend_ping(None, None, 0),
                        "tensor": lambda: lib.lib.cuplug_backend_tensor(None, 1, None),
                    }[c[1]]()
                    assert rc == E_INVALID_ARGUMENT, c
        finally:
            lib.destroy(h)
            lib.destroy(other)
