"""``cuplug inspect``: what device code is really inside an artifact, checked against its manifest.

A target is a backend ``.so``, a directory holding ``manifest.json`` (a build
directory or an installed backend package), a backend wheel, or the name of an
installed backend package (``cuda13``, ``cuplug_cuda13``, ``cuplug-cuda13``).
The device code is read by cuplug's own reader (``contract.fatbin``), never by
dlopen; the manifest through ``contract.manifest`` (the loader's own parser, so an
entry the loader would refuse is a finding here too).
"""

from __future__ import annotations

import dataclasses
import os
import zipfile
import zlib
from pathlib import Path
from typing import Any

from ..contract import fatbin, manifest
from ..contract.elfarch import machine_of
from ..contract.manifest import Artifact, ManifestError

FIELDS = ("sass", "ptx", "ptx_isa", "lto")
# An artifact is read whole to parse its ELF sections: larger members/files are refused, never read.
MAX_INSPECT_BYTES = 512 << 20
MAX_WHEEL_MEMBERS = 100_000


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


def _facts(data: bytes) -> dict[str, Any]:
    # the device code, and an LTO variant's LTO-IR (docs/lto.md): one parse of the ELF
    sections = fatbin.elf_sections(data, (fatbin.FATBIN_SECTION, fatbin.RELOCATABLE_SECTION))
    payload, relocatable = sections[fatbin.FATBIN_SECTION], sections[fatbin.RELOCATABLE_SECTION]
    code = fatbin.device_code(payload) if payload is not None else None
    lto = list(fatbin.lto_targets(relocatable)) if relocatable else []
    if code is None:
        return {"sass": [], "ptx": [], "ptx_isa": None, "lto": lto}
    return {"sass": list(code.sass), "ptx": list(code.ptx), "ptx_isa": code.ptx_isa, "lto": lto}


def _expected(art: Artifact) -> dict[str, Any]:
    return {"sass": list(art.sass), "ptx": list(art.ptx), "ptx_isa": art.ptx_isa, "lto": list(art.lto)}


def _check(where: str, data: bytes, art: Artifact | None) -> Finding:
    """The facts of one file, and every way they differ from its manifest entry."""
    variant = art.variant if art else None
    try:
        found = _facts(data)
    except fatbin.MissingDependency as exc:  # this environment's fault: not said of the file
        return Finding(where, variant, {}, None if art is None else _expected(art), [f"cannot read it here: {exc}"])
    except fatbin.FatbinError as exc:
        return Finding(where, variant, {}, None if art is None else _expected(art), [f"unreadable device code: {exc}"])
    arch = machine_of(data[:20])  # the CPU the file is for, from its ELF header
    if art is None:
        return Finding(where, None, found, None, [], arch)
    expected = _expected(art)
    problems = [f"{k}: file has {found[k]}, manifest says {expected[k]}" for k in FIELDS if found[k] != expected[k]]
    if art.arch and arch != art.arch:  # manifests from before `arch` have none
        problems.append(f"arch: file is {arch}, manifest says {art.arch}")
    if manifest.mismatch(art, len(data), manifest.sha256_hex(data)):
        problems.append("size/sha256 differ from the manifest (file changed after the build)")
    return Finding(where, variant, found, expected, problems, arch)


def _broken(where: str, why: str, variant: str | None = None) -> Finding:
    return Finding(where, variant, {}, None, [why])


def _refused_entries(where: str, found: manifest.Manifest) -> list[Finding]:
    """A finding per manifest entry the loader refuses (it names the entry and the field)."""
    return [_broken(where, why) for why in found.problems]


def _read_file(path: str) -> bytes | str:
    """The file's bytes, or why they were not read (too large, not a regular file, unreadable)."""
    try:
        return manifest.read_bounded(path, MAX_INSPECT_BYTES)
    except ManifestError as exc:
        return str(exc)


def _directory(base: str) -> list[Finding]:
    where = os.path.join(base, manifest.FILE_NAME)
    try:
        found = manifest.read(base)
    except ManifestError as exc:
        return [_broken(where, f"unusable manifest: {exc}")]
    findings = _refused_entries(where, found)
    for art in found.artifacts:
        if why := manifest.outside_problem(art.file):
            findings.append(_broken(base, why, art.variant))
            continue
        path = os.path.join(base, art.file)
        if not os.path.isfile(path):
            findings.append(_broken(path, "listed in the manifest, missing", art.variant))
            continue
        data = _read_file(path)
        findings.append(_broken(path, data, art.variant) if isinstance(data, str) else _check(path, data, art))
    return findings


def _member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, limit: int = MAX_INSPECT_BYTES) -> bytes | str:
    """A wheel member's bytes, or why not (claims to be larger than ``limit``, corrupt)."""
    if info.file_size > limit:
        return f"member claims {info.file_size} bytes, more than the {limit} inspect reads"
    try:
        with zf.open(info) as f:
            return f.read()  # zipfile never returns more than the entry's file_size, checked above
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, NotImplementedError, ValueError, RuntimeError) as exc:
        return f"member unreadable: {exc}"


def _wheel(path: Path) -> list[Finding]:
    findings: list[Finding] = []
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
        return [_broken(str(path), f"not a readable wheel (zip): {exc}")]
    with zf:
        by_name = {i.filename: i for i in zf.infolist()[:MAX_WHEEL_MEMBERS]}
        manifests = [n for n in by_name if n.endswith(f"/{manifest.FILE_NAME}") and n.count("/") == 1]
        if not manifests:
            raise InspectError(f"{path.name} holds no <package>/manifest.json: not a cuplug backend wheel")
        for m in manifests:
            base, where = m.rsplit("/", 1)[0], f"{path.name}!{m}"
            raw = _member(zf, by_name[m], manifest.MAX_MANIFEST_BYTES)
            try:
                if isinstance(raw, str):
                    raise ManifestError(raw)
                found = manifest.parse(raw, where)
            except ManifestError as exc:
                findings.append(_broken(where, f"unusable manifest: {exc}"))
                continue
            findings += _refused_entries(where, found)
            for art in found.artifacts:
                if why := manifest.outside_problem(art.file):
                    findings.append(_broken(where, why, art.variant))
                    continue
                member = f"{base}/{art.file}"
                if member not in by_name:
                    findings.append(
                        _broken(f"{path.name}!{member}", "listed in the manifest, missing from the wheel", art.variant)
                    )
                    continue
                got = _member(zf, by_name[member])
                where_member = f"{path.name}!{member}"
                findings.append(
                    _broken(where_member, got, art.variant) if isinstance(got, str) else _check(where_member, got, art)
                )
    return findings


def _manifest_entry_for(so: Path) -> Artifact | None:
    """The manifest entry naming this file, from <variant>/../manifest.json, if there is one."""
    try:
        directory = os.path.dirname(os.path.dirname(os.path.realpath(so)))
        if not os.path.isfile(os.path.join(directory, manifest.FILE_NAME)):
            return None
        real = os.path.realpath(so)
        found = manifest.read(directory)
        return next((a for a in found.artifacts if os.path.realpath(a.path) == real), None)
    except (ManifestError, OSError, ValueError):
        return None


def _installed(name: str) -> list[Finding] | None:
    from ..runtime.discovery import all_installed_packages

    wanted = name.replace("-", "_")
    for pkg in all_installed_packages():
        if wanted in (pkg.cuda, pkg.module):
            return [_broken(pkg.directory, pkg.error)] if pkg.error else _directory(pkg.directory)
    return None


def inspect_target(target: str | None) -> list[Finding]:
    """Findings for one target; every installed backend package when target is None."""
    if target is None:
        from ..runtime.discovery import all_installed_packages

        packages = all_installed_packages()
        if not packages:
            raise InspectError("no backend package installed (pip install a CUDA extra, e.g. 'cuplug[cuda13]')")
        return [f for p in packages for f in (_installed(p.module) or [])]
    path = Path(target)
    try:
        is_dir, is_file = path.is_dir(), path.is_file()
    except OSError as exc:  # e.g. a name too long (pathlib answers False for a NUL in it)
        raise InspectError(f"{target!r} cannot be examined: {exc}") from None
    if is_dir:
        if not (path / manifest.FILE_NAME).exists():
            raise InspectError(f"{path} holds no manifest.json")
        return _directory(str(path))
    if is_file:
        if path.suffix == ".whl":
            return _wheel(path)
        art = _manifest_entry_for(path)
        got = _read_file(str(path))
        return [
            _broken(str(path), got, art.variant if art else None)
            if isinstance(got, str)
            else _check(str(path), got, art)
        ]
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
        if f.found.get("lto"):
            lines.append(f"        LTO  {','.join(f.found['lto'])} (linked at load by nvJitLink)")
        lines.extend(f"        ! {p}" for p in f.problems)
    return "\n".join(lines)
