#!/usr/bin/env python3
"""Writes docs/reliability.md from the JUnit XML of real runs (stdlib only).

    python3 ci/reliability_table.py --run "CPU: Debian 12 VM, 2 cores, no GPU, fake libcuda.so.1=bench/results/cpu-2026-12-03-junit.xml" \
        --run "GPU: NVIDIA H200, driver 580.159.04=bench/results/h200-2026-12-03-final-gpu-junit.xml" > docs/reliability.md

Rows come from tests marked ``@pytest.mark.reliability(case=, how=, expect=)``:
tests/conftest.py records those three as JUnit properties, next to any measurement
a test records (record_property). One row per test function; its parameter ids and
its results (passed/failed/skipped per run) are listed, never typed in.
"""

from __future__ import annotations

import argparse
import re
import sys
import xml.etree.ElementTree as ET
from collections import OrderedDict

ROW_KEYS = ("case", "how", "expect")
# Issue 18's classes, one test module each: each gets a section of its own, in this order, with the
# mechanism that answers the class (one paragraph) above its rows.
SECTIONS = OrderedDict(
    [
        (
            "test_hostile_toctou",
            (
                "1. Verified is what is loaded (the bytes hashed are the bytes mapped)",
                "`verify.verified()` opens the artifact once (`O_NOFOLLOW`, non-blocking, a regular file of the "
                "manifest's size), the kernel copies it into a `memfd_create` file, the copy is sealed "
                "(`F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL`) and then read back and hashed; "
                "the loader dlopens `/proc/self/fd/N`. Sealed copies are kept per sha256 (same bytes, same "
                "name, the linker's existing handle); a name is never reused. Without `/proc/self/fd` or "
                "`memfd_create`, a private 0500 copy in a 0700 directory serves. Reports keep the real path.",
            ),
        ),
        (
            "test_hostile_trust",
            (
                "2. Who may serve a backend (the owner's extras, found through dist-info and RECORD)",
                "A backend name has one owner: `vector` is cuplug's (its dist-info beside the running package), "
                "any other name belongs to the one distribution registering it in `cuplug.cpu_backends` (two "
                "claimants: neither). A package serves the name only if the owner declares it as an extra and it "
                "registers in `cuplug.backends`; its files are found through its own dist-info and RECORD (never "
                "`find_spec`, never `sys.path[0]`); the CPU twin is verified against the owner's RECORD. Nothing is "
                "imported to decide; `doctor` lists every registration it did not trust, and why.",
            ),
        ),
        (
            "test_hostile_failures",
            (
                "3. Every failure is a reason, never an exception",
                "Every read is bounded (manifest 1 MiB, dist-info files 4 MiB, 256 entries, 64 targets, JSON depth, "
                "64 devices), every manifest field is type- and range-checked (a bad entry is a rejected "
                "`<cuda>/manifest` candidate, the rest stay usable), files are opened non-blocking and must be "
                "regular; each step of `load()` turns the unexpected into a rejected candidate with a code. The "
                "tools validate their arguments, run under a watchdog and print one line instead of a traceback.",
            ),
        ),
        (
            "test_hostile_driver",
            (
                "4. Driver facts that failed are unknown, not zero",
                "Each driver call's status is checked; a fact it did not give is `None` (JSON `null`, doctor "
                "`unknown`) and the failing call is in the device's `problem` and in the decision's reason "
                "(`driver-init-failed`); an impossible version or capability is unknown too.",
            ),
        ),
        (
            "test_hostile_fork",
            (
                "5. fork, copies and lifetimes",
                "`loading` and `verify` register `os.register_at_fork(after_in_child=...)` handlers that replace "
                "their locks in the child; so does `api` for every instance's lock (and marks CUDA instances "
                "unusable there), and the C frameworks take every instance's lock across `fork()` "
                "(`pthread_atfork`). A Backend and its Tensors refuse copy and pickle (`TypeError`); an "
                "unreachable Backend is finalized (`weakref.finalize`); memory lives while its Tensor or a DLPack "
                "consumer holds it, even after `close()`; a failed call frees the outputs it allocated; resident "
                "ids are `generation << 32 | slot`, slots reused, stale ids refused.",
            ),
        ),
        (
            "test_hostile_config",
            (
                "6. Knobs, hex case and what reaches the terminal",
                "`CUPLUG_BACKEND` is lowercased (so `CPU` means cpu) and must name an installed variant (else a "
                "`ConfigError` listing them); sha256 is compared in lowercase; text reports pass every outside "
                "string through `report.printable` (non-printables escaped); JSON stays exact.",
            ),
        ),
        (
            "test_hostile_operands",
            (
                "8. Operands and backends that lie (the DLPack / CAI / buffer boundary)",
                "`runtime/operands.py` treats each field a producer gives as a claim and checks it before use: "
                "ndim (0..32) before the shape array is read, extents as integers, the byte size in Python "
                "integers below 2^56, the address range inside the user address space and, for a host capsule, "
                "mapped (one `msync`); the buffer pointer is the export's own (`PyObject_GetBuffer`); CAI fields "
                "are typed and versioned, capsules named, consumed ones refused, versioned ones of major 1 only. "
                "`out=` may not overlap an input or output (exact in-place on elementwise ops excepted); outputs "
                "are bounded by the device's memory before allocation. A backend's op table is validated when its "
                "ping is read; a positive status, an id of 0 or a descriptor unlike its allocation is an error; "
                "its message lengths are bounded. A fuzz run of 12,000 lying operands checks all of it at once.",
            ),
        ),
        (
            "test_hostile_scaffold",
            (
                "7. `cuplug new-backend` never overwrites another package",
                "Names starting with `cuplug`, keywords, standard-library modules, reserved names, installed "
                "distributions and registered backend names are refused, as is a `--dir` that is a file.",
            ),
        ),
    ]
)


def _result(case: ET.Element) -> str:
    for tag in ("failure", "error"):
        if case.find(tag) is not None:
            return "FAILED"
    return "skipped" if case.find("skipped") is not None else "passed"


def collect(runs: list[tuple[str, str]]) -> tuple[OrderedDict, list[str]]:
    rows: OrderedDict[str, dict] = OrderedDict()
    headers = []
    for full_label, path in runs:
        label = full_label.split(":")[0]
        root = ET.parse(path).getroot()
        suite = root if root.tag == "testsuite" else root.find("testsuite")
        stamp = (suite.get("timestamp") or "")[:16].replace("T", " ") if suite is not None else ""
        headers.append(f"{full_label} ({stamp} UTC)" if stamp else full_label)
        for case in root.iter("testcase"):
            props = {p.get("name"): p.get("value") for p in case.iter("property")}
            if not all(k in props for k in ROW_KEYS):
                continue
            name = case.get("name", "")
            func = re.sub(r"\[.*\]$", "", name)
            key = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{func}"
            row = rows.setdefault(key, {**{k: props[k] for k in ROW_KEYS}, "results": {}, "measured": {}})
            param = name[len(func) + 1 : -1] if name != func else ""
            result = _result(case)
            if result == "skipped" and label in row["results"]:
                continue
            row["results"].setdefault(label, []).append((param, result))
            measured = {k: v for k, v in props.items() if k not in ROW_KEYS}
            if measured and result == "passed":
                row["measured"][label + (f" [{param}]" if param else "")] = measured
    return rows, headers


def _cell(results: list[tuple[str, str]]) -> str:
    ran = [(p, r) for p, r in results if r != "skipped"]
    if not ran:
        return "skipped"
    failed = [p or "-" for p, r in ran if r == "FAILED"]
    text = f"{len(ran) - len(failed)}/{len(ran)} passed"
    if failed:
        text += " — **FAILED**: " + ", ".join(failed)
    params = ", ".join(p for p, _ in ran if p)
    return text + (f" ({params})" if params and len(params) <= 90 else "")


def _table(rows: OrderedDict, keys: list[str], labels: list[str]) -> list[str]:
    out = ["| case | how it is produced | expected outcome | test | " + " | ".join(labels) + " |"]
    out.append("| --- | --- | --- | --- | " + " | ".join("---" for _ in labels) + " |")
    for key in keys:
        row = rows[key]
        cells = [row["case"], row["how"], row["expect"], f"`{key}`"]
        cells += [
            _cell(row["results"].get(label, [])) if label in row["results"] else "— (not in this run)"
            for label in labels
        ]
        out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return out


def render(rows: OrderedDict, headers: list[str], labels: list[str]) -> str:
    out = [
        "# Reliability: faults, bad input and hostile files",
        "",
        "Generated by `ci/reliability_table.py` from the JUnit XML of these runs (do not edit by hand):",
        "",
    ]
    out += [f"- {h}" for h in headers]
    out += [
        "",
        "Every row is one test marked `reliability` (its case, how and expected outcome are the test's own "
        "words); a result cell counts the test's parameter cases that ran on that machine. GPU rows skip on "
        "the CPU machine, which has no GPU.",
        "",
    ]
    groups: OrderedDict[str, list[str]] = OrderedDict([("", []), *((m, []) for m in SECTIONS)])
    for key in rows:
        module = key.split("::", 1)[0]
        groups[module if module in SECTIONS else ""].append(key)
    for module, keys in groups.items():
        if not keys:
            continue
        if module:
            if module == next(m for m, k in groups.items() if m and k):
                out += ["## Issue 18: hostile and broken environments", ""]
            title, mechanism = SECTIONS[module]
            out += [f"### {title}", "", mechanism, ""]
        out += _table(rows, keys, labels)
        out.append("")
    out.pop()
    measured = [(key, where, values) for key, row in rows.items() for where, values in row["measured"].items()]
    if measured:
        out += ["", "## Measured by these tests", "", "| test | run | values |", "| --- | --- | --- |"]
        for key, where, values in measured:
            shown = ", ".join(f"{k} = {v}" for k, v in values.items())
            out.append(f"| `{key}` | {where} | {shown} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--run",
        action="append",
        required=True,
        metavar="LABEL=JUNIT.xml",
        help="a run to read: its label (machine) and its JUnit XML; repeatable",
    )
    args = parser.parse_args(argv)
    runs = []
    for spec in args.run:
        label, sep, path = spec.rpartition("=")
        if not sep or not label:
            parser.error(f"--run {spec!r}: expected LABEL=PATH")
        runs.append((label, path))
    try:
        rows, headers = collect(runs)
    except (OSError, ET.ParseError) as exc:
        print(f"reliability_table: cannot read a run: {exc}", file=sys.stderr)
        return 1
    if not rows:
        print("reliability_table: no test marked `reliability` in these runs", file=sys.stderr)
        return 1
    sys.stdout.write(render(rows, headers, [label.split(":")[0] for label, _ in runs]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
