"""``cuplug inspect``: what device code is really inside an artifact, checked against its manifest.

A target is a backend ``.so``, a directory holding ``manifest.json`` (a build
directory or an installed backend package), a backend wheel, or the name of an
installed backend package (``cuda13``, ``cuplug_cuda13``, ``cuplug-cuda13``).
The device code is read by cuplug's own reader (``fatbin``), never by dlopen.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import zipfile
from pathlib import Path
from typing import Any

from . import fatbin, manifest
from .elfarch import machine_of

FIELDS = ("sass", "ptx", "ptx_isa")


class InspectError(ValueError):
    """The target does not exist or is not something inspect understands (usage error)."""


@dataclasses.dataclass
class Finding:
    where: str  # file inspected (path, or wheel!member)
    variant: str | None
    found: dict[str, Any]  # sass, ptx, ptx_isa read from the file
    expected: dict[str, Any] | None  # from the manifest; None when there is none
    problems: list[str]
    arch: str | None = None  # CPU architecture from the ELF header (x86_64, aarch64)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"ok": self.ok}


def _facts(data: bytes | str) -> dict[str, Any]:
    code = fatbin.read_elf(data)
    if code is None:
        return {"sass": [], "ptx": [], "ptx_isa": None}
    return {"sass": list(code.sass), "ptx": list(code.ptx), "ptx_isa": code.ptx_isa}


def _check(where: str, data: bytes, entry: dict[str, Any] | None) -> Finding:
    try:
        found = _facts(data)
    except fatbin.FatbinError as exc:
        variant = entry.get("variant") if entry else None
        return Finding(where, variant, {}, entry, [f"unreadable device code: {exc}"])
    arch = machine_of(data[:20])  # the CPU the file is for, from its ELF header
    problems = []
    if entry is not None:
        for key in FIELDS:
            if found[key] != entry.get(key):
                problems.append(f"{key}: file has {found[key]}, manifest says {entry.get(key)}")
        if entry.get("arch") and arch != entry["arch"]:  # manifests before `arch` have none
            problems.append(f"arch: file is {arch}, manifest says {entry['arch']}")
        if len(data) != entry.get("size") or hashlib.sha256(data).hexdigest() != entry.get("sha256"):
            problems.append("size/sha256 differ from the manifest (file changed after the build)")
    expected = None if entry is None else {k: entry.get(k) for k in FIELDS}
    return Finding(where, entry.get("variant") if entry else None, found, expected, problems, arch)


def _from_manifest(base: Path, data: dict[str, Any]) -> list[Finding]:
    findings = []
    for entry in data.get("artifacts", ()):
        path = base / entry["file"]
        if not path.is_file():
            findings.append(Finding(str(path), entry["variant"], {}, None, ["listed in the manifest, missing"]))
            continue
        findings.append(_check(str(path), path.read_bytes(), entry))
    return findings


def _wheel(path: Path) -> list[Finding]:
    findings = []
    with zipfile.ZipFile(path) as zf:
        names = zf.namelist()
        manifests = [n for n in names if n.endswith("/manifest.json") and n.count("/") == 1]
        if not manifests:
            raise InspectError(f"{path.name} holds no <package>/manifest.json: not a cuplug backend wheel")
        for m in manifests:
            base = m.rsplit("/", 1)[0]
            for entry in json.loads(zf.read(m)).get("artifacts", ()):
                member = f"{base}/{entry['file']}"
                if member not in names:
                    findings.append(
                        Finding(
                            f"{path.name}!{member}",
                            entry["variant"],
                            {},
                            None,
                            ["listed in the manifest, missing from the wheel"],
                        )
                    )
                    continue
                findings.append(_check(f"{path.name}!{member}", zf.read(member), entry))
    return findings


def _manifest_entry_for(so: Path) -> dict[str, Any] | None:
    """The manifest entry naming this file, from <variant>/../manifest.json, if there is one."""
    mpath = so.resolve().parent.parent / "manifest.json"
    if not mpath.is_file():
        return None
    for entry in json.loads(mpath.read_text()).get("artifacts", ()):
        if (mpath.parent / entry["file"]).resolve() == so.resolve():
            return entry  # type: ignore[no-any-return]
    return None


def _installed(name: str) -> list[Finding] | None:
    wanted = name.replace("-", "_")
    for pkg in manifest.installed_packages():
        if wanted in (pkg.cuda, pkg.module):
            if pkg.error:
                return [Finding(str(pkg.directory), None, {}, None, [pkg.error])]
            return _from_manifest(pkg.directory, json.loads((pkg.directory / "manifest.json").read_text()))
    return None


def inspect_target(target: str | None) -> list[Finding]:
    """Findings for one target; every installed backend package when target is None."""
    if target is None:
        packages = manifest.installed_packages()
        if not packages:
            raise InspectError("no backend package installed (pip install 'cuplug[cuda12]' or 'cuplug[cuda13]')")
        return [f for p in packages for f in (_installed(p.module) or [])]
    path = Path(target)
    if path.is_dir():
        mpath = path / "manifest.json"
        if not mpath.is_file():
            raise InspectError(f"{path} holds no manifest.json")
        return _from_manifest(path, json.loads(mpath.read_text()))
    if path.is_file():
        if path.suffix == ".whl":
            return _wheel(path)
        entry = _manifest_entry_for(path)
        return [_check(str(path), path.read_bytes(), entry)]
    found = _installed(target)
    if found is None:
        raise InspectError(f"{target!r} is neither a file, a directory nor an installed backend package")
    return found


def format_findings(findings: list[Finding]) -> str:
    lines = []
    for f in findings:
        sass = ",".join(f.found.get("sass", [])) or "-"
        ptx = ",".join(f.found.get("ptx", [])) or "-"
        isa = f" (ISA {f.found['ptx_isa']})" if f.found.get("ptx_isa") else ""
        verdict = "ok" if f.ok else "MISMATCH"
        if f.expected is None and f.ok:
            verdict = "no manifest to compare"
        lines.append(f"{f.variant or '?':7} {verdict:9} {f.where}")
        lines.append(f"        CPU  {f.arch or '?'}")
        lines.append(f"        SASS {sass}")
        lines.append(f"        PTX  {ptx}{isa}")
        lines.extend(f"        ! {p}" for p in f.problems)
    return "\n".join(lines)
