"""Why a learned call on an empty CuPy array is not repeated in C (tests/test_gpu_cupy_fast.py xfails it): what
the C reader reads of such an array, what the whole path teaches (fastpath.learn's verdict) and the dispatcher's
counters, for an empty, a small and an empty 2-D float16 array, allocating and with out=.

    PYTHONPATH=<site with cuplug> python3 bench/diag_cupy_empty.py      (bench/gpu_lto.sh runs it)
"""

import cupy as cp

import cuplug
from cuplug.runtime import fastpath

b = cuplug.load()
orig = fastpath.learn


def spy(run, sig, p, op, inputs, out, stream, given, made_by, like):
    r = orig(run, sig, p, op, inputs, out, stream, given, made_by, like)
    print("learn", op, "made_by", made_by, "->", r, "facts", {str(k): bool(v) for k, v in p.fast.items()})
    return r


fastpath.learn = spy
for shape in [(0,), (4,), (0, 3)]:
    x = cp.ones(shape, dtype=cp.float16)
    m = x.data
    print(shape, "operand", dict(ptr=m.ptr, dev=m.device_id, size=m.mem.size, strides=x.strides, char=x.dtype.char))
    b.run("add", x, x)
    s0 = b.run.stats()
    r = b.run("add", x, x)
    s1 = b.run.stats()
    print(shape, "result", type(r).__name__, r.shape, r.data.ptr, r.data.device_id, "stats", s0, s1)
    o = cp.empty(shape, dtype=cp.float16)
    b.run("add", x, x, out=o)
    s0 = b.run.stats()
    b.run("add", x, x, out=o)
    print(shape, "out=", s0, b.run.stats())
