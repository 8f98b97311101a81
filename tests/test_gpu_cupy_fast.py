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


def test_with_another_launch_stream_cupy_operands_take_the_whole_path_and_its_handshake(b):
    """stream= (or a PyTorch tensor first) launches elsewhere than CuPy's stream: the whole path imports the arrays
    by DLPack, whose handshake orders the launch after CuPy's work; the C path would not, so it is not taken."""
    x = cp.ones(1 << 16, dtype=cp.float32)
    o = cp.empty_like(x)
    a, other = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    b.run("add", x, x, out=o, stream=other.ptr)
    n = _fast(b)
    with a:
        SPIN((1,), (256,), (x, cp.int64(x.size), cp.int64(100_000_000)))
        b.run("add", x, x, out=o, stream=other.ptr)
    other.synchronize()
    assert _fast(b) == n and bool((o == 6.0).all())
    torch = pytest.importorskip("torch")
    t = torch.ones(1 << 16, device="cuda")
    b.run("add", t, x, out=o)
    b.run("add", t, x, out=o)
    assert _fast(b) == n  # PyTorch's stream first: the whole path, every time
    cp.cuda.Device().synchronize()
    assert bool((o == 4.0).all())


def test_an_allocating_call_comes_from_cupys_pool_through_the_fast_path(b):
    x = cp.arange(4096, dtype=cp.float32)
    b.run("add", x, x)
    n = _fast(b)
    again = b.run("add", x, x)
    assert _fast(b) == n + 1
    assert isinstance(again, cp.ndarray) and again.dtype == cp.float32 and again.shape == (4096,)
    assert isinstance(again.data.mem, cp.cuda.memory.PooledMemory)  # CuPy's pool made it
    assert bool((again == 2 * x).all())
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
    for a in [cp.ones((16, 16), dtype=cp.float16), cp.ones((3, 256))[1:2]]:
        b.run("add", a, a)
        n = _fast(b)
        r = b.run("add", a, a)
        assert _fast(b) == n + 1, a.strides
        assert r.shape == a.shape and bool((r == 2).all())


@pytest.mark.parametrize("shape", [(0,), (3, 0)])  # (3, 0): CuPy's strides skip the empty extent
def test_an_empty_cupy_array_is_repeated_in_c_with_an_empty_result(b, shape):
    """The H100 of bench/results/h100-2026-12-05-gpu-lto-1 (before 2c3caab: CuPy's strides of an array with an
    empty extent were refused) served the second call of an empty float16 add by the whole path; the H200 of
    bench/results/h200-2026-12-06-session-1 repeated it in C (bench/diag_cupy_empty.py), allocating and out=."""
    a = cp.ones(shape, dtype=cp.float16)
    b.run("add", a, a)
    n = _fast(b)
    r = b.run("add", a, a)
    assert isinstance(r, cp.ndarray) and r.shape == shape and r.dtype == cp.float16
    assert _fast(b) == n + 1, "an empty CuPy array's learned call went to the whole path"
    o = cp.empty(shape, dtype=cp.float16)
    b.run("add", a, a, out=o)
    n = _fast(b)
    assert b.run("add", a, a, out=o) is o and _fast(b) == n + 1
