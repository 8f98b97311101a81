"""Backend manifests: what each installed CUDA extra offers, read without dlopen.

A backend package (``cuplug-cuda12``/``cuplug-cuda13``, or any author's
``<name>-cuda13``) registers itself in the entry-point group ``cuplug.backends``
(name and value: its module) and ships ``manifest.json`` beside its artifacts;
the manifest's ``cuda`` field says which CUDA major it was built with. Locating the module uses
``importlib.util.find_spec``, which does not import it.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

MANIFEST_SCHEMA = 1
ENTRY_POINT_GROUP = "cuplug.backends"


class ManifestError(ValueError):
    """A manifest is missing, unreadable or of an unknown schema."""


@dataclasses.dataclass(frozen=True)
class Artifact:
    backend: str
    variant: str
    file: str  # relative to the package directory
    sha256: str
    size: int
    sass: tuple[str, ...]  # e.g. ("sm_80",)
    ptx: tuple[str, ...]  # e.g. ("compute_75",)
    ptx_isa: str | None  # e.g. "8.4"
    cuda_version: str  # toolkit, e.g. "12.4"
    min_driver: int  # cuDriverGetVersion the runtime needs, e.g. 12000
    abi: int
    cuda: str = ""  # package's CUDA major, e.g. "cuda12"
    arch: str = ""  # CPU architecture from the file's ELF header at build time ("" in older manifests)
    package_dir: str = ""  # absolute directory the manifest was read from

    @classmethod
    def from_json(cls, d: dict[str, Any], cuda: str, package_dir: str) -> Artifact:
        try:
            return cls(
                backend=str(d["backend"]),
                variant=str(d["variant"]),
                file=str(d["file"]),
                sha256=str(d["sha256"]),
                size=int(d["size"]),
                sass=tuple(d["sass"]),
                ptx=tuple(d["ptx"]),
                ptx_isa=d.get("ptx_isa"),
                cuda_version=str(d["cuda_version"]),
                min_driver=int(d["min_driver"]),
                abi=int(d["abi"]),
                arch=str(d.get("arch") or ""),
                cuda=cuda,
                package_dir=package_dir,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ManifestError(f"artifact entry lacks or mistypes a field: {exc}") from exc

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
    error: str | None = None  # why its manifest could not be used


def read_manifest(directory: Path, cuda: str = "") -> tuple[Artifact, ...]:
    path = directory / "manifest.json"
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise ManifestError(f"{path} is missing") from exc
    except (OSError, ValueError) as exc:
        raise ManifestError(f"{path} is unreadable: {exc}") from exc
    if not isinstance(data, dict) or data.get("schema") != MANIFEST_SCHEMA:
        raise ManifestError(
            f"{path}: schema {data.get('schema') if isinstance(data, dict) else '?'} "
            f"is not {MANIFEST_SCHEMA}; upgrade cuplug or reinstall the backend"
        )
    cuda = str(data.get("cuda") or cuda)
    return tuple(Artifact.from_json(a, cuda, str(directory)) for a in data.get("artifacts", ()))


CPU_ENTRY_POINT_GROUP = "cuplug.cpu_backends"


@dataclasses.dataclass(frozen=True)
class EntryPoint:
    name: str
    value: str


def entry_points(group: str) -> list[EntryPoint]:
    """The entry points of `group` of every installed distribution, first on sys.path winning.

    The same answer as ``importlib.metadata.entry_points(group=...)`` for installed wheels
    (``*.dist-info/entry_points.txt``, the INI format of PyPA's entry points specification),
    without importing importlib.metadata, which cost 13 ms of the 37 ms ``import cuplug`` took
    on the 2-core CI machine. Zipped or egg paths on sys.path are not searched: cuplug's
    backends ship as wheels.
    """
    seen: set[str] = set()
    found: list[EntryPoint] = []
    for entry in sys.path:
        try:
            names = sorted(os.listdir(entry or "."))
        except OSError:
            continue
        for meta in names:
            if not meta.endswith(".dist-info"):
                continue
            dist = re.sub(r"[-_.]+", "_", meta[: -len(".dist-info")].split("-")[0]).lower()
            if dist in seen:
                continue
            seen.add(dist)
            try:
                with open(os.path.join(entry or ".", meta, "entry_points.txt"), encoding="utf-8") as f:
                    text = f.read()
            except OSError:
                continue
            section = None
            for line in text.splitlines():
                line = line.strip()
                if not line or line[0] in "#;":
                    continue
                if line.startswith("[") and line.endswith("]"):
                    section = line[1:-1].strip()
                elif section == group and "=" in line:
                    name, _, value = line.partition("=")
                    found.append(EntryPoint(name.strip(), value.strip()))
    return found


def _package_dir(module: str) -> Path | None:
    """The directory of an installed package, found without importing it (None: not installed)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))).resolve()


def cpu_twin_path(backend: str) -> Path | None:
    """Where the package registered for `backend` in ``cuplug.cpu_backends`` keeps its CPU twin
    (None: no installed package registers it)."""
    for ep in entry_points(group=CPU_ENTRY_POINT_GROUP):
        directory = _package_dir(ep.value) if ep.name == backend else None
        if directory is not None:
            return directory / f"libcuplug_{backend}_cpu.so"
    return None


def _cuda_of_name(name: str) -> str:
    """'cuplug_cuda13' -> 'cuda13': the major a package is named for, when its manifest cannot say."""
    m = re.search(r"cuda\d+$", name)
    return m.group(0) if m else name


def installed_packages() -> tuple[InstalledPackage, ...]:
    """Every registered backend package, sorted by name, each with its artifacts or its error."""
    found = []
    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        cuda = _cuda_of_name(ep.name)
        directory = _package_dir(ep.value)
        if directory is None:
            found.append(InstalledPackage(cuda, ep.value, Path("."), error=f"module {ep.value} not found"))
            continue
        try:
            arts = read_manifest(directory, cuda)
            found.append(InstalledPackage(arts[0].cuda if arts else cuda, ep.value, directory, arts))
        except ManifestError as exc:
            found.append(InstalledPackage(cuda, ep.value, directory, error=str(exc)))
    return tuple(found)
