"""The CPU twin's ops (dev/cpu_shim.c, no cuplug framework) against tests/reference.py.

    python dev/check.py /path/to/libquant_shim.so [--dump DIR]

--dump writes inputs and outputs as .npy, for dev/kernel_check.cu's outputs to be compared.
"""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import reference

CODES = {"float32": (2, 32), "float16": (2, 16), "bfloat16": (4, 16)}


def shim_quantize(lib, x: np.ndarray, dtype: str, bs: int):
    n = x.size
    q = np.empty(n, np.int8)
    nb = max(1, -(-n // bs)) if bs > 0 else 1
    amax = np.empty(nb, np.float32)
    err = ctypes.create_string_buffer(256)
    code, bits = CODES[dtype]
    rc = lib.quant_shim_call(0, x.ctypes.data, code, bits, n, None, 0, q.ctypes.data, amax.ctypes.data, bs, err, 256)
    return rc, q, amax[: -(-n // bs)] if bs > 0 else amax, err.value.decode()


def shim_dequantize(lib, q: np.ndarray, amax: np.ndarray, bs: int):
    out = np.empty(q.size, np.float32)
    err = ctypes.create_string_buffer(256)
    rc = lib.quant_shim_call(
        1, q.ctypes.data, 0, 8, q.size, amax.ctypes.data, amax.size, out.ctypes.data, None, bs, err, 256
    )
    return rc, out, err.value.decode()


def special_values(rng: np.random.Generator, n: int) -> np.ndarray:
    x = (rng.standard_normal(n) * np.exp(rng.uniform(-20, 20, n))).astype(np.float32)
    picks = rng.integers(0, 40, n)
    x[picks == 0] = 0.0
    x[picks == 1] = -0.0
    x[picks == 2] = np.inf
    x[picks == 3] = np.nan
    x[picks == 4] = 1e-40  # subnormal
    return x


def main() -> int:
    lib = ctypes.CDLL(sys.argv[1])
    lib.quant_shim_call.argtypes = [
        ctypes.c_int,
        ctypes.c_void_p,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_longlong,
        ctypes.c_void_p,
        ctypes.c_longlong,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_longlong,
        ctypes.c_char_p,
        ctypes.c_int,
    ]
    rng = np.random.default_rng(0)
    bad = 0
    for n in (0, 1, 63, 64, 65, 1000, 4096, 4097, 100003):
        for bs in (64, 128, 256, 512, 1024, 2048, 4096):
            for dtype in CODES:
                for kind in ("normal", "special", "ties"):
                    if kind == "normal":
                        xf = rng.standard_normal(n).astype(np.float32)
                    elif kind == "special":
                        xf = special_values(rng, n)
                    else:  # exact ties: absmax 127 -> scale 1, x = k + 0.5
                        xf = (rng.integers(-127, 127, n) + 0.5).astype(np.float32)
                        xf[:: max(1, bs)] = 127.0
                    if dtype == "float32":
                        raw = xf
                    elif dtype == "float16":
                        raw = xf.astype(np.float16)
                        xf = raw.astype(np.float32)
                    else:
                        raw = reference.f32_to_bf16_bits(xf)
                        xf = reference.bf16_bits_to_f32(raw)
                    raw = np.ascontiguousarray(raw)
                    rc, q, amax, err = shim_quantize(lib, raw, dtype, bs)
                    rq, ra = reference.quantize(xf, bs)
                    ok = rc == 0 and np.array_equal(q, rq) and np.array_equal(amax.view(np.uint32), ra.view(np.uint32))
                    rc2, out, err2 = shim_dequantize(lib, rq, ra, bs)
                    ro = reference.dequantize(rq, ra, bs)
                    ok = ok and rc2 == 0 and np.array_equal(out.view(np.uint32), ro.view(np.uint32))
                    if not ok:
                        bad += 1
                        what = []
                        for name, a, b in (
                            ("q", q, rq),
                            ("absmax", amax.view(np.uint32), ra.view(np.uint32)),
                            ("out", out.view(np.uint32), ro.view(np.uint32)),
                        ):
                            diff = np.flatnonzero(a != b) if a.shape == b.shape else [-1]
                            if len(diff):
                                i = diff[0]
                                what.append(f"{name}: {len(diff)} differ, first [{i}] got {a[i]:#x} want {b[i]:#x}")
                                if name == "q":
                                    blk = i // bs
                                    what.append(f"x={xf[i]!r} absmax={ra[blk]!r}")
                        print("MISMATCH", n, bs, dtype, kind, rc, err, rc2, err2, "; ".join(what))
    for bs in (0, -1, 32, 100, 8192):
        rc, *_, err = shim_quantize(lib, np.zeros(10, np.float32), "float32", bs)
        print(bs, rc, err)
        bad += rc != -1 or "power of two" not in err
    rc, _, err = shim_dequantize(lib, np.zeros(300, np.int8), np.zeros(1, np.float32), 256)
    print(rc, err)
    bad += rc != -1 or "absmax has 1 elements" not in err
    print("bad:", bad)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
