"""The short table the runner prints last: one line per target row, one per skipped or failed scenario."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def load(out: Path) -> list[tuple[str, dict[str, Any]]]:
    """(run folder, record) of every record under ``out`` (out/run<N>/<scenario>.json), in run order."""
    rows = []
    for run_dir in sorted(out.glob("run*"), key=lambda p: int(p.name[3:]) if p.name[3:].isdigit() else 0):
        recs = [json.loads(path.read_text()) for path in run_dir.glob("*.json")]
        rows += [(run_dir.name, rec) for rec in sorted(recs, key=lambda r: r.get("position", 0)) if "scenario" in rec]
    return rows


def lines(records: list[tuple[str, dict[str, Any]]]) -> list[str]:
    out = [f"{'run':5} {'scenario':13} {'target row':58} {'value':>11}  {'target':>9}  verdict"]
    for run, rec in records:
        if rec.get("skipped") or rec.get("error"):
            why = rec.get("skipped") or "ERROR: " + rec["error"].strip().splitlines()[-1][:120]
            out.append(f"{run:5} {rec['scenario']:13} {'skipped: ' + why if rec.get('skipped') else why}")
            continue
        for row in rec["targets"]:
            value = "-" if row["value"] is None else f"{row['value']:.4g} {row['unit']}"
            out.append(
                f"{run:5} {rec['scenario']:13} {row['name'][:58]:58} {value:>11}  {row['bound'] or '':>9}  "
                f"{row['verdict']}"
            )
    return out


def main(out: Path) -> int:
    records = load(out)
    if not records:
        print(f"no records under {out} (expected {out}/run<N>/<scenario>.json)")
        return 1
    print("\n".join(lines(records)))
    return 0
