#!/usr/bin/env python3
"""Issue 22's three ratios against their targets, one bar group per run.

    python3 bench/plot22.py OUT.png run1.json [run2.json ...]   # the bundles of `perf22.py all`

Panels: cold start of a fresh process to a verified add over the context floor (lower is better,
target <= 1.10 for array.array operands; NumPy and the frameworks beside it), `sum` through
Backend.run over torch.sum (target >= 1.0), the host path over a pinned H2D + D2H copy in each of
three processes (target >= 0.8).
"""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def main() -> None:
    out, paths = sys.argv[1], sys.argv[2:]
    runs = [json.load(open(p)) for p in paths]
    fig, axes = plt.subplots(1, 3, figsize=(16, 5.2))
    width = 0.8 / max(len(runs), 1)

    def bars(ax, labels, values_per_run, target, better):
        for i, values in enumerate(values_per_run):
            xs = [k + (i - (len(runs) - 1) / 2) * width for k in range(len(labels))]
            rects = ax.bar(xs, values, width, label=f"run {runs[i].get('run', i + 1)}")
            for r, v in zip(rects, values, strict=True):
                ax.annotate(f"{v:.3f}", (r.get_x() + r.get_width() / 2, v), ha="center", va="bottom", fontsize=7)
        ax.axhline(target, color="red", linestyle="--", linewidth=1)
        ax.text(len(labels) - 0.5, target, f" target {better} {target}", color="red", va="bottom", ha="right")
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, rotation=15, fontsize=8)

    nan = float("nan")
    # Cold start: x the floor (median of interleaved fresh processes).
    labels = ["cuplug_array", "cuplug_load", "cuplug_numpy", "cupy"]
    vals = []
    for r in runs:
        rr = r.get("cold", {}).get("ratio_to_floor", {})
        vals.append([rr.get(c, {}).get("of_medians", nan) for c in labels])
    bars(axes[0], labels, vals, 1.10, "<=")
    floor = runs[0].get("cold", {}).get("wall_ms", {}).get("floor", {}).get("median", nan)
    axes[0].set_title(f"cold start to a verified add / context floor ({floor:.0f} ms, run 1)")
    axes[0].set_ylabel("x floor (lower is better)")
    # sum: torch time / cuplug time, queue kept full.
    labels = ["float32", "float16", "bfloat16"]
    vals = [
        [
            r.get("sum", {}).get(d, {}).get("ratio_to_torch_out", {}).get("queued", {}).get("cuplug_out_stream", nan)
            for d in labels
        ]
        for r in runs
    ]
    bars(axes[1], [f"sum {d}" for d in labels], vals, 1.0, ">=")
    axes[1].set_ylim(0.9, 1.1)
    axes[1].set_title("sum via Backend.run / torch.sum, 1 GiB on the device")
    axes[1].set_ylabel("x torch.sum throughput (higher is better)")
    # Host path: per process.
    vals = [
        r.get("host", {}).get("per_config", {}).get("default", {}).get("ratio_per_process", [nan] * 3) for r in runs
    ]
    labels = [f"process {k + 1}" for k in range(len(vals[0]))]
    bars(axes[2], labels, vals, 0.8, ">=")
    axes[2].set_ylim(0, 1.3)
    axes[2].set_title("host path run('add'), 1 GiB NumPy / pinned H2D+D2H")
    axes[2].set_ylabel("x pinned copy (higher is better)")
    for ax in axes:
        ax.legend(fontsize=8, loc="lower left")
    gpu = runs[0].get("cold", {}).get("machine", {}).get("gpu", "").split(",")[0]
    fig.suptitle(f"issue 22 on {gpu}")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main()
