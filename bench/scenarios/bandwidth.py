"""Bandwidth per dtype: `add` and `sum` on 1 GiB CUDA tensors through run(), against PyTorch, every dtype.

For each of the eight dtypes: x, y, out of 1 GiB each on the device; `run("add", x, y, out=out,
stream=<PyTorch's current>)` alternating with `torch.add(x, y, out=out)`, and `run("sum", x, out=s, stream=...)`
with `torch.sum(x, dim=0, dtype=s.dtype, out=s2)`; CUDA-event time per call with the queue kept full
(suite.cuda_timing, `queued`), median of the repeats. GB/s count bytes read + written (add: 3 GiB; sum: 1 GiB).
Each add is checked bit for bit against PyTorch's. Target: add >= 0.97x torch.add in every dtype (ABI v2's);
the sums are reported here, their targets are the `sum` scenario's (with its three timing modes).
"""

from __future__ import annotations

from typing import Any

from suite.cuda_timing import alternating, timers
from suite.scenario import Measured, Scenario, Skip, Target
from suite.stats import summary

GiB = 1 << 30
DTYPES = ("float32", "float16", "bfloat16", "float64", "int8", "uint8", "int32", "int64")
REPEATS = {False: 10, True: 3}


def _operands(torch: Any, name: str) -> tuple[Any, Any, int]:
    dt = getattr(torch, name)
    n = GiB // torch.tensor([], dtype=dt).element_size()
    if dt.is_floating_point:
        return torch.randn(n, device="cuda").to(dt), torch.randn(n, device="cuda").to(dt), n
    # small values: no overflow, so the add is comparable bit for bit in every integer dtype
    return torch.randint(0, 50, (n,), device="cuda", dtype=dt), torch.randint(0, 50, (n,), device="cuda", dtype=dt), n


def _gbs(ms: list[float], nbytes: int) -> dict[str, Any]:
    return summary([nbytes / m / 1e6 for m in ms], "GB/s")


def _pair(torch: Any, b: Any, cur: Any, name: str, repeats: int) -> tuple[dict[str, list[float]], bool, int]:
    """ms per call of cuplug's add and sum and PyTorch's, alternating; whether the adds agree bit for bit; bytes."""
    x, y, n = _operands(torch, name)
    out, out2 = torch.empty_like(x), torch.empty_like(x)
    sum_dtype = x.dtype if x.dtype.is_floating_point else torch.int64  # the op table's: int64 for the integers
    s, s2 = torch.empty((), device="cuda", dtype=sum_dtype), torch.empty((), device="cuda", dtype=sum_dtype)
    fns = {
        "run add": lambda: b.run("add", x, y, out=out, stream=cur),
        "torch.add(out=)": lambda: torch.add(x, y, out=out2),
        "run sum": lambda: b.run("sum", x, out=s, stream=cur),
        "torch.sum(out=)": lambda: torch.sum(x, dim=0, dtype=s2.dtype, out=s2),
    }
    ms = alternating(fns, timers(torch)["queued"], repeats)
    return ms, bool(torch.equal(out, out2)), x.element_size() * n


def measure(quick: bool) -> Measured:
    import torch

    import cuplug

    if not torch.cuda.is_available():
        raise Skip(f"PyTorch {torch.__version__} here sees no CUDA device")
    anchors: dict[str, Any] = {}
    results: dict[str, Any] = {}
    exact: dict[str, bool] = {}
    failures: dict[str, str] = {}
    with cuplug.load() as b:
        if b.device_type != 2:
            raise Skip(f"cuplug.load() chose the CPU: {b.trace.decision_reason}")
        cur = torch.cuda.current_stream()
        for name in DTYPES:
            try:
                ms, exact[name], size = _pair(torch, b, cur, name, REPEATS[quick])
            except Exception as exc:  # one dtype's failure is recorded; its targets say "not measured"
                failures[name] = f"{type(exc).__name__}: {exc}"
                continue
            finally:
                torch.cuda.empty_cache()
            results[f"add {name}"] = _gbs(ms["run add"], 3 * size)
            anchors[f"torch.add {name}"] = _gbs(ms["torch.add(out=)"], 3 * size)
            results[f"sum {name}"] = _gbs(ms["run sum"], size)
            anchors[f"torch.sum {name}"] = _gbs(ms["torch.sum(out=)"], size)
        variant = f"{b.cuda}:{b.variant}"
    details = {
        "timing": "CUDA events, queue kept full (suite.cuda_timing queued: 3 primed, 20 timed calls per sample)",
        "variant": variant,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0),
        "add_bit_exact_vs_torch": exact,
        "failures": failures,
    }
    return Measured(anchors, results, details)


SCENARIO = Scenario(
    name="bandwidth",
    what="add and sum on 1 GiB CUDA tensors through run(), every dtype, against torch.add / torch.sum (GB/s)",
    group="throughput (x the anchor)",
    runs_on="gpu",
    needs=("gpu", "torch"),
    anchors={"torch.add <dtype>, torch.sum <dtype>": "PyTorch on the same tensors, alternating, same timer"},
    targets=(
        *(Target(f"add {d}", f"add {d}", f"torch.add {d}", "ratio", "x", (">=", 0.97), "ABI v2") for d in DTYPES),
        *(
            Target(f"sum {d}", f"sum {d}", f"torch.sum {d}", "ratio", "x", None, "reported (targets: scenario sum)")
            for d in DTYPES
        ),
    ),
    measure=measure,
    timeout_s=300,
)
