"""Plots the ABI v2 results against their targets: python bench/plot_typed.py TYPED.json QUANT.json OUT.png

TYPED.json from bench/typed_bench.py (H200), QUANT.json from examples/quant's GPU benchmark.
"""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def main(typed_path: str, quant_path: str, out: str) -> None:
    t = json.load(open(typed_path))
    q = json.load(open(quant_path))
    fig, (ratios, calls, quant) = plt.subplots(1, 3, figsize=(16, 5))
    labels, values, targets = [], [], []
    for name in ("float32", "float16", "bfloat16"):
        for major in ("cuda13", "cuda12"):
            labels.append(f"add {name}\n{major}")
            values.append(t[f"ratio_add_{name}"][major])
            targets.append(0.97)
    for major in ("cuda13", "cuda12"):
        labels.append(f"sum float32\n{major}")
        values.append(t["ratio_sum_float32"][major])
        targets.append(1.0)
    colors = ["#5aa469" if v >= tg else "#e07b39" for v, tg in zip(values, targets, strict=True)]
    ratios.bar(range(len(values)), values, color=colors)
    for i, (v, tg) in enumerate(zip(values, targets, strict=True)):
        ratios.hlines(tg, i - 0.4, i + 0.4, colors="black", linestyles="dashed")
        ratios.text(i, v + 0.005, f"{v:.3f}", ha="center", fontsize=8)
    ratios.set_xticks(range(len(values)), labels, fontsize=7)
    ratios.set_ylim(0.8, 1.05)
    ratios.set_title(
        "run() on 1 GiB PyTorch CUDA tensors / PyTorch\n(dashed: target; batches of 20 queued calls)", fontsize=9
    )
    per = {
        "torch.add": t["per_call_torch_add"]["median_us"],
        "cuplug out=,\nstream=": t["per_call_cuplug_add_out_stream"]["median_us"],
        "cuplug\nallocating": t["per_call_cuplug_add"]["median_us"],
    }
    calls.bar(list(per), list(per.values()), color=["#888888", "#3a7dc9", "#8db7e6"])
    for i, v in enumerate(per.values()):
        calls.text(i, v, f"{v:.0f} us", ha="center", va="bottom", fontsize=8)
    calls.set_title("host time of one one-element add (median of 10,000; no target)", fontsize=9)
    rows = [r for r in q["rows"] if r["n"] == max(x["n"] for x in q["rows"])]
    names = [f"{r['op']}\n{r['dtype']}" for r in rows]
    speed = [r["torch_composed"]["median_ms"] / r["fused_out"]["median_ms"] for r in rows]
    quant.bar(range(len(speed)), speed, color="#3a7dc9")
    for i, v in enumerate(speed):
        quant.text(i, v, f"{v:.1f}x", ha="center", va="bottom", fontsize=8)
    quant.set_xticks(range(len(speed)), names, fontsize=7)
    quant.set_title(f"fused blockwise int8 quantize vs composed PyTorch ops (n={rows[0]['n']:,})", fontsize=9)
    fig.suptitle(f"cuplug ABI v2 on {t['device']} (bench/results/h200-2026-12-03-abi2/)", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main(*sys.argv[1:4])
