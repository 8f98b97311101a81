"""Checks an artifact before dlopen, so that the bytes that were hashed are the bytes that get mapped.

The file is opened once (no symlink at the last component, non-blocking, must be a
regular file of the manifest's size) and copied once, by the kernel (``sendfile``),
into an anonymous in-memory file (``memfd_create``). The copy is sealed
(``F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL``: nobody, this process
included, can change it any more), then the sealed bytes are read back and
hashed and their ELF header checked, and the loader dlopens
``/proc/self/fd/N`` of it. Renaming another file over the artifact or rewriting it in
place (``cp``) after that changes nothing that is mapped; doing it during the read
gives a digest that differs (artifact-corrupt), never a planted constructor or a
SIGBUS from a truncated mapping.

Sealed copies are kept per sha256 for the life of the process (their descriptors
stay open, close-on-exec): loading the same bytes again dlopens the same
``/proc/self/fd/N`` name, so the dynamic linker hands back the library it already
has (one copy of its global state, as a dlopen of one path twice does). A name is
never reused for other bytes: each new copy gets a descriptor number above every
one used before.

Without a usable ``/proc/self/fd`` (not mounted) or without ``memfd_create``
(seccomp, old kernels), the verified bytes are written to a private file (mode
0500 in a fresh 0700 directory of this process, removed at exit) and that is
dlopened: other users cannot touch it; the same user could, as they could attach a
debugger to this process anyway.
"""

from __future__ import annotations

import _thread
import os
import stat
import struct
import sys

from ..contract import reasons
from ..contract.elfarch import host_arch, machine_of
from ..contract.errors import ArtifactError
from ..contract.manifest import mismatch, outside_problem
from ..contract.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ..contract.manifest import Artifact

ELF_MAGIC = b"\x7fELF"
ELFCLASS64, ELFDATA2LSB, ET_DYN = 2, 1, 3
PROC_SELF_FD = "/proc/self/fd"  # a module attribute, so a test can take /proc away
CHUNK = 1 << 20


# Hash files below this size with the interpreter's own SHA-256 (no import); larger ones with OpenSSL's
# (hashlib, SHA-NI): on the 2-core CPU machine the built-in one takes 3.3 ms per MB, OpenSSL 0.6 ms per MB
# plus 3.4 ms to import hashlib, so they break even near 1.2 MB (cuplug's CPU twin is 68 KB, a fatbin 1.2 MB).
BUILTIN_SHA256_BELOW = 1 << 20


class Verified(Record):
    """A checked artifact: ``path`` is the real file (what reports show), ``load_path`` what to dlopen."""

    __slots__ = ("path", "load_path", "sha256", "how")
    path: str
    load_path: str
    sha256: str
    how: str  # "memfd" (sealed in-memory copy) or "private-copy" (no /proc/self/fd)


class _Image(Record):
    __slots__ = ("fd", "load_path", "ident", "how")
    fd: int | None
    load_path: str
    ident: tuple[int, int]  # (st_dev, st_ino) of the sealed copy, to notice a descriptor closed under us
    how: str


_lock = _thread.allocate_lock()
_images: dict[str, _Image] = {}
_used_names: set[str] = set()
_floor = [3]
_private_dir: list[str] = []


def _reset_after_fork() -> None:
    global _lock
    _lock = _thread.allocate_lock()


os.register_at_fork(after_in_child=_reset_after_fork)


def _corrupt(message: str) -> ArtifactError:
    return ArtifactError(message, reasons.ARTIFACT_CORRUPT)


def resolve_inside(package_dir: str, relative: str) -> str:
    """The artifact's absolute path; refuses absolute names, '..', and symlinks out of the package."""
    if why := outside_problem(relative):
        raise _corrupt(why)
    try:
        base = os.path.realpath(package_dir)
        path = os.path.realpath(os.path.join(base, relative))
    except (OSError, ValueError) as exc:
        raise _corrupt(f"manifest file {relative!r} cannot be resolved: {exc}") from exc
    if os.path.commonpath([base, path]) != base or path == base:
        raise _corrupt(f"manifest file {relative!r} resolves to {path}, outside {base}")
    return path


def check_elf_header(head: bytes, name: str) -> None:
    if len(head) < 20 or head[:4] != ELF_MAGIC:
        raise _corrupt(f"{name} is not an ELF file")
    if head[4] != ELFCLASS64 or head[5] != ELFDATA2LSB:
        raise _corrupt(f"{name} is not a 64-bit little-endian ELF (class {head[4]}, data {head[5]})")
    e_type, e_machine = struct.unpack_from("<HH", head, 16)
    if e_type != ET_DYN:
        raise _corrupt(f"{name} is not a shared object (ELF type {e_type})")
    arch, here = machine_of(head), host_arch()
    if arch != here:
        raise _corrupt(
            f"{name} is an {arch} shared object (e_machine {e_machine}); this machine is {here}: "
            f"install the wheel built for {here}"
        )


def _open_artifact(path: str) -> int:
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY | os.O_NOFOLLOW
    try:
        return os.open(path, flags)
    except FileNotFoundError:
        raise _corrupt(f"{path} listed in the manifest does not exist; reinstall the backend package") from None
    except PermissionError:
        raise _corrupt(f"{path} cannot be read by this user (permission denied); it cannot be verified") from None
    except OSError as exc:
        raise _corrupt(f"{path} cannot be opened: {exc.strerror or exc}") from None


def _new_sink(name: str) -> tuple[int, str]:
    """A writable in-memory file for the copy: (fd, "memfd"), or (-1, why not)."""
    create = getattr(os, "memfd_create", None)
    if create is None:
        return -1, "os.memfd_create is not available"
    try:
        label = f"cuplug:{name}".encode()[:240].decode(errors="ignore")  # the kernel takes 249 bytes at most
        return create(label, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING), "memfd"
    except OSError as exc:
        return -1, f"memfd_create failed: {exc.strerror or exc}"


def sealed_copy(data: bytes, name: str) -> tuple[int, str] | None:
    """``data`` in a sealed in-memory file, for a reader that takes a path: (fd, ``/proc/self/fd/N``), the caller
    closes fd; None where memfd_create or /proc is missing. (An LTO variant's linked image: the bytes the loader
    checked are the bytes the library's registration reads.)"""
    fd, _ = _new_sink(name)
    if fd < 0:
        return None
    try:
        _write_all(fd, data)
        _seal(fd)
        path = _proc_path(fd)
    except OSError:
        path = None
    if path is None:
        os.close(fd)
        return None
    return fd, path


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _copy_and_hash(src: int, sink: int, size: int, name: str, write_to: int = -1) -> tuple[str, bytes]:
    """Reads exactly ``size`` bytes of ``src`` and hashes them: (hex digest, first 64 bytes).

    ``sink`` >= 0 (a memfd): copied by the kernel, sealed, then the copy is hashed. Otherwise
    read here in chunks, each hashed and (``write_to`` >= 0) written there.
    """
    if sink >= 0:
        return _kernel_copy_then_hash(src, sink, size, name)
    digest = _sha256(size)
    head = b""
    remaining = size
    try:
        while remaining:
            chunk = os.read(src, min(CHUNK, remaining))
            if not chunk:
                raise _corrupt(f"{name}: ended after {size - remaining} of {size} bytes (truncated while read)")
            digest.update(chunk)
            if len(head) < 64:
                head += chunk[: 64 - len(head)]
            if write_to >= 0:
                _write_all(write_to, chunk)
            remaining -= len(chunk)
        if os.read(src, 1):
            raise _corrupt(f"{name}: longer than the manifest's {size} bytes (grew while read)")
    except OSError as exc:
        raise _corrupt(f"{name}: read failed: {exc.strerror or exc}") from None
    return digest.hexdigest(), head


def _kernel_copy_then_hash(src: int, sink: int, size: int, name: str) -> tuple[str, bytes]:
    """The file copied into the memfd by the kernel (sendfile), the memfd sealed, then its bytes hashed.

    What is hashed is the sealed copy itself (read back from it), so nothing can change
    between the hash and the dlopen of that copy.
    """
    copied = 0
    try:
        while copied < size:
            n = os.sendfile(sink, src, copied, size - copied)
            if n == 0:
                raise _corrupt(f"{name}: ended after {copied} of {size} bytes (truncated while read)")
            copied += n
        if os.pread(src, 1, size):
            raise _corrupt(f"{name}: longer than the manifest's {size} bytes (grew while read)")
    except OSError as exc:
        raise _corrupt(f"{name}: read failed: {exc.strerror or exc}") from None
    _seal(sink)
    digest, offset, head = _sha256(size), 0, b""
    while chunk := os.pread(sink, CHUNK, offset):
        digest.update(chunk)
        head = head or chunk[:64]
        offset += len(chunk)
    return digest.hexdigest(), head


def _sha256(size: int) -> Any:
    """A SHA-256 object: OpenSSL's (hashlib) for large files or when hashlib is loaded anyway, else the
    interpreter's built-in one (see BUILTIN_SHA256_BELOW)."""
    if size >= BUILTIN_SHA256_BELOW or "hashlib" in sys.modules:
        import hashlib

        return hashlib.sha256()
    try:
        if sys.version_info >= (3, 12):
            from _sha2 import sha256  # type: ignore[import-not-found,unused-ignore]
        else:
            from _sha256 import sha256  # type: ignore[import-not-found,unused-ignore,no-redef]
    except ImportError:  # a Python built without them
        from hashlib import sha256  # type: ignore[assignment,unused-ignore]
    return sha256()


def _seal(fd: int) -> None:
    import fcntl

    seals = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)


def _renumber(fd: int) -> int:
    """``fd`` moved above every descriptor number a sealed copy ever had, so no name is reused."""
    import fcntl

    try:
        new = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, max(_floor[0], fd))
    except OSError:
        return fd
    os.close(fd)
    _floor[0] = new + 1
    return new


def _proc_path(fd: int) -> str | None:
    """``/proc/self/fd/N`` when it reaches this very file (None: /proc missing or not ours)."""
    path = f"{PROC_SELF_FD}/{fd}"
    try:
        a, b = os.stat(path), os.fstat(fd)
    except OSError:
        return None
    return path if (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino) else None


def _private_copy(src_fd: int, data_fd: int | None, name: str, sha: str) -> str:
    """The fallback: the verified bytes in a private file of this process (see the module docstring)."""
    import atexit
    import shutil
    import tempfile

    if not _private_dir:
        d = tempfile.mkdtemp(prefix="cuplug-verified-")
        _private_dir.append(d)
        atexit.register(shutil.rmtree, d, True)
    target = os.path.join(_private_dir[0], f"{sha[:16]}-{name}")
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        if data_fd is not None:  # copy from the sealed memfd
            offset = 0
            while chunk := os.pread(data_fd, CHUNK, offset):
                _write_all(fd, chunk)
                offset += len(chunk)
        else:  # no memfd: read the file again, and hash what is written
            os.lseek(src_fd, 0, os.SEEK_SET)
            got, _ = _copy_and_hash(src_fd, -1, os.fstat(src_fd).st_size, name, write_to=fd)
            if got != sha:
                raise _corrupt(f"{name}: sha256 differs from the manifest (file altered while read)")
        os.chmod(target, 0o500)
    except BaseException:  # a half-written copy never stays under the name the next verify would create
        os.unlink(target)
        raise
    finally:
        os.close(fd)
    return target


def verified(artifact: Artifact) -> Verified:
    """Checks ``artifact`` and returns where its verified bytes can be dlopened; raises artifact-corrupt."""
    path = resolve_inside(artifact.package_dir, artifact.file)
    name = os.path.basename(path)
    if artifact.arch and artifact.arch != host_arch():  # the manifest says so: no need to open the file
        raise _corrupt(
            f"{name} is built for {artifact.arch} (manifest); this machine is {host_arch()}: "
            f"install the wheel built for {host_arch()}"
        )
    src = _open_artifact(path)
    sink = -1
    try:
        st = os.fstat(src)
        if not stat.S_ISREG(st.st_mode):
            raise _corrupt(f"{path} is not a regular file")
        if why := mismatch(artifact, st.st_size, artifact.sha256):
            raise _corrupt(f"{name}: {why}")
        sink, _why_not = _new_sink(name)  # -1: no memfd, the private copy serves
        try:
            sha, head = _copy_and_hash(src, sink, artifact.size, name)
        except (OSError, AttributeError):  # sealing refused (an old kernel): the private copy serves
            if sink < 0:
                raise
            os.close(sink)
            sink = -1
            sha, head = _copy_and_hash(src, sink, artifact.size, name)
        if why := mismatch(artifact, artifact.size, sha):
            raise _corrupt(f"{name}: {why}")
        check_elf_header(head, name)
        with _lock:
            cached = _images.get(sha)
            if cached is not None and _still_ours(cached):
                return Verified(path, cached.load_path, sha, cached.how)
            owned, sink = sink, -1  # _keep owns it from here: kept by the image, or closed, even if it fails
            image = _keep(src, owned, name, sha)
            _images[sha] = image
            return Verified(path, image.load_path, sha, image.how)
    finally:
        os.close(src)
        if sink >= 0:
            os.close(sink)


def _still_ours(image: _Image) -> bool:
    if image.fd is None:
        return os.path.exists(image.load_path)
    try:
        st = os.fstat(image.fd)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == image.ident


def _keep(src: int, sink: int, name: str, sha: str) -> _Image:
    """Seals the copy and gives it a name that was never dlopened before."""
    if sink >= 0:  # sealed already (before it was hashed)
        fd = _renumber(sink)
        proc = _proc_path(fd)
        if proc is not None and proc not in _used_names:
            _used_names.add(proc)
            st = os.fstat(fd)
            return _Image(fd, proc, (st.st_dev, st.st_ino), "memfd")
        try:
            target = _private_copy(src, fd, name, sha)
        finally:
            os.close(fd)
    else:
        target = _private_copy(src, None, name, sha)
    st = os.stat(target)
    return _Image(None, target, (st.st_dev, st.st_ino), "private-copy")


def verify(artifact: Artifact) -> str:
    """Returns the absolute path of a file that matches its manifest entry, or raises artifact-corrupt.

    To load it, dlopen ``verified(artifact).load_path`` (the bytes that were hashed), not this path.
    """
    return verified(artifact).path
