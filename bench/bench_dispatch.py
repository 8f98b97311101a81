"""Framework-native dispatch (issue 30), as pytest-benchmark scenarios: per-call overhead of every call path
beside its anchor (torch.add, cupy.add, np.add) in the same run, and on a GPU: a 1 GiB allocating add
against torch.add, CUDA graph capture and replay, torch.compile.

    python -m pytest bench/bench_dispatch.py --benchmark-json=OUT.json -p no:cacheprovider
    python bench/dispatch_report.py OUT.json RESULTS_DIR     # ratios against the targets, JSON + PNG

pytest-benchmark calibrates the rounds and reports median and IQR per case; each case is one call (a
1-element operand: the cost is the way in, not the kernel). On CUDA, host wall time per call: launches are
asynchronous, a synchronize ends each round (``benchmark.pedantic``'s teardown would not be timed, so
the queue is drained by the next round's setup).
"""

from __future__ import annotations

import os

import pytest

import cuplug

np = pytest.importorskip("numpy")
torch = pytest.importorskip("torch") if os.environ.get("BENCH_NO_TORCH") != "1" else None
CUDA = torch is not None and torch.cuda.is_available()
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "2000"))


@pytest.fixture(scope="module")
def backend():
    with cuplug.load() as b:
        yield b


def _bench(benchmark, fn, group):
    benchmark.group = group
    benchmark.extra_info["rounds_per_call"] = ROUNDS
    if CUDA:
        fn()
        torch.cuda.synchronize()
        benchmark.pedantic(fn, rounds=ROUNDS, iterations=1, warmup_rounds=100, setup=torch.cuda.synchronize)
    else:
        fn()
        benchmark.pedantic(fn, rounds=ROUNDS, iterations=1, warmup_rounds=100)


# ---- the host (CPU machine, or the CPU twin anywhere) ------------------------------------------------------


@pytest.mark.parametrize("path", ["np.add(out=)", "run(out=) numpy", "run numpy", "run(out=) resident", "run resident"])
def test_per_call_host(benchmark, backend, path):
    if backend.device_type == 2:
        pytest.skip("the host paths are timed on the CPU twin")
    x, y, o = (np.ones(1, np.float32) for _ in range(3))
    t, u, r = backend.buffer(x), backend.buffer(y), backend.empty(1)
    fns = {
        "np.add(out=)": lambda: np.add(x, y, out=o),
        "run(out=) numpy": lambda: backend.run("add", x, y, out=o),
        "run numpy": lambda: backend.run("add", x, y),
        "run(out=) resident": lambda: backend.run("add", t, u, out=r),
        "run resident": lambda: backend.run("add", t, u),
    }
    _bench(benchmark, fns[path], "per-call host")


# ---- PyTorch CUDA tensors --------------------------------------------------------------------------------------

TORCH_PATHS = [
    "torch.add(out=)",
    "torch.add",
    "run(out=) torch",
    "run torch",
    "torch op (cuplug.torch)",
    "torch op .out",
    "run(out=) resident",
    "cupy.add",
    "run(out=) cupy",
    "torch.add(out=) cpu",
    "run(out=) torch cpu (CPU twin)",
]


@pytest.fixture(scope="module")
def cpu_twin():
    """The CPU twin beside the CUDA backend: its run(out=) on PyTorch CPU tensors is the dispatcher's reading of
    three tensors plus a trivial C call, with no CUDA call at all (where the time above the launch goes)."""
    with cuplug.load(env={**os.environ, "CUPLUG_BACKEND": "cpu"}) as b:
        yield b


@pytest.fixture(scope="module")
def ops(backend):
    import cuplug.torch

    return cuplug.torch.register(backend, "cuplug_bench")


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU and PyTorch with CUDA")
@pytest.mark.parametrize("path", TORCH_PATHS)
def test_per_call_cuda(benchmark, backend, ops, cpu_twin, path):
    x, y, o = (torch.ones(1, device="cuda") for _ in range(3))
    hx, hy, ho = (torch.ones(1) for _ in range(3))
    t, u, r = backend.empty(1), backend.empty(1), backend.empty(1)
    fns = {
        "torch.add(out=)": lambda: torch.add(x, y, out=o),
        "torch.add": lambda: torch.add(x, y),
        "run(out=) torch": lambda: backend.run("add", x, y, out=o),
        "run torch": lambda: backend.run("add", x, y),
        "torch op (cuplug.torch)": lambda: ops.add(x, y),
        "torch op .out": lambda: ops.add.out(x, y, out=o),
        "run(out=) resident": lambda: backend.run("add", t, u, out=r),
        "torch.add(out=) cpu": lambda: torch.add(hx, hy, out=ho),
        "run(out=) torch cpu (CPU twin)": lambda: cpu_twin.run("add", hx, hy, out=ho),
    }
    if path.startswith(("cupy", "run(out=) cupy")):
        cupy = pytest.importorskip("cupy")
        cx, cy, co = (cupy.ones(1, dtype=cupy.float32) for _ in range(3))
        fns["cupy.add"] = lambda: cupy.add(cx, cy, out=co)
        fns["run(out=) cupy"] = lambda: backend.run("add", cx, cy, out=co)
    _bench(benchmark, fns[path], "per-call cuda")


# ---- throughput and capture ----------------------------------------------------------------------------------


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("path", ["torch.add", "run torch", "torch op (cuplug.torch)"])
def test_alloc_1gib(benchmark, backend, ops, path):
    n = (1 << 30) // 4
    x, y = torch.ones(n, device="cuda"), torch.ones(n, device="cuda")
    fns = {
        "torch.add": lambda: torch.add(x, y),
        "run torch": lambda: backend.run("add", x, y),
        "torch op (cuplug.torch)": lambda: ops.add(x, y),
    }
    fn = fns[path]
    fn()
    torch.cuda.synchronize()

    def timed():
        fn()
        torch.cuda.synchronize()

    benchmark.group = "alloc 1 GiB add"
    benchmark.pedantic(timed, rounds=30, iterations=1, warmup_rounds=3)


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("path", ["torch.add", "run torch", "torch op (cuplug.torch)"])
def test_graph_replay(benchmark, backend, ops, path):
    """An allocating call captured in a CUDA graph, replayed: the result is right after replay, and a replay
    of 100 captured calls is timed (per call) beside torch.add's."""
    x, y = torch.arange(1024, device="cuda", dtype=torch.float32), torch.ones(1024, device="cuda")
    fns = {
        "torch.add": lambda: torch.add(x, y),
        "run torch": lambda: backend.run("add", x, y),
        "torch op (cuplug.torch)": lambda: ops.add(x, y),
    }
    fn = fns[path]
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()  # warm-up on the capture stream (scratch, allocator)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        results = [fn() for _ in range(100)]
    x.add_(1)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(results[-1], x + y)
    benchmark.group = "graph replay (100 calls)"
    benchmark.extra_info["calls_per_replay"] = 100

    def replay():
        g.replay()
        torch.cuda.synchronize()

    benchmark.pedantic(replay, rounds=50, iterations=1, warmup_rounds=3)
