"""Which installed packages may serve a backend: read from dist-info, without dlopen, without import.

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

Installed distributions are read by ``contract.distributions`` (where they are looked up,
and why a dist-info planted beside a script is never read).

Nothing here knows a CUDA major: a package's major is its manifest's ``cuda`` (or the
``cudaNN`` its name ends in), and the owner's extras say which packages exist.
"""

from __future__ import annotations

import os

from ..contract import manifest
from ..contract.distributions import (
    OWN_DISTRIBUTION,
    Distribution,
    EntryPoint,
    Installed,
    own_distribution,
)
from ..contract.manifest import Artifact, ManifestError
from ..contract.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, ClassVar

OWN_BACKEND = "vector"
OWN_CPU_PACKAGE = "cuplug/_cpu"
MAX_MODULE_CHARS = 200


def module_dir(value: str) -> str | None:
    """'scankit' -> 'scankit', 'a.b' -> 'a/b'; None for anything that is not a plain module path."""
    if not 0 < len(value) <= MAX_MODULE_CHARS:
        return None
    parts = value.split(".")
    if len(parts) > 16 or not all(p.isidentifier() and p.isascii() for p in parts):
        return None
    return "/".join(parts)


def cuda_of_name(name: str) -> str:
    """'cuplug_cuda13' -> 'cuda13': the major a package is named for, when its manifest cannot say."""
    at = name.rfind("cuda")
    return name[at:] if at >= 0 and manifest.is_cuda_major(name[at:]) else name


class InstalledPackage(Record):
    """One trusted backend package: its artifacts, or why its manifest cannot be used."""

    __slots__ = ("cuda", "module", "directory", "artifacts", "error", "distribution", "problems")
    _defaults: ClassVar[dict[str, Any]] = {"artifacts": (), "error": None, "distribution": "", "problems": ()}
    cuda: str
    module: str
    directory: str
    artifacts: tuple[Artifact, ...]
    error: str | None  # why its manifest could not be used at all
    distribution: str  # e.g. "cuplug_cuda13"
    problems: tuple[str, ...]  # manifest entries that were refused (the rest are used)


class Refused(Record):
    """An installed registration cuplug does not trust, and why (shown by doctor)."""

    __slots__ = ("distribution", "where", "registration", "reason")
    distribution: str
    where: str  # its dist-info directory
    registration: str  # e.g. "cuplug.backends: zzz = zzz_unrelated"
    reason: str

    def to_json(self) -> dict[str, str]:
        return self._asdict()


class Owner(Record):
    __slots__ = ("distribution", "package")
    distribution: Distribution
    package: str  # the directory (relative to the site) that holds the CPU twin, e.g. "cuplug/_cpu"


class Discovery(Record):
    """Everything installed that bears on one backend name."""

    __slots__ = ("backend", "owner", "packages", "refused", "cpu", "cpu_problem", "extras")
    _defaults: ClassVar[dict[str, Any]] = {"extras": ()}
    backend: str
    owner: Owner | None
    packages: tuple[InstalledPackage, ...]
    refused: tuple[Refused, ...]
    cpu: Artifact | None  # the CPU twin, from the owner's RECORD
    cpu_problem: str | None  # why there is no CPU twin to verify
    extras: tuple[str, ...]  # the extras the owner declares (cuda12, cuda13, ...), for the hint to install one

    @property
    def artifacts(self) -> tuple[Artifact, ...]:
        return tuple(a for p in self.packages for a in p.artifacts if a.backend == self.backend)

    @property
    def unusable(self) -> tuple[tuple[str, str], ...]:
        """(cuda, why) for manifests that could not be read and for single entries that were refused."""
        whole = [(p.cuda, f"{p.module}: {p.error}") for p in self.packages if p.error]
        entries = [(p.cuda, f"{p.module}: {why}") for p in self.packages for why in p.problems]
        return (*whole, *entries)

    @property
    def owner_name(self) -> str:
        return self.owner.distribution.name if self.owner else self.backend


def _refuse(dist: Distribution, group: str, ep: EntryPoint, reason: str) -> Refused:
    return Refused(dist.name, dist.dist_info, f"{group}: {ep.name} = {ep.value}", reason)


def _owner_of(backend: str, installed: Installed) -> tuple[Owner | None, list[Refused], str | None]:
    refused: list[Refused] = []
    group = manifest.CPU_ENTRY_POINT_GROUP
    claims = [(d, ep) for d, ep in installed.entry_points(group) if ep.name == backend]
    if backend == OWN_BACKEND:
        for d, ep in claims:
            if d.name != OWN_DISTRIBUTION:
                refused.append(_refuse(d, group, ep, f"'{backend}' is cuplug's own backend"))
        own = own_distribution()
        if own is None:
            return (
                None,
                refused,
                "cuplug's own dist-info is not beside the running package (not installed from a wheel?)",
            )
        return Owner(own, OWN_CPU_PACKAGE), refused, None
    by_dist: dict[str, tuple[Distribution, EntryPoint]] = {}
    for d, ep in claims:
        by_dist.setdefault(d.name, (d, ep))
    if len(by_dist) > 1:
        names = ", ".join(sorted(by_dist))
        for d, ep in by_dist.values():
            why = (
                f"backend '{backend}' is claimed by {len(by_dist)} distributions ({names}); cuplug trusts "
                "none of them: uninstall the one you did not mean"
            )
            refused.append(_refuse(d, group, ep, why))
        return None, refused, f"backend '{backend}' has no single owner ({names} all claim it)"
    if not by_dist:
        return None, refused, None
    d, ep = next(iter(by_dist.values()))
    directory = module_dir(ep.value)
    if directory is None:
        refused.append(_refuse(d, group, ep, f"value {ep.value!r} is not a module path"))
        return None, refused, f"{d.name} registers '{backend}' with a value that is not a module path"
    return Owner(d, directory), refused, None


def _package(dist: Distribution, ep: EntryPoint) -> InstalledPackage:
    cuda = cuda_of_name(ep.name)
    directory = module_dir(ep.value)
    if directory is None:
        why = f"entry-point value {ep.value!r} is not a module path"
        return InstalledPackage(cuda, ep.value, dist.site, error=why, distribution=dist.name)
    pkg_dir = os.path.join(dist.site, directory)
    if f"{directory}/{manifest.FILE_NAME}" not in dist.record():
        why = dist.record_error or f"{dist.dist_info_name}/RECORD does not list {directory}/{manifest.FILE_NAME}"
        return InstalledPackage(cuda, ep.value, pkg_dir, error=why, distribution=dist.name)
    try:
        real, site = os.path.realpath(pkg_dir), os.path.realpath(dist.site)
        if os.path.commonpath([real, site]) != site or real == site:
            raise ManifestError(f"{pkg_dir} resolves to {real}, outside {dist.site}")
        found = manifest.read(pkg_dir, cuda)
    except (ManifestError, OSError, ValueError) as exc:
        return InstalledPackage(cuda, ep.value, pkg_dir, error=str(exc), distribution=dist.name)
    return InstalledPackage(found.cuda, ep.value, pkg_dir, found.artifacts, None, dist.name, found.problems)


def _cpu_twin(backend: str, owner: Owner) -> tuple[Artifact | None, str | None]:
    rel = f"{owner.package}/libcuplug_{backend}_cpu.so"
    dist = owner.distribution
    entry = dist.recorded(rel)
    if entry is None:
        why = dist.record_error or f"{dist.dist_info_name}/RECORD does not list {rel}"
        return None, f"the CPU backend of '{backend}' cannot be verified: {why}"
    sha, size = entry
    if sha is None or size is None or not manifest.MIN_ARTIFACT_BYTES <= size <= manifest.MAX_ARTIFACT_BYTES:
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
        package_dir=os.path.join(dist.site, owner.package),
    )
    return art, None


def discover(backend: str = OWN_BACKEND, installed: Installed | None = None) -> Discovery:
    """The trusted backend packages of ``backend``, its CPU twin, and every refused registration."""
    installed = Installed() if installed is None else installed
    owner, refused, owner_problem = _owner_of(backend, installed)
    owner_extras = owner.distribution.extras() if owner else {}
    # Extras of the owners of other backends: their packages are someone's, just not this backend's.
    others: set[str] = set()
    for d, _ in installed.entry_points(manifest.CPU_ENTRY_POINT_GROUP):
        if owner is None or d.name != owner.distribution.name:
            others |= set(d.extras())
    if backend != OWN_BACKEND and (own := own_distribution()) is not None:
        others |= set(own.extras())
    declared = ", ".join(sorted(n.replace("_", "-") for n in owner_extras)) or "none"
    packages = []
    group = manifest.ENTRY_POINT_GROUP
    for dist, ep in sorted(installed.entry_points(group), key=lambda x: (x[1].name, x[0].name)):
        if dist.name in owner_extras:
            packages.append(_package(dist, ep))
        elif dist.name not in others:
            owner_name = owner.distribution.name if owner else "no distribution"
            why = (
                f"registers as a backend package, but {owner_name} (the owner of backend '{backend}') "
                f"does not declare it as an extra (it declares: {declared}); not trusted"
            )
            refused.append(_refuse(dist, group, ep, why))
    cpu, cpu_problem = _cpu_twin(backend, owner) if owner else (None, owner_problem)
    extras = tuple(sorted(set(owner_extras.values())))
    return Discovery(backend, owner, tuple(packages), tuple(refused), cpu, cpu_problem, extras)


def all_installed_packages() -> tuple[InstalledPackage, ...]:
    """The trusted backend packages of every owner (cuplug's and every author's), for ``cuplug inspect``."""
    installed = Installed()
    group = manifest.CPU_ENTRY_POINT_GROUP
    others = {ep.name for _, ep in installed.entry_points(group) if ep.name != OWN_BACKEND}
    seen, found = set(), []
    for name in [OWN_BACKEND, *sorted(others)]:
        for pkg in discover(name, installed).packages:
            if pkg.directory not in seen:
                seen.add(pkg.directory)
                found.append(pkg)
    return tuple(found)


def cpu_twin_path(backend: str) -> str | None:
    """Where the owner of ``backend`` keeps its CPU twin (None: no trusted owner records one)."""
    art = discover(backend).cpu
    return None if art is None else art.path
