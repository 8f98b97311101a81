"""``cuplug inspect``: what device code is really inside an artifact, checked against its manifest.

A target is a backend ``.so``, a directory holding ``manifest.json`` (a build
directory or an installed backend package), a backend wheel, or the name of an
installed backend package (``cuda13``, ``cuplug_cuda13``, ``cuplug-cuda13``).
The device code is read by cuplug's own reader (``fatbin``), never by dlopen.
"""

from __future__ import annotations

import dataclasses
import hashlib
import zipfile
import zlib
from pathlib import Path
from typing import Any

from . import fatbin, manifest
from .elfarch import machine_of

FIELDS = ("sass", "ptx", "ptx_isa")
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


def _facts(data: bytes | str) -> dict[str, Any]:
    code = fatbin.read_elf(data)
    if code is None:
        return {"sass": [], "ptx": [], "ptx_isa": None}
    return {"sass": list(code.sass), "ptx": list(code.ptx), "ptx_isa": code.ptx_isa}


def _variant(entry: dict[str, Any] | None) -> str | None:
    v = entry.get("variant") if isinstance(entry, dict) else None
    return v if isinstance(v, str) else None


def _check(where: str, data: bytes, entry: dict[str, Any] | None) -> Finding:
    try:
        found = _facts(data)
    except fatbin.FatbinError as exc:
        return Finding(where, _variant(entry), {}, entry, [f"unreadable device code: {exc}"])
    arch = machine_of(data[:20])  # the CPU the file is for, from its ELF header
    problems = []
    if entry is not None:
        try:
            manifest.Artifact.from_json(entry, "", "")
        except manifest.ManifestError as exc:
            problems.append(f"the loader refuses this manifest entry: {exc}")
        for key in FIELDS:
            if found[key] != entry.get(key):
                problems.append(f"{key}: file has {found[key]}, manifest says {entry.get(key)}")
        if entry.get("arch") and arch != entry["arch"]:  # manifests before `arch` have none
            problems.append(f"arch: file is {arch}, manifest says {entry['arch']}")
        sha = entry.get("sha256")
        if (
            len(data) != entry.get("size")
            or not isinstance(sha, str)
            or hashlib.sha256(data).hexdigest() != sha.lower()
        ):
            problems.append("size/sha256 differ from the manifest (file changed after the build)")
    expected = None if entry is None else {k: entry.get(k) for k in FIELDS}
    return Finding(where, _variant(entry), found, expected, problems, arch)


def _entries(data: dict[str, Any]) -> list[tuple[dict[str, Any] | None, str | None, str | None]]:
    """(entry, its file, what is wrong with it) for each manifest entry: a malformed one is a finding, not a crash."""
    out: list[tuple[dict[str, Any] | None, str | None, str | None]] = []
    for i, entry in enumerate(data.get("artifacts") or []):
        if not isinstance(entry, dict):
            out.append((None, None, f"manifest entry {i} is not an object"))
            continue
        f = entry.get("file")
        if not isinstance(f, str) or not f or "\0" in f or len(f) > 255 or f.startswith("/") or ".." in f.split("/"):
            out.append((entry, None, f"manifest entry {i}: file {f!r} is not a relative path inside the package"))
            continue
        out.append((entry, f, None))
    return out


def _broken(where: str, why: str) -> list[Finding]:
    return [Finding(where, None, {}, None, [why])]


def _read_manifest(directory: Path) -> dict[str, Any] | list[Finding]:
    try:
        return manifest.read_manifest_document(directory)
    except manifest.ManifestError as exc:
        return _broken(str(directory / "manifest.json"), f"unusable manifest: {exc}")


def _read_file(path: Path) -> bytes | str:
    """The file's bytes, or why they were not read (too large, not a regular file, unreadable)."""
    try:
        return manifest.read_bounded(path, MAX_INSPECT_BYTES)
    except manifest.ManifestError as exc:
        return str(exc)


def _from_manifest(base: Path, data: dict[str, Any]) -> list[Finding]:
    findings = []
    for entry, rel, problem in _entries(data):
        if rel is None:
            findings.append(Finding(str(base), _variant(entry), {}, None, [problem or "bad entry"]))
            continue
        path = base / rel
        if not path.is_file():
            findings.append(Finding(str(path), _variant(entry), {}, None, ["listed in the manifest, missing"]))
            continue
        data_or_why = _read_file(path)
        if isinstance(data_or_why, str):
            findings.append(Finding(str(path), _variant(entry), {}, None, [data_or_why]))
            continue
        findings.append(_check(str(path), data_or_why, entry))
    return findings


def _member(zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> bytes | str:
    """A wheel member's bytes, read in bounded chunks; or why not (claims to be huge, corrupt)."""
    if info.file_size > MAX_INSPECT_BYTES:
        return f"member claims {info.file_size} bytes, more than the {MAX_INSPECT_BYTES} inspect reads"
    chunks, total = [], 0
    try:
        with zf.open(info) as f:
            while chunk := f.read(1 << 20):
                total += len(chunk)
                if total > MAX_INSPECT_BYTES:
                    return f"member is larger than the {MAX_INSPECT_BYTES} bytes inspect reads"
                chunks.append(chunk)
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, NotImplementedError, ValueError, RuntimeError) as exc:
        return f"member unreadable: {exc}"
    return b"".join(chunks)


def _wheel(path: Path) -> list[Finding]:
    findings: list[Finding] = []
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
        return _broken(str(path), f"not a readable wheel (zip): {exc}")
    with zf:
        infos = zf.infolist()[:MAX_WHEEL_MEMBERS]
        by_name = {i.filename: i for i in infos}
        manifests = [n for n in by_name if n.endswith("/manifest.json") and n.count("/") == 1]
        if not manifests:
            raise InspectError(f"{path.name} holds no <package>/manifest.json: not a cuplug backend wheel")
        for m in manifests:
            base = m.rsplit("/", 1)[0]
            raw = _member(zf, by_name[m])
            try:
                if isinstance(raw, str) or len(raw) > manifest.MAX_MANIFEST_BYTES:
                    raise manifest.ManifestError(raw if isinstance(raw, str) else "larger than 1 MiB")
                data = manifest.parse_json(raw, f"{path.name}!{m}")
                if not isinstance(data, dict) or not isinstance(data.get("artifacts", []), list):
                    raise manifest.ManifestError("not a manifest object with an artifacts list")
            except manifest.ManifestError as exc:
                findings += _broken(f"{path.name}!{m}", f"unusable manifest: {exc}")
                continue
            for entry, rel, problem in _entries(data):
                if rel is None:
                    findings.append(Finding(f"{path.name}!{m}", _variant(entry), {}, None, [problem or "bad entry"]))
                    continue
                member = f"{base}/{rel}"
                where = f"{path.name}!{member}"
                if member not in by_name:
                    findings.append(
                        Finding(where, _variant(entry), {}, None, ["listed in the manifest, missing from the wheel"])
                    )
                    continue
                got = _member(zf, by_name[member])
                if isinstance(got, str):
                    findings.append(Finding(where, _variant(entry), {}, None, [got]))
                    continue
                findings.append(_check(where, got, entry))
    return findings


def _manifest_entry_for(so: Path) -> dict[str, Any] | None:
    """The manifest entry naming this file, from <variant>/../manifest.json, if there is one."""
    try:
        directory = so.resolve().parent.parent
        if not (directory / "manifest.json").is_file():
            return None
        data = manifest.read_manifest_document(directory)
        for entry, rel, _ in _entries(data):
            if rel is not None and (directory / rel).resolve() == so.resolve():
                return entry
    except (manifest.ManifestError, OSError, RuntimeError, ValueError):
        return None
    return None


def _installed(name: str) -> list[Finding] | None:
    wanted = name.replace("-", "_")
    for pkg in manifest.all_installed_packages():
        if wanted in (pkg.cuda, pkg.module):
            if pkg.error:
                return [Finding(str(pkg.directory), None, {}, None, [pkg.error])]
            data = _read_manifest(pkg.directory)
            return data if isinstance(data, list) else _from_manifest(pkg.directory, data)
    return None


def inspect_target(target: str | None) -> list[Finding]:
    """Findings for one target; every installed backend package when target is None."""
    if target is None:
        packages = manifest.all_installed_packages()
        if not packages:
            raise InspectError("no backend package installed (pip install 'cuplug[cuda12]' or 'cuplug[cuda13]')")
        return [f for p in packages for f in (_installed(p.module) or [])]
    path = Path(target)
    try:
        is_dir, is_file = path.is_dir(), path.is_file()
    except (OSError, ValueError) as exc:
        raise InspectError(f"{target!r} cannot be examined: {exc}") from None
    if is_dir:
        if not (path / "manifest.json").exists():
            raise InspectError(f"{path} holds no manifest.json")
        data = _read_manifest(path)
        return data if isinstance(data, list) else _from_manifest(path, data)
    if is_file:
        if path.suffix == ".whl":
            return _wheel(path)
        entry = _manifest_entry_for(path)
        got = _read_file(path)
        if isinstance(got, str):
            return [Finding(str(path), _variant(entry), {}, None, [got])]
        return [_check(str(path), got, entry)]
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
