"""Kernel-only bandwidth of the CUDA shim (dev/cuda_shim.cu): python dev/bench_shim.py LIB."""

from __future__ import annotations

import ctypes
import sys

lib = ctypes.CDLL(sys.argv[1])
lib.quant_shim_bench.restype = ctypes.c_double
lib.quant_shim_bench.argtypes = [
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_longlong,
    ctypes.c_longlong,
    ctypes.c_int,
]
n = 1 << 28
for name, code, bits in (("float32", 2, 32), ("float16", 2, 16), ("bfloat16", 4, 16)):
    for bs in (64, 256, 4096):
        ms = lib.quant_shim_bench(0, code, bits, n, bs, 50)
        moved = n * (bits // 8 + 1) + (n // bs) * 4
        print(f"quantize   {name:8s} bs={bs:4d} n=2^28: {ms:.3f} ms, {moved / ms / 1e6:.0f} GB/s")
for bs in (64, 256, 4096):
    ms = lib.quant_shim_bench(1, 0, 8, n, bs, 50)
    moved = n * 5 + (n // bs) * 4
    print(f"dequantize int8     bs={bs:4d} n=2^28: {ms:.3f} ms, {moved / ms / 1e6:.0f} GB/s")
