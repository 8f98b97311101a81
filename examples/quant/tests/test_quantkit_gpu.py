"""quantkit on PyTorch CUDA tensors (`gpu` tests; skipped without torch.cuda).

* PyTorch CUDA float16/bfloat16/float32 tensors are read in place; the results are
  backend-owned device tensors that ``torch.from_dlpack`` wraps without a copy.
* Every result is bit-identical to ``torch_quantize`` / ``torch_dequantize``: the
  README's formulas composed from PyTorch ops, op by op in float32.
* ``benchmark()`` times the fused kernels against those compositions (CUDA events on
  PyTorch's stream, median of N runs with min/p10/p90/max) and writes JSON to
  $QUANTKIT_BENCH_JSON; ``test_benchmark`` runs it when that variable is set, and
  ``python tests/test_quantkit_gpu.py OUT.json`` runs it alone.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

import pytest

torch = pytest.importorskip("torch")
import quantkit  # noqa: E402

import cuplug  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs PyTorch with a CUDA device"),
]
DTYPES = [torch.float16, torch.bfloat16, torch.float32]
CANONICAL_NAN = 0x7FC00000


# ---- the reference: the same formulas, composed from PyTorch ops
def torch_quantize(x: torch.Tensor, blocksize: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    xf = x.reshape(-1).float()
    n = xf.numel()
    nb = -(-n // blocksize)
    blocks = torch.nn.functional.pad(xf, (0, nb * blocksize - n)).view(nb, blocksize)
    m = (blocks.view(torch.int32) & 0x7FFFFFFF).amax(dim=1)  # |x| as ordered bits: exact, NaN on top
    absmax = m.masked_fill(m > 0x7F800000, CANONICAL_NAN).view(torch.float32)
    # tensor / tensor: an IEEE division (127.0 / t would be computed as t.reciprocal() * 127)
    scale = torch.full_like(absmax, 127.0) / absmax
    p = blocks * scale[:, None]
    q = torch.round(p.clamp(-127.0, 127.0)).masked_fill(torch.isnan(p), 0.0).to(torch.int8)
    return q.view(-1)[:n].view(x.shape), absmax


def torch_dequantize(q: torch.Tensor, absmax: torch.Tensor, blocksize: int = 256) -> torch.Tensor:
    dscale = absmax / torch.full_like(absmax, 127.0)  # tensor / tensor, not a multiplication by 1/127
    y = q.reshape(-1).float() * dscale.repeat_interleave(blocksize)[: q.numel()]
    return y.masked_fill(torch.isnan(y), float("nan")).view(q.shape)  # float("nan") is 0x7FC00000


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32) if t.dtype == torch.float32 else t


def _values(shape: tuple[int, ...], dtype: torch.dtype, seed: int, special: bool = False) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(shape, device="cuda", generator=g) * torch.exp(
        torch.rand(shape, device="cuda", generator=g) * 8 - 4
    )
    if special:
        pick = torch.randint(0, 64, shape, device="cuda", generator=g)
        for k, v in enumerate([0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e-40, -3e-39]):
            x[pick == k] = v
    return x.to(dtype)


@pytest.fixture(scope="module", autouse=True)
def cuda_backend():
    b = quantkit.load()
    if b.variant == "cpu":
        pytest.fail(f"quantkit fell back to the CPU on a CUDA machine:\n{b.trace.text()}")
    b.close()


def _check(x: torch.Tensor, blocksize: int) -> tuple[object, object]:
    q, absmax = quantkit.quantize(x, blocksize=blocksize)
    assert isinstance(q, cuplug.Tensor) and isinstance(absmax, cuplug.Tensor)
    qt, at = torch.from_dlpack(q), torch.from_dlpack(absmax)
    assert qt.data_ptr() == q.data_ptr and at.data_ptr() == absmax.data_ptr  # shared, not copied
    assert qt.is_cuda and qt.dtype == torch.int8 and tuple(qt.shape) == tuple(x.shape)
    want_q, want_a = torch_quantize(x, blocksize)
    assert torch.equal(_bits(at), _bits(want_a))
    assert torch.equal(qt, want_q)
    y = torch.from_dlpack(quantkit.dequantize(q, absmax, blocksize=blocksize))
    assert torch.equal(_bits(y), _bits(torch_dequantize(want_q, want_a, blocksize)))
    return q, absmax


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1,), (65,), (3, 257), (4099, 1000), ((1 << 22) + 3,)], ids=str)
def test_cuda_tensors_match_the_torch_reference_bit_for_bit(dtype, shape):
    for i, blocksize in enumerate((64, 256, 4096)):
        _check(_values(shape, dtype, seed=i), blocksize)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_special_values_and_unaligned_views(dtype):
    x = _values((1 << 20,), dtype, seed=5, special=True)
    for blocksize in (64, 4096):
        _check(x, blocksize)
        _check(x[1:], blocksize)  # data pointer off the 16-byte grid: the scalar path
        _check(x[3:-5], blocksize)


def test_out_writes_into_torch_tensors_and_streams_are_honoured():
    x = _values((10_000,), torch.bfloat16, seed=9)
    q = torch.empty(10_000, dtype=torch.int8, device="cuda")
    absmax = torch.empty(40, dtype=torch.float32, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        got = quantkit.quantize(x, blocksize=256, out=(q, absmax), stream=s)
    s.synchronize()
    assert got[0] is q and got[1] is absmax
    want_q, want_a = torch_quantize(x, 256)
    assert torch.equal(q, want_q) and torch.equal(_bits(absmax), _bits(want_a))


def test_from_dlpack_shares_the_backends_memory():
    q, _ = quantkit.quantize(torch.ones(512, device="cuda"), blocksize=256)
    qt = torch.from_dlpack(q)
    qt[0] = 5
    torch.cuda.synchronize()
    assert list(q.to_host())[:2] == [5, 127]


def test_a_bad_blocksize_is_refused_on_the_gpu_too():
    with pytest.raises(cuplug.InvalidInputError, match=r"power of two in \[64, 4096\], got 100"):
        quantkit.quantize(torch.ones(512, device="cuda"), blocksize=100)


# ---- the benchmark
def _time(fn, runs: int) -> dict[str, float]:
    """Milliseconds per call, CUDA events on PyTorch's current stream (our work is ordered on it)."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(runs):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        fn()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1))
    times.sort()
    return {
        "median_ms": statistics.median(times),
        "min_ms": times[0],
        "p10_ms": times[len(times) // 10],
        "p90_ms": times[(9 * len(times)) // 10],
        "max_ms": times[-1],
        "runs": runs,
    }


def _call_overhead_us(calls: int = 300) -> dict[str, float]:
    """Host microseconds per quantize call on 4096 elements (out=), and for torch_quantize."""
    x = torch.ones(4096, device="cuda")
    q, a = torch.empty(4096, dtype=torch.int8, device="cuda"), torch.empty(16, device="cuda")
    result = {}
    for name, fn in (
        ("quantkit_out", lambda: quantkit.quantize(x, out=(q, a))),
        ("quantkit_alloc", lambda: quantkit.quantize(x)),
        ("torch_composed", lambda: torch_quantize(x)),
    ):
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        result[name] = (time.perf_counter() - t0) / calls * 1e6
    return result


def benchmark(runs: int = 50, sizes: tuple[int, ...] = (1 << 16, 1 << 20, 1 << 24, 1 << 28)) -> dict[str, object]:
    """Fused quantkit kernels against the same computation composed from PyTorch ops."""
    with quantkit.load() as b:
        backend = {"variant": b.variant, "label": b.trace.candidates[0].label if b.trace.candidates else None}
    rows = []
    for blocksize in (256, 4096):
        for dtype in DTYPES:
            for n in sizes:
                x = _values((n,), dtype, seed=1)
                q, absmax = torch_quantize(x, blocksize)
                nb = absmax.numel()
                q_bytes = n * (x.element_size() + 1) + nb * 4
                dq_bytes = n * 5 + nb * 4
                q_out = torch.empty_like(q)
                a_out = torch.empty_like(absmax)
                y_out = torch.empty(q.shape, dtype=torch.float32, device="cuda")
                cases = {
                    "quantize": (
                        lambda x=x, bs=blocksize: quantkit.quantize(x, blocksize=bs),
                        lambda x=x, bs=blocksize, o=(q_out, a_out): quantkit.quantize(x, blocksize=bs, out=o),
                        lambda x=x, bs=blocksize: torch_quantize(x, bs),
                        q_bytes,
                    ),
                    "dequantize": (
                        lambda q=q, a=absmax, bs=blocksize: quantkit.dequantize(q, a, blocksize=bs),
                        lambda q=q, a=absmax, bs=blocksize, o=y_out: quantkit.dequantize(q, a, blocksize=bs, out=o),
                        lambda q=q, a=absmax, bs=blocksize: torch_dequantize(q, a, bs),
                        dq_bytes,
                    ),
                }
                for op, (fused, fused_out, composed, moved) in cases.items():
                    if op == "dequantize" and dtype != torch.float32:
                        continue  # its input is int8 + float32 whatever x was
                    f, fo, c = _time(fused, runs), _time(fused_out, runs), _time(composed, runs)
                    rows.append(
                        {
                            "op": op,
                            "dtype": str(dtype).removeprefix("torch."),
                            "n": n,
                            "blocksize": blocksize,
                            "bytes_moved": moved,
                            "fused": f,
                            "fused_out": fo,
                            "torch_composed": c,
                            "fused_gbps": moved / f["median_ms"] / 1e6,
                            "fused_out_gbps": moved / fo["median_ms"] / 1e6,
                            "speedup_median": c["median_ms"] / f["median_ms"],
                            "speedup_out_median": c["median_ms"] / fo["median_ms"],
                        }
                    )
                del q_out, a_out, y_out
                del x, q, absmax
                torch.cuda.empty_cache()
    return {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cuplug": getattr(cuplug, "__version__", None),
        "quantkit": quantkit.__version__,
        "backend": backend,
        "timing": "CUDA events on PyTorch's current stream around one call (host work included); fused = quantkit "
        "allocating its backend-owned results, fused_out = quantkit writing into preallocated torch tensors "
        "(out=), torch_composed = torch_quantize/torch_dequantize of this file (the same formulas, PyTorch's "
        "caching allocator)",
        "call_overhead_us": _call_overhead_us(),
        "rows": rows,
    }


def test_benchmark(tmp_path):
    path = os.environ.get("QUANTKIT_BENCH_JSON")
    if not path:
        pytest.skip("set QUANTKIT_BENCH_JSON=<file> to run the benchmark")
    runs = int(os.environ.get("QUANTKIT_BENCH_RUNS", "50"))
    result = benchmark(runs)
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    assert all(r["fused"]["median_ms"] > 0 for r in result["rows"])


if __name__ == "__main__":
    out = benchmark(int(os.environ.get("QUANTKIT_BENCH_RUNS", "50")))
    with open(sys.argv[1], "w") as fh:
        json.dump(out, fh, indent=1)
    for r in out["rows"]:
        print(
            f"{r['op']:10s} {r['dtype']:8s} n={r['n']:>10d} bs={r['blocksize']:4d}: fused {r['fused']['median_ms']:.3f} ms, "
            f"out= {r['fused_out']['median_ms']:.3f} ms ({r['fused_out_gbps']:.0f} GB/s), "
            f"torch {r['torch_composed']['median_ms']:.3f} ms, x{r['speedup_out_median']:.1f}"
        )
