"""One PNG per run: every target row of every record against its bound, one panel per scenario group.

A bar is the row's value (a ratio to its anchor, or a time); its bound is a red tick, the parity line (1x) a
grey line in ratio panels, an anchor's own time a grey dot in time panels. Green: met, orange: missed, grey:
reported (no target). Skipped scenarios are listed under the panels, with their reason.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

COLOURS = {"met": "#5aa469", "missed": "#e07b39", "reported": "#9a9a9a"}
UNIT_LABEL = {"x": "x the anchor (ratio)", "us": "microseconds (dot: the anchor's)", "ms": "milliseconds"}
LEGEND = "green: met, orange: missed, grey: reported (no target); red tick: the target"


def _panels(records: list[dict[str, Any]]) -> dict[str, list[tuple[str, dict[str, Any]]]]:
    panels: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for rec in records:
        for row in rec.get("targets", []):
            if row.get("value") is not None:
                panels.setdefault(rec["group"], []).append((rec["scenario"], row))
    return panels


def _draw(ax: Any, group: str, rows: list[tuple[str, dict[str, Any]]]) -> None:
    labels = [f"{scenario}: {row['name']}" for scenario, row in rows]
    values = [row["value"] for _, row in rows]
    colours = [COLOURS.get(row["verdict"], COLOURS["reported"]) for _, row in rows]
    ys = list(range(len(rows)))
    ax.barh(ys, values, color=colours, height=0.7)
    units = sorted({row["unit"] for _, row in rows})
    if units == ["x"]:
        ax.axvline(1.0, color="#555555", lw=0.8)
    for y, (_, row) in zip(ys, rows, strict=True):
        bound = row.get("bound")
        if bound:
            b = float(bound.split()[1])
            ax.plot([b, b], [y - 0.45, y + 0.45], color="red", lw=2)
        if row["unit"] != "x" and row.get("anchor_median") is not None:
            ax.plot([row["anchor_median"]], [y], "o", color="#555555", ms=4)
        text = f" {row['value']:.3g}{row['unit']}" + (f" (target {bound})" if bound else "")
        ax.text(row["value"], y, text, va="center", fontsize=7)
    ax.set_yticks(ys, labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_title(group, fontsize=9, loc="left")
    ax.set_xlabel(", ".join(UNIT_LABEL.get(u, u) for u in units), fontsize=8)
    ax.margins(x=0.25)


def plot(records: list[dict[str, Any]], png: Path, title: str) -> Path | None:
    """Writes ``png``; None when no record has a value to show. Raises ImportError without matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = _panels(records)
    if not panels:
        return None
    heights = [len(rows) + 1.5 for rows in panels.values()]
    fig, axes = plt.subplots(
        len(panels), 1, figsize=(11, 0.32 * sum(heights) + 1.6), gridspec_kw={"height_ratios": heights}, squeeze=False
    )
    for ax, (group, rows) in zip(axes[:, 0], panels.items(), strict=True):
        _draw(ax, group, rows)
    skipped = [f"{r['scenario']}: {r['skipped']}" for r in records if r.get("skipped")]
    errors = [f"{r['scenario']}: ERROR (see its record)" for r in records if r.get("error")]
    fig.suptitle(f"{title}\n{LEGEND}", fontsize=9)
    footer = "\n".join(["skipped " + s for s in skipped] + errors)
    fig.tight_layout(rect=(0, 0.02 * (1 + footer.count("\n")) if footer else 0, 1, 0.96))
    if footer:
        fig.text(0.01, 0.005, footer, fontsize=7, va="bottom", color="#555555")
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png
