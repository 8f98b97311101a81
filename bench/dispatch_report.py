#!/usr/bin/env python3
"""pytest-benchmark JSON of bench/bench_dispatch.py -> dispatch.json (each path in microseconds beside its
anchor of the same run, against issue 30's targets) and dispatch.png (each figure against its target).

    python bench/dispatch_report.py BENCH.json OUT_DIR [--command "how the JSON was made"]
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

# (group, path) -> (the anchor's path in the same group, the target, what the target bounds)
TARGETS = {
    ("per-call host", "run(out=) numpy"): ("np.add(out=)", 10.0, "us"),
    ("per-call host", "run(out=) resident"): ("np.add(out=)", 5.0, "us"),
    ("per-call host", "run numpy"): ("np.add(out=)", None, "us"),
    ("per-call host", "run resident"): ("np.add(out=)", None, "us"),
    ("per-call cuda", "run(out=) torch"): ("torch.add(out=)", 5.0, "us"),
    ("per-call cuda", "run torch"): ("torch.add", 10.0, "us"),
    ("per-call cuda", "torch op (cuplug.torch)"): ("torch.add", None, "us"),
    ("per-call cuda", "torch op .out"): ("torch.add(out=)", None, "us"),
    ("per-call cuda", "run(out=) resident"): ("torch.add(out=)", None, "us"),
    ("per-call cuda", "run(out=) cupy"): ("cupy.add", None, "us"),
    ("alloc 1 GiB add", "run torch"): ("torch.add", 0.97, "ratio"),
    ("alloc 1 GiB add", "torch op (cuplug.torch)"): ("torch.add", 0.97, "ratio"),
    ("graph replay (100 calls)", "run torch"): ("torch.add", None, "ratio"),
    ("graph replay (100 calls)", "torch op (cuplug.torch)"): ("torch.add", None, "ratio"),
}


def _path(name: str) -> str:
    m = re.search(r"\[(.*)\]$", name)
    return m.group(1) if m else name


def records(doc: dict) -> list[dict]:
    by = {(b["group"], _path(b["name"])): b for b in doc["benchmarks"]}
    out = []
    for (group, path), b in sorted(by.items()):
        st = b["stats"]
        rec = {
            "group": group,
            "path": path,
            "median_us": st["median"] * 1e6,
            "iqr_us": st["iqr"] * 1e6,
            "min_us": st["min"] * 1e6,
            "rounds": st["rounds"],
        }
        spec = TARGETS.get((group, path))
        if spec is not None:
            anchor, target, kind = spec
            a = by.get((group, anchor))
            if a is not None:
                rec["anchor"] = anchor
                rec["anchor_median_us"] = a["stats"]["median"] * 1e6
                rec["ratio_to_anchor"] = a["stats"]["median"] / st["median"]  # > 1: faster than the anchor
            if target is not None:
                rec["target"] = f"<= {target} us" if kind == "us" else f">= {target}x the anchor"
                value = rec["median_us"] if kind == "us" else rec.get("ratio_to_anchor", 0.0)
                rec["met"] = value <= target if kind == "us" else value >= target
        out.append(rec)
    return out


def plot(recs: list[dict], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    per_call = [r for r in recs if r["group"].startswith("per-call")]
    ratios = [r for r in recs if "ratio" in (r.get("target") or "") or r["group"].startswith(("alloc", "graph"))]
    with_ratio = [r for r in ratios if "ratio_to_anchor" in r]
    if with_ratio:
        fig, axes = plt.subplots(1, 2, figsize=(13, 5), gridspec_kw={"width_ratios": [2, 1]})
    else:  # the CPU machine: per-call figures only
        fig, ax0 = plt.subplots(1, 1, figsize=(9, 0.6 * len(per_call) + 1.5))
        axes = [ax0]
    ax = axes[0]
    labels = [f"{r['group'].removeprefix('per-call ')}: {r['path']}" for r in per_call]
    ax.barh(labels, [r["median_us"] for r in per_call], xerr=[r["iqr_us"] / 2 for r in per_call], color="#4c78a8")
    for i, r in enumerate(per_call):
        if r.get("target", "").startswith("<="):
            t = float(r["target"].split()[1])
            ax.plot([t, t], [i - 0.4, i + 0.4], color="red")
    ax.set_xscale("log")
    ax.set_xlabel("host wall per call, us (median, IQR; red: target)")
    ax.invert_yaxis()
    if not with_ratio:
        fig.tight_layout()
        fig.savefig(png, dpi=110)
        return
    ax = axes[1]
    rl = [f"{r['group']}: {r['path']}" for r in with_ratio]
    ax.barh(rl, [r["ratio_to_anchor"] for r in with_ratio], color="#72b7b2")
    ax.axvline(1.0, color="grey", lw=0.8)
    ax.axvline(0.97, color="red", lw=0.8, ls="--")
    ax.set_xlabel("anchor time / cuplug time (>= 0.97 target, dashed)")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bench_json", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--command", default="", help="the command that made the benchmark JSON (recorded)")
    args = p.parse_args()
    doc = json.loads(args.bench_json.read_text())
    recs = records(doc)
    args.out.mkdir(parents=True, exist_ok=True)
    result = {
        "command": args.command,
        "machine": doc.get("machine_info", {}).get("cpu", {}).get("brand_raw", ""),
        "python": doc.get("machine_info", {}).get("python_version", ""),
        "datetime": doc.get("datetime", ""),
        "records": recs,
    }
    (args.out / "dispatch.json").write_text(json.dumps(result, indent=1) + "\n")
    try:
        plot(recs, args.out / "dispatch.png")
    except ImportError:
        print("dispatch_report: no matplotlib, no plot")
    for r in recs:
        mark = "" if "met" not in r else (" MET" if r["met"] else " MISSED")
        ratio = f" ({r['ratio_to_anchor']:.2f}x {r['anchor']})" if "ratio_to_anchor" in r else ""
        print(f"{r['group']:>26} | {r['path']:<26} {r['median_us']:10.2f} us{ratio}{mark}")


if __name__ == "__main__":
    main()
