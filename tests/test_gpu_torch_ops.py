"""On a real GPU (issues 30, 31): cuplug ops as PyTorch ops on CUDA tensors, CUDA graph capture of
allocating calls, torch.compile with inductor, and a lying __cuda_array_interface__ over real memory.
Skips without a GPU (the CPU half is tests/test_torch_ops.py)."""

from __future__ import annotations

import sys
from typing import ClassVar

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device for PyTorch", allow_module_level=True)

import cuplug  # noqa: E402
import cuplug.torch  # noqa: E402
from conftest import HERE  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def b():
    with cuplug.load() as backend:
        assert backend.device_type == 2, backend.trace
        yield backend


@pytest.fixture(scope="module")
def ops(b):
    return cuplug.torch.register(b, "cuplug_gpu_test")


def test_results_come_from_pytorchs_allocator_on_its_current_stream(b):
    x = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        before = torch.cuda.memory_allocated()
        r = b.run("add", x, x)
        assert isinstance(r, torch.Tensor) and torch.cuda.memory_allocated() - before == 4 << 20
        doubled = r * 2  # on s, no synchronize: the call ran on s
    s.synchronize()
    assert torch.equal(doubled, x * 4)


def test_every_op_checks_and_compiles_on_cuda(b):
    """opcheck of every op (functional and .out) on CUDA samples, run()'s results, fullgraph compile."""
    sys.path.insert(0, str(HERE))
    import torch_opcheck

    orig = torch_opcheck.samples
    torch_opcheck.samples = lambda sig: ([t.cuda() for t in orig(sig)[0]], orig(sig)[1])
    try:
        report = torch_opcheck.check(b, "cuplug_gpu_opcheck")
    finally:
        torch_opcheck.samples = orig
    for name, r in report.items():
        assert r == torch_opcheck.PASSED, name


def test_inductor_compiles_a_function_of_cuplug_ops(ops):
    def f(x, y):
        return ops.sum(ops.scale_add(ops.add(x, y), alpha=2.0, beta=1.0) * 3)

    x, y = torch.randn(1 << 20, device="cuda"), torch.randn(1 << 20, device="cuda")
    got = torch.compile(f, fullgraph=True)(x, y)
    assert torch.allclose(got, f(x, y), rtol=1e-5)


@pytest.mark.parametrize("how", ["run", "torch op", "torch op .out"])
def test_an_allocating_call_is_captured_in_a_cuda_graph_and_replays(b, ops, how):
    x = torch.arange(4096, device="cuda", dtype=torch.float32)
    y = torch.ones(4096, device="cuda")
    out = torch.empty(4096, device="cuda")
    calls = {
        "run": lambda: b.run("add", x, y),
        "torch op": lambda: ops.add(x, y),
        "torch op .out": lambda: (ops.add.out(x, y, out=out), out)[1],
    }
    call = calls[how]
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            call()
            b.run("sum", x)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        r = call()
        total = b.run("sum", r)
    for k in range(3):
        x.copy_(torch.arange(4096, device="cuda", dtype=torch.float32) * k)
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(r, x + y) and float(total) == float((x + y).sum())


def test_a_lying_cai_over_real_memory_is_refused_by_the_backend(b):
    """A CAI dict naming a real allocation but more elements than it holds: the CUDA backend's range check
    (cuPointerGetAttributes) refuses it before any launch; the instance keeps working."""
    t = torch.ones(1024, device="cuda")

    class Liar:
        __cuda_array_interface__: ClassVar[dict] = {
            "shape": (1 << 22,),
            "typestr": "<f4",
            "data": (t.data_ptr(), False),
            "version": 3,
            "strides": None,
        }

    with pytest.raises(cuplug.InvalidInputError, match=r"runs past the end of its memory"):
        b.run("sum", Liar())
    assert float(b.run("sum", t)) == 1024.0


# ---- the C dispatcher (runtime/fastpath.py) on CUDA tensors: used, on the current stream, every check kept


def _fast(b) -> int:
    stats = getattr(b.run, "stats", None)
    if stats is None:
        pytest.skip("the wheel's C dispatcher is not in use here")
    return stats()["fast_calls"]


def test_a_learned_call_on_cuda_tensors_takes_the_fast_path_on_the_current_stream(b):
    x = torch.arange(1 << 16, device="cuda", dtype=torch.float16)
    o = torch.empty_like(x)
    b.run("add", x, x, out=o)
    n = _fast(b)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        torch.cuda._sleep(10_000_000)  # the launch must queue behind this on s, not run at once elsewhere
        assert b.run("add", x, x, out=o) is o
        r = b.run("add", x, x)
        assert isinstance(r, torch.Tensor) and r.device == x.device and r.dtype == torch.float16
        doubled = (r + o) * 1
    s.synchronize()
    assert _fast(b) == n + 1  # the out= call; the allocating one was learned by this first use
    assert torch.equal(doubled, (x + x) * 2)


def test_per_call_checks_of_cuda_tensors_after_the_call_was_learned(b):
    x, y, o = (torch.ones(256, device="cuda") for _ in range(3))
    b.run("add", x, y, out=o)
    b.run("add", x, y, out=o)
    o.requires_grad_(True)
    with pytest.raises(cuplug.InvalidInputError, match="requires grad"):
        b.run("add", x, y, out=o)
    o.requires_grad_(False)
    with pytest.raises(cuplug.InvalidInputError, match="not C-contiguous"):
        b.run("add", torch.ones(256, 2, device="cuda")[:, 0], y, out=o)
    with pytest.raises(cuplug.InvalidInputError, match="negated"):
        b.run("add", torch._neg_view(x), y, out=o)
    with pytest.raises(cuplug.InvalidInputError, match="overlaps"):
        base = torch.ones(512, device="cuda")
        b.run("add", base[:256], y, out=base[128:384])
    with pytest.raises(cuplug.InvalidInputError, match="cpu"):
        b.run("add", x.cpu(), y, out=o)


def test_a_fast_allocating_call_is_captured_in_a_cuda_graph_and_replays(b):
    x = torch.arange(4096, device="cuda", dtype=torch.float32)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            b.run("add", x, x)
    torch.cuda.current_stream().wait_stream(s)
    n = _fast(b)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        r = b.run("add", x, x)
    assert _fast(b) == n + 1
    x.add_(1)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(r, x + x)
