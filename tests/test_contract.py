"""The contract core and the layers on it (issue 17).

- the manifest's JSON Schema and cuplug's own parser accept and refuse the same entries, and every
  manifest the build writes is valid against it;
- the package's layers: the contract core imports nothing of the rest, nothing imports the tools, the
  runtime does not import the build kit, and no module imports one that imports it back;
- ``import cuplug`` loads cuplug's ``__init__`` alone, and the decision imports none of the standard
  library's expensive modules (typing, dataclasses, logging, re, pathlib, json);
- the tables (reason/exit codes, selection tiers, the wheel gate's rules) are what the docs show;
- the JSON reader without ``json`` gives what ``json.loads`` gives, errors included.
"""

from __future__ import annotations

import ast
import copy
import json
import math
import sys
from importlib import resources
from pathlib import Path

import pytest

from conftest import ROOT, clean_env, env_for, needs_wheels, run_json

GOOD = {
    "backend": "vector",
    "variant": "sm80",
    "file": "sm80/libcuplug_vector.so",
    "sha256": "ab" * 32,
    "size": 761400,
    "sass": ["sm_80"],
    "ptx": [],
    "ptx_isa": None,
    "cuda_version": "12.4",
    "min_driver": 12000,
    "abi": 2,
    "arch": "x86_64",
}
# field -> values the manifest format refuses (wrong type, shape or range)
BAD = {
    "backend": [None, 7, "", "Vector", "1vector", "a" * 65, "vec-tor", "véctor"],
    "variant": [None, "", "SM80", "_sm80", "s" * 33, "sm 80"],
    "file": [None, "", "a" * 256, "a\\b", "a\0b", 5],
    "sha256": [None, "ab" * 31, "zz" * 32, "ab" * 33, 1],
    "size": [None, 63, 2**31 + 1, -1, "761400", True, 1.5],
    "sass": [
        None,
        "sm_80",
        ["sm80"],
        ["sm_8"],
        ["sm_80b"],
        ["compute"],
        ["sm_12345"],
        ["sm_80"] * 65,
        [80],
        ["lto_75"],
    ],
    "ptx": [None, ["compute_7"], ["ptx_75"], "compute_75"],
    "ptx_isa": [8.4, "8", "8.4.1", "a.b", "8.", "1234.1"],
    "cuda_version": [None, "", "12.", "12.4.1.1", "x", 12.4, "1234"],
    "min_driver": [None, -1, 1_000_000, "12000", 12000.5, False],
    "abi": [None, -1, 1_000_001, "2"],
    "arch": ["", "X86_64", "x" * 33, 64],
    "lto": [None, "lto_75", ["sm_75"], ["compute_75"], ["lto_75a"], ["lto_7"], ["lto_75"] * 65, [75]],
}
# field -> other values it accepts
ALSO_GOOD = {
    "variant": ["fatbin", "0", "sm_90a_fast"],
    "sha256": ["AB" * 32],
    "sass": [[], ["sm_90a", "sm_100f", "sm_75"]],
    "ptx": [["compute_75"], ["compute_120"]],
    "ptx_isa": ["9.0", "123.456"],
    "cuda_version": ["13", "12.4.1"],
    "arch": [None, "aarch64"],
    "size": [64, 2**31],
    "lto": [[], ["lto_75"], ["lto_75", "lto_90"]],
}


def _schema() -> dict:
    return json.loads(resources.files("cuplug").joinpath("schemas/manifest.schema.json").read_text())


def _cases() -> list[tuple[str, object, bool]]:
    cases = [(field, value, False) for field, values in BAD.items() for value in values]
    cases += [(field, value, True) for field, values in ALSO_GOOD.items() for value in values]
    cases += [(field, "<missing>", field in ("ptx_isa", "arch")) for field in GOOD]
    return cases


@pytest.mark.parametrize(("field", "value", "accepted"), _cases(), ids=lambda v: repr(v)[:30])
def test_schema_and_parser_agree_on_every_entry(field, value, accepted):
    from jsonschema import Draft202012Validator

    from cuplug.contract import manifest

    entry = copy.deepcopy(GOOD)
    if value == "<missing>":
        del entry[field]
    else:
        entry[field] = value
    doc = {"schema": 1, "cuda": "cuda12", "artifacts": [entry]}
    by_schema = Draft202012Validator(_schema()).is_valid(doc)
    parsed = manifest.parse(json.dumps(doc).encode(), "test")
    by_parser = not parsed.problems
    assert (by_schema, by_parser) == (accepted, accepted), (field, value, parsed.problems)
    if not accepted:  # the refusal names the field
        assert field in parsed.problems[0]


@pytest.mark.parametrize(
    "doc",
    [{"schema": 2, "artifacts": []}, {"artifacts": []}, {"schema": 1, "artifacts": {}}, {"schema": 1, "cuda": "c13"}],
)
def test_schema_and_parser_refuse_the_same_documents(doc):
    from jsonschema import Draft202012Validator

    from cuplug.contract import manifest

    assert not Draft202012Validator(_schema()).is_valid(doc)
    with pytest.raises(manifest.ManifestError):
        manifest.parse(json.dumps(doc).encode(), "test")


@needs_wheels
def test_every_built_manifest_is_valid_and_reads_back_the_same(site):
    """The build's manifests (as installed from the wheels) against the schema, and through the typed model
    back to the same bytes (the build writes them through that model)."""
    from jsonschema import Draft202012Validator

    from cuplug.contract import manifest

    validator = Draft202012Validator(_schema())
    for major in ("cuda12", "cuda13"):
        raw = (site / f"cuplug_{major}" / "manifest.json").read_bytes()
        assert not list(validator.iter_errors(json.loads(raw)))
        found = manifest.parse(raw, major)
        assert found.cuda == major and len(found.artifacts) == 4 and not found.problems
        assert manifest.dumps(found.cuda, found.artifacts).encode() == raw


def test_one_size_and_sha256_check():
    from cuplug.contract import manifest

    art = manifest.Artifact.from_json(GOOD)
    assert manifest.mismatch(art, GOOD["size"], GOOD["sha256"].upper()) is None
    assert "size" in manifest.mismatch(art, GOOD["size"] - 1, GOOD["sha256"])
    assert "sha256" in manifest.mismatch(art, GOOD["size"], "cd" * 32)


# ---- layers ---------------------------------------------------------------------------------------


def _package_imports() -> dict[str, set[str]]:
    """module -> the cuplug modules it imports (at any depth of its code: lazy imports count too)."""
    import cuplug

    base = Path(cuplug.__file__).parent
    graph: dict[str, set[str]] = {}
    for path in sorted(base.rglob("*.py")):
        rel = path.relative_to(base.parent).with_suffix("")
        name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        package = name if rel.name == "__init__" else name.rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = package.split(".")
                    anchor = ".".join(parts[: len(parts) - node.level + 1])
                    target = f"{anchor}.{node.module}" if node.module else anchor
                else:
                    target = node.module or ""
                found.add(target)
                found |= {f"{target}.{a.name}" for a in node.names}
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
        graph[name] = {t for t in found if t.startswith("cuplug.") and _is_module(base, t)}
    return graph


def _is_module(base: Path, dotted: str) -> bool:
    rel = Path(*dotted.split(".")[1:])
    return (base / rel).with_suffix(".py").is_file() or (base / rel / "__init__.py").is_file()


LAYERS = ("contract", "runtime", "tools", "kit", "build", "frameworks")


def _layer(module: str) -> str:
    """cuplug.runtime.select -> runtime; cuplug, cuplug.__main__ -> top."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else "top"


def test_layers_import_only_downward():
    graph = _package_imports()
    # what each layer may import; `top` is cuplug/__init__ (the lazy facade) and __main__ (python -m cuplug)
    allowed = {
        "contract": {"contract"},
        "runtime": {"contract", "runtime", "top"},
        "tools": {"contract", "runtime", "tools", "kit", "top"},
        "kit": {"contract", "kit"},
        "build": {"kit"},  # the kit's old name: an alias package of it
        "frameworks": {"contract", "runtime", "frameworks"},  # framework adapters (cuplug.torch): nothing imports them
        "top": {"contract", "runtime", "top", "frameworks"},  # cuplug/torch.py, the adapter's public name
    }
    wrong = [
        f"{m} imports {t}"
        for m, targets in graph.items()
        for t in targets
        if _layer(t) not in allowed[_layer(m)] and m != "cuplug.__main__"
    ]
    assert not wrong, wrong


def test_no_import_cycle():
    graph = _package_imports()
    # cuplug.__init__ is only a lazy facade: its imports are for type checkers (TYPE_CHECKING), so it is no edge
    graph = {m: {t for t in ts if t != "cuplug"} for m, ts in graph.items()}
    modules = {
        m
        for m in graph
        if not m.endswith(("contract", "runtime", "tools", "kit", "build", "frameworks")) and m != "cuplug"
    }

    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for t in graph.get(todo.pop(), ()):
                if t in modules and t not in seen:
                    seen.add(t)
                    todo.append(t)
        return seen

    cycles = sorted(m for m in modules if m in reach(m))
    assert not cycles, f"modules that import themselves back: {cycles}"


EXPENSIVE = (
    "typing",
    "dataclasses",
    "logging",
    "re",
    "pathlib",
    "json",
    "threading",
    "hashlib",
    "inspect",
    "platform",
    "collections",
)
LAZY = """
import sys
before = set(sys.modules)
import cuplug
after_import = sorted(set(sys.modules) - before)
{call}
new = set(sys.modules) - before
print(str([after_import, sorted(m for m in {expensive!r} if m in new)]).replace("'", '"'))
"""


@needs_wheels
@pytest.mark.parametrize("call", ["", "cuplug.explain()", "cuplug.load().close()"])
def test_the_decision_imports_nothing_expensive(call, site, fake_driver_dir):
    """`import cuplug` loads its __init__ alone; explain() and load() (to the CPU, fake driver) none of the
    standard library modules that cost more than the decision (measured: nox -s decision_bench)."""
    code = LAZY.format(call=call, expensive=EXPENSIVE)
    after_import, loaded = run_json(
        code, env_for(site, fake_driver_dir, CUPLUG_BACKEND="cpu" if "load" in call else "")
    )
    assert [m for m in after_import if m != "__future__"] == ["cuplug"]  # __future__: 40 lines, no imports
    assert loaded == [], f"{call or 'import cuplug'} imported {loaded}"


def test_json_without_json_module_gives_what_json_gives():
    from cuplug.contract import jsontext

    for text in ['{"a": [1, 2.5, "x\\u00e9", null, true, false]}', "  [ ]  ", '"s"', "0", "-1.5e3", '{"n": NaN}']:
        assert jsontext.loads(text) == json.loads(text, parse_constant=lambda c: None), text
    for text in ["", "{", "[1,]", "[1] x", "{'a': 1}", "tru", '"\\x"', "\x00"]:
        with pytest.raises(json.JSONDecodeError) as ours:
            jsontext.loads(text)
        with pytest.raises(json.JSONDecodeError) as theirs:
            json.loads(text)
        assert str(ours.value) == str(theirs.value)
    assert math.isinf(jsontext.loads("Infinity", parse_constant=float))
    with pytest.raises(RecursionError):
        jsontext.loads("[" * 100_000)


def test_record_is_immutable_and_compares_by_value():
    from cuplug.contract.manifest import Artifact

    a = Artifact.from_json(GOOD)
    b = Artifact.from_json(copy.deepcopy(GOOD))
    assert a == b and hash(a) == hash(b) and a._replace(size=64) != a
    with pytest.raises(AttributeError):
        a.size = 1
    with pytest.raises(TypeError):
        Artifact("vector")  # missing fields
    assert a.to_json() == {**GOOD, "sass": ["sm_80"], "ptx": []}


# ---- tables shown in the docs -----------------------------------------------------------------------


def _reference_pages() -> dict[str, str]:
    import importlib.util

    spec = importlib.util.spec_from_file_location("cuplug_reference", ROOT / "docs" / "_ext" / "cuplug_reference.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.render()


@pytest.mark.parametrize("page", ["codes.md", "selection.md", "gate.md", "cli.md"])
def test_the_reference_pages_are_what_the_code_says(page):
    """docs/reference/ is generated from the tables (reasons.TABLE, select.TIERS, gate's rules, the CLI's
    parser); the committed pages must be the current ones (`nox -s docs` rewrites them)."""
    want = _reference_pages()[page]
    committed = (ROOT / "docs" / "reference" / page).read_text()
    if page == "cli.md" and f"(Python {sys.version_info[0]}.{sys.version_info[1]})" not in committed:
        pytest.skip("cli.md was generated by another Python (argparse's layout differs between versions)")
    assert committed == want, f"docs/reference/{page} is stale: run `nox -s docs`"


def test_reason_codes_are_the_doctor_schemas():
    from cuplug.contract import reasons

    schema = json.loads(resources.files("cuplug").joinpath("schemas/doctor.schema.json").read_text())
    assert set(reasons.ALL) == set(schema["$defs"]["code"]["enum"])


def test_probe_help_lists_every_exit_code():
    from cuplug.contract import reasons

    out = run_json(
        "import json, subprocess, sys; print(json.dumps(subprocess.run([sys.executable, '-m', 'cuplug', 'probe', "
        "'--help'], capture_output=True, text=True).stdout))",
        clean_env(),
    )
    for number in {n for _, n, _ in reasons.TABLE} | {n for n, _ in reasons.OTHER_EXITS}:
        assert f"\n  {number:>2}  " in out, number
    assert all(code in out for code in reasons.ALL if code not in ("ok", "forced"))


def test_the_loader_decides_on_no_cuda_major():
    """A cuda14 needs a toolchain lock and variants, not a loader edit: no comparison, table key or
    membership test in the runtime or the contract names a CUDA major (messages may give examples)."""
    import cuplug

    base = Path(cuplug.__file__).parent
    majors = [f"cuda{n}" for n in range(10, 20)]
    found = []
    for path in [*(base / "runtime").glob("*.py"), *(base / "contract").glob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            operands = []
            if isinstance(node, ast.Compare):
                operands = [node.left, *node.comparators]
            elif isinstance(node, ast.Dict):
                operands = [k for k in node.keys if k is not None]
            for operand in operands:
                for sub in ast.walk(operand):
                    if isinstance(sub, ast.Constant) and isinstance(sub.value, str) and sub.value in majors:
                        found.append(f"{path.name}:{node.lineno}: {sub.value}")
    assert not found, found


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))
