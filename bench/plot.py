"""Plots a bench results JSON (bench/gpu_bench.py) as a PNG beside it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def main(path: str) -> None:
    r = json.loads(Path(path).read_text())
    fig, (bw, cold) = plt.subplots(1, 2, figsize=(12, 4.5))
    bars = {
        "device copy": r["d2d_copy_GBs"],
        "torch.add": r["torch_add_GBs"],
        "cuplug add\ncuda13": r["cuda13:fatbin_add_GBs"],
        "cuplug add\ncuda12": r["cuda12:fatbin_add_GBs"],
        "cuplug scale_add\ncuda13": r["cuda13:fatbin_scale_add_GBs"],
    }
    bw.bar(list(bars), list(bars.values()), color=["#888", "#e07b39", "#3a7dc9", "#6fa8dc", "#3a7dc9"])
    bw.set_ylabel("GB/s (bytes read + written)")
    bw.set_title(f"Resident 1 GiB arrays on {r['device']}")
    for i, v in enumerate(bars.values()):
        bw.text(i, v, f"{v:.0f}", ha="center", va="bottom", fontsize=8)
    starts = {
        "cuplug\n(fatbin)": r["cold_cuplug_ms"],
        "CuPy": r["cold_cupy_ms"],
        "PyTorch": r["cold_torch_ms"],
        "cuplug ptx\nno JIT cache": r["cold_ptx_nocache_ms"],
        "cuplug ptx\nwarm cache": r["cold_ptx_warm_cache_ms"],
    }
    cold.bar(list(starts), list(starts.values()), color=["#3a7dc9", "#5aa469", "#e07b39", "#6fa8dc", "#6fa8dc"])
    cold.set_ylabel("ms, fresh process: import to verified 1M add")
    cold.set_title("Cold start (median of 5 processes)")
    for i, v in enumerate(starts.values()):
        cold.text(i, v, f"{v:.0f}", ha="center", va="bottom", fontsize=8)
    fig.tight_layout()
    out = Path(path).with_suffix(".png")
    fig.savefig(out, dpi=110)
    print(out)


if __name__ == "__main__":
    main(sys.argv[1])
