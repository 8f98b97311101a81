"""`cuplug inspect` (tools.inspection), in process, on the real cuda13 package and copies doctored in the test.

Each artifact's device code is read from its file and compared with its manifest entry field by field
(sass, ptx, ptx_isa), with its CPU, its size and its sha256: any difference is a problem named in the
finding; an entry the loader would refuse is a finding too; a target inspect does not understand is
an InspectError (usage), never another exception.
"""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import pytest

from conftest import WHEELS, needs_wheels
from cuplug.tools import inspection

pytestmark = needs_wheels


@pytest.fixture
def pkg(site, tmp_path) -> Path:
    dest = tmp_path / "cuplug_cuda13"
    shutil.copytree(site / "cuplug_cuda13", dest)
    return dest


def _edit(pkg: Path, index: int, **change: object) -> dict:
    doc = json.loads((pkg / "manifest.json").read_text())
    doc["artifacts"][index].update(change)
    (pkg / "manifest.json").write_text(json.dumps(doc))
    return doc


def test_every_artifact_of_a_package_matches(pkg):
    found = inspection.inspect_target(str(pkg))
    assert len(found) == 4 and all(f.ok for f in found), [f.problems for f in found]
    fat = next(f for f in found if f.variant == "fatbin")
    assert fat.found == fat.expected and "sm_90" in fat.found["sass"] and fat.found["ptx_isa"] == "9.0"
    assert fat.arch == "x86_64" and fat.where == str(pkg / "fatbin" / "libcuplug_vector.so")
    assert fat.to_json()["ok"] is True


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"sha256": "ab" * 32}, "size/sha256 differ"),
        ({"size": 99}, "size/sha256 differ"),
        ({"sass": ["sm_75"]}, "sass: file has"),
        ({"ptx": []}, "ptx: file has"),
        ({"ptx_isa": "8.0"}, "ptx_isa: file has"),
        ({"arch": "aarch64"}, "arch: file is x86_64, manifest says aarch64"),
    ],
)
def test_every_field_is_compared(pkg, change, words):
    doc = _edit(pkg, 0, **change)
    variant = doc["artifacts"][0]["variant"]
    found = inspection.inspect_target(str(pkg))
    bad = [f for f in found if not f.ok]
    assert [f.variant for f in bad] == [variant] and any(words in p for p in bad[0].problems), bad


def test_entries_the_loader_refuses_are_findings(pkg):
    _edit(pkg, 1, backend="Bad Name")
    _edit(pkg, 2, file="../escape.so")
    found = inspection.inspect_target(str(pkg))
    problems = [p for f in found for p in f.problems]
    assert any("manifest entry 1" in p and "backend" in p for p in problems)
    assert any("must be a relative path inside the package" in p for p in problems)


def test_a_missing_or_swapped_file(pkg):
    (pkg / "sm75" / "libcuplug_vector.so").unlink()
    shutil.copy(pkg / "sm80" / "libcuplug_vector.so", pkg / "ptx" / "libcuplug_vector.so")
    found = {f.variant: f for f in inspection.inspect_target(str(pkg))}
    assert found["sm75"].problems == ["listed in the manifest, missing"]
    assert any("size/sha256" in p or "sass" in p for p in found["ptx"].problems)


@pytest.mark.parametrize(
    ("text", "words"),
    [("{", "unusable manifest"), ('{"schema": 2}', "schema 2"), ('{"schema": 1, "artifacts": 5}', "not a list")],
)
def test_an_unusable_manifest_is_one_finding(pkg, text, words):
    (pkg / "manifest.json").write_text(text)
    (finding,) = inspection.inspect_target(str(pkg))
    assert not finding.ok and finding.where.endswith("manifest.json") and words in finding.problems[0]


def test_one_library_with_and_without_its_manifest(pkg, tmp_path):
    (f,) = inspection.inspect_target(str(pkg / "sm80" / "libcuplug_vector.so"))
    assert f.ok and f.variant == "sm80" and f.expected == f.found
    alone = tmp_path / "alone.so"
    shutil.copy(pkg / "sm80" / "libcuplug_vector.so", alone)
    (f,) = inspection.inspect_target(str(alone))
    assert f.ok and f.expected is None and f.found["sass"] == ["sm_80"]
    assert "no manifest to compare" in inspection.format_findings([f])


def test_a_wheel(tmp_path):
    wheel = next(Path(WHEELS or "").glob("cuplug_cuda13-*.whl"))
    found = inspection.inspect_target(str(wheel))
    assert len(found) == 4 and all(f.ok for f in found) and all("!cuplug_cuda13/" in f.where for f in found)
    doctored = tmp_path / wheel.name
    with zipfile.ZipFile(wheel) as zin, zipfile.ZipFile(doctored, "w") as zout:
        for item in zin.infolist():
            data = zin.read(item)
            if item.filename.endswith("sm75/libcuplug_vector.so"):
                data = data[:-1] + bytes([data[-1] ^ 1])
            if item.filename.endswith("sm80/libcuplug_vector.so"):
                continue
            zout.writestr(item, data)
    found = {f.variant: f for f in inspection.inspect_target(str(doctored))}
    assert any("size/sha256" in p for p in found["sm75"].problems)
    assert found["sm80"].problems == ["listed in the manifest, missing from the wheel"]
    assert sum(f.ok for f in found.values()) == 2


def test_what_inspect_does_not_understand(tmp_path):
    not_wheel = tmp_path / "x.whl"
    with zipfile.ZipFile(not_wheel, "w") as zf:
        zf.writestr("x/__init__.py", "")
    with pytest.raises(inspection.InspectError, match=r"holds no <package>/manifest\.json"):
        inspection.inspect_target(str(not_wheel))
    with pytest.raises(inspection.InspectError, match=r"holds no manifest\.json"):
        inspection.inspect_target(str(tmp_path))
    with pytest.raises(inspection.InspectError, match="neither a file, a directory nor an installed backend"):
        inspection.inspect_target(str(tmp_path / "nothing-here"))
    zipless = tmp_path / "y.whl"
    zipless.write_bytes(b"not a zip")
    (f,) = inspection.inspect_target(str(zipless))
    assert not f.ok and "not a readable wheel" in f.problems[0]


def test_format_findings_shows_every_fact_and_problem(pkg):
    _edit(pkg, 0, sha256="ab" * 32)
    text = inspection.format_findings(inspection.inspect_target(str(pkg)))
    assert "MISMATCH" in text and "! size/sha256 differ" in text and "SASS sm_75" in text and "CPU  x86_64" in text
    assert "PTX  compute_75 (ISA 9.0)" in text
