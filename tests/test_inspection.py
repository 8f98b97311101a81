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
    verdicts = [line.split()[:2] for line in text.splitlines() if not line.startswith(" ")]
    assert sorted(v for _, v in verdicts) == ["MISMATCH", "ok", "ok", "ok"]  # "no manifest" only without one


def test_a_bad_entry_does_not_hide_the_ones_after_it(pkg):
    """An entry naming a file outside the package, then a missing one: each is a finding, the rest still checked."""
    _edit(pkg, 0, file="../outside.so")
    (pkg / "ptx" / "libcuplug_vector.so").unlink()
    found = inspection.inspect_target(str(pkg))
    problems = [p for f in found for p in f.problems]
    assert any("must be a relative path inside the package" in p for p in problems)
    assert any("listed in the manifest, missing" in p for p in problems)
    assert sum(f.ok for f in found) == 2


def test_an_artifact_larger_than_inspect_reads_is_a_finding(pkg, monkeypatch):
    monkeypatch.setattr(inspection, "MAX_INSPECT_BYTES", 1000)
    found = inspection.inspect_target(str(pkg))
    assert len(found) == 4 and not any(f.ok for f in found)
    assert all(f.problems[0].endswith("more than the 1000 this reader accepts") for f in found), [
        f.problems for f in found
    ]


def _zip_info(name: str, claimed: int) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name)
    info.file_size = claimed
    return info


def test_a_wheel_member_is_read_up_to_512_mib(tmp_path):
    path = tmp_path / "m.zip"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("p/a.so", b"elf" * 10)
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo("p/a.so")
        assert inspection._member(zf, info) == b"elf" * 10
        info.file_size = 512 << 20  # what the entry claims is what is checked first: 512 MiB is read...
        assert not str(inspection._member(zf, info)).startswith("member claims")
        info.file_size = (512 << 20) + 1  # ...one byte more is refused unread
        assert (
            inspection._member(zf, info)
            == f"member claims {(512 << 20) + 1} bytes, more than the {512 << 20} inspect reads"
        )


@pytest.mark.parametrize("compression", [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED])
def test_a_corrupt_wheel_member_is_a_finding_not_a_crash(tmp_path, compression):
    wheel = next(Path(WHEELS or "").glob("cuplug_cuda13-*.whl"))
    doctored = tmp_path / wheel.name
    with zipfile.ZipFile(wheel) as zin, zipfile.ZipFile(doctored, "w", compression) as zout:
        for item in zin.infolist():
            zout.writestr(item.filename, zin.read(item), compress_type=compression)
    with zipfile.ZipFile(doctored) as zf:
        info = next(i for i in zf.infolist() if i.filename.endswith("sm80/libcuplug_vector.so"))
    data = bytearray(doctored.read_bytes())
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    for k in range(start + 100, start + 132):  # bytes inside the member's data
        data[k] ^= 0x5A
    doctored.write_bytes(bytes(data))
    found = {f.variant: f for f in inspection.inspect_target(str(doctored))}
    assert found["sm80"].problems[0].startswith("member unreadable: ")
    assert sum(f.ok for f in found.values()) == 3  # the other members are still checked


def _wheel_of(tmp_path: Path, members: dict[str, bytes]) -> Path:
    path = tmp_path / "two-1-py3-none-manylinux_2_17_x86_64.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def test_an_unusable_manifest_in_a_wheel_does_not_hide_the_next_package(tmp_path):
    wheel = next(Path(WHEELS or "").glob("cuplug_cuda13-*.whl"))
    with zipfile.ZipFile(wheel) as zin:
        members = {i.filename: zin.read(i) for i in zin.infolist()}
    members = {"aaa_broken/manifest.json": b"{not json", **members}  # the wheel's first package
    found = inspection.inspect_target(str(_wheel_of(tmp_path, members)))
    assert found[0].where.endswith("!aaa_broken/manifest.json") and "unusable manifest" in found[0].problems[0]
    assert len(found) == 5 and sum(f.ok for f in found) == 4


def test_a_member_missing_from_a_wheel_does_not_hide_the_next_one(tmp_path):
    wheel = next(Path(WHEELS or "").glob("cuplug_cuda13-*.whl"))
    with zipfile.ZipFile(wheel) as zin:
        members = {i.filename: zin.read(i) for i in zin.infolist()}
    doc = json.loads(members["cuplug_cuda13/manifest.json"])
    first = doc["artifacts"][0]["file"]
    del members[f"cuplug_cuda13/{first}"]
    last = f"cuplug_cuda13/{doc['artifacts'][-1]['file']}"
    members[last] = members[last][:-1] + bytes([members[last][-1] ^ 1])
    found = inspection.inspect_target(str(_wheel_of(tmp_path, members)))
    assert found[0].problems == ["listed in the manifest, missing from the wheel"]
    assert any("size/sha256" in p for p in found[-1].problems) and sum(f.ok for f in found) == 2


def test_a_library_beside_an_unusable_manifest_is_inspected_alone(pkg):
    (pkg / "manifest.json").write_text("{not json")
    (f,) = inspection.inspect_target(str(pkg / "sm80" / "libcuplug_vector.so"))
    assert f.ok and f.expected is None and f.found["sass"] == ["sm_80"]


def test_a_file_that_is_not_for_the_manifests_cpu_is_a_finding(pkg):
    lib = pkg / "sm80" / "libcuplug_vector.so"
    data = bytearray(lib.read_bytes())
    data[18:20] = (183).to_bytes(2, "little")  # e_machine: aarch64
    lib.write_bytes(bytes(data))
    import hashlib

    _edit(pkg, _index(pkg, "sm80"), size=len(data), sha256=hashlib.sha256(data).hexdigest())
    (f,) = [f for f in inspection.inspect_target(str(pkg)) if f.variant == "sm80"]
    assert f.arch == "aarch64" and f.problems == ["arch: file is aarch64, manifest says x86_64"]


def _index(pkg: Path, variant: str) -> int:
    doc = json.loads((pkg / "manifest.json").read_text())
    return next(i for i, a in enumerate(doc["artifacts"]) if a["variant"] == variant)


def test_a_nested_manifest_json_in_a_wheel_is_not_a_backend_manifest(tmp_path):
    wheel = next(Path(WHEELS or "").glob("cuplug_cuda13-*.whl"))
    with zipfile.ZipFile(wheel) as zin:
        members = {i.filename: zin.read(i) for i in zin.infolist()}
    members["cuplug_cuda13/data/manifest.json"] = b"{an unrelated data file"
    found = inspection.inspect_target(str(_wheel_of(tmp_path, members)))
    assert len(found) == 4 and all(f.ok for f in found)


def test_only_a_whl_file_is_read_as_a_wheel(pkg, tmp_path):
    odd = tmp_path / "libvector.zip"  # a library under any other name is a library
    shutil.copy(pkg / "sm80" / "libcuplug_vector.so", odd)
    (f,) = inspection.inspect_target(str(odd))
    assert f.ok and f.found["sass"] == ["sm_80"]


def test_a_library_that_cannot_be_read_keeps_its_variant(pkg, monkeypatch):
    monkeypatch.setattr(inspection, "MAX_INSPECT_BYTES", 1000)
    (f,) = inspection.inspect_target(str(pkg / "sm80" / "libcuplug_vector.so"))
    assert f.variant == "sm80" and not f.ok and f.problems[0].endswith("more than the 1000 this reader accepts")


def test_a_name_too_long_to_examine_is_a_usage_error():
    with pytest.raises(inspection.InspectError, match="cannot be examined"):
        inspection.inspect_target("x" * 5000)


def test_an_entry_escaping_a_wheel_does_not_hide_the_ones_after_it(tmp_path):
    """A wheel's manifest whose first entry names a file outside its package: one finding, the rest still checked."""
    wheel = next(Path(WHEELS or "").glob("cuplug_cuda13-*.whl"))
    with zipfile.ZipFile(wheel) as zin:
        members = {i.filename: zin.read(i) for i in zin.infolist()}
    doc = json.loads(members["cuplug_cuda13/manifest.json"])
    doc["artifacts"][0]["file"] = "../outside.so"
    members["cuplug_cuda13/manifest.json"] = json.dumps(doc).encode()
    found = inspection.inspect_target(str(_wheel_of(tmp_path, members)))
    assert "must be a relative path inside the package" in found[0].problems[0]
    assert len(found) == 4 and sum(f.ok for f in found) == 3


def test_a_library_finds_its_own_entry_whatever_the_manifests_order(pkg):
    """An author's manifest may list its artifacts in any order: each library is compared with the entry that
    names it, never a neighbour's."""
    doc = json.loads((pkg / "manifest.json").read_text())
    for order in (doc["artifacts"], doc["artifacts"][::-1]):
        (pkg / "manifest.json").write_text(json.dumps({**doc, "artifacts": order}))
        for art in order:
            (f,) = inspection.inspect_target(str(pkg / art["file"]))
            assert f.ok and f.variant == art["variant"], (art["variant"], f.problems)


def test_a_wheel_is_read_up_to_its_100000th_member(tmp_path):
    """A zip of countless entries costs inspect no more than 100,000 of them: an artifact that is member 100,000
    is checked, one after it is as good as missing (and said so)."""
    wheel = next(Path(WHEELS or "").glob("cuplug_cuda13-*.whl"))
    with zipfile.ZipFile(wheel) as zin:
        members = {i.filename: zin.read(i) for i in zin.infolist()}
    doc = json.loads(members["cuplug_cuda13/manifest.json"])
    last, after = (f"cuplug_cuda13/{a['file']}" for a in doc["artifacts"][-2:])
    tail = {name: members.pop(name) for name in (last, after)}
    filler = {f"filler/{i}": b"" for i in range(100_000 - 1 - len(members))}
    found = inspection.inspect_target(str(_wheel_of(tmp_path, {**members, **filler, **tail})))
    assert [f.ok for f in found] == [True, True, True, False]
    assert found[3].problems == ["listed in the manifest, missing from the wheel"]
