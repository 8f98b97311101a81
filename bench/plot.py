"""Plots a bench results JSON (bench/gpu_bench.py) as a PNG beside it: python bench/plot.py RESULTS.json"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

BLUE, LIGHT, ORANGE, GREY, GREEN = "#3a7dc9", "#8db7e6", "#e07b39", "#888888", "#5aa469"
STEPS = [
    ("import", "import cuplug"),
    ("cuinit", "dlopen libcuda + cuInit"),
    ("own", "probe + select + verify + dlopen"),
    ("context", "context (cudaFree(0))"),
    ("first_launch", "first launch (JIT for PTX)"),
    ("first_add", "first 1M add, host to host"),
]


def _bars(ax, bars: dict[str, float], colors: list[str], ylabel: str, title: str) -> None:
    ax.bar(list(bars), list(bars.values()), color=colors)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    for i, v in enumerate(bars.values()):
        ax.text(i, v, f"{v:.0f}", ha="center", va="bottom", fontsize=8)
    ax.tick_params(axis="x", labelsize=8)


def main(path: str) -> None:
    r = json.loads(Path(path).read_text())
    fig, ((bw, host), (cold, steps)) = plt.subplots(2, 2, figsize=(13, 9))
    _bars(
        bw,
        {
            "device copy": r["d2d_copy_GBs"],
            "torch.add": r["torch_add_GBs"],
            "cuplug add\ncuda13": r["cuda13:fatbin_add_GBs"],
            "cuplug add\ncuda12": r["cuda12:fatbin_add_GBs"],
            "cuplug\nscale_add\ncuda13": r["cuda13:fatbin_scale_add_GBs"],
        },
        [GREY, ORANGE, BLUE, LIGHT, BLUE],
        "GB/s (bytes read + written)",
        f"Resident 1 GiB arrays on {r['device']} (median of {r['repeats']})",
    )
    _bars(
        host,
        {
            "pinned copy\nH2D + D2H\n(torch)": r["pinned_h2d_d2h_GBs"],
            "cuplug run(add)\nhost arrays\ncuda13": r["cuda13:fatbin_host_add_GBs"],
            "same, 1 staging\nthread": r["cuda13:fatbin_host_add_1thread_GBs"],
            "pageable copy\nH2D + D2H\n(torch)": r["torch_pageable_h2d_d2h_GBs"],
        },
        [GREY, BLUE, LIGHT, ORANGE],
        "GB/s (bytes moved over PCIe)",
        "Host arrays, 1 GiB each (median of 3)",
    )
    _bars(
        cold,
        {"cuplug\n(auto: fatbin)": r["cold_cuplug_ms"], "CuPy": r["cold_cupy_ms"], "PyTorch": r["cold_torch_ms"]},
        [BLUE, GREEN, ORANGE],
        "ms",
        "Cold start: fresh process, import to a verified 1M add (median of 5)",
    )
    runs = {
        "fatbin": r["breakdown_fatbin"],
        "ptx, no JIT\ncache": r["breakdown_ptx_nocache"],
        "ptx after\ncuplug warmup": r["breakdown_ptx_after_warmup"],
    }
    bottoms = [0.0] * len(runs)
    palette = ["#1f4e79", "#999999", "#2e8b57", "#cccccc", "#e07b39", "#8db7e6"]
    for (key, label), color in zip(STEPS, palette, strict=True):
        values = [
            (b["probe"] + b["select"] + b["verify"] + b["dlopen"]) if key == "own" else b[key] for b in runs.values()
        ]
        steps.bar(list(runs), values, bottom=bottoms, color=color, label=label)
        bottoms = [a + v for a, v in zip(bottoms, values, strict=True)]
    for i, total in enumerate(bottoms):
        steps.text(i, total, f"{total:.0f}", ha="center", va="bottom", fontsize=8)
    steps.set_ylabel("ms (median per step of 5 processes)")
    steps.set_title("Where a cuplug cold start goes (interpreter start not included)", fontsize=10)
    steps.set_ylim(0, max(bottoms) * 1.55)  # room for the legend above the bars
    steps.legend(fontsize=7, loc="upper left", ncols=2)
    fig.tight_layout()
    out = Path(path).with_suffix(".png")
    fig.savefig(out, dpi=100)
    print(out)


if __name__ == "__main__":
    main(sys.argv[1])
