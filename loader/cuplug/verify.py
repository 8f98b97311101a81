"""Checks an artifact before dlopen: a truncated .so can SIGBUS the process, so never get there."""

from __future__ import annotations

import hashlib
import os
import struct
from pathlib import Path

from . import reasons
from .elfarch import host_arch, machine_of
from .errors import ArtifactError
from .manifest import Artifact

ELF_MAGIC = b"\x7fELF"
ELFCLASS64, ELFDATA2LSB, ET_DYN, EM_X86_64 = 2, 1, 3, 62


def resolve_inside(package_dir: Path, relative: str) -> Path:
    """The artifact's absolute path; refuses absolute names, '..', and symlinks out of the package."""
    if os.path.isabs(relative) or ".." in Path(relative).parts or not relative:
        raise ArtifactError(
            f"manifest file {relative!r} must be a relative path inside the package", reasons.ARTIFACT_CORRUPT
        )
    base = package_dir.resolve()
    path = (base / relative).resolve()
    if base not in path.parents:
        raise ArtifactError(f"manifest file {relative!r} resolves to {path}, outside {base}", reasons.ARTIFACT_CORRUPT)
    return path


def check_elf_header(head: bytes, name: str) -> None:
    if len(head) < 20 or head[:4] != ELF_MAGIC:
        raise ArtifactError(f"{name} is not an ELF file", reasons.ARTIFACT_CORRUPT)
    if head[4] != ELFCLASS64 or head[5] != ELFDATA2LSB:
        raise ArtifactError(
            f"{name} is not a 64-bit little-endian ELF (class {head[4]}, data {head[5]})", reasons.ARTIFACT_CORRUPT
        )
    e_type, e_machine = struct.unpack_from("<HH", head, 16)
    if e_type != ET_DYN:
        raise ArtifactError(f"{name} is not a shared object (ELF type {e_type})", reasons.ARTIFACT_CORRUPT)
    arch, here = machine_of(head), host_arch()
    if arch != here:
        raise ArtifactError(
            f"{name} is an {arch} shared object (e_machine {e_machine}); this machine is {here}: "
            f"install the wheel built for {here}",
            reasons.ARTIFACT_CORRUPT,
        )


def verify(artifact: Artifact) -> Path:
    """Returns the absolute path of a file that matches its manifest entry, or raises artifact-corrupt."""
    path = resolve_inside(Path(artifact.package_dir), artifact.file)
    if artifact.arch and artifact.arch != host_arch():  # the manifest says so: no need to open the file
        raise ArtifactError(
            f"{Path(artifact.file).name} is built for {artifact.arch} (manifest); this machine is {host_arch()}: "
            f"install the wheel built for {host_arch()}",
            reasons.ARTIFACT_CORRUPT,
        )
    if not path.is_file():
        raise ArtifactError(
            f"{path} listed in the manifest does not exist; reinstall the backend package", reasons.ARTIFACT_CORRUPT
        )
    size = path.stat().st_size
    if size != artifact.size:
        raise ArtifactError(
            f"{path.name}: size {size} != manifest {artifact.size} (truncated or replaced)", reasons.ARTIFACT_CORRUPT
        )
    digest = hashlib.sha256()
    with path.open("rb") as f:
        head = f.read(64)
        digest.update(head)
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    if digest.hexdigest() != artifact.sha256:
        raise ArtifactError(f"{path.name}: sha256 differs from the manifest (file altered)", reasons.ARTIFACT_CORRUPT)
    check_elf_header(head, path.name)
    return path
