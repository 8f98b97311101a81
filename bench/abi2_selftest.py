#!/usr/bin/env python3
"""Standalone GPU self-test of a v2 CUDA backend library: ctypes + NumPy only (cuda-bindings optional).

    python3 bench/abi2_selftest.py build/backends/cuda13/fatbin/libcuplug_vector.so [more.so ...]

For every dtype x op (add, scale_add, sum) and several shapes (0 elements, tails, N-D, several
chunks) it runs the op
  - on device tensors (resident tensors: alloc, upload, call, download), on the instance stream,
  - on device tensors at a byte_offset that breaks 16-byte alignment (the scalar kernels),
  - on host tensors (the staged path: chunk-pipelined for add/scale_add, whole arrays for sum),
and compares with a NumPy reference: bit-exact for add and scale_add (float16/bfloat16 computed in
float32 and rounded to nearest even, two roundings for scale_add, integers wrapping), exact for
integer sums, for float sums within rtol * sum(|x|) (1e-2 fp16, 2e-2 bf16, 1e-5 fp32, 1e-12 fp64)
and bit-identical across repeats, alignments and paths (deterministic). It also checks the ping
JSON and its length protocol, the error codes (unknown op, integral alpha for integers, a host
pointer or another device id given as a CUDA tensor, a mix of host and device operands, a tensor
past the end of its allocation, stale ids, wrong nbytes), and, with cuda-bindings, a caller stream
with stream_wait and a pointer from another CUDA context (must be CUPLUG_E_WRONG_DEVICE).
Prints a table; exits 1 on any mismatch.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import sys
import time

import numpy as np

# ---- the C ABI (backends/include/cuplug/backend.h) --------------------------------------------


class CDtype(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class CTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device_type", ctypes.c_int32),
        ("device_id", ctypes.c_int32),
        ("ndim", ctypes.c_int32),
        ("dtype", CDtype),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class CAttrValue(ctypes.Union):
    _fields_ = [("i", ctypes.c_int64), ("f", ctypes.c_double)]


class CAttr(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("kind", ctypes.c_int32), ("value", CAttrValue)]


assert ctypes.sizeof(CTensor) == 48 and CTensor.shape.offset == 24

OK, E_INVALID, E_UNKNOWN_OP, E_BAD_BUFFER, E_OOM, E_DEVICE, E_NO_IMAGE, E_TOO_SMALL, E_WRONG_DEVICE = (
    0,
    -1,
    -2,
    -3,
    -4,
    -5,
    -6,
    -7,
    -8,
)
STATUS = {
    0: "OK",
    -1: "INVALID_ARGUMENT",
    -2: "UNKNOWN_OP",
    -3: "BAD_BUFFER",
    -4: "OUT_OF_MEMORY",
    -5: "DEVICE",
    -6: "NO_KERNEL_IMAGE",
    -7: "BUFFER_TOO_SMALL",
    -8: "WRONG_DEVICE",
}
CPU, CUDA, CUDA_HOST = 1, 2, 3

# name -> (DLPack code, bits, NumPy storage dtype)
DTYPES = {
    "float16": (2, 16, np.float16),
    "bfloat16": (4, 16, np.uint16),  # bit patterns; NumPy has no bfloat16
    "float32": (2, 32, np.float32),
    "float64": (2, 64, np.float64),
    "int8": (0, 8, np.int8),
    "uint8": (1, 8, np.uint8),
    "int32": (0, 32, np.int32),
    "int64": (0, 64, np.int64),
}
FLOATS = ("float16", "bfloat16", "float32", "float64")
SUM_RTOL = {"float16": 1e-2, "bfloat16": 2e-2, "float32": 1e-5, "float64": 1e-12}


def cdtype(name: str) -> CDtype:
    code, bits, _ = DTYPES[name]
    return CDtype(code, bits, 1)


def accum_of(name: str) -> str:
    return name if name in FLOATS else "int64"


class Backend:
    def __init__(self, path: str) -> None:
        self.lib = lib = ctypes.CDLL(os.path.abspath(path), mode=os.RTLD_NOW | os.RTLD_LOCAL)
        P, INT, LL, S, U64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong, ctypes.c_char_p, ctypes.c_uint64
        TP = ctypes.POINTER(CTensor)
        sigs = {
            "abi_version": (INT, []),
            "create": (P, [S]),
            "last_create_error": (INT, [S, INT]),
            "ping": (INT, [P, S, INT]),
            "call": (INT, [P, S, TP, INT, TP, INT, ctypes.POINTER(CAttr), INT, U64]),
            "stream_wait": (INT, [P, U64, U64]),
            "alloc": (LL, [P, CDtype, INT, ctypes.POINTER(ctypes.c_int64)]),
            "upload": (INT, [P, LL, P, LL]),
            "download": (INT, [P, LL, P, LL]),
            "tensor": (INT, [P, LL, TP]),
            "free": (INT, [P, LL]),
            "sync": (INT, [P]),
            "last_error": (INT, [P, S, INT]),
            "destroy": (None, [P]),
        }
        for short, (res, args) in sigs.items():
            fn = getattr(lib, "cuplug_backend_" + short)
            fn.restype, fn.argtypes = res, args
            setattr(self, "_" + short, fn)
        assert self._abi_version() == 2, self._abi_version()
        t0 = time.perf_counter()
        self.h = self._create(None)
        self.create_ms = (time.perf_counter() - t0) * 1e3
        if not self.h:
            buf = ctypes.create_string_buffer(1024)
            self._last_create_error(buf, len(buf))
            raise RuntimeError(f"create failed: {buf.value.decode()}")
        self.keep: list = []  # shape arrays and host buffers referenced by descriptors

    def error(self) -> str:
        need = self._last_error(self.h, None, 0)
        buf = ctypes.create_string_buffer(need + 1)
        self._last_error(self.h, buf, len(buf))
        return buf.value.decode("utf-8", "replace")

    def ping(self) -> tuple[dict, int, bytes]:
        small = ctypes.create_string_buffer(16)
        need = self._ping(self.h, small, len(small))
        if need < 0:
            raise RuntimeError(f"ping: {STATUS.get(need)}: {self.error()}")
        buf = ctypes.create_string_buffer(need + 1)
        again = self._ping(self.h, buf, len(buf))
        return json.loads(buf.value.decode()), need if again == need else -1, small.raw

    def shape_of(self, shape: tuple[int, ...]):
        arr = (ctypes.c_int64 * max(1, len(shape)))(*shape)
        self.keep.append(arr)
        return ctypes.cast(arr, ctypes.POINTER(ctypes.c_int64))

    def host(self, arr: np.ndarray, name: str, device_type: int = CPU) -> CTensor:
        self.keep.append(arr)
        return CTensor(arr.ctypes.data, device_type, 0, arr.ndim, cdtype(name), self.shape_of(arr.shape), None, 0)

    def alloc(self, name: str, shape: tuple[int, ...]) -> int:
        rid = self._alloc(self.h, cdtype(name), len(shape), self.shape_of(shape))
        if rid <= 0:
            raise RuntimeError(f"alloc {name} {shape}: {STATUS.get(rid)}: {self.error()}")
        return rid

    def upload(self, rid: int, arr: np.ndarray) -> None:
        arr = np.ascontiguousarray(arr)
        rc = self._upload(self.h, rid, arr.ctypes.data, arr.nbytes)
        if rc != OK:
            raise RuntimeError(f"upload: {STATUS.get(rc)}: {self.error()}")

    def download(self, rid: int, dtype, shape) -> np.ndarray:
        out = np.empty(shape, dtype=dtype)
        rc = self._download(self.h, rid, out.ctypes.data, out.nbytes)
        if rc != OK:
            raise RuntimeError(f"download: {STATUS.get(rc)}: {self.error()}")
        return out

    def tensor(self, rid: int) -> CTensor:
        t = CTensor()
        rc = self._tensor(self.h, rid, ctypes.byref(t))
        if rc != OK:
            raise RuntimeError(f"tensor: {STATUS.get(rc)}: {self.error()}")
        return t

    def call(self, op: str, ins: list[CTensor], outs: list[CTensor], attrs: dict | None = None, stream: int = 0) -> int:
        cin = (CTensor * max(1, len(ins)))(*ins)
        cout = (CTensor * max(1, len(outs)))(*outs)
        items = list((attrs or {}).items())
        cattrs = (CAttr * max(1, len(items)))()
        for k, (name, v) in enumerate(items):
            cattrs[k].name = name.encode()
            if isinstance(v, int):
                cattrs[k].kind, cattrs[k].value.i = 0, v
            else:
                cattrs[k].kind, cattrs[k].value.f = 1, float(v)
        return self._call(self.h, op.encode(), cin, len(ins), cout, len(outs), cattrs, len(items), stream)

    def close(self) -> None:
        self._destroy(self.h)
        self.h = None


# ---- NumPy references -------------------------------------------------------------------------


def bf16_to_f32(u: np.ndarray) -> np.ndarray:
    return (u.astype(np.uint32) << np.uint32(16)).view(np.float32)


def f32_to_bf16(f: np.ndarray) -> np.ndarray:
    u = np.ascontiguousarray(f, dtype=np.float32).view(np.uint32)
    r = ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)
    r[(u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)] = 0x7FFF
    return r


def to_f32(x: np.ndarray, name: str) -> np.ndarray:
    return bf16_to_f32(x) if name == "bfloat16" else x.astype(np.float32)


def from_f32(f: np.ndarray, name: str) -> np.ndarray:
    return f32_to_bf16(f) if name == "bfloat16" else f.astype(np.float16)


def ref_add(x, y, name):
    if name in ("float16", "bfloat16"):
        return from_f32(to_f32(x, name) + to_f32(y, name), name)
    return x + y  # IEEE for floats; wraps for integer arrays


def ref_scale_add(x, name, alpha, beta):
    if name in ("float16", "bfloat16"):
        t = from_f32(to_f32(x, name) * np.float32(alpha), name)
        return from_f32(to_f32(t, name) + np.float32(beta), name)
    if name == "float32":
        return (x * np.float32(alpha)) + np.float32(beta)  # two ufuncs: two roundings
    if name == "float64":
        return (x * np.float64(alpha)) + np.float64(beta)
    with np.errstate(over="ignore"):
        return (x.astype(np.int64) * np.int64(alpha) + np.int64(beta)).astype(DTYPES[name][2])


def ref_sum(x, name):
    if name in FLOATS:
        v = to_f32(x, name).astype(np.float64) if name in ("float16", "bfloat16") else x.astype(np.float64)
        return math.fsum(v.ravel().tolist()), float(np.abs(v).sum())
    return int(x.astype(np.int64).sum(dtype=np.int64)), 0.0


def random_array(name: str, shape, rng) -> np.ndarray:
    if name in FLOATS:
        f = (rng.standard_normal(shape) * 8).astype(np.float32 if name != "float64" else np.float64)
        if name == "float16":
            return f.astype(np.float16)
        if name == "bfloat16":
            return f32_to_bf16(f).reshape(shape)
        return f
    info = np.iinfo(DTYPES[name][2])
    return rng.integers(info.min, info.max, size=shape, endpoint=True, dtype=DTYPES[name][2])


def bits(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.view(f"u{a.itemsize}") if a.dtype.kind == "f" else a


def sum_value(raw: np.ndarray, name: str):
    acc = accum_of(name)
    if acc == "bfloat16":
        return float(bf16_to_f32(raw.reshape(1))[0])
    if acc in FLOATS:
        return float(raw.reshape(1)[0])
    return int(raw.reshape(1)[0])


# ---- the test -------------------------------------------------------------------------------

SHAPES = [(0,), (1,), (7,), (1000,), (3, 5, 7), (300_007,), ((1 << 21) + 5,)]
BIG = (12_000_003,)  # > 32 MiB of float32: several staging threads


class Report:
    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str, str, str]] = []
        self.failures = 0

    def add(self, dtype: str, op: str, path: str, ok: bool, detail: str = "") -> None:
        self.rows.append((dtype, op, path, "ok" if ok else "FAIL", detail))
        self.failures += not ok

    def print(self) -> None:
        w = [max(len(r[i]) for r in [*self.rows, ("dtype", "op", "path", "result", "detail")]) for i in range(5)]
        line = lambda r: "  ".join(c.ljust(w[i]) for i, c in enumerate(r))  # noqa: E731
        print(line(("dtype", "op", "path", "result", "detail")))
        print("  ".join("-" * x for x in w))
        for r in self.rows:
            print(line(r))


def run_op_paths(b: Backend, rep: Report, name: str, op: str, shape, rng, sums: dict) -> None:
    """One op on one shape: device (aligned), device at a misaligned byte_offset, host. Compares."""
    st = DTYPES[name][2]
    n = int(np.prod(shape))
    size = np.dtype(st).itemsize
    x = random_array(name, shape, rng)
    y = random_array(name, shape, rng) if op == "add" else None
    attrs = {}
    if op == "scale_add":
        attrs = {"alpha": 1.7, "beta": -0.3} if name in FLOATS else {"alpha": 3, "beta": -7}
    if op == "add":
        ref = ref_add(x, y, name)
    elif op == "scale_add":
        ref = ref_scale_add(x, name, attrs["alpha"], attrs["beta"])
    else:
        ref, scale = ref_sum(x, name)
    out_name = accum_of(name) if op == "sum" else name
    out_st = DTYPES[out_name][2]
    out_shape = () if op == "sum" else shape
    label = "x".join(map(str, shape))

    def check(got_raw: np.ndarray, path: str) -> None:
        if op != "sum":
            ok = got_raw.shape == ref.shape and np.array_equal(bits(got_raw), bits(ref))
            detail = ""
            if not ok:
                bad = np.flatnonzero(bits(got_raw).ravel() != bits(ref).ravel())
                i = int(bad[0]) if bad.size else -1
                detail = f"{bad.size} of {n} differ; first [{i}]: got {got_raw.ravel()[i]!r} want {ref.ravel()[i]!r}"
            rep.add(name, op, f"{path} {label}", ok, detail)
            return
        got = sum_value(got_raw, name)
        if name in FLOATS:
            err = abs(got - ref)
            ok = err <= SUM_RTOL[name] * max(scale, 1.0) and math.isfinite(got)
            detail = f"got {got!r} ref {ref!r} err/scale {err / max(scale, 1.0):.2e}"
        else:
            ok = got == ref
            detail = "" if ok else f"got {got} want {ref}"
        key = (name, label)
        raw_bits = bytes(np.ascontiguousarray(got_raw).tobytes())
        if key in sums and sums[key] != raw_bits:
            ok, detail = False, detail + f"; not the bits of the first run ({sums[key].hex()} vs {raw_bits.hex()})"
        sums.setdefault(key, raw_bits)
        rep.add(name, op, f"{path} {label}", ok, detail)

    # Device, aligned: resident tensors.
    ix = b.alloc(name, shape)
    b.upload(ix, x)
    ins = [b.tensor(ix)]
    if y is not None:
        iy = b.alloc(name, shape)
        b.upload(iy, y)
        ins.append(b.tensor(iy))
    io = b.alloc(out_name, out_shape)
    rc = b.call(op, ins, [b.tensor(io)], attrs)
    if rc != OK:
        rep.add(name, op, f"device {label}", False, f"{STATUS.get(rc)}: {b.error()}")
    else:
        check(b.download(io, out_st, out_shape), "device")
    if op == "sum" and n > 0:  # the same bits again: deterministic
        b.call(op, ins, [b.tensor(io)], attrs)
        check(b.download(io, out_st, out_shape), "device again")

    # Device, misaligned: element 1 onward of an (n + 1)-element buffer.
    if n > 0:
        flat = (n + 1,)
        mx = b.alloc(name, flat)
        b.upload(mx, np.concatenate([np.zeros(1, st), x.ravel()]))
        mins = []
        for rid in [mx] + ([None] if y is not None else []):
            if rid is None:
                rid = b.alloc(name, flat)
                b.upload(rid, np.concatenate([np.zeros(1, st), y.ravel()]))
            t = b.tensor(rid)
            t.byte_offset, t.ndim, t.shape = size, len(shape), b.shape_of(shape)
            mins.append(t)
        if op == "sum":
            mo = b.alloc(out_name, out_shape)
            tout = b.tensor(mo)
        else:
            mo = b.alloc(out_name, flat)
            tout = b.tensor(mo)
            tout.byte_offset, tout.ndim, tout.shape = np.dtype(out_st).itemsize, len(shape), b.shape_of(shape)
        rc = b.call(op, mins, [tout], attrs)
        if rc != OK:
            rep.add(name, op, f"device+offset {label}", False, f"{STATUS.get(rc)}: {b.error()}")
        elif op == "sum":
            check(b.download(mo, out_st, out_shape), "device+offset")
        else:
            check(b.download(mo, out_st, flat)[1:].reshape(shape), "device+offset")

    # Host: staged.
    hx = np.ascontiguousarray(x)
    hins = [b.host(hx, name)]
    if y is not None:
        hins.append(b.host(np.ascontiguousarray(y), name, CUDA_HOST))  # CUDA-host is staged the same way
    hout = np.full(out_shape, 0x55, dtype=out_st) if out_st != np.float16 else np.zeros(out_shape, out_st)
    rc = b.call(op, hins, [b.host(hout, out_name)], attrs)
    if rc != OK:
        rep.add(name, op, f"host {label}", False, f"{STATUS.get(rc)}: {b.error()}")
    else:
        check(hout, "host")
    b.keep.clear()


def expect(rep: Report, b: Backend, what: str, rc: int, want: int, words: tuple[str, ...] = ()) -> None:
    msg = b.error() if rc != OK else ""
    ok = rc == want and all(w.lower() in msg.lower() for w in words)
    rep.add("-", "errors", what, ok, f"{STATUS.get(rc, rc)}: {msg}")


def error_cases(b: Backend, rep: Report, cuda: bool) -> None:
    """cuda=False (the CPU twin, for checking this script): only the checks a CPU backend can make."""
    f32 = "float32"
    n = 1024
    a = b.alloc(f32, (n,))
    b.upload(a, np.ones(n, np.float32))
    o = b.alloc(f32, (n,))
    ta, to = b.tensor(a), b.tensor(o)
    expect(rep, b, "unknown op", b.call("no_such_op", [ta], [to]), E_UNKNOWN_OP, ("add",))
    i32 = b.alloc("int32", (n,))
    ti = b.tensor(i32)
    expect(rep, b, "int scale_add alpha=0.5", b.call("scale_add", [ti], [ti], {"alpha": 0.5}), E_INVALID, ("alpha",))
    hostbuf = np.ones(n, np.float32)
    if cuda:
        fake = b.host(hostbuf, f32)
        fake.device_type = CUDA
        expect(rep, b, "host pointer as CUDA tensor", b.call("add", [fake, ta], [to]), E_WRONG_DEVICE, ("cuda",))
        other = b.tensor(a)
        other.device_id = 1
        expect(
            rep, b, "device_id 1 on a cuda:0 instance", b.call("add", [other, ta], [to]), E_WRONG_DEVICE, ("cuda:1",)
        )
        expect(rep, b, "mixed host and device", b.call("add", [b.host(hostbuf, f32), ta], [to]), E_INVALID, ("mix",))
        past = b.tensor(a)
        past.shape = b.shape_of((n * 4,))
        past2 = b.tensor(o)
        past2.shape = b.shape_of((n * 4,))
        expect(rep, b, "tensor past its allocation", b.call("add", [past, past], [past2]), E_INVALID, ("allocation",))
    wrong_shape = b.tensor(o)
    wrong_shape.shape = b.shape_of((n - 1,))
    expect(rep, b, "output shape mismatch", b.call("add", [ta, ta], [wrong_shape]), E_INVALID, ("shape",))
    expect(rep, b, "upload nbytes too small", b._upload(b.h, a, hostbuf.ctypes.data, 4), E_TOO_SMALL, ("nbytes",))
    expect(rep, b, "upload nbytes too large", b._upload(b.h, a, hostbuf.ctypes.data, 8 * n), E_INVALID, ("nbytes",))
    b._free(b.h, o)
    t = CTensor()
    expect(rep, b, "tensor() of a freed id", b._tensor(b.h, o, ctypes.byref(t)), E_BAD_BUFFER, ("not a live",))
    expect(rep, b, "free twice", b._free(b.h, o), E_BAD_BUFFER)
    expect(rep, b, "made-up id", b._download(b.h, 12345, hostbuf.ctypes.data, 4 * n), E_BAD_BUFFER)
    # Zero elements: a resident tensor of shape (0,), add launches nothing, sum writes 0.
    z = b.alloc(f32, (0,))
    tz = b.tensor(z)
    zero_ok = tz.data is not None and b.call("add", [tz, tz], [tz]) == OK
    s = b.alloc(f32, ())
    b.upload(s, np.array(5.0, np.float32))
    zero_ok = zero_ok and b.call("sum", [tz], [b.tensor(s)]) == OK
    zero_ok = zero_ok and float(b.download(s, np.float32, ())) == 0.0
    rep.add("-", "errors", "zero-element add/sum", zero_ok, "" if zero_ok else b.error())
    rep.add(
        "-",
        "errors",
        "instance usable after errors",
        b.call("add", [ta, ta], [b.tensor(a)]) == OK and bool(np.all(b.download(a, np.float32, (n,)) == 2.0)),
        b.error(),
    )
    b.keep.clear()


def driver_cases(b: Backend, rep: Report) -> None:
    """A caller stream + stream_wait, and a pointer of another context (needs cuda-bindings)."""
    try:
        from cuda.bindings import driver as drv
    except ImportError:
        try:
            from cuda import cuda as drv  # older cuda-python
        except ImportError:
            rep.add("-", "driver", "caller stream / foreign context", True, "SKIPPED: no cuda-bindings")
            return
    SUCCESS = drv.CUresult.CUDA_SUCCESS
    n = (1 << 22) + 1
    x = np.arange(n, dtype=np.float32)
    a, o = b.alloc("float32", (n,)), b.alloc("float32", (n,))
    b.upload(a, x)
    # The instance's create() left the primary context current on this thread.
    err, stream = drv.cuStreamCreate(1)  # CU_STREAM_NON_BLOCKING
    if err != SUCCESS:
        rep.add("-", "driver", "caller stream", False, f"cuStreamCreate: {err}")
    else:
        handle = int(stream)
        rc = b.call("scale_add", [b.tensor(a)], [b.tensor(o)], {"alpha": 2.0, "beta": 1.0}, stream=handle)
        rc2 = b._stream_wait(b.h, 0, handle)  # instance stream waits for the caller's: download sees the result
        got = b.download(o, np.float32, (n,)) if rc == OK and rc2 == OK else None
        ok = got is not None and np.array_equal(got, x * np.float32(2) + np.float32(1))
        rep.add("float32", "scale_add", "caller stream + stream_wait", ok, "" if ok else f"{rc} {rc2} {b.error()}")
        rc3 = b._stream_wait(b.h, handle, 0)
        drv.cuStreamSynchronize(stream)
        rep.add("-", "driver", "stream_wait(caller, instance)", rc3 == OK, b.error() if rc3 else "")
        drv.cuStreamDestroy(stream)
    err, dev = drv.cuDeviceGet(0)
    if hasattr(drv, "CUctxCreateParams"):
        err, ctx = drv.cuCtxCreate(None, 0, dev)
    else:
        err, ctx = drv.cuCtxCreate(0, dev)
    if err != SUCCESS:
        rep.add("-", "driver", "foreign context", False, f"cuCtxCreate: {err}")
        return
    try:
        err, ptr = drv.cuMemAlloc(4 * 1024)
        drv.cuCtxPopCurrent()
        t = CTensor(int(ptr), CUDA, 0, 1, cdtype("float32"), b.shape_of((1024,)), None, 0)
        small = b.alloc("float32", (1024,))
        expect(
            rep, b, "pointer of another context", b.call("add", [t, t], [b.tensor(small)]), E_WRONG_DEVICE, ("context",)
        )
        ok = b.call("add", [b.tensor(a), b.tensor(a)], [b.tensor(o)]) == OK and np.array_equal(
            b.download(o, np.float32, (n,)), x + x
        )
        rep.add("-", "driver", "instance unharmed after it", ok, b.error())
        drv.cuCtxPushCurrent(ctx)
        drv.cuMemFree(ptr)
        drv.cuCtxPopCurrent()
    finally:
        drv.cuCtxDestroy(ctx)
    b.keep.clear()


def main(paths: list[str]) -> int:
    total_fail = 0
    for path in paths:
        print(f"\n=== {path}")
        try:
            b = Backend(path)
        except (OSError, RuntimeError) as exc:
            print(f"cannot create: {exc}")
            total_fail += 1
            continue
        rep = Report()
        try:
            info, need, small = b.ping()
        except RuntimeError as exc:
            print(exc)  # e.g. NO_KERNEL_IMAGE for sm75/sm80 variants on a newer GPU
            b.close()
            total_fail += "NO_KERNEL_IMAGE" not in str(exc) or "fatbin" in path or "/ptx/" in path
            continue
        cuda = info["device"]["type"] == "cuda"
        ok = (
            need > 16
            and small[15:16] == b"\0"
            and info["abi"] == 2
            and isinstance(info["stream"], int)
            and (info["stream"] != 0) == cuda
            and set(info["ops"]) == {"add", "scale_add", "sum"}
        )
        rep.add("-", "ping", f"json {need} B, stream {info['stream']:#x}", ok, json.dumps(info["device"]))
        print(
            f"create {b.create_ms:.1f} ms; {info['device']['name']} cc {info['device']['capability']}, "
            f"variant {info['variant']}, runtime {info['runtime_version']}, driver {info['driver_version']}"
        )
        rng = np.random.default_rng(2026)
        sums: dict = {}
        t0 = time.perf_counter()
        for name in DTYPES:
            for op in ("add", "scale_add", "sum"):
                for shape in SHAPES:
                    try:
                        run_op_paths(b, rep, name, op, shape, rng, sums)
                    except RuntimeError as exc:
                        rep.add(name, op, "x".join(map(str, shape)), False, str(exc))
        for name, op in (("float32", "add"), ("float16", "scale_add"), ("float32", "sum")):
            run_op_paths(b, rep, name, op, BIG, rng, sums)
        # int64 wraparound with a large integral alpha
        x = random_array("int64", (4099,), rng)
        a = b.alloc("int64", (4099,))
        b.upload(a, x)
        rc = b.call("scale_add", [b.tensor(a)], [b.tensor(a)], {"alpha": float(2**40 + 3), "beta": -(2**62)})
        got = b.download(a, np.int64, (4099,))
        with np.errstate(over="ignore"):
            want = x * np.int64(2**40 + 3) + np.int64(-(2**62))
        rep.add(
            "int64", "scale_add", "in place, alpha 2^40+3 (wraps)", rc == OK and np.array_equal(got, want), b.error()
        )
        try:
            cuda = info["device"]["type"] == "cuda"
            error_cases(b, rep, cuda)
            if cuda:
                driver_cases(b, rep)
        except Exception as exc:
            rep.add("-", "errors", "exception", False, repr(exc))
        rc = b._sync(b.h)
        rep.add("-", "sync", "final", rc == OK, b.error() if rc else "")
        b.close()
        rep.print()
        print(f"{len(rep.rows)} checks, {rep.failures} failed, {time.perf_counter() - t0:.1f} s")
        total_fail += rep.failures
    print(f"\nTOTAL FAILURES: {total_fail}")
    return 1 if total_fail else 0


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1:]))
