"""Verification before dlopen (runtime.verify), in process: what is refused, and what is mapped.

A file is refused (artifact-corrupt) unless it lies inside its package, is a regular file of the
manifest's size whose sha256 is the manifest's, and is a 64-bit little-endian shared object for this
machine's CPU; what is dlopened is the sealed copy that was hashed (memfd), or, without /proc/self/fd
or memfd, a private 0500 copy; the same bytes verified twice give the same name.
"""

from __future__ import annotations

import hashlib
import os
import stat
import struct
import sys

import pytest

from cuplug.contract import reasons
from cuplug.contract.elfarch import host_arch
from cuplug.contract.errors import ArtifactError
from cuplug.contract.manifest import Artifact
from cuplug.runtime import verify


def _artifact(directory, name: str, data: bytes, **change) -> Artifact:
    (directory / name).write_bytes(data)
    fields = {
        "backend": "vector",
        "variant": "x",
        "file": name,
        "sha256": hashlib.sha256(data).hexdigest(),
        "size": len(data),
        "sass": (),
        "ptx": (),
        "ptx_isa": None,
        "cuda_version": "13.0",
        "min_driver": 13000,
        "abi": 2,
        "package_dir": str(directory),
        **change,
    }
    return Artifact(**fields)


def _corrupt(art: Artifact, words: str) -> None:
    with pytest.raises(ArtifactError) as err:
        verify.verified(art)
    assert err.value.code == reasons.ARTIFACT_CORRUPT and words in str(err.value), str(err.value)


@pytest.fixture
def lib(cpu_lib_path):
    return cpu_lib_path.read_bytes()


def test_a_good_file_is_mapped_from_its_sealed_copy(tmp_path, lib):
    art = _artifact(tmp_path, "a.so", lib)
    v = verify.verified(art)
    assert v.path == str(tmp_path / "a.so") and v.sha256 == art.sha256 and v.how == "memfd"
    assert v.load_path.startswith("/proc/self/fd/") and open(v.load_path, "rb").read() == lib
    again = verify.verified(art)
    assert again.load_path == v.load_path  # the same bytes: the same name, so dlopen gives the same library
    assert verify.verify(art) == v.path


def test_the_sealed_copy_cannot_change(tmp_path, lib):
    v = verify.verified(_artifact(tmp_path, "b.so", lib + b"\0"))  # other bytes than the test above: a new copy
    with pytest.raises(OSError):
        with open(v.load_path, "r+b") as f:
            f.write(b"x")


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"size": 100}, "size"),
        ({"sha256": "0" * 64}, "sha256 differs from the manifest"),
        ({"file": "missing.so"}, "does not exist"),
        ({"file": "/etc/passwd"}, "must be a relative path inside the package"),
        ({"file": "../a.so"}, "must be a relative path inside the package"),
        ({"arch": "aarch64" if host_arch() != "aarch64" else "x86_64"}, "(manifest); this machine is"),
    ],
)
def test_what_the_manifest_does_not_say_is_refused(tmp_path, lib, change, words):
    art = _artifact(tmp_path, "a.so", lib)
    _corrupt(art._replace(**change), words)


def test_the_manifests_arch_for_this_machine_is_accepted(tmp_path, lib):
    assert verify.verified(_artifact(tmp_path, "a.so", lib, arch=host_arch())).how == "memfd"


def test_a_symlink_out_of_the_package_is_refused(tmp_path, lib):
    pkg, outside = tmp_path / "pkg", tmp_path / "outside.so"
    pkg.mkdir()
    outside.write_bytes(lib)
    (pkg / "a.so").symlink_to(outside)
    art = _artifact(tmp_path, "unused", b"", package_dir=str(pkg))._replace(
        file="a.so", size=len(lib), sha256=hashlib.sha256(lib).hexdigest()
    )
    _corrupt(art, "outside")
    assert verify.resolve_inside(str(pkg), "sub/../x.so".replace("sub/../", "")) == str(pkg / "x.so")


def test_what_is_not_a_regular_file_is_refused(tmp_path, lib):
    art = _artifact(tmp_path, "a.so", lib)
    os.remove(tmp_path / "a.so")
    os.mkfifo(tmp_path / "a.so")
    _corrupt(art, "not a regular file")


def test_an_unreadable_file_is_named(tmp_path, lib):
    if os.geteuid() == 0:
        pytest.skip("root reads every file")
    art = _artifact(tmp_path, "a.so", lib)
    os.chmod(tmp_path / "a.so", 0)
    _corrupt(art, "permission denied")


def _elf(cls: int = 2, data: int = 1, e_type: int = 3, machine: int = 62) -> bytes:
    head = bytearray(b"\x7fELF" + bytes([cls, data, 1]) + b"\0" * 9)
    head += struct.pack("<HH", e_type, machine) + b"\0" * 60
    return bytes(head)


@pytest.mark.parametrize(
    ("head", "words"),
    [
        (b"MZ" + b"\0" * 80, "not an ELF file"),
        (b"\x7fEL", "not an ELF file"),
        (_elf(cls=1), "not a 64-bit little-endian ELF"),
        (_elf(data=2), "not a 64-bit little-endian ELF"),
        (_elf(e_type=2), "not a shared object (ELF type 2)"),
        (_elf(machine=183 if host_arch() != "aarch64" else 62), "shared object (e_machine"),
    ],
)
def test_the_elf_header_must_be_a_shared_object_for_this_cpu(tmp_path, head, words):
    with pytest.raises(ArtifactError, match=words.replace("(", r"\(").replace(")", r"\)")):
        verify.check_elf_header(head, "a.so")
    if len(head) >= 64:  # the same through verified(): the header is checked after the hash
        _corrupt(_artifact(tmp_path, "h.so", head + b"\0" * 64), words)


def test_a_good_header_passes():
    machine = {"x86_64": 62, "aarch64": 183}[host_arch()]
    verify.check_elf_header(_elf(machine=machine), "a.so")


def test_without_proc_self_fd_a_private_copy_serves(tmp_path, lib, monkeypatch):
    monkeypatch.setattr(verify, "PROC_SELF_FD", str(tmp_path / "no-proc"))
    v = verify.verified(_artifact(tmp_path, "c.so", lib + b"\1"))
    assert v.how == "private-copy" and v.load_path != v.path and open(v.load_path, "rb").read() == lib + b"\1"
    assert stat.S_IMODE(os.stat(v.load_path).st_mode) == 0o500
    assert stat.S_IMODE(os.stat(os.path.dirname(v.load_path)).st_mode) == 0o700


def test_without_memfd_a_private_copy_serves(tmp_path, lib, monkeypatch):
    monkeypatch.delattr(os, "memfd_create")
    v = verify.verified(_artifact(tmp_path, "d.so", lib + b"\2"))
    assert v.how == "private-copy" and open(v.load_path, "rb").read() == lib + b"\2"
    bad = _artifact(tmp_path, "e.so", lib + b"\3")._replace(sha256="1" * 64)
    _corrupt(bad, "sha256 differs")


def test_small_files_are_hashed_without_hashlib(monkeypatch):
    """Below BUILTIN_SHA256_BELOW the interpreter's own SHA-256 (importing hashlib costs more than hashing
    the CPU twin); at it and above OpenSSL's; once the application has hashlib, always hashlib."""
    monkeypatch.delitem(sys.modules, "hashlib")
    small = verify._sha256(verify.BUILTIN_SHA256_BELOW - 1)
    assert type(small).__module__ in ("_sha256", "_sha2") and "hashlib" not in sys.modules
    large = verify._sha256(verify.BUILTIN_SHA256_BELOW)
    assert type(large).__module__ == "_hashlib" and "hashlib" in sys.modules
    assert type(verify._sha256(10)).__module__ == "_hashlib"  # hashlib is loaded now
    for h in (small, large):
        h.update(b"abc")
        assert h.hexdigest() == hashlib.sha256(b"abc").hexdigest()
