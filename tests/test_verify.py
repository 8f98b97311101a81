"""Verification before dlopen (runtime.verify), in process: what is refused, and what is mapped.

A file is refused (artifact-corrupt) unless it lies inside its package, is a regular file of the
manifest's size whose sha256 is the manifest's, and is a 64-bit little-endian shared object for this
machine's CPU; what is dlopened is the sealed copy that was hashed (memfd), or, without /proc/self/fd
or memfd, a private 0500 copy; the same bytes verified twice give the same name.
"""

from __future__ import annotations

import atexit
import errno
import fcntl
import hashlib
import json
import os
import resource
import stat
import struct
import subprocess
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
        ({"file": "."}, "resolves to"),  # the package directory itself is no artifact
        ({"file": "./"}, "resolves to"),
        ({"file": "a.so/b.so"}, "a.so/b.so cannot be opened: Not a directory"),  # the error's words, not its repr
        ({"arch": "aarch64" if host_arch() != "aarch64" else "x86_64"}, "(manifest); this machine is"),
        ({"arch": "zarch"}, "(manifest); this machine is"),  # any other name, whichever way it sorts
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


def test_an_unreadable_file_is_named(tmp_path, lib, monkeypatch):
    art = _artifact(tmp_path, "a.so", lib)
    os.chmod(tmp_path / "a.so", 0)
    if os.geteuid() == 0:  # root reads every local file; a root-squashed NFS mount still answers EACCES
        real, path = os.open, os.path.realpath(tmp_path / "a.so")

        def squashed(name, *args, **kwargs):
            if name == path:
                raise PermissionError(errno.EACCES, "Permission denied", name)
            return real(name, *args, **kwargs)

        monkeypatch.setattr(os, "open", squashed)
    _corrupt(art, "permission denied")


def test_a_package_dir_that_cannot_be_resolved_is_refused(tmp_path, lib, monkeypatch):
    art = _artifact(tmp_path, "a.so", lib)
    _corrupt(art._replace(package_dir=str(tmp_path) + "\0"), "cannot be resolved")  # ValueError: a NUL byte
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    _corrupt(art._replace(package_dir="."), "cannot be resolved")  # OSError: the working directory is gone


def _elf(cls: int = 2, data: int = 1, e_type: int = 3, machine: int = 62) -> bytes:
    head = bytearray(b"\x7fELF" + bytes([cls, data, 1]) + b"\0" * 9)
    head += struct.pack("<HH", e_type, machine) + b"\0" * 60
    return bytes(head)


@pytest.mark.parametrize(
    ("head", "words"),
    [
        (b"MZ" + b"\0" * 80, "not an ELF file"),
        (b"\x7fEL", "not an ELF file"),
        (b"\xcf\xfa\xed\xfe" + b"\0" * 80, "not an ELF file"),  # a Mach-O (its magic sorts above ELF's)
        (_elf()[:19], "not an ELF file"),  # too short for e_type and e_machine
        (_elf(cls=1), "not a 64-bit little-endian ELF (class 1, data 1)"),
        (_elf(cls=3), "not a 64-bit little-endian ELF (class 3, data 1)"),
        (_elf(data=2), "not a 64-bit little-endian ELF (class 2, data 2)"),
        (_elf(data=0), "not a 64-bit little-endian ELF (class 2, data 0)"),
        (_elf(e_type=2), "not a shared object (ELF type 2)"),
        (_elf(e_type=4), "not a shared object (ELF type 4)"),
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
    verify.check_elf_header(_elf(machine=machine)[:20], "a.so")  # e_machine ends at byte 20: enough


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


@pytest.mark.parametrize(
    ("size", "builtin"),
    [(68_000, True), (1_048_575, True), (1_048_576, False), (1_200_000, False)],  # the CPU twin; 1 MiB; a fatbin
)
def test_the_sha256_choice_by_size(monkeypatch, size, builtin):
    """The threshold is 1 MiB, typed here rather than read from the module (see BUILTIN_SHA256_BELOW)."""
    monkeypatch.delitem(sys.modules, "hashlib")
    module = type(verify._sha256(size)).__module__
    assert (module in ("_sha256", "_sha2"), module == "_hashlib") == (builtin, not builtin), module


def test_files_around_the_threshold_verify_with_their_digest(tmp_path, lib, monkeypatch):
    at = verify.BUILTIN_SHA256_BELOW
    arts = [_artifact(tmp_path, f"t{size}.so", lib.ljust(size, b"\7")) for size in (at - 1, at, at + 1)]
    monkeypatch.delitem(sys.modules, "hashlib")  # so that the one below is hashed by the built-in SHA-256
    for art in arts:
        v = verify.verified(art)
        assert v.sha256 == art.sha256 and open(v.load_path, "rb").read(1 << 21) == (tmp_path / art.file).read_bytes()


def test_a_python_without_its_own_sha256_falls_back_to_hashlib(monkeypatch):
    for name in ("_sha256", "_sha2"):
        monkeypatch.setitem(sys.modules, name, None)  # import fails, as in a build without them
    monkeypatch.delitem(sys.modules, "hashlib")
    h = verify._sha256(10)
    h.update(b"abc")
    assert h.hexdigest() == hashlib.sha256(b"abc").hexdigest()


def _open_fds() -> set[int]:
    """This process's open descriptors (the one that listed them is closed again by then)."""
    fds = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            fcntl.fcntl(int(name), fcntl.F_GETFD)
        except OSError:
            continue
        fds.add(int(name))
    return fds


def _fd_of(v: verify.Verified) -> int:
    assert v.how == "memfd", v
    return int(v.load_path.rsplit("/", 1)[1])


def test_verifying_keeps_one_descriptor_and_closes_nobody_elses(tmp_path, lib):
    before = _open_fds()
    v = verify.verified(_artifact(tmp_path, "f.so", lib + b"fds"))
    kept = before | {_fd_of(v)}
    assert _open_fds() == kept  # the sealed copy's, nothing else: the file's own is closed
    _corrupt(_artifact(tmp_path, "g.so", lib)._replace(size=1), "size")  # refused before the copy
    _corrupt(_artifact(tmp_path, "h.so", b"MZ" + b"\0" * 100), "not an ELF file")  # refused after it
    assert _open_fds() == kept


def test_a_copy_whose_descriptor_was_closed_is_made_again_under_a_new_name(tmp_path, lib):
    """Something that closes descriptors it does not own (a closefrom) takes the sealed copy away: the
    same bytes get a new copy, and a /proc/self/fd/N name already dlopened is never given to it."""
    data = lib + b"closed"
    art = _artifact(tmp_path, "i.so", data)
    names: list[str] = []
    for _ in range(4):
        v = verify.verified(art)
        assert v.how == "memfd" and v.load_path not in names and open(v.load_path, "rb").read() == data
        names.append(v.load_path)
        os.close(_fd_of(v))


def test_a_copy_whose_number_holds_another_file_now_is_made_again(tmp_path, lib):
    data = lib + b"replaced"
    art = _artifact(tmp_path, "j.so", data)
    older = os.memfd_create("older")  # created before the copy, then others after it
    (tmp_path / "other").write_bytes(b"other")
    ours = []
    try:
        v = verify.verified(art)
        for make in (lambda: older, lambda: os.memfd_create("newer"), lambda: os.open(tmp_path / "other", 0)):
            other = make()
            ours += [other, _fd_of(v)]
            os.dup2(other, _fd_of(v))  # the copy's number now holds another file
            again = verify.verified(art)
            assert (
                again.how == "memfd" and again.load_path != v.load_path and open(again.load_path, "rb").read() == data
            )
            v = again
    finally:
        for fd in set(ours):
            os.close(fd)


def test_when_no_higher_descriptor_is_free_the_copy_is_still_made(tmp_path, lib):
    """With RLIMIT_NOFILE at the next number a copy would get, the copy keeps the number it has (or a
    private copy serves), under a name never dlopened before."""
    held = [os.dup(0) for _ in range(32)]
    try:
        first = verify.verified(_artifact(tmp_path, "r.so", lib + b"rlimit-1"))
    finally:
        for fd in held:
            os.close(fd)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (_fd_of(first) + 1, hard))
    try:
        v = verify.verified(_artifact(tmp_path, "s.so", lib + b"rlimit-2"))
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert v.load_path != first.load_path and open(v.load_path, "rb").read() == lib + b"rlimit-2"


def test_a_sealed_copy_never_takes_a_standard_streams_number(tmp_path, lib):
    """A daemon that closed 0-2 reopens them later (open /dev/null three times): they must still be free."""
    art = _artifact(tmp_path, "q.so", lib + b"streams")
    code = (
        "import os, sys\n"
        "from cuplug.contract.manifest import Artifact\n"
        "from cuplug.runtime import verify\n"
        "art = Artifact(**eval(sys.argv[1]))\n"
        "for fd in (0, 1, 2):\n"
        "    os.close(fd)\n"
        "v = verify.verified(art)\n"
        "with open(sys.argv[2], 'w') as f:\n"
        "    f.write(v.load_path)\n"
    )
    subprocess.run([sys.executable, "-c", code, repr(art._asdict()), str(tmp_path / "out")], check=True, timeout=60)
    load_path = (tmp_path / "out").read_text()
    assert load_path.startswith("/proc/self/fd/") and int(load_path.rsplit("/", 1)[1]) > 2, load_path


NAME_COMES_BACK = """
import atexit, fcntl, hashlib, json, os, resource, shutil, sys, tempfile
from cuplug.contract.manifest import Artifact
from cuplug.runtime import verify
arts = [Artifact(**a) for a in eval(sys.argv[1])]
first = [verify.verified(a) for a in arts[:3]]
assert all(v.how == "memfd" for v in first), first
numbers = sorted(int(v.load_path.rsplit("/", 1)[1]) for v in first)
fillers = []
while True:  # every free number below the copies' taken, so the next descriptors get theirs
    fd = os.open("/dev/null", os.O_RDONLY)
    if fd > numbers[-1]:
        os.close(fd)
        break
    fillers.append(fd)
for n in numbers:
    os.close(n)  # a closefrom(): the numbers come back, the names stay dlopened
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (numbers[-1] + 1, hard))  # no number above them to move to
try:
    v = verify.verified(arts[3])
finally:
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
with open(sys.argv[2], "w") as f:
    same = open(v.load_path, "rb").read() == open(arts[3].path, "rb").read()
    json.dump([[x.load_path for x in first], v.load_path, v.how, same], f)
"""


def test_a_memfd_name_already_dlopened_is_never_given_to_other_bytes(tmp_path, lib):
    """The dynamic linker keys what it loaded by path: a /proc/self/fd/N name that served one library must never
    serve other bytes, or dlopen hands back the old library. Here the copies' descriptors were closed and no
    higher number is left (RLIMIT_NOFILE), so the new copy's memfd gets an old number: the private copy serves."""
    arts = [_artifact(tmp_path, f"{c}.so", lib + c.encode()) for c in ("a1", "a2", "a3", "b")]
    proc = subprocess.run(
        [sys.executable, "-c", NAME_COMES_BACK, repr([a._asdict() for a in arts]), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    names, load_path, how, same = json.loads((tmp_path / "out").read_text())
    assert load_path not in names and how == "private-copy" and same, (names, load_path, how)


def test_a_file_swapped_for_a_symlink_after_it_was_resolved_is_not_followed(tmp_path, lib, monkeypatch):
    """The artifact's path is resolved (no symlink out of the package), then opened without following a symlink
    at its last component: one renamed over the file between the two is refused, even to bytes that verify."""
    art = _artifact(tmp_path, "swapped.so", lib + b"swap")
    elsewhere = tmp_path / "elsewhere.so"
    elsewhere.write_bytes(lib + b"swap")
    resolve = verify.resolve_inside

    def resolve_then_swap(package_dir, relative):
        path = resolve(package_dir, relative)
        (tmp_path / "link").symlink_to(elsewhere)
        os.rename(tmp_path / "link", path)  # what another user's `ln -sf` + rename does in the window
        return path

    monkeypatch.setattr(verify, "resolve_inside", resolve_then_swap)
    _corrupt(art, "cannot be opened: Too many levels of symbolic links")


@pytest.mark.parametrize("where", ["fdinfo", "another memfd"])
def test_a_proc_that_does_not_lead_to_the_copy_is_not_trusted(tmp_path, lib, monkeypatch, where):
    """/proc/self/fdinfo/N exists for every open N but is not the copy; nor is a directory whose every N
    leads to an older in-memory file (as a stale bind mount or another process's /proc would): the
    private copy serves."""
    older = os.memfd_create("older")
    try:
        if where == "fdinfo":
            monkeypatch.setattr(verify, "PROC_SELF_FD", "/proc/self/fdinfo")
        else:
            (tmp_path / "fd").mkdir()
            for n in range(verify._floor[0] + 64):  # every number the copy can get
                os.symlink(f"/proc/self/fd/{older}", tmp_path / "fd" / str(n))
            monkeypatch.setattr(verify, "PROC_SELF_FD", str(tmp_path / "fd"))
        data = lib + where.encode()
        v = verify.verified(_artifact(tmp_path, "u.so", data))
    finally:
        os.close(older)
    assert v.how == "private-copy" and open(v.load_path, "rb").read() == data


def test_a_private_copy_is_reused_until_it_is_removed(tmp_path, lib, monkeypatch):
    monkeypatch.setattr(verify, "PROC_SELF_FD", str(tmp_path / "no-proc"))
    art = _artifact(tmp_path, "k.so", lib + b"private")
    v = verify.verified(art)
    assert v.how == "private-copy" and verify.verified(art).load_path == v.load_path
    os.remove(v.load_path)  # a tmp cleaner
    again = verify.verified(art)
    assert again.how == "private-copy" and open(again.load_path, "rb").read() == lib + b"private"


def test_the_private_copies_are_removed_at_exit_quietly_if_already_gone(tmp_path, lib, monkeypatch):
    registered = []
    monkeypatch.setattr(verify, "_private_dir", [])
    monkeypatch.setattr(atexit, "register", lambda func, *args: registered.append((func, args)))
    monkeypatch.setattr(verify, "PROC_SELF_FD", str(tmp_path / "no-proc"))
    v = verify.verified(_artifact(tmp_path, "l.so", lib + b"atexit"))
    ((func, args),) = registered
    func(*args)
    assert not os.path.exists(os.path.dirname(v.load_path))
    func(*args)  # a tmp cleaner got there first: nothing to say at exit


def _refuse(*args):
    raise OSError(errno.EPERM, "Operation not permitted")  # what a seccomp filter answers


def test_when_memfd_create_fails_a_private_copy_serves(tmp_path, lib, monkeypatch, capfdbinary):
    monkeypatch.setattr(os, "memfd_create", _refuse)
    before = _open_fds()
    v = verify.verified(_artifact(tmp_path, "m.so", lib + b"seccomp"))
    assert v.how == "private-copy" and open(v.load_path, "rb").read() == lib + b"seccomp"
    assert _open_fds() == before and capfdbinary.readouterr() == (b"", b"")  # no descriptor kept or touched


def test_without_memfd_nothing_is_written_anywhere_but_the_private_copy(tmp_path, lib, monkeypatch, capfdbinary):
    monkeypatch.delattr(os, "memfd_create")
    before = _open_fds()
    v = verify.verified(_artifact(tmp_path, "n.so", lib + b"no-memfd"))
    assert v.how == "private-copy" and open(v.load_path, "rb").read() == lib + b"no-memfd"
    assert _open_fds() == before and capfdbinary.readouterr() == (b"", b"")


@pytest.mark.parametrize("how", ["EINVAL", "no F_ADD_SEALS"])
def test_when_sealing_is_refused_a_private_copy_serves(tmp_path, lib, monkeypatch, capfdbinary, how):
    """An old kernel refuses F_ADD_SEALS (EINVAL); an old Python lacks the constant (AttributeError)."""
    if how == "EINVAL":
        real = fcntl.fcntl

        def old_kernel(fd, cmd, arg=0):
            if cmd == fcntl.F_ADD_SEALS:
                raise OSError(errno.EINVAL, "Invalid argument")
            return real(fd, cmd, arg)

        monkeypatch.setattr(fcntl, "fcntl", old_kernel)
    else:
        monkeypatch.delattr(fcntl, "F_ADD_SEALS")
    before = _open_fds()
    data = lib + how.encode()
    v = verify.verified(_artifact(tmp_path, "o.so", data))
    assert v.how == "private-copy" and open(v.load_path, "rb").read() == data
    assert _open_fds() == before and capfdbinary.readouterr() == (b"", b"")


@pytest.mark.parametrize("memfd", [True, False])
def test_an_io_error_while_reading_is_refused_in_words(tmp_path, lib, monkeypatch, memfd):
    art = _artifact(tmp_path, "v.so", lib + b"eio")

    def failing_disk(*args):
        raise OSError(errno.EIO, "Input/output error")

    if not memfd:
        monkeypatch.delattr(os, "memfd_create")
    monkeypatch.setattr(os, "sendfile" if memfd else "read", failing_disk)
    _corrupt(art, "v.so: read failed: Input/output error")


@pytest.mark.parametrize("memfd", [True, False])
@pytest.mark.parametrize("change", [-10, +10])
def test_a_file_cut_or_grown_while_it_is_read_is_refused(tmp_path, lib, monkeypatch, memfd, change):
    data = lib + b"race"
    n = len(data)
    art = _artifact(tmp_path, "w.so", data)
    name = "sendfile" if memfd else "read"
    real, calls = getattr(os, name), []

    def racing(*args):
        calls.append(args)
        assert len(calls) < 100, "the copy does not end"
        if len(calls) == 1:  # another process rewrites the file just as it is read
            with open(tmp_path / "w.so", "r+b") as f:
                f.truncate(n + change) if change < 0 else (f.seek(n), f.write(b"\0" * change))
        return real(*args)

    if not memfd:
        monkeypatch.delattr(os, "memfd_create")
    monkeypatch.setattr(os, name, racing)
    if change < 0:
        _corrupt(art, f"w.so: ended after {n + change} of {n} bytes (truncated while read)")
    else:
        _corrupt(art, f"w.so: longer than the manifest's {n} bytes (grew while read)")


@pytest.mark.parametrize("memfd", [True, False])
def test_the_copy_gives_the_digest_and_first_64_bytes_of_what_it_read_in_pieces(tmp_path, lib, monkeypatch, memfd):
    """What check_elf_header sees is the first 64 bytes of the hashed bytes, however the kernel hands them
    over (short reads and short copies: network and FUSE file systems, signals)."""
    data = lib + b"pieces"
    (tmp_path / "x.so").write_bytes(data)
    name = "sendfile" if memfd else "read"
    real, calls = getattr(os, name), []

    def short(*args):
        calls.append(1)
        if len(calls) > 12:  # 12 pieces of 7 bytes: more than the head
            return real(*args)
        return real(*args[:-1], min(args[-1], 7 if name == "read" else 4096))

    src = os.open(tmp_path / "x.so", os.O_RDONLY)
    sink = os.memfd_create("x", os.MFD_ALLOW_SEALING) if memfd else -1
    monkeypatch.setattr(os, name, short)
    try:
        sha, head = verify._copy_and_hash(src, sink, len(data), "x.so")
    finally:
        monkeypatch.undo()
        os.close(src)
        if sink >= 0:
            os.close(sink)
    assert len(calls) > 12 and sha == hashlib.sha256(data).hexdigest() and head == data[:64]


def test_without_memfd_a_file_altered_before_its_private_copy_is_refused(tmp_path, lib, monkeypatch):
    """Without memfd the file is read twice (hash, then the private copy): a change in between is caught."""
    monkeypatch.delattr(os, "memfd_create")
    data = lib + b"\0\0\0\0"
    sha = hashlib.sha256(data).hexdigest()
    below = next(lib + t for t in (b"%04d" % i for i in range(999)) if hashlib.sha256(lib + t).hexdigest() < sha)
    above = next(lib + t for t in (b"%04d" % i for i in range(999)) if hashlib.sha256(lib + t).hexdigest() > sha)
    real = verify.check_elf_header
    for i, altered in enumerate((below, above)):
        art = _artifact(tmp_path, f"p{i}.so", data)

        def alter(head, name, path=tmp_path / art.file, altered=altered):
            real(head, name)
            path.write_bytes(altered)  # in place, the same size, after the hash

        monkeypatch.setattr(verify, "check_elf_header", alter)
        _corrupt(art, f"p{i}.so: sha256 differs from the manifest (file altered while read)")
    monkeypatch.setattr(verify, "check_elf_header", real)
    (tmp_path / art.file).write_bytes(data)  # put back: the same file verifies again (no half copy left behind)
    assert verify.verified(art).how == "private-copy"


def test_a_private_copy_that_fails_after_the_memfd_closes_each_descriptor_once(tmp_path, lib, monkeypatch):
    """memfd works, /proc does not, and the private copy then fails: its own error comes out (never EBADF from
    a second close), and no descriptor of this process is lost or leaked."""
    art = _artifact(tmp_path, "p.so", lib + b"\0" * 7)  # bytes no other test verified: nothing cached
    monkeypatch.setattr(verify, "PROC_SELF_FD", str(tmp_path / "no-proc"))

    def fails(*_):
        raise FileNotFoundError(2, "No such file or directory", "private dir")

    monkeypatch.setattr(verify, "_private_copy", fails)
    before = sorted(os.listdir("/proc/self/fd"))
    with pytest.raises(FileNotFoundError):
        verify.verified(art)
    assert sorted(os.listdir("/proc/self/fd")) == before


def test_a_long_non_ascii_file_name_still_gets_a_memfd(tmp_path, lib):
    name = "\u00e9" * 120 + ".so"  # 243 bytes in UTF-8: the label given to the kernel is cut in bytes, not characters
    art = _artifact(tmp_path, name, lib + b"\0" * 9)
    assert verify.verified(art).how == "memfd"


def test_a_long_name_labels_its_memfd_cut_to_240_bytes():
    """Operators see each verified copy as memfd:cuplug:<name> in /proc/PID/maps and fd links; a name longer than
    the kernel takes (249 bytes) is cut, never refused: cuplug: and the name, 240 bytes in all."""
    for name, label in (("sm80", "cuplug:sm80"), ("x" * 300, "cuplug:" + "x" * 233)):
        fd, how = verify._new_sink(name)
        try:
            assert how == "memfd" and os.readlink(f"/proc/self/fd/{fd}") == f"/memfd:{label} (deleted)"
        finally:
            os.close(fd)
