#!/usr/bin/env python3
"""cuplug's benchmark suite: named scenarios, each measured beside its anchor in the same run.

    python bench/run.py --list                                   # the scenarios, their anchors and targets
    python bench/run.py [SCENARIO|all|gpu|cpu ...] --out DIR [--runs N] [--quick] [--budget SECONDS]
    python bench/run.py --table DIR                              # the table of the records under DIR

Each scenario runs in a fresh process of its own (this one imports nothing of CUDA, so cold starts find an idle
device) and writes DIR/run<N>/<scenario>.json: the scenario, the command that made it, the machine, the
anchors and results (median with IQR and min/max), the targets (met, missed or reported), when it started and
how long it took. A scenario that cannot run here writes a record saying `skipped` and why. Each run also
gets DIR/run<N>/targets.png (with matplotlib). `gpu` names every scenario with a GPU half, `cpu` every one
that runs without a GPU; nothing named is `all`. `--quick`: fewer repeats, for a smoke test (its records say
so). What each figure means: docs/performance.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from scenarios import all_scenarios  # noqa: E402
from suite import machine, needs, table  # noqa: E402
from suite.scenario import RUNS_ON, Scenario, Skip  # noqa: E402
from suite.targets import evaluate  # noqa: E402

SELECTIONS = {"all": ("gpu", "cpu", "both"), "gpu": ("gpu", "both"), "cpu": ("cpu", "both")}
BUDGET_FLOOR_S = 30  # a scenario is not started with less than this left of --budget


def _now() -> str:
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


def _select(names: list[str], known: dict[str, Scenario]) -> list[Scenario]:
    picked: list[str] = []
    for name in names or ["all"]:
        if name in SELECTIONS:
            picked += [s.name for s in known.values() if s.runs_on in SELECTIONS[name]]
        elif name in known:
            picked.append(name)
        else:
            raise SystemExit(f"run.py: unknown scenario {name!r}; choose from {[*known, *SELECTIONS]} (--list)")
    return [known[n] for n in known if n in picked]  # run order, each once


def _list(known: dict[str, Scenario]) -> None:
    for s in known.values():
        print(f"{s.name} [{s.runs_on}: {RUNS_ON[s.runs_on]}; needs {', '.join(s.needs) or 'nothing'}]")
        print(f"    {s.what}")
        for anchor, what in s.anchors.items():
            print(f"    anchor    {anchor}: {what}")
        for t in s.targets:
            vs = f" vs {t.anchor}" if t.anchor and t.how != "value" else ""
            if t.bound:
                print(f"    target    {t.result}{vs} {t.bound[0]} {t.bound[1]:g}{t.unit} ({t.source})")
            else:
                print(f"    reported  {t.result}{vs} ({t.unit})")


# ---- the scenario's own process -----------------------------------------------------------------------------


def _measure(name: str, into: Path, quick: bool) -> None:
    """Runs in the child: measure one scenario, write what came of it (ran, skipped or the error) to ``into``."""
    scenario = all_scenarios()[name]
    try:
        doc: dict[str, Any] = {"status": "ran", **scenario.measure(quick).to_json()}
    except Skip as exc:
        doc = {"status": "skipped", "reason": str(exc)}
    except Exception:
        doc = {"status": "error", "error": traceback.format_exc()}
    into.write_text(json.dumps(doc))


def _child_env(scenario: Scenario) -> tuple[dict[str, str], dict[str, str]]:
    """The child's environment, and what the runner set in it (recorded)."""
    env, set_here = dict(os.environ), {}
    if scenario.runs_on == "both" and not needs.has_gpu() and "CUPLUG_BACKEND" not in env:
        set_here["CUPLUG_BACKEND"] = "cpu"  # no GPU: the CPU twin, chosen outright rather than by fall-back
    env["PYTHONUNBUFFERED"] = "1"
    return {**env, **set_here}, set_here


def _run_child(scenario: Scenario, quick: bool, timeout_s: float) -> dict[str, Any]:
    env, set_here = _child_env(scenario)
    with tempfile.TemporaryDirectory(prefix=f"cuplug-bench-{scenario.name}-") as tmp:
        into = Path(tmp) / "measured.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--measure", scenario.name, "--into", str(into)]
        proc = subprocess.Popen([*cmd, *(["--quick"] if quick else [])], cwd=tmp, env=env, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the scenario's own process group: it and what it started
            proc.wait()
            return {"status": "error", "error": f"{scenario.name}: stopped after {timeout_s:.0f} s (its time limit)"}
        if not into.exists():
            return {"status": "error", "error": f"{scenario.name}: its process exited with rc {rc} and no result"}
        doc = json.loads(into.read_text())
    doc["runner_env"] = set_here
    return doc


# ---- the runner -------------------------------------------------------------------------------------------------


def _outcome(scenario: Scenario, quick: bool, deadline: float) -> dict[str, Any]:
    """The scenario's measurement (ran, skipped or error), or why it was not started."""
    left = deadline - time.monotonic()
    reason = needs.missing(scenario.needs)
    if reason is None and left < BUDGET_FLOOR_S:
        reason = f"less than {BUDGET_FLOOR_S} s of the run's --budget was left ({left:.0f} s)"
    if reason:
        return {"status": "skipped", "reason": reason}
    return _run_child(scenario, quick, min(left, scenario.timeout_s))


def _record(scenario: Scenario, run: int, position: int, args: argparse.Namespace, deadline: float) -> dict[str, Any]:
    started, t0 = _now(), time.monotonic()
    rec: dict[str, Any] = {
        "scenario": scenario.name,
        "what": scenario.what,
        "group": scenario.group,
        "runs_on": scenario.runs_on,
        "run": run,
        "position": position,  # its place in the run's order
        "quick": args.quick,
        "command": shlex.join([sys.executable, *sys.argv]),
        "argv": [sys.executable, *sys.argv],
        "machine": machine.machine(),
        "anchors_are": scenario.anchors,
        "anchors": {},
        "results": {},
        "targets": [],
        "started": started,
    }
    doc = _outcome(scenario, args.quick, deadline)
    if doc["status"] == "ran":
        measured = {**doc["anchors"], **doc["results"]}
        rec.update(anchors=doc["anchors"], results=doc["results"], details=doc["details"])
        rec["targets"] = [evaluate(t, measured) for t in scenario.targets]
    elif doc["status"] == "skipped":
        rec["skipped"] = doc["reason"]
    else:
        rec["error"] = doc["error"]
    if doc.get("runner_env"):
        rec["runner_env"] = doc["runner_env"]
    rec["seconds"] = round(time.monotonic() - t0, 2)
    return rec


def _next_run(out: Path) -> int:
    """Runs go on after the ones already in ``out``: earlier records are never overwritten."""
    done = [int(p.name[3:]) for p in out.glob("run*") if p.name[3:].isdigit()]
    return max(done, default=0) + 1


def _plot(records: list[dict[str, Any]], run_dir: Path, quick: bool) -> None:
    from suite.plot import plot

    m = machine.machine()
    gpu = (m["gpu"] or {}).get("devices", ["no GPU"])[0].split(",")[0]
    where = f"{m['host']} ({m['cores']} cores, {gpu}), commit {m['source']['commit'] or '?'}"
    title = f"cuplug benchmark suite: {run_dir.parent.name}/{run_dir.name} on {where}" + (", --quick" if quick else "")
    try:
        png = plot(records, run_dir / "targets.png", title)
    except ImportError:
        print("run.py: no matplotlib here: no targets.png (pip install matplotlib)")
        return
    if png:
        print(f"run.py: {png}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scenarios", nargs="*", help="scenario names, or all / gpu / cpu (default: all)")
    p.add_argument("--out", type=Path, help="where the records go: OUT/run<N>/<scenario>.json, OUT/run<N>/targets.png")
    p.add_argument("--runs", type=int, default=1, help="how many times the whole selection runs (default 1)")
    p.add_argument("--quick", action="store_true", help="few repeats: a smoke test, not a measurement to quote")
    p.add_argument("--budget", type=float, help="seconds for the whole invocation; later scenarios skip past it")
    p.add_argument("--list", action="store_true", help="the scenarios, their anchors and targets")
    p.add_argument("--table", type=Path, metavar="DIR", help="print the table of the records under DIR")
    p.add_argument("--measure", help=argparse.SUPPRESS)  # the scenario's own process
    p.add_argument("--into", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.measure:
        _measure(args.measure, args.into, args.quick)
        return 0
    if args.table:
        return table.main(args.table)
    known = all_scenarios()
    if args.list:
        _list(known)
        return 0
    if args.out is None:
        p.error("--out DIR is needed (e.g. --out bench/results/<date>-<host>)")
    selected = _select(args.scenarios, known)
    deadline = time.monotonic() + (args.budget if args.budget else float("inf"))
    first = _next_run(args.out)
    made: list[dict[str, Any]] = []
    for run in range(first, first + args.runs):
        run_dir = args.out / f"run{run}"
        run_dir.mkdir(parents=True, exist_ok=True)
        records = []
        for position, scenario in enumerate(selected, 1):
            print(f"== run {run}: {scenario.name} ({scenario.what})", flush=True)
            rec = _record(scenario, run, position, args, deadline)
            (run_dir / f"{scenario.name}.json").write_text(json.dumps(rec, indent=1) + "\n")
            records.append(rec)
            state = "skipped: " + rec["skipped"] if "skipped" in rec else "ERROR" if "error" in rec else "done"
            print(f"   {scenario.name}: {state} ({rec['seconds']:.1f} s)", flush=True)
            if "error" in rec:
                print(rec["error"], file=sys.stderr)
        _plot(records, run_dir, args.quick)
        made += records
    print(f"== records in {args.out}")
    print("\n".join(table.lines([(f"run{r['run']}", r) for r in made])))
    return 1 if any("error" in r for r in made) else 0


if __name__ == "__main__":
    sys.exit(main())
