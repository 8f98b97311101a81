"""The out= half of the allocating-vs-out= scenario (bench/scenarios/alloc_vs_out.py), as pytest-benchmark cases:
the same 1 GiB float32 add as bench_dispatch.py's `test_alloc_1gib`, written into a caller's tensor.

    python -m pytest bench/bench_dispatch.py bench/bench_alloc_out.py -k "alloc_1gib or out_1gib" \\
        --benchmark-json=OUT.json -p no:cacheprovider

Each round is one call and a synchronize (host wall time), 30 rounds after 3 warm-up ones, as there.
"""

from __future__ import annotations

import pytest

import cuplug

torch = pytest.importorskip("torch")
CUDA = torch.cuda.is_available()


@pytest.fixture(scope="module")
def backend():
    with cuplug.load() as b:
        yield b


@pytest.fixture(scope="module")
def ops(backend):
    import cuplug.torch

    return cuplug.torch.register(backend, "cuplug_bench_out")


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("path", ["torch.add(out=)", "run(out=) torch", "torch op .out"])
def test_out_1gib(benchmark, backend, ops, path):
    n = (1 << 30) // 4
    x, y, o = torch.ones(n, device="cuda"), torch.ones(n, device="cuda"), torch.empty(n, device="cuda")
    fns = {
        "torch.add(out=)": lambda: torch.add(x, y, out=o),
        "run(out=) torch": lambda: backend.run("add", x, y, out=o),
        "torch op .out": lambda: ops.add.out(x, y, out=o),
    }
    fn = fns[path]
    fn()
    torch.cuda.synchronize()
    assert torch.equal(o[:4], torch.full((4,), 2.0, device="cuda"))

    def timed():
        fn()
        torch.cuda.synchronize()

    benchmark.group = "out= 1 GiB add"
    benchmark.pedantic(timed, rounds=30, iterations=1, warmup_rounds=3)
