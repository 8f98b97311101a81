"""The committed mutation results (issue 23) and the tables behind them stay true.

The mutation run itself takes hours on 2 cores (the GitHub workflow's ``mutants`` job runs it); what the
suite checks, in milliseconds, is what a reader of ``docs/mutation-testing.md`` relies on: every module of
``ci/mutants.py`` has a result at the target, every survivor listed carries the argument its equivalents file
holds now, every argument names a line its module still has, and every hand-written C mutation names code that
is still there (``ci/c_mutants.py`` refuses to run otherwise).
"""

from __future__ import annotations

import importlib.util
import json

from conftest import ROOT


def _ci_module(name: str):
    spec = importlib.util.spec_from_file_location(f"ci_{name}", ROOT / "ci" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


mutants = _ci_module("mutants")
c_mutants = _ci_module("c_mutants")
# the newest run's directory (ISO dates sort by time)
LATEST = max(ROOT.glob("bench/results/mutants-*/mutants.json"))


def _results() -> dict[str, dict]:
    return {r["module"]: r for r in json.loads(LATEST.read_text())["modules"]}


def test_every_module_has_a_committed_result_at_the_target():
    results = _results()
    assert sorted(results) == sorted(mutants.MODULES), LATEST
    for module, r in results.items():
        assert not r.get("error") and not r.get("pending"), (module, r.get("error"), r.get("pending"))
        assert r["score_counting_equivalent"] >= mutants.TARGET, (module, r["score_counting_equivalent"])
        assert r["killed"] + r["timeout"] + r["incompetent"] + r["survived"] == mutants._mutants(r)


def test_every_survivor_listed_is_argued_with_the_argument_kept_for_it():
    """A survivor without an argument, or with one its equivalents file no longer holds, is a report that lies:
    re-run the module or ``ci/mutants.py --summarize`` after editing ci/mutants_equivalent/."""
    stale = []
    for module, r in _results().items():
        arguments = mutants._equivalents(module)
        for s in r["survivors"]:
            if not s["equivalent"] or arguments.get(mutants._key(s)) != s["equivalent"]:
                stale.append((module, s["line"], s["operator"]))
    assert stale == []


def test_every_argument_names_a_line_its_module_still_has():
    """Checked for each module whose committed result is of its current source; a module changed since its
    result is marked **older** in the report (its arguments are of the source it mutated, and the next run
    of it drops those whose lines went)."""
    by_slug = {mutants._slug(m): m for m in mutants.MODULES}
    results = _results()
    files = sorted(mutants.EQUIVALENT.glob("*.json"))
    assert files
    for path in files:
        module = by_slug.get(path.stem)
        assert module, f"{path.name} names no module of ci/mutants.py"
        if module in results and mutants._source_state(results[module]) != "current":
            continue
        lines = {ln.strip() for ln in (ROOT / "loader" / "cuplug" / module).read_text().splitlines()}
        for key, why in json.loads(path.read_text()).items():
            operator, _, line = key.partition(" | ")
            assert operator.startswith("core/") and line in lines and why.strip(), (path.name, key)


def test_every_c_mutation_names_code_that_is_there_and_the_runs_met_the_target():
    assert len(c_mutants.load_table()) >= 30  # SystemExit, naming the entry, if a snippet moved
    runs = sorted(ROOT.glob("bench/results/c-mutants-*/c_mutants.json"))
    assert runs
    for path in runs:
        summary = json.loads(path.read_text())["summary"]["all"]
        assert summary["score_counting_equivalent"] >= c_mutants.TARGET, path


def test_a_result_says_whether_it_was_made_from_the_current_source():
    """The report's `source` column: a result of an older source is marked, so a reader knows to re-run it."""
    module = "runtime/policy.py"
    current = {"module": module, "source_sha256": mutants.source_digest(module)}
    assert mutants._source_state(current) == "current"
    assert mutants._source_state({**current, "source_sha256": "0" * 64}) == "**older**"
    assert mutants._source_state({"module": module}) == "unknown"
