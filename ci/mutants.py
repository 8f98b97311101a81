"""Mutation testing of the runtime, the operator's tools and the shipping gate with cosmic-ray (issue 23).

    python ci/mutants.py --slot SITE_PACKAGES [--slot ...] --out DIR [MODULE ...] [--changed BASE]
                         [--work DIR] [--resume] [--summarize]

Run by ``nox -s mutants`` (which makes the slots: venvs with cuplug installed from its wheel). Each
module is mutated *in place in a slot's installed copy* (cosmic-ray's way), so every test that starts
``python -c 'import cuplug'`` or ``python -m cuplug`` sees the mutant, and cuplug's trust rule
(its dist-info beside the package) holds: the measurement that chose cosmic-ray over mutmut is in
``bench/results/mutants-tool-choice-2026-12-03.md``. Slots run modules in parallel, one each.

Per module: ``cosmic-ray init`` -> ``cr-filter-operators`` (``|`` in annotations: never evaluated,
``from __future__ import annotations``) -> ``cosmic-ray exec`` with the module's own tests (MODULES)
-> killed / survived / incompetent / timeout from the session database. The survivors are listed with
their diff; ``ci/mutants_equivalent/<module>.json`` holds the argument for each one judged equivalent (a
mutant that cannot change behaviour). Written: ``DIR/mutants.json`` and ``DIR/mutants.md``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET = 0.90  # killed / (killed + survived) per module
# Survivors argued equivalent (a mutant that cannot change behaviour): one JSON file per module,
# ci/mutants_equivalent/<module with - for />.json, {"<operator> | <the source line, stripped>": "why"}
# (every mutant of that operator on that line).
EQUIVALENT = ROOT / "ci" / "mutants_equivalent"

# module (under cuplug/) -> its test stages. Every mutant meets the first stage (fast, in process: seconds);
# only the survivors of a stage meet the next (the last: subprocesses, installed wheels, fake drivers).
# pytest's -x stops at the first failure, so a killed mutant costs little either way.
# The API's tests without PyTorch first (its import costs 3 s a mutant), then the PyTorch interop tests.
REFERENCE_PAGES = "tests/test_contract.py::test_the_reference_pages_are_what_the_code_says"
API_STAGES = [["tests/test_api.py", "tests/test_api_v2.py"], ["tests/test_api_torch.py"]]
# test_hostile_operands.py's in-process tests (its fuzz run, leak check and planted backend start processes:
# seconds a mutant; they meet only the survivors, in the next stage)
OPERANDS_IN_PROCESS = [
    f"tests/test_hostile_operands.py::{t}"
    for t in (
        "test_dlpack_metadata_is_bounded_before_it_is_used",
        "test_a_dlpack_device_that_is_no_device_is_refused",
        "test_a_max_version_that_is_no_pair_is_a_clear_error",
        "test_the_pointer_is_the_exports_own",
        "test_read_only_buffers_are_read_in_place_and_released",
        "test_capsules_of_unknown_layouts_are_refused",
        "test_a_versioned_capsule_of_major_1_is_read_with_its_flags",
        "test_a_producer_whose_dlpack_raises_is_named",
        "test_cuda_array_interface_fields_are_checked",
        "test_an_honest_cuda_array_interface_reaches_c",
        "test_partial_overlap_is_refused_and_exact_in_place_is_allowed",
        "test_two_outputs_over_the_same_memory_are_refused",
        "test_an_undocumented_positive_status_is_an_error",
        "test_an_alloc_that_answers_0_is_no_tensor",
        "test_a_descriptor_that_differs_from_the_allocation_is_refused",
        "test_a_huge_declared_output_is_refused_before_allocation",
        "test_a_long_op_or_attribute_name_is_cut_in_the_message",
        "test_an_input_of_another_dtype_of_the_same_size_is_refused",
        "test_resident_inputs_are_checked_against_the_signature_too",
        "test_the_producer_stream_of_an_out_array_is_waited_for",
        "test_a_sum_of_resident_cuda_tensors_is_a_python_number",
        "test_a_tensor_used_in_calls_is_freed_when_its_last_reference_goes",
        "test_the_address_space_bound_is_2_to_the_56",
        "test_a_dlpack_device_is_a_pair_of_int32s",
        "test_a_stream_whose_index_raises_type_error_is_no_stream",
        "test_a_capsule_of_another_device_type_is_named_as_such",
        "test_host_capsules_at_odd_or_empty_addresses",
        "test_a_cai_data_field_is_exactly_a_pair",
        "test_pytorch_cpu_tensors_their_device_and_their_bytes",
        "test_more_edges_of_the_dlpack_import",
        "test_a_host_range_running_into_an_unmapped_page_is_refused",
        "test_the_mapping_check_measures_the_range_it_is_given",
        "test_the_first_element_is_base_plus_offset_for_every_check",
    )
]
MODULES: dict[str, list[list[str]]] = {
    # (tests/test_third_major.py runs a cuplug of its own site, patched to declare a cuda14 extra: no mutant there)
    # the reference pages (docs/reference/) are generated from the tables: the docs say what the code does
    "runtime/select.py": [["tests/test_select.py", REFERENCE_PAGES], ["tests/test_hostile_config.py"]],
    "runtime/policy.py": [["tests/test_policy.py"], ["tests/test_hostile_config.py"]],
    "runtime/driver.py": [
        ["tests/test_driver_probe.py"],
        ["tests/test_hostile_driver.py", "tests/test_driver_and_cli.py"],
    ],
    "runtime/verify.py": [["tests/test_verify.py"], ["tests/test_reliability.py", "tests/test_hostile_toctou.py"]],
    "runtime/loading.py": [
        ["tests/test_loading.py"],
        ["tests/test_cli.py"],
        ["tests/test_reliability.py", "tests/test_hostile_config.py", "tests/test_hostile_failures.py"],
    ],
    "runtime/library.py": [["tests/test_library.py"], ["tests/test_reliability.py", "tests/test_hostile_failures.py"]],
    "runtime/api.py": [*API_STAGES, ["tests/test_hostile_fork.py"]],
    # the ABI binding: an op's declared signature read and checked, DLPack import and export
    "runtime/signature.py": [["tests/test_signature.py"], *API_STAGES, ["tests/test_cpu_abi_v2.py"]],
    "runtime/dlpack.py": [*API_STAGES, ["tests/test_hostile_fork.py"]],
    # operand import and the prepared call (issues 30, 31): the hostile-operand suite first (in process but for
    # its fuzz run, leak check and planted backend), then the API's
    "runtime/operands.py": [
        OPERANDS_IN_PROCESS,
        ["tests/test_hostile_operands.py::test_fuzz_lying_operands", "tests/test_api_v2.py"],
        ["tests/test_hostile_operands.py", "tests/test_api.py"],
        [*API_STAGES[1], "tests/test_torch_ops.py", "tests/test_hostile_review.py"],
    ],
    "runtime/plan.py": [
        ["tests/test_api_v2.py", *OPERANDS_IN_PROCESS],
        ["tests/test_hostile_operands.py"],
        API_STAGES[1],
    ],
    "tools/cli.py": [
        ["tests/test_cli.py"],
        [
            "tests/test_driver_and_cli.py",
            "tests/test_operator_tools.py",
            "tests/test_hostile_config.py",
            REFERENCE_PAGES,
        ],
    ],
    "tools/inspection.py": [
        ["tests/test_inspection.py"],
        ["tests/test_operator_tools.py", "tests/test_hostile_failures.py"],
    ],
    "contract/fatbin.py": [["tests/test_fatbin.py"], ["tests/test_operator_tools.py"]],
    "kit/gate.py": [["tests/test_gate.py", REFERENCE_PAGES], ["tests/test_build_matrix.py", "tests/test_wheels.py"]],
}
# Modules on load()'s path also answer for what they import (tests/test_contract.py): a mutant that makes
# them import typing at run time (TYPE_CHECKING = True) changes what every application pays.
LAZY_IMPORTS = "tests/test_contract.py::test_the_decision_imports_nothing_expensive"
for _m in (
    "runtime/select.py",
    "runtime/policy.py",
    "runtime/driver.py",
    "runtime/verify.py",
    "runtime/loading.py",
    "runtime/library.py",
    "runtime/api.py",
    "runtime/signature.py",
    "runtime/dlpack.py",
    "runtime/operands.py",
    "runtime/plan.py",
):
    MODULES[_m][-1] = [*MODULES[_m][-1], LAZY_IMPORTS]
# A mutant's test command may take this many times the unmutated run's (measured first, per module and
# stage) before it counts as a hang (detected: timeout), so a slow suite is never mistaken for one.
TIMEOUT_FACTOR, TIMEOUT_FLOOR_S = 3.0, 30.0
# A mutant's outcome; all but "skipped" (filtered before the run) are mutants the score is over.
OUTCOMES = ("killed", "timeout", "incompetent", "survived", "pending", "skipped")
DETECTED = ("killed", "timeout", "incompetent")
RUN_FACTS = ("seconds", "baseline_s", "resumed")  # known only while the run runs: kept by --summarize


def _test_command(tests: list[str]) -> str:
    existing = [str(ROOT / t) for t in tests if (ROOT / t.split("::")[0]).is_file()]
    return (
        f"{sys.executable} -m pytest -x -q -p no:cacheprovider -p no:randomly --rootdir={ROOT} "
        f"-c {ROOT / 'pyproject.toml'} -m 'not gpu and not aarch64_emulated' " + " ".join(existing)
    )


def _config(module: str, python: str, tests: list[str], timeout: float) -> str:
    command = _test_command(tests).replace(sys.executable, python, 1)
    return f"""[cosmic-ray]
module-path = "cuplug/{module}"
timeout = {timeout:.0f}
excluded-modules = []
test-command = "{command}"

[cosmic-ray.distributor]
name = "local"

# `|` appears only in annotations here (from __future__ import annotations): never evaluated
[cosmic-ray.filters.operators-filter]
exclude-operators = ["core/ReplaceBinaryOperator_BitOr_.*"]
"""


def _slug(module: str) -> str:
    return module.replace("/", "-").removesuffix(".py")


def _made_from(work: Path, module: str) -> Path:
    """Where the sha256 of the source a module's database was made from is kept (beside the database)."""
    return work / f"{_slug(module)}.source-sha256"


def _bin(site: Path) -> Path:
    """<venv>/lib/pythonX.Y/site-packages -> <venv>/bin."""
    return site.parents[2] / "bin"


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run_module(module: str, site: Path, work: Path, log: list[str], resume: bool = False) -> dict[str, object]:
    """One module in one slot: init, filter, exec; returns its counts and survivors. ``resume`` keeps the
    module's database when it was made from the same source (its digest beside it) and re-runs only the
    survivors not argued equivalent and the mutants a stopped run never reached: what was killed stays killed
    while tests are only added. Any change to the module's source makes it a whole run."""
    bin_dir = _bin(site)
    python = str(bin_dir / "python")
    work.mkdir(parents=True, exist_ok=True)
    # a stage whose files are all gone would make pytest collect the whole suite: such a stage is dropped
    stages = [t for t in MODULES[module] if any((ROOT / f.split("::")[0]).is_file() for f in t)]
    configs = [work / f"{_slug(module)}.stage{i}.toml" for i in range(len(stages))]
    db = work / f"{_slug(module)}.sqlite"
    made_from = _made_from(work, module)
    target = site / "cuplug" / module
    before = _digest(target)
    resumed = resume and db.is_file() and made_from.is_file() and made_from.read_text().strip() == before
    if resume and not resumed:
        print(f"{module}: no database made from this source: a whole run", flush=True)
    if not resumed:
        db.unlink(missing_ok=True)
        made_from.unlink(missing_ok=True)
    tmp = work / f"tmp-{site.parents[2].name}"
    tmp.mkdir(exist_ok=True)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "TMPDIR": str(tmp),  # pytest's basetemp, per slot
        "PYTHONDONTWRITEBYTECODE": "1",  # a mutant's bytecode must never be cached next to the real file
    }
    t0 = time.monotonic()
    # The unmutated module first: every stage's tests must pass (a red suite kills every mutant for nothing),
    # and their time sets the stage's timeout.
    baseline = []
    for i, tests in enumerate(stages):
        start = time.monotonic()
        proc = subprocess.run(
            _test_command(tests).replace(sys.executable, python, 1),
            shell=True,
            cwd=site,
            env=env,
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            raise RuntimeError(
                f"{module}: the unmutated tests of stage {i} fail, fix them first:\n{proc.stdout[-3000:]}"
            )
        baseline.append(time.monotonic() - start)
        configs[i].write_text(_config(module, python, tests, max(TIMEOUT_FLOOR_S, TIMEOUT_FACTOR * baseline[-1])))
    if not resumed:
        for step in (
            ["cosmic-ray", "init", str(configs[0]), str(db)],
            ["cr-filter-operators", str(db), str(configs[0])],
        ):
            subprocess.run([str(bin_dir / step[0]), *step[1:]], cwd=site, env=env, check=True, capture_output=True)
        made_from.write_text(before + "\n")
    # A resumed run leaves the survivors argued equivalent as they are (the argument says no test can kill them;
    # a whole run still sends every survivor through every stage, so a wrong argument shows there).
    keep = _argued_jobs(module, db, target.read_text().splitlines()) if resumed else set()
    for i, cfg in enumerate(configs):
        if i or resumed:  # the survivors so far meet this stage's tests
            with sqlite3.connect(db) as con:
                survivors = con.execute("select job_id from work_results where test_outcome = 'SURVIVED'").fetchall()
                con.executemany(
                    "delete from work_results where job_id = ?", [(j,) for (j,) in survivors if j not in keep]
                )
        subprocess.run([str(bin_dir / "cosmic-ray"), "exec", str(cfg), str(db)], cwd=site, env=env, check=True)
    if _digest(target) != before:  # cosmic-ray restores each file; a killed run could leave a mutant behind
        raise RuntimeError(f"{target} was left mutated: reinstall cuplug into {site.parents[2]}")
    result = summarize(module, db, target.read_text().splitlines())
    result["seconds"] = round(time.monotonic() - t0, 1)
    result["date"] = str(datetime.date.today())
    result["baseline_s"] = [round(v, 1) for v in baseline]
    result["source_sha256"] = before  # what was mutated: a reader can tell a result of an older source
    if resumed:
        result["resumed"] = True  # "seconds" is the resumed part's
    log.append(f"{module}: {result['killed']} killed, {result['survived']} survived in {result['seconds']} s")
    print(log[-1], flush=True)
    return result


def _argued_jobs(module: str, db: Path, source: list[str]) -> set[str]:
    """The surviving mutants of a database whose operator and line have an argument of equivalence."""
    argued = _equivalents(module)
    with sqlite3.connect(db) as con:
        rows = con.execute(
            "select s.job_id, s.operator_name, s.start_pos_row from mutation_specs s join work_results r "
            "on r.job_id = s.job_id where r.test_outcome = 'SURVIVED'"
        ).fetchall()
    return {
        job
        for job, op, row in rows
        if 0 < row <= len(source) and _key({"operator": op, "source": source[row - 1].strip()}) in argued
    }


def summarize(module: str, db: Path, source: list[str]) -> dict[str, object]:
    con = sqlite3.connect(db)
    rows = con.execute(
        "select s.operator_name, s.occurrence, s.start_pos_row, s.start_pos_col, r.worker_outcome, r.test_outcome, "
        "r.diff from mutation_specs s left join work_results r on r.job_id = s.job_id"
    ).fetchall()
    counts = dict.fromkeys(OUTCOMES, 0)
    survivors = []
    for op, occ, row, col, worker, test, diff in rows:
        if worker is None:  # a run stopped early: it survived the stages it met, not yet the rest
            counts["pending"] += 1
        elif worker == "SKIPPED":
            counts["skipped"] += 1
        elif worker == "ABNORMAL":
            counts["timeout"] += 1
        elif test == "INCOMPETENT":
            counts["incompetent"] += 1
        elif test == "KILLED":
            counts["killed"] += 1
        else:
            counts["survived"] += 1
            text = source[row - 1].strip() if 0 < row <= len(source) else ""
            survivors.append(
                {"line": row, "col": col, "operator": op, "occurrence": occ, "source": text, "diff": _short(diff)}
            )
    detected = sum(counts[k] for k in DETECTED)
    total = _mutants(counts)  # pending counts against the score
    return {
        "module": module,
        **counts,
        "score": round(detected / total, 4) if total else None,
        "survivors": sorted(survivors, key=lambda s: (s["line"], s["col"], s["operator"])),
    }


def _short(diff: str | None) -> str:
    lines = [
        ln
        for ln in (diff or "").splitlines()
        if ln[:1] in "+-" and not ln.startswith(("+++", "---")) and ln[1:].strip()
    ]
    return "\n".join(lines[:4])


def _key(s: dict[str, object]) -> str:
    """A survivor's name that outlives edits elsewhere in the file: the operator and the source line."""
    return f"{s['operator']} | {s['source']}"


def _equivalents(module: str) -> dict[str, str]:
    path = EQUIVALENT / f"{_slug(module)}.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def report(results: list[dict[str, object]], out: Path, meta: dict[str, object]) -> None:
    for r in results:
        equivalent = _equivalents(str(r["module"]))
        for s in r["survivors"]:  # type: ignore[union-attr]
            s["equivalent"] = equivalent.get(_key(s))
        argued = sum(1 for s in r["survivors"] if s["equivalent"])  # type: ignore[union-attr]
        denominator = _mutants(r)
        r["score_counting_equivalent"] = (
            round((denominator - int(r["survived"]) - int(r.get("pending", 0)) + argued) / denominator, 4)
            if denominator
            else None
        )  # type: ignore[call-overload]
    doc = {**meta, "target": TARGET, "modules": results}
    (out / "mutants.json").write_text(json.dumps(doc, indent=2) + "\n")
    lines = [
        f"# Mutation testing ({meta['date']})",
        "",
        f"`{meta['command']}` on {meta['machine']}; cosmic-ray {meta['cosmic_ray']}, the installed wheel mutated in",
        "place, each module against its own tests (`ci/mutants.py`, MODULES). Score = detected / (detected +",
        "survived), detected = killed + timeout + incompetent; `|` in annotations filtered (never evaluated).",
        "",
        "Source: the module's sha256 when the report was written matches the one mutated (`current`), or not.",
        "",
        "| module | mutants | killed | timeout | incompetent | survived | score | with equivalents | target | time "
        "| source |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        n = _mutants(r)
        met = "met" if (r["score_counting_equivalent"] or 0) >= TARGET else "**missed**"
        if r.get("error"):
            met = "**did not run** (mutants.json says why)"
        lines.append(
            f"| `{r['module']}` | {n} | {r['killed']} | {r['timeout']} | {r['incompetent']} | {r['survived']}{_pending(r)} | "
            f"{_pct(r['score'])} | {_pct(r['score_counting_equivalent'])} | {met} | {r.get('seconds', '-')} s"
            f"{' (resumed)' if r.get('resumed') else ''} | {_source_state(r)} |"
        )
    missing = [m for m in MODULES if m not in {r["module"] for r in results}]
    if missing:
        lines += ["", "Not in this report (not run into this directory): " + ", ".join(f"`{m}`" for m in missing) + "."]
    for r in results:
        if not r["survivors"]:
            continue
        lines += ["", f"## `{r['module']}`: survivors", ""]
        for s in r["survivors"]:  # type: ignore[union-attr]
            why = f" — equivalent: {s['equivalent']}" if s["equivalent"] else ""
            diff = "; ".join(d.strip() for d in str(s["diff"]).splitlines())
            lines.append(f"- line {s['line']} `{s['operator']}` #{s['occurrence']}: `{diff}`{why}")
    (out / "mutants.md").write_text("\n".join(lines) + "\n")


def source_digest(module: str) -> str:
    return _digest(ROOT / "loader" / "cuplug" / module)


def _source_state(r: dict[str, object]) -> str:
    if not r.get("source_sha256"):
        return "unknown"
    return "current" if r["source_sha256"] == source_digest(str(r["module"])) else "**older**"


def _mutants(r: dict[str, object]) -> int:
    """The mutants a score is over: every outcome but skipped."""
    return sum(int(r.get(k, 0)) for k in OUTCOMES if k != "skipped")  # type: ignore[call-overload]


def _pending(r: dict[str, object]) -> str:
    return f" + {r['pending']} not through every stage (stopped)" if r.get("pending") else ""


def _pct(v: object) -> str:
    return "-" if v is None else f"{float(v) * 100:.1f} %"  # type: ignore[arg-type]


def changed_modules(base: str) -> list[str]:
    names = subprocess.run(
        ["git", "diff", "--name-only", base, "--", "loader/cuplug"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [m for m in MODULES if f"loader/cuplug/{m}" in names]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("modules", nargs="*", help=f"modules under cuplug/ (default: all {len(MODULES)})")
    p.add_argument("--slot", action="append", type=Path, help="a venv's site-packages with cuplug (one per slot)")
    p.add_argument(
        "--summarize",
        action="store_true",
        help="run nothing: report the modules' databases in --work as they stand (a run stopped early; its "
        "mutants not yet through every stage are 'pending' and count as survivors)",
    )
    p.add_argument("--out", required=True, type=Path, help="where mutants.json and mutants.md go")
    p.add_argument("--changed", metavar="BASE", help="only the modules whose source differs from git BASE")
    p.add_argument("--work", type=Path, default=ROOT / "build" / "mutants", help="cosmic-ray's configs and databases")
    p.add_argument(
        "--resume",
        action="store_true",
        help="keep a module's database made from the same source and re-run only its survivors not argued "
        "equivalent and the mutants a stopped run never reached (after adding tests); a changed source is a whole run",
    )
    args = p.parse_args(argv)
    modules = args.modules or (changed_modules(args.changed) if args.changed else list(MODULES))
    unknown = sorted(set(modules) - set(MODULES))
    if unknown:
        p.error(f"unknown module(s) {unknown}; choose from {sorted(MODULES)}")
    if not modules:
        print("mutants: no module of the list changed; nothing to do")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    log: list[str] = []
    free = list(args.slot or [])
    results: dict[str, dict[str, object]] = {}

    from importlib.metadata import version

    meta = {
        "date": str(datetime.date.today()),
        "command": "python3 ci/nox.py -s mutants [-- MODULE ...], one module set per run, merged by module",
        "machine": f"{os.uname().nodename}, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}",
        "cosmic_ray": version("cosmic-ray"),
        "slots": len(args.slot or []),
    }
    lock = threading.Lock()

    def kept_results() -> list[dict[str, object]]:  # modules run earlier into the same DIR stay in its report
        earlier = args.out / "mutants.json"
        return json.loads(earlier.read_text())["modules"] if earlier.is_file() else []

    def write_report() -> None:  # after every module: a run stopped early still reports what it finished
        merged = {str(r["module"]): r for r in kept_results() if r["module"] in MODULES} | results
        report([merged[m] for m in MODULES if m in merged], args.out, meta)

    if args.summarize:
        earlier_runs = {str(r["module"]): r for r in kept_results()}
        for module in modules:
            db = args.work / f"{_slug(module)}.sqlite"
            if not db.is_file():
                p.error(f"{db} does not exist: {module} was never run into {args.work}")
            result = summarize(module, db, (ROOT / "loader" / "cuplug" / module).read_text().splitlines())
            made_from = _made_from(args.work, module)
            earlier = earlier_runs.get(module, {})
            # the run's own facts (time, baselines) stay when its database is summarized again
            result = {k: earlier[k] for k in RUN_FACTS if k in earlier} | result
            result["date"] = str(datetime.date.fromtimestamp(db.stat().st_mtime))
            if made_from.is_file():
                result["source_sha256"] = made_from.read_text().strip()
            results[module] = result
        write_report()
        return 0
    if not args.slot:
        p.error("--slot is required (a venv's site-packages with cuplug), unless --summarize")

    def job(module: str) -> None:
        site = free.pop()
        try:
            result = run_module(module, site, args.work, log, resume=args.resume)
        except (RuntimeError, subprocess.CalledProcessError) as exc:  # the other modules still run and report
            zero = dict.fromkeys(OUTCOMES, 0)
            result = {"module": module, **zero, "error": str(exc)[-2000:], "survivors": [], "score": None}
            print(f"mutants: {module} did not run: {exc}", flush=True)
        finally:
            free.append(site)
        with lock:
            results[module] = result
            write_report()

    with concurrent.futures.ThreadPoolExecutor(max_workers=len(args.slot)) as pool:
        for f in [pool.submit(job, m) for m in modules]:
            f.result()
    missed = [m for m in modules if (results[m].get("score") or 0) < TARGET]
    print(f"mutants: {len(modules) - len(missed)}/{len(modules)} modules at >= {TARGET:.0%} before equivalents")
    return 0


if __name__ == "__main__":
    sys.exit(main())
