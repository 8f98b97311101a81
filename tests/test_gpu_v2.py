"""ABI v2 on a real GPU (marker gpu): PyTorch/CuPy tensors in place, every dtype x op against PyTorch,
zero copy, streams without a synchronize, wrong devices and contexts, lifetimes. Both CUDA majors."""

from __future__ import annotations

import gc
from typing import ClassVar

import numpy as np
import pytest

import cuplug
import cuplug.runtime.dlpack

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device for PyTorch", allow_module_level=True)

MAJORS = ["cuda12:fatbin", "cuda13:fatbin"]
DTYPES = [
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.int8,
    torch.uint8,
    torch.int32,
    torch.int64,
]
SUM_RTOL = {torch.float16: 1e-2, torch.bfloat16: 2e-2, torch.float32: 1e-5, torch.float64: 1e-12}


@pytest.fixture(params=MAJORS)
def b(request, monkeypatch):
    monkeypatch.setenv("CUPLUG_BACKEND", request.param)
    with cuplug.load() as backend:
        assert f"{backend.cuda}:{backend.variant}" == request.param, backend.trace.text()
        yield backend


def _rand(dtype, shape, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g, device="cuda", dtype=torch.float32) * 8).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(info.min, info.max, shape, generator=g, device="cuda", dtype=torch.int64).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1,), (3, 1000, 7), ((1 << 22) + 3,)])
def test_every_dtype_and_op_bit_exact_against_pytorch(b, dtype, shape):
    x, y = _rand(dtype, shape, 1), _rand(dtype, shape, 2)
    r = b.run("add", x, y)
    assert isinstance(r, torch.Tensor) and r.device == x.device  # PyTorch's allocator for PyTorch inputs
    assert torch.equal(r, x + y)
    alpha, beta = (3, -7) if not dtype.is_floating_point else (1.7, -0.3)
    assert torch.equal(torch.from_dlpack(b.run("scale_add", x, alpha=alpha, beta=beta)), x * alpha + beta)
    s = torch.from_dlpack(b.run("sum", x))
    if dtype.is_floating_point:
        assert s.dtype == dtype and s.shape == ()
        ref = x.double().sum()
        scale = x.double().abs().sum().clamp(min=1.0)
        assert abs(float(s.double()) - float(ref)) <= SUM_RTOL[dtype] * float(scale)
    else:  # int64 accumulation, as torch.sum
        assert s.dtype == torch.int64 and int(s) == int(x.sum())


def test_sum_is_deterministic(b):
    x = torch.randn(1 << 26, device="cuda")
    first = torch.from_dlpack(b.run("sum", x)).clone()
    for _ in range(5):
        assert torch.equal(torch.from_dlpack(b.run("sum", x)), first)  # the same bits on every run


def test_zero_copy_in_and_out(b):
    n = 1 << 26  # 256 MiB of float32
    x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    torch.cuda.synchronize()
    held0 = torch.cuda.memory_allocated()
    r = b.run("add", x, y)
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() - held0 == 4 * n  # the output only, from PyTorch's caching allocator
    assert isinstance(r, torch.Tensor) and torch.equal(r, x + y)
    t = b.buffer(np.ones(8, np.float32))
    owned = b.run("add", t, t)  # backend-owned (resident inputs): exported without a copy
    e = torch.from_dlpack(owned)
    assert e.data_ptr() == owned.data_ptr and torch.equal(e, torch.full((8,), 2.0, device="cuda"))
    out = torch.empty_like(x)
    ptr = out.data_ptr()
    assert b.run("add", x, y, out=out) is out and out.data_ptr() == ptr and torch.equal(out, x + y)


def test_cupy_round_trip(b):
    cp = pytest.importorskip("cupy")
    x = cp.arange(1 << 20, dtype=cp.float32)
    r = b.run("scale_add", x, alpha=2.0, beta=1.0)
    assert isinstance(r, cp.ndarray)  # CuPy's pool for CuPy inputs
    cp.testing.assert_array_equal(r, x * cp.float32(2) + cp.float32(1))
    t = b.run("add", b.buffer(np.ones(4, np.float32)), b.buffer(np.ones(4, np.float32)))  # backend-owned
    back = cp.asarray(t)  # __cuda_array_interface__
    assert back.data.ptr == t.data_ptr and cp.from_dlpack(t).data.ptr == t.data_ptr

    class OnlyCAI:  # Numba-style producer: __cuda_array_interface__ alone
        def __init__(self, a):
            self.__cuda_array_interface__ = a.__cuda_array_interface__

    got = cp.asarray(b.run("add", OnlyCAI(x), OnlyCAI(x)))
    cp.testing.assert_array_equal(got, x + x)


def test_pytorch_keeps_working_on_its_own_stream_without_a_synchronize(b):
    s = torch.cuda.Stream()
    checks = []
    with torch.cuda.stream(s):
        for k in range(10):
            x = torch.randn(1 << 24, device="cuda")
            y = torch.full_like(x, float(k))
            doubled = torch.from_dlpack(b.run("add", x, y)) * 2  # consumed on s, no synchronize
            out = torch.empty_like(x)
            b.run("scale_add", x, alpha=3.0, beta=1.0, out=out)
            after = out + 1  # PyTorch reads our output on s
            checks.append((x, y, doubled, after))
            del x, y  # freed to PyTorch's allocator while our work may be queued: must not be reused early
    torch.cuda.synchronize()
    for x, y, doubled, after in checks:
        assert torch.equal(doubled, (x + y) * 2)
        assert torch.equal(after, x * 3.0 + 1.0 + 1)


def test_explicit_stream_arguments(b):
    s = torch.cuda.Stream()
    x = torch.randn(1 << 20, device="cuda")
    for stream in (s, s.cuda_stream, torch.cuda.current_stream()):
        with torch.cuda.stream(s):
            r = b.run("add", x, x, stream=stream)
            assert torch.equal(torch.from_dlpack(r), x + x)
    cp = pytest.importorskip("cupy")
    cs = cp.cuda.Stream(non_blocking=True)
    with cs:
        cx = cp.ones(1000, dtype=cp.float32)
        got = cp.asarray(b.run("add", cx, cx, stream=cs))
        cs.synchronize()
        assert float(got.sum()) == 2000.0


def test_host_tensors_to_a_cuda_op_are_staged(b):
    x = torch.randn(3, 1 << 20)
    got = b.run("add", x, x)
    assert isinstance(got, torch.Tensor) and got.device.type == "cpu" and torch.equal(got, x + x)
    with pytest.raises(cuplug.InvalidInputError, match="mix of host and device"):
        b.run("add", x, x.cuda())


@pytest.mark.parametrize("n", [1, 1000, (1 << 20) // 12, (1 << 20) // 12 + 1, 1 << 20])
def test_host_calls_either_side_of_the_direct_copy_bound(b, n):
    """Host operands of at most 1 MiB in all are copied as they are (pageable, the instance's stream), larger ones
    through the pinned stagers: elementwise, in place, a reduction and a backend-owned upload/download on both
    sides of the bound (n float32 elements: 3 operands of an add are 12n bytes)."""
    x = np.arange(n, dtype=np.float32) % 97
    y = np.ones(n, np.float32)
    np.testing.assert_array_equal(b.run("add", x, y), x + y)
    inplace = x.copy()
    assert b.run("add", inplace, y, out=inplace) is inplace
    np.testing.assert_array_equal(inplace, x + y)
    assert float(b.run("sum", x)) == pytest.approx(float(x.astype(np.float64).sum()), rel=1e-5)
    t = b.buffer(x)
    np.testing.assert_array_equal(np.asarray(t.to_host()), x)


def test_a_dtype_the_op_does_not_take(b):
    with pytest.raises(cuplug.InvalidInputError, match=r"(?i)dtype"):
        b.run(
            "add",
            torch.ones(4, device="cuda", dtype=torch.complex64),
            torch.ones(4, device="cuda", dtype=torch.complex64),
        )


def test_a_pointer_from_another_context_is_refused_before_launch(b):
    drv = pytest.importorskip("cuda.bindings.driver")
    err, dev = drv.cuDeviceGet(0)
    err, ctx = drv.cuCtxCreate(None, 0, dev) if hasattr(drv, "CUctxCreateParams") else drv.cuCtxCreate(0, dev)
    assert err == drv.CUresult.CUDA_SUCCESS, err
    try:
        err, ptr = drv.cuMemAlloc(4096)
        assert err == drv.CUresult.CUDA_SUCCESS
        drv.cuCtxPopCurrent()

        class Foreign:
            __cuda_array_interface__: ClassVar[dict] = {
                "shape": (1024,),
                "typestr": "<f4",
                "data": (int(ptr), False),
                "version": 3,
            }

        with pytest.raises(cuplug.InvalidInputError, match=r"(?i)context|device"):
            b.run("add", Foreign(), Foreign())
        assert torch.equal(
            torch.from_dlpack(b.run("add", torch.ones(3, device="cuda"), torch.ones(3, device="cuda"))),
            torch.full((3,), 2.0, device="cuda"),
        )  # the instance is unharmed
    finally:
        drv.cuCtxDestroy(ctx)


def test_an_exported_result_outlives_close(monkeypatch):
    monkeypatch.setenv("CUPLUG_BACKEND", "cuda13:fatbin")
    b = cuplug.load()
    x = b.buffer(np.arange(1 << 20, dtype=np.float32))
    held = torch.from_dlpack(b.run("add", x, x))
    x = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
    b.close()
    gc.collect()
    torch.cuda.synchronize()
    assert torch.equal(held, x + x)  # no use after free
    del held
    gc.collect()
    assert cuplug.runtime.dlpack.live_exports() == 0


def test_numpy_host_path_every_dtype(b):
    for dt in ("float16", "float32", "float64", "int8", "uint8", "int32", "int64"):
        x = (np.arange(100_003) % 100).astype(dt)
        np.testing.assert_array_equal(b.run("add", x, x), (x + x).astype(dt))
