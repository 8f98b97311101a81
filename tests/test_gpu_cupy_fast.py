"""On a real GPU (issue 30): the C dispatcher reads exact ``cupy.ndarray`` operands itself (fastcall.c, read_cupy):
a learned call is repeated in C on CuPy's current stream, allocates from CuPy's pool, and every per-call check of
the whole path still holds (contiguity, overlap, dtype, device). Skips without a GPU and CuPy."""

from __future__ import annotations

import pytest

cp = pytest.importorskip("cupy")
try:
    if cp.cuda.runtime.getDeviceCount() < 1:
        raise RuntimeError("no device")
except Exception:
    pytest.skip("no CUDA device for CuPy", allow_module_level=True)

import cuplug  # noqa: E402

pytestmark = pytest.mark.gpu

# A kernel that spins ~50 ms on the GPU: a launch on the wrong stream would run before it finishes writing.
SPIN = cp.RawKernel(
    r"""
extern "C" __global__ void spin_then_fill(float* x, long long n, long long cycles) {
  long long start = clock64();
  while (clock64() - start < cycles) {}
  for (long long i = threadIdx.x; i < n; i += blockDim.x) x[i] = 3.0f;
}""",
    "spin_then_fill",
)


@pytest.fixture(scope="module")
def b():
    with cuplug.load() as backend:
        assert backend.device_type == 2, backend.trace
        if getattr(backend.run, "stats", None) is None:
            pytest.skip("the wheel's C dispatcher is not in use here")
        yield backend


def _fast(b) -> int:
    return b.run.stats()["fast_calls"]


def test_a_learned_call_on_cupy_arrays_takes_the_fast_path_on_cupys_current_stream(b):
    x = cp.ones(1 << 16, dtype=cp.float32)
    o = cp.empty_like(x)
    b.run("add", x, x, out=o)  # learned
    n = _fast(b)
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        SPIN((1,), (256,), (x, cp.int64(x.size), cp.int64(100_000_000)))  # x becomes 3 only after the spin
        assert b.run("add", x, x, out=o) is o
    s.synchronize()
    assert _fast(b) == n + 1
    assert bool((o == 6.0).all())


def test_an_allocating_call_comes_from_cupys_pool_through_the_fast_path(b):
    x = cp.arange(4096, dtype=cp.float32)
    first = b.run("add", x, x)
    n = _fast(b)
    again = b.run("add", x, x)
    assert _fast(b) == n + 1
    assert isinstance(again, cp.ndarray) and again.dtype == cp.float32 and again.shape == (4096,)
    assert again.data.ptr != first.data.ptr and bool((again == 2 * x).all())
    total = b.run("sum", x)
    assert float(total) == float(x.sum())


def test_per_call_checks_of_cupy_arrays_after_the_call_was_learned(b):
    x, y, o = (cp.ones(256, dtype=cp.float32) for _ in range(3))
    b.run("add", x, y, out=o)
    b.run("add", x, y, out=o)
    n = _fast(b)
    with pytest.raises(cuplug.InvalidInputError):  # a view with gaps: the whole path names it
        b.run("add", cp.ones((256, 2), dtype=cp.float32)[:, 0], y, out=o)
    with pytest.raises(cuplug.InvalidInputError, match="overlaps"):
        base = cp.ones(512, dtype=cp.float32)
        b.run("add", base[:256], y, out=base[128:384])
    with pytest.raises(cuplug.InvalidInputError):
        b.run("add", x, y, out=cp.ones(256, dtype=cp.float64))  # another dtype: the whole path names it
    with pytest.raises(cuplug.InvalidInputError):
        b.run("add", x, cp.ones(255, dtype=cp.float32), out=o)
    assert _fast(b) == n  # none of these was repeated in C
    offset = cp.arange(300, dtype=cp.float32)[44:]  # a contiguous view at an offset: its own address
    b.run("add", offset, y, out=o)
    b.run("add", offset, y, out=o)
    assert bool((o == cp.arange(44, 300, dtype=cp.float32) + 1).all())
    for shape in [(0,), (16, 16), (1, 256)]:  # empty, 2-D, a size-1 dimension of any stride
        a = cp.ones(shape, dtype=cp.float16)
        for _ in range(2):
            r = b.run("add", a, a)
        assert r.shape == shape and bool((r == 2).all())
