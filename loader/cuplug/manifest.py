"""Backend manifests and who may serve a backend: read without dlopen, without import.

Trust rule (DESIGN.md, "Selection and loading" 4). A backend name is owned by one
distribution: ``vector`` by cuplug itself (the distribution whose dist-info lies beside
the running ``cuplug`` package); any other name by the one installed distribution that
registers it in the entry-point group ``cuplug.cpu_backends`` (two claimants: neither
is trusted). A backend package (``cuplug-cuda13``, an author's ``scankit-cuda13``) is
used for that backend only when

- the owner declares it as one of its extras (``Requires-Dist: cuplug-cuda13==0.1.0;
  extra == "cuda13"``), and
- it registers itself in ``cuplug.backends`` (name: its module, value: its package),

and its files are located through its own ``*.dist-info`` (the directory the
dist-info lies in, and its RECORD), never through ``sys.path`` lookups of the package
or an import. The CPU twin lies in the owner's own distribution and is verified like a
CUDA artifact against the sha256 and size the installer recorded in the owner's
RECORD. Every other registration is shown, with why it was not trusted
(:class:`Refused`).

Distributions are looked up in the sys.path entries in order (the first of a name
wins, as for ``importlib.metadata``), except the implicit ``sys.path[0]`` (the
running script's directory or the working directory), so a folder or a dist-info
planted beside a script cannot stand in for an installed package.

Every read is bounded (size, count, JSON depth) and every field is type- and
range-checked: a bad manifest entry is a :class:`ManifestError`, never another
exception.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import stat
import sys
from pathlib import Path
from typing import Any, NamedTuple

MANIFEST_SCHEMA = 1
ENTRY_POINT_GROUP = "cuplug.backends"
CPU_ENTRY_POINT_GROUP = "cuplug.cpu_backends"
OWN_DISTRIBUTION = "cuplug"
OWN_BACKEND = "vector"

# Bounds on what is read from disk: a manifest is a few KiB, a RECORD a few hundred KiB.
MAX_MANIFEST_BYTES = 1 << 20
MAX_METADATA_BYTES = 4 << 20
MAX_ARTIFACTS = 256
MAX_TARGETS = 64
MAX_ARTIFACT_BYTES = 1 << 31  # 2 GiB: read into a sealed in-memory file before dlopen
MAX_DIRECTORY_ENTRIES = 100_000

_BACKEND = re.compile(r"[a-z][a-z0-9_]{0,63}")
_VARIANT = re.compile(r"[a-z0-9][a-z0-9_]{0,31}")
_TARGET = re.compile(r"(?:sm|compute)_\d{2,4}[af]?")
_ISA = re.compile(r"\d{1,3}\.\d{1,3}")
_CUDA_VERSION = re.compile(r"\d{1,3}(?:\.\d{1,3}){0,2}")
_CUDA_MAJOR = re.compile(r"cuda\d{1,3}")
_SHA256 = re.compile(r"[0-9a-fA-F]{64}")
_ARCH = re.compile(r"[a-z0-9_]{1,32}")
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*){0,15}")
_DIST_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,198}[A-Za-z0-9])?")


class ManifestError(ValueError):
    """A manifest (or a dist-info file) is missing, unreadable, too large or malformed."""


def normalize(name: str) -> str:
    """PEP 503 name normalization, with '_' (the dist-info spelling): 'Cuplug-CUDA13' -> 'cuplug_cuda13'."""
    name = name.lower().replace("-", "_").replace(".", "_")
    while "__" in name:
        name = name.replace("__", "_")
    return name


def read_bounded(path: Path | str, limit: int) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes; ManifestError otherwise.

    Opened non-blocking, so a FIFO never hangs the caller; a device (/dev/zero), a
    directory or anything larger than ``limit`` is refused before it is read whole.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
    except FileNotFoundError as exc:
        raise ManifestError(f"{path} is missing") from exc
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        raise ManifestError(f"{path} cannot be opened: {_why(exc)}") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ManifestError(f"{path} is not a regular file")
        if st.st_size > limit:
            raise ManifestError(f"{path} is {st.st_size} bytes, more than the {limit} this reader accepts")
        chunks, total = [], 0
        while True:
            chunk = os.read(fd, min(1 << 20, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise ManifestError(f"{path} grew past {limit} bytes while it was read")
        return b"".join(chunks)
    except OSError as exc:
        raise ManifestError(f"{path} cannot be read: {_why(exc)}") from exc
    finally:
        os.close(fd)


def _why(exc: BaseException) -> str:
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__


def _no_constant(name: str) -> Any:
    raise ManifestError(f"{name} is not valid JSON (NaN and Infinity are not numbers a manifest may hold)")


def parse_json(data: bytes, where: str) -> Any:
    """JSON with every error (bad UTF-8, syntax, NaN/Infinity, nesting too deep) a ManifestError."""
    try:
        return json.loads(data.decode("utf-8"), parse_constant=_no_constant)
    except ManifestError as exc:
        raise ManifestError(f"{where}: {exc}") from None
    except RecursionError:
        raise ManifestError(f"{where}: JSON nested too deeply") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise ManifestError(f"{where} is not valid JSON: {exc}") from None


def _int(d: dict[str, Any], key: str, lo: int, hi: int) -> int:
    v = d.get(key)
    if type(v) is not int or not lo <= v <= hi:
        raise ManifestError(f"{key} {_show(v)} is not an integer in [{lo}, {hi}]")
    return v


def _str(d: dict[str, Any], key: str, pattern: re.Pattern[str], optional: bool = False) -> str | None:
    v = d.get(key)
    if v is None and optional:
        return None
    if not isinstance(v, str) or not pattern.fullmatch(v):
        raise ManifestError(
            f"{key} {_show(v)} is not {'absent or ' if optional else ''}a string like {pattern.pattern}"
        )
    return v


def _targets(d: dict[str, Any], key: str) -> tuple[str, ...]:
    v = d.get(key)
    if (
        not isinstance(v, list)
        or len(v) > MAX_TARGETS
        or not all(isinstance(t, str) and _TARGET.fullmatch(t) for t in v)
    ):
        raise ManifestError(f"{key} {_show(v)} is not a list of up to {MAX_TARGETS} targets like sm_80 / compute_75")
    return tuple(v)


def _show(v: object) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _file(d: dict[str, Any]) -> str:
    v = d.get("file")
    if not isinstance(v, str) or not 0 < len(v) <= 255 or "\0" in v or "\\" in v:
        raise ManifestError(f"file {_show(v)} is not a relative path of 1 to 255 characters without NUL")
    return v


@dataclasses.dataclass(frozen=True)
class Artifact:
    backend: str
    variant: str
    file: str  # relative to the package directory
    sha256: str  # lowercase hex
    size: int
    sass: tuple[str, ...]  # e.g. ("sm_80",)
    ptx: tuple[str, ...]  # e.g. ("compute_75",)
    ptx_isa: str | None  # e.g. "8.4"
    cuda_version: str  # toolkit, e.g. "12.4"
    min_driver: int  # cuDriverGetVersion the runtime needs, e.g. 12000
    abi: int
    cuda: str = ""  # package's CUDA major, e.g. "cuda12"
    package_dir: str = ""  # absolute directory the manifest was read from
    arch: str = ""  # CPU architecture from the file's ELF header at build time ("" in older manifests)

    @classmethod
    def from_json(cls, d: object, cuda: str, package_dir: str) -> Artifact:
        """One manifest entry, every field checked for type and range (ManifestError names the first bad one)."""
        if not isinstance(d, dict):
            raise ManifestError(f"artifact entry {_show(d)} is not an object")
        sha = _str(d, "sha256", _SHA256)
        assert sha is not None
        return cls(
            backend=str(_str(d, "backend", _BACKEND)),
            variant=str(_str(d, "variant", _VARIANT)),
            file=_file(d),
            sha256=sha.lower(),
            size=_int(d, "size", 64, MAX_ARTIFACT_BYTES),
            sass=_targets(d, "sass"),
            ptx=_targets(d, "ptx"),
            ptx_isa=_str(d, "ptx_isa", _ISA, optional=True),
            cuda_version=str(_str(d, "cuda_version", _CUDA_VERSION)),
            min_driver=_int(d, "min_driver", 0, 999_999),
            abi=_int(d, "abi", 0, 1_000_000),
            arch=_str(d, "arch", _ARCH, optional=True) or "",  # "" in manifests from before the field
            cuda=cuda,
            package_dir=package_dir,
        )

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        del d["cuda"], d["package_dir"]
        if not self.arch:
            del d["arch"]
        d["sass"], d["ptx"] = list(self.sass), list(self.ptx)
        return d


@dataclasses.dataclass(frozen=True)
class InstalledPackage:
    cuda: str
    module: str
    directory: Path
    artifacts: tuple[Artifact, ...] = ()
    error: str | None = None  # why its manifest could not be used at all
    distribution: str = ""  # e.g. "cuplug_cuda13"
    problems: tuple[str, ...] = ()  # manifest entries that were refused (the rest are used)


class Refused(NamedTuple):
    """An installed registration cuplug does not trust, and why (shown by doctor)."""

    distribution: str
    where: str  # its dist-info directory
    registration: str  # e.g. "cuplug.backends: zzz = zzz_unrelated"
    reason: str

    def to_json(self) -> dict[str, str]:
        return dict(self._asdict())


def read_manifest_document(directory: Path) -> dict[str, Any]:
    """The manifest.json of ``directory`` as a dict of schema 1 (bounded read; ManifestError otherwise)."""
    path = directory / "manifest.json"
    data = parse_json(read_bounded(path, MAX_MANIFEST_BYTES), str(path))
    if not isinstance(data, dict) or data.get("schema") != MANIFEST_SCHEMA:
        schema = data.get("schema") if isinstance(data, dict) else "?"
        raise ManifestError(
            f"{path}: schema {_show(schema)} is not {MANIFEST_SCHEMA}; upgrade cuplug or reinstall the backend"
        )
    arts = data.get("artifacts", [])
    if not isinstance(arts, list):
        raise ManifestError(f"{path}: artifacts {_show(arts)} is not a list")
    if len(arts) > MAX_ARTIFACTS:
        raise ManifestError(f"{path}: {len(arts)} artifacts, more than {MAX_ARTIFACTS}")
    return data


def read_manifest_entries(directory: Path, cuda: str = "") -> tuple[tuple[Artifact, ...], tuple[str, ...], str]:
    """(usable artifacts, one problem per refused entry, the manifest's CUDA major)."""
    data = read_manifest_document(directory)
    declared = data.get("cuda")
    if declared is not None:
        if not isinstance(declared, str) or not _CUDA_MAJOR.fullmatch(declared):
            raise ManifestError(f"{directory / 'manifest.json'}: cuda {_show(declared)} is not like cuda13")
        cuda = declared
    good, bad = [], []
    for i, entry in enumerate(data["artifacts"] if "artifacts" in data else []):
        try:
            good.append(Artifact.from_json(entry, cuda, str(directory)))
        except ManifestError as exc:
            label = entry.get("variant") if isinstance(entry, dict) and isinstance(entry.get("variant"), str) else None
            bad.append(f"manifest entry {i}" + (f" ({_show(label)})" if label else "") + f": {exc}")
    return tuple(good), tuple(bad), cuda


def read_manifest(directory: Path, cuda: str = "") -> tuple[Artifact, ...]:
    """Every artifact of a manifest; any refused entry is a ManifestError (strict, for tools)."""
    good, bad, _ = read_manifest_entries(directory, cuda)
    if bad:
        raise ManifestError(f"{directory / 'manifest.json'}: {bad[0]}")
    return good


# ---- installed distributions (dist-info), read without importlib.metadata --------------------------


class EntryPoint(NamedTuple):
    name: str
    value: str


class Distribution:
    """One ``*.dist-info`` directory; its files are read lazily, bounded, and never raise."""

    def __init__(self, name: str, dist_info: Path | str) -> None:
        self.name = name  # normalized
        self._dist_info = dist_info
        self._entry_points: dict[str, list[EntryPoint]] | None = None
        self._record: dict[str, tuple[str, str]] | None = None
        self.record_error: str | None = None

    @property
    def dist_info(self) -> Path:
        if not isinstance(self._dist_info, Path):
            self._dist_info = Path(self._dist_info)
        return self._dist_info

    @property
    def site(self) -> Path:
        return self.dist_info.parent

    def __repr__(self) -> str:
        return f"<Distribution {self.name} at {self.dist_info}>"

    def _text(self, member: str) -> str | None:
        try:
            return read_bounded(os.path.join(self._dist_info, member), MAX_METADATA_BYTES).decode("utf-8", "replace")
        except ManifestError as exc:
            if member == "RECORD":
                self.record_error = str(exc)
            return None

    def entry_points(self, group: str) -> list[EntryPoint]:
        """The INI format of PyPA's entry points specification."""
        if self._entry_points is None:
            parsed: dict[str, list[EntryPoint]] = {}
            section = None
            for line in (self._text("entry_points.txt") or "").splitlines():
                line = line.strip()
                if not line or line[0] in "#;":
                    continue
                if line.startswith("[") and line.endswith("]"):
                    section = line[1:-1].strip()
                elif section is not None and "=" in line:
                    name, _, value = line.partition("=")
                    parsed.setdefault(section, []).append(EntryPoint(name.strip(), value.strip()))
            self._entry_points = parsed
        return self._entry_points.get(group, [])

    def extras(self) -> set[str]:
        """Normalized names of the distributions this one requires only under an extra (its optional backends)."""
        found = set()
        text = self._text("METADATA") or ""
        head = text.split("\n\n", 1)[0]  # the headers; the description follows the first blank line
        for line in head.splitlines():
            if not line.lower().startswith("requires-dist:"):
                continue
            req, _, marker = line.split(":", 1)[1].partition(";")
            name = req.strip()
            for stop in " <>=!~[(@":
                name = name.split(stop, 1)[0]
            if name and "extra" in marker and "==" in marker.replace(" ", "").split("extra", 1)[1][:2]:
                found.add(normalize(name))
        return found

    def record(self) -> dict[str, tuple[str, str]]:
        """RECORD: relative path -> (its hash field, its size field), as written."""
        if self._record is None:
            rows: dict[str, tuple[str, str]] = {}
            for line in (self._text("RECORD") or "").splitlines():
                parts = line.rsplit(",", 2)
                if len(parts) == 3 and parts[0]:
                    rows[parts[0].strip('"')] = (parts[1], parts[2])
            self._record = rows
        return self._record

    def recorded(self, path: str) -> tuple[str | None, int | None] | None:
        """(sha256 hex or None, size or None) that RECORD holds for ``path``; None when it does not list it."""
        entry = self.record().get(path)
        if entry is None:
            return None
        digest, size = entry
        return _record_sha256(digest), int(size) if size.isdigit() and len(size) < 16 else None


def _record_sha256(field: str) -> str | None:
    """'sha256=<urlsafe base64, unpadded>' -> hex; None for any other or a malformed hash."""
    import binascii

    algo, _, value = field.partition("=")
    if algo != "sha256" or not value:
        return None
    try:
        raw = binascii.a2b_base64(value.replace("-", "+").replace("_", "/") + "=" * (-len(value) % 4))
    except (binascii.Error, ValueError):
        return None
    return raw.hex() if len(raw) == 32 else None


def search_path() -> list[str]:
    """The sys.path entries distributions are looked up in: all but the implicit sys.path[0]."""
    entries = list(sys.path)
    if entries and not getattr(sys.flags, "safe_path", False):
        entries = entries[1:]  # the script's directory, or '' / the cwd for -c and -m
    return [e for e in entries if e]


class Installed:
    """The distributions visible to this process, first of each name on the search path."""

    def __init__(self, path: list[str] | None = None) -> None:
        self.dists: dict[str, Distribution] = {}
        for entry in search_path() if path is None else path:
            try:
                with os.scandir(entry) as it:
                    names = []
                    for i, e in enumerate(it):
                        if i >= MAX_DIRECTORY_ENTRIES:
                            break
                        if e.name.endswith(".dist-info"):
                            names.append(e.name)
            except (OSError, ValueError):
                continue
            for meta in sorted(names):
                name = normalize(meta[: -len(".dist-info")].split("-")[0])
                if name and name not in self.dists:
                    self.dists[name] = Distribution(name, os.path.join(os.path.abspath(entry), meta))

    def entry_points(self, group: str) -> list[tuple[Distribution, EntryPoint]]:
        return [(d, ep) for d in self.dists.values() for ep in d.entry_points(group)]


def entry_points(group: str) -> list[EntryPoint]:
    """The entry points of ``group`` of every installed distribution (first of a name on the search path)."""
    return [ep for _, ep in Installed().entry_points(group)]


def own_distribution() -> Distribution | None:
    """cuplug's own dist-info: beside the package that is running (never looked up elsewhere)."""
    site = Path(__file__).resolve().parent.parent
    try:
        names = sorted(n for n in os.listdir(site) if n.endswith(".dist-info"))
    except OSError:
        return None
    for meta in names:
        if normalize(meta[: -len(".dist-info")].split("-")[0]) == OWN_DISTRIBUTION:
            return Distribution(OWN_DISTRIBUTION, site / meta)
    return None


class Owner(NamedTuple):
    distribution: Distribution
    package: str  # the directory (relative to the site) that holds the CPU twin, e.g. "cuplug/_cpu"


class Discovery(NamedTuple):
    """Everything installed that bears on one backend name."""

    backend: str
    owner: Owner | None
    packages: tuple[InstalledPackage, ...]
    refused: tuple[Refused, ...]
    cpu: Artifact | None  # the CPU twin, from the owner's RECORD
    cpu_problem: str | None  # why there is no CPU twin to verify


def _cuda_of_name(name: str) -> str:
    """'cuplug_cuda13' -> 'cuda13': the major a package is named for, when its manifest cannot say."""
    m = re.search(r"cuda\d+$", name)
    return m.group(0) if m else name


def _module_dir(value: str) -> str | None:
    """'scankit' -> 'scankit', 'a.b' -> 'a/b'; None for anything that is not a plain module path."""
    return value.replace(".", "/") if len(value) <= 200 and _MODULE.fullmatch(value) else None


def _refuse(dist: Distribution, group: str, ep: EntryPoint, reason: str) -> Refused:
    return Refused(dist.name, str(dist.dist_info), f"{group}: {ep.name} = {ep.value}", reason)


def _owner_of(backend: str, installed: Installed) -> tuple[Owner | None, list[Refused], str | None]:
    refused: list[Refused] = []
    claims = [(d, ep) for d, ep in installed.entry_points(CPU_ENTRY_POINT_GROUP) if ep.name == backend]
    if backend == OWN_BACKEND:
        for d, ep in claims:
            if d.name != OWN_DISTRIBUTION:
                refused.append(_refuse(d, CPU_ENTRY_POINT_GROUP, ep, f"'{backend}' is cuplug's own backend"))
        own = own_distribution()
        if own is None:
            return (
                None,
                refused,
                "cuplug's own dist-info is not beside the running package (not installed from a wheel?)",
            )
        return Owner(own, "cuplug/_cpu"), refused, None
    by_dist: dict[str, tuple[Distribution, EntryPoint]] = {}
    for d, ep in claims:
        by_dist.setdefault(d.name, (d, ep))
    if len(by_dist) > 1:
        names = ", ".join(sorted(by_dist))
        for d, ep in by_dist.values():
            refused.append(
                _refuse(
                    d,
                    CPU_ENTRY_POINT_GROUP,
                    ep,
                    f"backend '{backend}' is claimed by {len(by_dist)} distributions ({names}); cuplug trusts "
                    "none of them: uninstall the one you did not mean",
                )
            )
        return None, refused, f"backend '{backend}' has no single owner ({names} all claim it)"
    if not by_dist:
        return None, refused, None
    d, ep = next(iter(by_dist.values()))
    directory = _module_dir(ep.value)
    if directory is None:
        refused.append(_refuse(d, CPU_ENTRY_POINT_GROUP, ep, f"value {ep.value!r} is not a module path"))
        return None, refused, f"{d.name} registers '{backend}' with a value that is not a module path"
    return Owner(d, directory), refused, None


def _package(dist: Distribution, ep: EntryPoint) -> InstalledPackage:
    cuda = _cuda_of_name(ep.name)
    directory = _module_dir(ep.value)
    if directory is None:
        return InstalledPackage(
            cuda,
            ep.value,
            dist.site,
            error=f"entry-point value {ep.value!r} is not a module path",
            distribution=dist.name,
        )
    pkg_dir = dist.site / directory
    record = dist.record()
    if f"{directory}/manifest.json" not in record:
        why = dist.record_error or f"{dist.dist_info.name}/RECORD does not list {directory}/manifest.json"
        return InstalledPackage(cuda, ep.value, pkg_dir, error=why, distribution=dist.name)
    try:
        real = pkg_dir.resolve()
        if dist.site.resolve() not in real.parents:
            raise ManifestError(f"{pkg_dir} resolves to {real}, outside {dist.site}")
        arts, problems, cuda = read_manifest_entries(pkg_dir, cuda)
    except (ManifestError, OSError, RuntimeError) as exc:  # RuntimeError: a symlink loop in resolve()
        return InstalledPackage(cuda, ep.value, pkg_dir, error=str(exc), distribution=dist.name)
    return InstalledPackage(cuda, ep.value, pkg_dir, arts, distribution=dist.name, problems=problems)


def _cpu_twin(backend: str, owner: Owner) -> tuple[Artifact | None, str | None]:
    rel = f"{owner.package}/libcuplug_{backend}_cpu.so"
    dist = owner.distribution
    entry = dist.recorded(rel)
    if entry is None:
        why = dist.record_error or f"{dist.dist_info.name}/RECORD does not list {rel}"
        return None, f"the CPU backend of '{backend}' cannot be verified: {why}"
    sha, size = entry
    if sha is None or size is None or not 64 <= size <= MAX_ARTIFACT_BYTES:
        return None, f"the CPU backend of '{backend}' cannot be verified: RECORD has no sha256 and size for {rel}"
    art = Artifact(
        backend=backend,
        variant="cpu",
        file=rel.rsplit("/", 1)[1],
        sha256=sha,
        size=size,
        sass=(),
        ptx=(),
        ptx_isa=None,
        cuda_version="",
        min_driver=0,
        abi=0,
        cuda="",
        package_dir=str(dist.site / owner.package),
    )
    return art, None


def discover(backend: str = OWN_BACKEND, installed: Installed | None = None) -> Discovery:
    """The trusted backend packages of ``backend``, its CPU twin, and every refused registration."""
    installed = Installed() if installed is None else installed
    owner, refused, owner_problem = _owner_of(backend, installed)
    owner_extras = owner.distribution.extras() if owner else set()
    # Extras of the owners of other backends: their packages are someone's, just not this backend's.
    others: set[str] = set()
    for d, _ in installed.entry_points(CPU_ENTRY_POINT_GROUP):
        if owner is None or d.name != owner.distribution.name:
            others |= d.extras()
    if backend != OWN_BACKEND and (own := own_distribution()) is not None:
        others |= own.extras()
    packages = []
    for dist, ep in sorted(installed.entry_points(ENTRY_POINT_GROUP), key=lambda x: (x[1].name, x[0].name)):
        if dist.name in owner_extras:
            packages.append(_package(dist, ep))
        elif dist.name not in others:
            owner_name = owner.distribution.name if owner else "no distribution"
            refused.append(
                _refuse(
                    dist,
                    ENTRY_POINT_GROUP,
                    ep,
                    f"registers as a backend package, but {owner_name} (the owner of backend '{backend}') "
                    "does not declare it as an extra; not trusted",
                )
            )
    cpu, cpu_problem = _cpu_twin(backend, owner) if owner else (None, owner_problem)
    return Discovery(backend, owner, tuple(packages), tuple(refused), cpu, cpu_problem)


def installed_packages(backend: str = OWN_BACKEND) -> tuple[InstalledPackage, ...]:
    """The trusted backend packages of ``backend``, sorted by name, each with its artifacts or its error."""
    return discover(backend).packages


def all_installed_packages() -> tuple[InstalledPackage, ...]:
    """The trusted backend packages of every owner (cuplug's and every author's), for ``cuplug inspect``."""
    installed = Installed()
    others = {ep.name for _, ep in installed.entry_points(CPU_ENTRY_POINT_GROUP) if ep.name != OWN_BACKEND}
    names = [OWN_BACKEND, *sorted(others)]
    seen, found = set(), []
    for name in names:
        for pkg in discover(name, installed).packages:
            if pkg.directory not in seen:
                seen.add(pkg.directory)
                found.append(pkg)
    return tuple(found)


def cpu_twin_path(backend: str) -> Path | None:
    """Where the owner of ``backend`` keeps its CPU twin (None: no trusted owner records one)."""
    art = discover(backend).cpu
    return None if art is None else Path(art.package_dir) / art.file
