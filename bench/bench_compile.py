"""torch.compile of a function of cuplug ops (issue 30), as pytest-benchmark cases (group "compile"):

    f(a, c) = sum(scale_add(add(a, c), alpha=2, beta=1))     through cuplug.torch.register(backend, ns)

eager and under torch.compile(fullgraph=True), beside the same computation in plain PyTorch ops, eager and
compiled. On CUDA tensors where a GPU is (the backend cuplug.load() picks), else on the CPU twin with PyTorch
CPU tensors. Each round is one call (and a synchronize on CUDA); the first call of a compiled function (the
compilation) is timed once and kept in extra_info["first_call_s"].

    BENCH_COMPILE_N (elements, default 2^20)  BENCH_COMPILE_BACKEND (default inductor)  BENCH_ROUNDS (default 1000)
"""

from __future__ import annotations

import os
import time

import pytest

import cuplug

torch = pytest.importorskip("torch")
N = int(os.environ.get("BENCH_COMPILE_N", str(1 << 20)))
COMPILER = os.environ.get("BENCH_COMPILE_BACKEND", "inductor")
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "1000"))


@pytest.fixture(scope="module")
def backend():
    with cuplug.load() as b:
        yield b


@pytest.fixture(scope="module")
def ops(backend):
    import cuplug.torch

    return cuplug.torch.register(backend, "cuplug_bench_compile")


def functions(ops):
    return {
        "cuplug": lambda a, c: ops.sum(ops.scale_add(ops.add(a, c), alpha=2.0, beta=1.0)),
        "torch": lambda a, c: torch.sum(torch.add(a, c) * 2.0 + 1.0),
    }


@pytest.mark.parametrize("path", ["torch eager", "torch compiled", "cuplug eager", "cuplug compiled"])
def test_compile(benchmark, backend, ops, path):
    device = "cuda" if backend.device_type == 2 else "cpu"
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    a, c = torch.ones(N, device=device), torch.full((N,), 2.0, device=device)
    which, mode = path.split()
    fn = functions(ops)[which]
    if mode == "compiled":
        fn = torch.compile(fn, fullgraph=True, backend=COMPILER)
        t = time.perf_counter()
        fn(a, c)
        sync()
        benchmark.extra_info["first_call_s"] = round(time.perf_counter() - t, 3)
    got = fn(a, c)
    sync()
    assert got.item() == 7.0 * N, (path, got.item())  # (1 + 2) * 2 + 1 per element, exact in float32
    benchmark.group = "compile"
    benchmark.extra_info.update(n=N, device=device, compiler=COMPILER if mode == "compiled" else None)

    def call():
        fn(a, c)
        sync()

    benchmark.pedantic(call, rounds=ROUNDS, iterations=1, warmup_rounds=min(100, ROUNDS // 10))
