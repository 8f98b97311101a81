"""Mutation testing of the C CPU paths through a small list of hand-written source mutations (issue 23).

    python ci/c_mutants.py [--python PY] [--out DIR] [--only ID ...] [--list] [--keep]

The list is data: ``ci/c_mutants.json`` (id, file, the original snippet, its replacement, the careless edit
it stands for, and optionally why it is equivalent). A snippet must occur exactly once in its file, or the
run refuses to start: the table stays true as the code changes.

For each mutation: a private copy of backends/ (and of the test file, conftest.py and pyproject.toml, so the
test backends that tests/test_cpu_abi_v2.py compiles from ROOT/backends/common see the mutant too) gets the
edit; the CPU .so is built as ``cuplug_add_cpu_backend`` builds it (backends/cmake/cuplug.cmake); then
``pytest -x tests/test_cpu_abi_v2.py`` runs on it (``$CUPLUG_TEST_CPU_LIB``). A build failure is
*incompetent* (reported apart, not counted); pytest non-zero: *killed*; past the timeout: *timeout*
(detected); pytest 0: *survived*. The unmutated copy runs first and must pass.

Written: ``DIR/c_mutants.json`` and ``DIR/c_mutants.md`` (default DIR: bench/results/c-mutants-<date>).
Run it niced on a shared machine: ``nice -n 10 .nox/tests/bin/python ci/c_mutants.py`` (the Python must have
cuplug's test dependencies: pytest, numpy, hypothesis).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "ci" / "c_mutants.json"
TARGET = 0.90  # detected / (detected + survived), equivalents argued counted as detected
TEST = "tests/test_cpu_abi_v2.py"
# What a mutant's copy needs: the sources, and the test with what it imports (ROOT = the copy).
COPIED = ["backends", "tests/conftest.py", TEST, "pyproject.toml"]
SOURCE = "backends/cpu/vector_cpu.c"
TIMEOUT_FACTOR, TIMEOUT_FLOOR_S = 3.0, 60.0  # of the unmutated run's time


def build_command(tree: Path, out: Path) -> list[str]:
    """cuplug_add_cpu_backend(vector ...) of backends/cmake/cuplug.cmake, as one compiler line."""
    b = tree / "backends"
    return [
        os.environ.get("CC", "cc"),
        "-shared",
        "-fPIC",
        "-std=gnu11",  # C_STANDARD 11, CMake's default extensions
        "-O3",
        "-DNDEBUG",  # CMAKE_BUILD_TYPE Release
        "-Wall",
        "-Wextra",
        "-Wno-missing-field-initializers",
        "-ffp-contract=off",
        "-fvisibility=hidden",
        '-DCUPLUG_BACKEND_NAME="vector"',
        f"-I{b / 'include'}",
        f"-I{b / 'common'}",
        str(tree / SOURCE),
        "-o",
        str(out),
        f"-Wl,--version-script={b / 'cmake' / 'cuplug_exports.map'}",
        "-Wl,--no-undefined",
        "-Wl,--as-needed",
        "-Wl,--exclude-libs,ALL",
        "-Wl,--build-id=none",
        "-Wl,--strip-all",
        "-lpthread",
        "-ldl",
        "-lrt",
        "-lm",
    ]


def load_table(path: Path = TABLE) -> list[dict[str, str]]:
    """The mutations, each checked: known keys, unique id, the original exactly once in its file."""
    mutations = json.loads(path.read_text())["mutations"]
    problems, seen = [], set()
    for m in mutations:
        missing = {"id", "file", "original", "replacement", "what"} - set(m)
        if missing:
            problems.append(f"{m.get('id', m)}: lacks {sorted(missing)}")
            continue
        if m["id"] in seen:
            problems.append(f"{m['id']}: id used twice")
        seen.add(m["id"])
        src = ROOT / m["file"]
        count = src.read_text().count(m["original"]) if src.is_file() else -1
        if count != 1:
            where = "file missing" if count < 0 else f"found {count} times"
            problems.append(f"{m['id']}: the original snippet must occur exactly once in {m['file']} ({where})")
    if problems:
        raise SystemExit("c_mutants: refusing the table (fix ci/c_mutants.json):\n  " + "\n  ".join(problems))
    return mutations


def run_tests(python: str, tree: Path, lib: Path, work: Path, timeout: float) -> tuple[str, float, str]:
    """('passed' | 'failed' | 'timeout', seconds, the output's tail; pytest killed by a signal: its last line)."""
    cmd = [
        python,
        "-m",
        "pytest",
        "-x",
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:randomly",
        "--hypothesis-seed=0",  # the fuzz test draws the same calls for every mutant
        f"--rootdir={tree}",
        "-c",
        str(tree / "pyproject.toml"),
        str(tree / TEST),
    ]
    tmp = work / "tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    env = {**os.environ, "CUPLUG_TEST_CPU_LIB": str(lib), "TMPDIR": str(tmp), "PYTHONDONTWRITEBYTECODE": "1"}
    start = time.monotonic()
    # A session of its own: on a timeout the whole group goes (a fork test's hung children included).
    proc = subprocess.Popen(
        cmd, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
        outcome = "passed" if proc.returncode == 0 else "failed"
        if proc.returncode < 0:  # a crash: no summary line, so say so
            out += f"\npytest killed by signal {-proc.returncode} ({signal.Signals(-proc.returncode).name})"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        outcome = "timeout"
    return outcome, time.monotonic() - start, out[-4000:]


def first_failure(output: str) -> str | None:
    """The test pytest -x stopped at (its short summary line), or how pytest died."""
    m = re.search(r"^(?:FAILED|ERROR) \S*?::(\S+)", output, re.M)
    if m:
        return m.group(1)
    lines = output.strip().splitlines()
    if not (lines and lines[-1].startswith("pytest killed by signal")):
        return None
    crashed_in = re.findall(r"line \d+ in (test_\w+)", output)  # faulthandler's traceback of the crash
    return f"{crashed_in[0]} ({lines[-1].removeprefix('pytest ')})" if crashed_in else lines[-1]


def run_one(m: dict[str, str] | None, python: str, tree: Path, work: Path, timeout: float) -> dict[str, object]:
    """Applies mutation m (None: the unmutated copy) to the copy, builds, tests, restores."""
    src = tree / m["file"] if m else None
    original = src.read_text() if src else ""
    if m and src:
        src.write_text(original.replace(m["original"], m["replacement"], 1))
    lib = work / "libcuplug_vector_cpu.so"
    lib.unlink(missing_ok=True)
    try:
        build = subprocess.run(build_command(tree, lib), capture_output=True, text=True)
        if build.returncode != 0:
            return {"outcome": "incompetent", "seconds": 0.0, "detail": build.stderr[-1500:]}
        outcome, seconds, output = run_tests(python, tree, lib, work, timeout)
    finally:
        if src:
            src.write_text(original)
    result: dict[str, object] = {
        "outcome": {"passed": "survived", "failed": "killed", "timeout": "timeout"}[outcome],
        "seconds": round(seconds, 1),
    }
    if outcome == "failed":
        result["killed_by"] = first_failure(output)
    if m is None or outcome == "passed":  # pytest's last line ("144 passed in 8.1s"); all of it if it failed
        lines = output.strip().splitlines()
        result["detail"] = lines[-1] if outcome == "passed" and lines else output[-3000:]
    return result


def summarize(results: list[dict[str, object]]) -> dict[str, dict[str, object]]:
    """Counts per file and overall; score = detected / (detected + survived), incompetent left out."""
    groups: dict[str, list[dict[str, object]]] = {}
    for r in results:
        groups.setdefault(str(r["file"]), []).append(r)
    groups["all"] = results
    out = {}
    for name, rs in groups.items():
        c = {k: sum(1 for r in rs if r["outcome"] == k) for k in ("killed", "timeout", "survived", "incompetent")}
        argued = sum(1 for r in rs if r["outcome"] == "survived" and r.get("equivalent"))
        counted = c["killed"] + c["timeout"] + c["survived"]
        detected = c["killed"] + c["timeout"]
        out[name] = {
            "mutants": len(rs),
            **c,
            "equivalent_argued": argued,
            "score": round(detected / counted, 4) if counted else None,
            "score_counting_equivalent": round((detected + argued) / counted, 4) if counted else None,
        }
    return out


def _pct(v: object) -> str:
    return "-" if v is None else f"{float(v) * 100:.1f} %"  # type: ignore[arg-type]


def report(doc: dict[str, object], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "c_mutants.json").write_text(json.dumps(doc, indent=2) + "\n")
    summary: dict[str, dict[str, object]] = doc["summary"]  # type: ignore[assignment]
    lines = [
        f"# C mutation testing of the CPU paths ({doc['date']})",
        "",
        f"`{doc['command']}` on {doc['machine']}: {len(doc['mutants'])} hand-written mutations "  # type: ignore[arg-type]
        "(`ci/c_mutants.json`), each built as `cuplug_add_cpu_backend` builds the CPU twin and met by "
        f"`pytest -x {TEST}` (the test backends it compiles see the mutant too). Unmutated run: "
        f"{doc['baseline_s']} s; timeout {doc['timeout_s']} s; whole run {doc['seconds']} s.",
        "",
        "Score = detected / (detected + survived), detected = killed + timeout; incompetent (does not build) apart.",
        "",
        *([str(doc["note"]), ""] if doc.get("note") else []),
        "| file | mutants | killed | timeout | survived | incompetent | score | with equivalents | target |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, s in summary.items():
        label = "**all**" if name == "all" else f"`{name}`"
        score = s["score_counting_equivalent"]
        met = "-" if score is None else ("met" if score >= TARGET else "**missed**")  # type: ignore[operator]
        lines.append(
            f"| {label} | {s['mutants']} | {s['killed']} | {s['timeout']} | {s['survived']} | {s['incompetent']} | "
            f"{_pct(s['score'])} | {_pct(s['score_counting_equivalent'])} | {met} |"
        )
    rows = doc["mutants"]
    survivors = [r for r in rows if r["outcome"] == "survived"]  # type: ignore[union-attr]
    lines += ["", "## Survivors", ""]
    if not survivors:
        lines.append("None.")
    for r in survivors:
        why = f" — **equivalent**: {r['equivalent']}" if r.get("equivalent") else ""
        lines.append(f"- `{r['id']}` ({r['file']}): {r['what']}{why}")
    incompetent = [r for r in rows if r["outcome"] == "incompetent"]  # type: ignore[union-attr]
    if incompetent:
        lines += ["", "## Incompetent (does not build)", ""]
        lines += [f"- `{r['id']}` ({r['file']}): {r['what']}" for r in incompetent]
    lines += [
        "",
        "## Every mutant",
        "",
        "| id | outcome | killed by | s | the careless edit |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in rows:  # type: ignore[union-attr]
        lines.append(f"| `{r['id']}` | {r['outcome']} | {r.get('killed_by') or ''} | {r['seconds']} | {r['what']} |")
    (out / "c_mutants.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--python", default=sys.executable, help="the interpreter that runs pytest (default: this one)")
    p.add_argument("--out", type=Path, help="where c_mutants.json/.md go (default bench/results/c-mutants-<date>)")
    p.add_argument("--only", nargs="+", metavar="ID", help="just these mutations (by id)")
    p.add_argument("--list", action="store_true", help="print the table (checked) and exit")
    p.add_argument("--keep", action="store_true", help="keep the work directory (its path is printed)")
    args = p.parse_args(argv)
    mutations = load_table()
    if args.only:
        unknown = sorted(set(args.only) - {m["id"] for m in mutations})
        if unknown:
            p.error(f"unknown id(s) {unknown}; see --list")
        mutations = [m for m in mutations if m["id"] in args.only]
    if args.list:
        for m in mutations:
            print(f"{m['id']:36} {m['file']:38} {m['what']}")
        return 0
    date = str(datetime.date.today())
    out = args.out or ROOT / "bench" / "results" / f"c-mutants-{date}"
    work = Path(tempfile.mkdtemp(prefix="c-mutants-"))
    tree = work / "tree"
    for rel in COPIED:
        dst = tree / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if (ROOT / rel).is_dir() else shutil.copy2)(ROOT / rel, dst)
    t0 = time.monotonic()
    try:
        base = run_one(None, args.python, tree, work, timeout=3600)
        if base["outcome"] != "survived":
            print(f"c_mutants: the unmutated copy does not pass ({base['outcome']}):\n{base.get('detail', '')}")
            return 1
        timeout = max(TIMEOUT_FLOOR_S, TIMEOUT_FACTOR * float(base["seconds"]))  # type: ignore[arg-type]
        print(f"c_mutants: unmutated run {base['seconds']} s; timeout {timeout:.0f} s", flush=True)
        results = []
        for n, m in enumerate(mutations, 1):
            r = {**m, **run_one(m, args.python, tree, work, timeout)}
            r.pop("original"), r.pop("replacement")
            if r["outcome"] != "survived":
                r.pop("equivalent", None)  # an argument only matters while the mutant survives
            results.append(r)
            print(f"[{n}/{len(mutations)}] {m['id']}: {r['outcome']} {r.get('killed_by') or ''}", flush=True)
    finally:
        if args.keep:
            print(f"c_mutants: work directory kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    for r in results:
        if r["outcome"] != "survived":
            r.pop("detail", None)
    only = f" --only {' '.join(args.only)}" if args.only else ""
    doc = {
        "date": date,
        "command": f"python ci/c_mutants.py{only}",
        "machine": f"{os.uname().nodename}, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}",
        "compiler": subprocess.run(
            [build_command(tree, work)[0], "--version"], capture_output=True, text=True
        ).stdout.splitlines()[0],
        "baseline_s": base["seconds"],
        "timeout_s": round(timeout),
        "seconds": round(time.monotonic() - t0, 1),
        "target": TARGET,
        "summary": summarize(results),
        "mutants": results,
    }
    report(doc, out)
    s = doc["summary"]["all"]  # type: ignore[index]
    print(
        f"c_mutants: {s['killed']} killed, {s['timeout']} timeout, {s['survived']} survived "
        f"({s['equivalent_argued']} argued equivalent), {s['incompetent']} incompetent; score "
        f"{_pct(s['score'])}, {_pct(s['score_counting_equivalent'])} with equivalents -> {out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
