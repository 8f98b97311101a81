"""`sum` against `torch.sum` (issue 22): 1 GiB on the device through Backend.run, float32, float16, bfloat16.

The same tensor for both, `b.run("sum", x, out=s, stream=<PyTorch's current>)` against `torch.sum(x, dim=0,
out=s2)`, alternating, in three modes (suite.cuda_timing: queued, the target's; batch20; single), and the
allocating `run("sum", x)` against `torch.sum(x)`. Determinism: the bit patterns of repeated sums (one is the
claim). docs/performance.md, "`sum` against `torch.sum`", explains each figure.
"""

from __future__ import annotations

from typing import Any

from suite.cuda_timing import alternating, timers
from suite.scenario import Measured, Scenario, Skip, Target
from suite.stats import summary

GiB = 1 << 30
DTYPES = ("float32", "float16", "bfloat16")
REPEATS = {False: 10, True: 3}
DETERMINISM_RUNS = {False: 20, True: 5}
ANCHOR_OF = {"run(out=, stream=)": "torch.sum(out=)", "run allocating": "torch.sum allocating"}


def _bits(torch: Any, fn: Any, s: Any, runs: int) -> int:
    """How many distinct bit patterns ``runs`` calls leave in ``s``."""
    seen = set()
    for _ in range(runs):
        fn()
        seen.add(s.reshape(1).view(torch.int16 if s.dtype != torch.float32 else torch.int32)[0].item())
    return len(seen)


def _one_dtype(torch: Any, b: Any, name: str, quick: bool) -> tuple[dict[str, dict[str, list[float]]], dict]:
    dt = getattr(torch, name)
    n = GiB // torch.tensor([], dtype=dt).element_size()
    x = torch.randn(n, device="cuda").to(dt)
    s, s2 = torch.empty((), device="cuda", dtype=dt), torch.empty((), device="cuda", dtype=dt)
    cur = torch.cuda.current_stream()
    fns = {
        "run(out=, stream=)": lambda: b.run("sum", x, out=s, stream=cur),
        "torch.sum(out=)": lambda: torch.sum(x, dim=0, out=s2),
        "run allocating": lambda: b.run("sum", x),
        "torch.sum allocating": lambda: torch.sum(x),
    }
    per_mode = {mode: alternating(fns, timer, REPEATS[quick]) for mode, timer in timers(torch).items()}
    runs = DETERMINISM_RUNS[quick]
    ref = float(x.double().sum())
    scale = float(x.double().abs().sum())
    facts = {
        "n": n,
        "distinct_bit_patterns": _bits(torch, fns["run(out=, stream=)"], s, runs),
        "torch_distinct_bit_patterns": _bits(torch, fns["torch.sum(out=)"], s2, runs),
        "determinism_runs": runs,
        "rel_error_vs_sum_abs": abs(float(s.float()) - ref) / scale,
        "torch_rel_error_vs_sum_abs": abs(float(s2.float()) - ref) / scale,
    }
    return per_mode, facts


def measure(quick: bool) -> Measured:
    import torch

    import cuplug

    if not torch.cuda.is_available():
        raise Skip(f"PyTorch {torch.__version__} here sees no CUDA device")
    anchors: dict[str, Any] = {}
    results: dict[str, Any] = {}
    facts: dict[str, Any] = {}
    with cuplug.load() as b:
        if b.device_type != 2:
            raise Skip(f"cuplug.load() chose the CPU: {b.trace.decision_reason}")
        for name in DTYPES:
            per_mode, facts[name] = _one_dtype(torch, b, name, quick)
            torch.cuda.empty_cache()
            for mode, samples in per_mode.items():
                for fn, ms in samples.items():
                    where = results if fn in ANCHOR_OF else anchors
                    where[f"{name} {fn} {mode}"] = summary(ms, "ms")
        variant = f"{b.cuda}:{b.variant}"
    details = {"variant": variant, "torch": torch.__version__, "device": torch.cuda.get_device_name(0), **facts}
    return Measured(anchors, results, details)


def _targets() -> tuple[Target, ...]:
    """Per dtype: the target (queued, out=); the other two modes of the same call and the allocating call, reported."""
    rows = []
    for d in DTYPES:
        for fn, mode, bound in (
            ("run(out=, stream=)", "queued", (">=", 1.0)),
            ("run(out=, stream=)", "batch20", None),
            ("run(out=, stream=)", "single", None),
            ("run allocating", "queued", None),
        ):
            key = f"{d} {fn} {mode}"
            source = "issue 22" if bound else "reported, no target"
            rows.append(Target(key, key, f"{d} {ANCHOR_OF[fn]} {mode}", "speedup", "x", bound, source))
    return tuple(rows)


SCENARIO = Scenario(
    name="sum",
    what="sum of 1 GiB on the device through run() against torch.sum, 3 float dtypes, 3 timing modes",
    group="throughput (x the anchor)",
    runs_on="gpu",
    needs=("gpu", "torch"),
    anchors={
        "torch.sum(out=)": "`torch.sum(x, dim=0, out=s2)` on the same tensor, alternating, same timer",
        "torch.sum allocating": "`torch.sum(x)`",
    },
    targets=_targets(),
    measure=measure,
    timeout_s=300,
)
