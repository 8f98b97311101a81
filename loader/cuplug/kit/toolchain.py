"""Hermetic CUDA toolchains, installed into the user cache and reused.

Two routes, both pinned and checksum-verified by lock files in ``toolchains/``:

* CUDA 13.0 from PyPI (``cuda-toolkit[...]==13.0.2``, every component pinned,
  installed with ``pip --require-hashes --no-deps``).
* CUDA 12.4 from Debian trixie non-free (PyPI has no CUDA 12 nvcc), fetched
  with ``apt-get download`` under a private apt configuration (the system's
  apt state is never touched), checked against the lock's sha256 and unpacked
  with ``dpkg-deb``; its ``nvcc.profile`` is rewritten to be relocatable.
  Debian ships CCCL (libcu++ with ``nv/target``, CUB, Thrust) apart from
  ``nvidia-cuda-dev``, as ``libcu++-dev``/``libcub-dev``/``libthrust-dev``;
  the lock pins those too, and they unpack into the toolkit's ``usr/include``.

Both toolchains carry the headers a real kernel includes (``cuda_fp16.h``,
``cuda_bf16.h``, cooperative groups, CUB/Thrust/libcu++, NVTX 3,
``cuda_profiler_api.h``); :data:`REQUIRED_HEADERS` is checked before an
install counts as complete. See ``docs/toolchains.md``.

A bullseye glibc sysroot (same route) lets the backends link against glibc
2.31's libraries so wheels get ``manylinux_2_17``.

Cross builds for aarch64 (``install(major, arch="aarch64")``, see
``docs/aarch64.md``) reuse the x86_64 nvcc of each major and add, each from its
own lock: Debian bookworm's gcc 12 aarch64 cross compiler (``cross-aarch64.txt``,
unpacked, not installed), a bullseye arm64 glibc sysroot
(``sysroot-bullseye-arm64.txt``) and the aarch64 static CUDA runtime
(``cuda12-aarch64.txt`` from Debian trixie arm64, ``cuda13-aarch64.txt`` from
PyPI's manylinux2014_aarch64 wheel). An overlay directory holds a hard link of
the x86_64 nvcc with a profile whose include and library paths name
``targets/sbsa-linux`` (NVIDIA's cross layout, which CMake looks for).

Each install lands in ``<cache>/toolchains/<name>-<lock digest>``; a
``.complete`` marker written last makes reruns instant and a half-finished
install (interrupted download) start over.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from .process import BuildError, run
from .resources import toolchains_dir

Log = Callable[[str], None]

DEBIAN_MIRROR = "http://deb.debian.org/debian"
DEBIAN_KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")


class ToolchainError(BuildError):
    """A toolchain could not be installed; the message says which step and what to do."""


@dataclasses.dataclass(frozen=True)
class Toolchain:
    """Where one installed CUDA toolkit's pieces are."""

    major: str  # "cuda12" | "cuda13"
    version: str  # toolkit version, e.g. "12.4"
    root: Path  # CUDAToolkit_ROOT
    nvcc: Path
    cuobjdump: Path
    cmake_args: tuple[str, ...] = ()
    arch: str = "x86_64"  # the CPU the host code is built for (ELF e_machine of the result)


def cache_root() -> Path:
    """``$CUPLUG_CACHE_DIR``, else ``$XDG_CACHE_HOME/cuplug``, else ``~/.cache/cuplug`` (contract.cache's rule)."""
    from cuplug.contract.cache import cache_root as root

    return Path(root())


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:12]


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _run(cmd: list[str], step: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
    return run(cmd, step, env, cwd, error=ToolchainError)


def pip_install_locked(python: str, target: Path, requirements: Path, step: str, platform: str | None = None) -> None:
    """Wheels pinned by version and sha256 in ``requirements`` (no dependencies, binaries only) into ``target``:
    how the CUDA 13 toolchain, nvJitLink and the optional components (components.py) are installed; ``platform``
    (a wheel tag: manylinux2014_aarch64) for another CPU's wheels."""
    _run(
        [
            python,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--require-hashes",
            "--only-binary=:all:",
            *(["--platform", platform] if platform else []),
            "--disable-pip-version-check",
            "--no-compile",
            "--target",
            str(target),
            "-r",
            str(requirements),
        ],
        step,
    )


def _reusable(label: str, dest: Path, log: Log) -> bool:
    """``dest`` is already installed in the cache (its install finished: .complete); says so."""
    if (dest / ".complete").exists():
        log(f"{label}: reusing {dest}")
        return True
    return False


def _fresh_dir(path: Path) -> None:
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)


# ---------------------------------------------------------------- Debian route


@dataclasses.dataclass(frozen=True)
class DebLock:
    suite: str
    components: str
    packages: tuple[tuple[str, str, str], ...]  # (name, version, sha256)
    arch: str = "amd64"  # Debian architecture of the index the rows come from (``# arch:``)


def read_deb_lock(path: Path) -> DebLock:
    """Reads a ``toolchains/*.txt`` Debian lock: ``# suite:``/``# components:``/``# arch:`` and rows."""
    suite = components = ""
    arch = "amd64"
    rows = []
    for line in path.read_text().splitlines():
        if line.startswith("# suite:"):
            suite = line.split(":", 1)[1].strip()
        elif line.startswith("# components:"):
            components = line.split(":", 1)[1].strip()
        elif line.startswith("# arch:"):
            arch = line.split(":", 1)[1].strip()
        elif line.strip() and not line.startswith("#"):
            name, version, sha = line.split()
            rows.append((name, version, sha))
    if not suite or not rows:
        raise ToolchainError(f"{path}: lock file lacks '# suite:' or package rows")
    return DebLock(suite, components or "main", tuple(rows), arch)


def _private_apt(state: Path, lock: DebLock, log: Log) -> dict[str, str]:
    """An apt configuration under ``state`` that knows only ``lock.suite``."""
    for sub in ("etc/apt.conf.d", "etc/preferences.d", "lists/partial", "archives/partial", "log"):
        (state / sub).mkdir(parents=True, exist_ok=True)
    (state / "status").touch()
    sandbox = 'APT::Sandbox::User "root";\n' if os.geteuid() == 0 else ""
    (state / "apt.conf").write_text(
        f'Dir::Etc "{state}/etc";\nDir::State "{state}";\nDir::State::Lists "{state}/lists";\n'
        f'Dir::State::status "{state}/status";\nDir::Cache "{state}";\n'
        f'Dir::Cache::archives "{state}/archives";\nDir::Log "{state}/log";\n'
        f'APT::Architecture "{lock.arch}";\nAPT::Architectures {{ "{lock.arch}"; }};\n{sandbox}'
    )
    if not DEBIAN_KEYRING.exists():
        raise ToolchainError(f"{DEBIAN_KEYRING} missing: install the debian-archive-keyring package")
    (state / "etc/sources.list").write_text(
        f"deb [signed-by={DEBIAN_KEYRING}] {DEBIAN_MIRROR} {lock.suite} {lock.components}\n"
    )
    env = {**os.environ, "APT_CONFIG": str(state / "apt.conf"), "LC_ALL": "C"}
    if not any((state / "lists").glob("*Packages*")):
        log(f"apt: reading the {lock.suite} package index (private apt state {state})")
        _run(["apt-get", "update", "-q"], f"apt-get update for {lock.suite}", env=env)
    return env


def fetch_debs(lock: DebLock, downloads: Path, log: Log) -> list[Path]:
    """Downloads each locked .deb once into ``downloads`` and checks its sha256."""
    downloads.mkdir(parents=True, exist_ok=True)
    missing = [r for r in lock.packages if not _matching_deb(downloads, r, lock.arch)]
    if missing:
        state = f"apt-{lock.suite}" if lock.arch == "amd64" else f"apt-{lock.suite}-{lock.arch}"
        env = _private_apt(cache_root() / state, lock, log)
        for name, version, _ in missing:
            log(f"apt: downloading {name}={version}")
            try:
                _run(["apt-get", "download", "-q", f"{name}={version}"], f"download {name}", env=env, cwd=downloads)
            except ToolchainError as exc:
                raise ToolchainError(
                    f"{exc}\nRetry the same command; if the version is gone from the mirror, update "
                    f"{name}'s row in the lock file under toolchains/."
                ) from exc
    debs = []
    for row in lock.packages:
        deb = _matching_deb(downloads, row, lock.arch)
        if deb is None or sha256_file(deb) != row[2]:
            if deb is not None:
                deb.unlink()
            raise ToolchainError(
                f"{row[0]}={row[1]}: sha256 does not match the lock (download corrupted?); "
                "it was removed, run the command again"
            )
        debs.append(deb)
    return debs


def _matching_deb(directory: Path, row: tuple[str, str, str], arch: str = "amd64") -> Path | None:
    name, version, _ = row
    quoted = version.replace(":", "%3a")
    for deb in directory.glob(f"{name}_*.deb"):
        if not deb.name.endswith((f"_{arch}.deb", "_all.deb")):
            continue  # libc6 2.31 amd64 and arm64 share name and version
        if deb.name.startswith(f"{name}_{quoted}_") or deb.name.startswith(f"{name}_{version}_"):
            return deb
    return None


def _unpack(deb: Path, dest: Path, members: tuple[str, ...] = ()) -> None:
    """``dpkg -x``, or only ``members`` (tar wildcards) to skip 2 GB of unused libraries."""
    if not members:
        _run(["dpkg-deb", "-x", str(deb), str(dest)], f"unpack {deb.name}")
        return
    tar = subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb)], stdout=subprocess.PIPE)
    rc = subprocess.run(["tar", "-x", "-C", str(dest), "--wildcards", *members], stdin=tar.stdout, check=False)
    tar.wait()
    if tar.returncode or rc.returncode:
        raise ToolchainError(f"unpack {deb.name}: dpkg-deb/tar failed; delete {dest} and retry")


NVCC_PROFILE = """\
# Relocatable profile written by cuplug: every path is relative to this file.
TOP                = $(_HERE_)/../../..
NVVMIR_LIBRARY_DIR = $(TOP)/lib/cuda/nvvm/libdevice
PATH              += $(_HERE_):$(TOP)/bin:
LD_LIBRARY_PATH   += $(TOP)/lib/x86_64-linux-gnu:
INCLUDES          +=  "-I$(TOP)/include" $(_SPACE_)
LIBRARIES         =+ $(_SPACE_) "-L$(TOP)/lib/x86_64-linux-gnu/stubs" "-L$(TOP)/lib/x86_64-linux-gnu"
"""


def install_cuda12(log: Log) -> Toolchain:
    """CUDA 12.4 from Debian trixie non-free, relocated under the cache."""
    lock_file = toolchains_dir() / "cuda12.txt"
    lock = read_deb_lock(lock_file)
    dest = cache_root() / "toolchains" / f"cuda-12.4-debian-{_digest(lock_file)}"
    usr = dest / "usr"
    tc = Toolchain(
        major="cuda12",
        version="12.4",
        root=usr,
        nvcc=usr / "lib/nvidia-cuda-toolkit/bin/nvcc",
        cuobjdump=usr / "bin/cuobjdump",
        cmake_args=(f"-DCUDAToolkit_ROOT={usr}",),
    )
    if _reusable(tc.major, dest, log):
        return tc
    debs = fetch_debs(lock, cache_root() / "downloads" / "debian-trixie", log)
    _fresh_dir(dest)
    for deb in debs:
        log(f"cuda12: unpacking {deb.name}")
        if deb.name.startswith("nvidia-cuda-dev_"):
            # 930 MB of .deb, of which the build needs headers and the static runtime.
            _unpack(
                deb,
                dest,
                (
                    "./usr/include/*",
                    "*libcudart_static.a",
                    "*libcudadevrt.a",
                    "*libcudart.so",
                    "*libculibos.a",
                    "*stubs/libcuda.so",
                ),
            )
        else:
            _unpack(deb, dest)
    profile = usr / "lib/nvidia-cuda-toolkit/bin/nvcc.profile"
    profile.unlink(missing_ok=True)  # an absolute symlink to /etc/nvcc.profile
    profile.write_text(NVCC_PROFILE)
    wrapper = usr / "bin/nvcc"  # execs an absolute /usr path: make it relative
    wrapper.unlink(missing_ok=True)
    wrapper.write_text('#!/bin/sh\nexec "$(dirname "$(readlink -f "$0")")/../lib/nvidia-cuda-toolkit/bin/nvcc" "$@"\n')
    wrapper.chmod(0o755)
    _check_headers(tc, (usr / "include",))
    _check_nvcc(tc, log)
    (dest / ".complete").write_text(lock_file.read_text())
    return tc


def install_nvjitlink(log: Log, python: str = sys.executable) -> Path:
    """NVIDIA's nvJitLink wheels of both majors (toolchains/nvjitlink.txt) in a private site directory, for the
    tests and benchmarks of LTO variants (docs/lto.md): put it on sys.path and the loader finds them there."""
    lock_file = toolchains_dir() / "nvjitlink.txt"
    dest = cache_root() / "toolchains" / f"nvjitlink-{_digest(lock_file)}"
    if _reusable("nvjitlink", dest, log):
        return dest / "site"
    _fresh_dir(dest)
    log("nvjitlink: pip install of the pinned nvJitLink wheels (about 60 MB)")
    pip_install_locked(
        python, dest / "site", lock_file, "pip install of nvJitLink (retry; check that PyPI is reachable)"
    )
    (dest / ".complete").touch()
    return dest / "site"


def install_cuda13(log: Log, python: str = sys.executable) -> Toolchain:
    """CUDA 13.0.2 from PyPI into a private --target directory."""
    lock_file = toolchains_dir() / "cuda13.txt"
    dest = cache_root() / "toolchains" / f"cuda-13.0.2-pypi-{_digest(lock_file)}"
    cu13 = dest / "site/nvidia/cu13"
    tc = Toolchain(
        major="cuda13",
        version="13.0",
        root=cu13,
        nvcc=cu13 / "bin/nvcc",
        cuobjdump=cu13 / "bin/cuobjdump",
        cmake_args=(f"-DCUDAToolkit_ROOT={cu13}",),
    )
    if _reusable(tc.major, dest, log):
        return tc
    _fresh_dir(dest)
    log("cuda13: pip install of the pinned CUDA 13.0.2 wheels (about 105 MB)")
    pip_install_locked(
        python, dest / "site", lock_file, "pip install of the CUDA 13 toolchain (retry; check that PyPI is reachable)"
    )
    # The pip layout has lib/ but nvcc's profile and CMake expect lib64/ and libcudart.so.
    if not (cu13 / "lib64").exists():
        (cu13 / "lib64").symlink_to("lib")
    if not (cu13 / "lib/libcudart.so").exists():
        (cu13 / "lib/libcudart.so").symlink_to("libcudart.so.13")
    _check_headers(tc, (cu13 / "include", cu13 / "include/cccl"))  # nvcc.profile: -I include, -isystem cccl
    _check_nvcc(tc, log)
    (dest / ".complete").write_text(lock_file.read_text())
    return tc


# Headers every toolchain must have, relative to one of its include directories (nvcc searches
# them all). A lock that loses a package fails the install here, not in an author's build.
REQUIRED_HEADERS = (
    "cuda_runtime.h",
    "cuda_fp16.h",
    "cuda_bf16.h",
    "cooperative_groups.h",
    "cooperative_groups/reduce.h",
    "nv/target",  # cuda_fp16.h and cuda_bf16.h include it (libcu++)
    "cuda/std/type_traits",  # cooperative groups include it (libcu++)
    "cub/cub.cuh",
    "thrust/version.h",
    "nvtx3/nvToolsExt.h",
    "cuda_profiler_api.h",
)


def _check_headers(tc: Toolchain, include_dirs: tuple[Path, ...]) -> None:
    missing = [h for h in REQUIRED_HEADERS if not any((d / h).is_file() for d in include_dirs)]
    if missing:
        raise ToolchainError(
            f"{tc.major}: the installed toolchain lacks {', '.join(missing)} under "
            f"{', '.join(map(str, include_dirs))}; its lock file under toolchains/ misses a package"
        )


def _check_nvcc(tc: Toolchain, log: Log) -> None:
    out = _run([str(tc.nvcc), "--version"], f"{tc.major}: nvcc --version")
    if f"release {tc.version}" not in out:
        raise ToolchainError(f"{tc.nvcc} is not CUDA {tc.version}:\n{out}")
    log(f"{tc.major}: nvcc {tc.version} ready at {tc.nvcc}")


# CPU architecture (ELF e_machine / uname -m) -> Debian architecture, multiarch triplet.
ARCHES = {"x86_64": ("amd64", "x86_64-linux-gnu"), "aarch64": ("arm64", "aarch64-linux-gnu")}
SYSROOT_LOCKS = {"x86_64": "sysroot-bullseye.txt", "aarch64": "sysroot-bullseye-arm64.txt"}


def _check_arch(arch: str) -> None:
    if arch not in ARCHES:
        raise ToolchainError(f"unknown CPU architecture {arch!r}; choose one of {sorted(ARCHES)}")


def _downloads(lock: DebLock) -> Path:
    """The .deb cache of one suite (amd64: the directory the x86_64 locks always used)."""
    tail = "" if lock.arch == "amd64" else f"-{lock.arch}"
    return cache_root() / "downloads" / f"debian-{lock.suite}{tail}"


def install_sysroot(log: Log, arch: str = "x86_64") -> Path:
    """A bullseye glibc 2.31 sysroot of ``arch`` for linking (never for running)."""
    _check_arch(arch)
    lock_file = toolchains_dir() / SYSROOT_LOCKS[arch]
    tail = "" if arch == "x86_64" else f"-{ARCHES[arch][0]}"
    dest = cache_root() / "toolchains" / f"sysroot-bullseye{tail}-{_digest(lock_file)}"
    if _reusable("sysroot", dest, log):
        return dest
    lock = read_deb_lock(lock_file)
    debs = fetch_debs(lock, _downloads(lock), log)
    _fresh_dir(dest)
    for deb in debs:
        _unpack(deb, dest)
    # Absolute symlinks (libdl.so -> /lib/...) would lead ld back to the host glibc.
    _relative_symlinks(dest)
    (dest / ".complete").write_text(lock_file.read_text())
    log(f"sysroot: {arch} glibc 2.31 sysroot ready at {dest}")
    return dest


PYTHON_HEADER_LOCKS = {"x86_64": "python-headers.txt", "aarch64": "python-headers-arm64.txt"}
PYTHON_ABI3 = "3.11"  # the stable ABI the cuplug wheel's extension is built on (loader/fastcall)


def install_python_headers(log: Log, arch: str = "x86_64") -> Path:
    """CPython 3.11's headers for ``arch`` (Debian bookworm's libpython3.11-dev, headers only): the include
    directory holding ``python3.11/Python.h`` and the multiarch ``<triplet>/python3.11/pyconfig.h``."""
    _check_arch(arch)
    lock_file = toolchains_dir() / PYTHON_HEADER_LOCKS[arch]
    dest = cache_root() / "toolchains" / f"python-headers-{ARCHES[arch][0]}-{_digest(lock_file)}"
    include = dest / "usr" / "include"
    if _reusable("python headers", dest, log):
        return include
    lock = read_deb_lock(lock_file)
    debs = fetch_debs(lock, _downloads(lock), log)
    _fresh_dir(dest)
    for deb in debs:
        _unpack(deb, dest, ("./usr/include/*",))
    for needed in (include / f"python{PYTHON_ABI3}" / "Python.h", include / ARCHES[arch][1] / f"python{PYTHON_ABI3}"):
        if not needed.exists():
            raise ToolchainError(f"{dest} lacks {needed.relative_to(dest)}; check {lock_file.name}")
    (dest / ".complete").write_text(lock_file.read_text())
    log(f"python headers: CPython {PYTHON_ABI3} ({arch}) at {include}")
    return include


def _relative_symlinks(dest: Path) -> None:
    for link in dest.rglob("*"):
        if link.is_symlink() and os.readlink(link).startswith("/"):
            target = dest / os.readlink(link).lstrip("/")
            link.unlink()
            link.symlink_to(os.path.relpath(target, link.parent))


# ---------------------------------------------------------------- aarch64 cross route

CROSS_TRIPLET = "aarch64-linux-gnu"
CROSS_TARGET_DIR = "targets/sbsa-linux"  # NVIDIA's cross layout; CMake's FindCUDAToolkit looks for it
_BINUTILS_WRAPPER = """#!/bin/sh
# Written by cuplug: Debian's cross binutils find their private libbfd/libopcodes in
# /usr/lib/x86_64-linux-gnu; in this relocated tree they are beside us.
d="$(dirname "$(readlink -f "$0")")/.."
LD_LIBRARY_PATH="$d/lib/x86_64-linux-gnu${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}" exec "$d/libexec/cuplug-binutils/{name}" "$@"
"""


def install_cross_compiler(log: Log) -> Path:
    """Debian bookworm's gcc 12 aarch64 cross compiler, unpacked under the cache.

    Returns the prefix of its tools, ``<dir>/usr/bin/aarch64-linux-gnu-`` (append ``gcc``, ``g++``).
    """
    lock_file = toolchains_dir() / "cross-aarch64.txt"
    dest = cache_root() / "toolchains" / f"cross-aarch64-gcc12-{_digest(lock_file)}"
    prefix = dest / "usr" / "bin" / f"{CROSS_TRIPLET}-"
    if _reusable("cross", dest, log):
        return prefix
    lock = read_deb_lock(lock_file)
    debs = fetch_debs(lock, _downloads(lock), log)
    _fresh_dir(dest)
    for deb in debs:
        log(f"cross: unpacking {deb.name}")
        _unpack(deb, dest)
    _relative_symlinks(dest)
    bindir = dest / "usr" / "bin"
    real = dest / "usr" / "libexec" / "cuplug-binutils"
    real.mkdir(parents=True, exist_ok=True)
    for tool in sorted(bindir.glob(f"{CROSS_TRIPLET}-*")):
        if tool.is_symlink() or not _needs_private_bfd(tool):
            continue
        tool.rename(real / tool.name)
        tool.write_text(_BINUTILS_WRAPPER.format(name=tool.name))
        tool.chmod(0o755)
    # libc.so is a linker script naming /usr/aarch64-linux-gnu/lib/...: bare names make ld
    # search its library path instead (this tree's lib, or a sysroot's when one is given).
    for script in (dest / "usr" / CROSS_TRIPLET / "lib").glob("*.so"):
        if not script.is_symlink() and script.stat().st_size < 4096 and b"GNU ld script" in script.read_bytes():
            script.write_text(script.read_text().replace(f"/usr/{CROSS_TRIPLET}/lib/", ""))
    for name in ("gcc", "g++", "cpp", "gcc-ar", "gcc-nm", "gcc-ranlib"):  # crossbuild-essential's unversioned names
        link = bindir / f"{CROSS_TRIPLET}-{name}"
        if not link.exists():
            link.symlink_to(f"{CROSS_TRIPLET}-{name}-12")
    _check_cross(prefix, dest, log)
    (dest / ".complete").write_text(lock_file.read_text())
    return prefix


def _needs_private_bfd(tool: Path) -> bool:
    """Whether an ELF tool of the cross binutils NEEDs its private libbfd/libopcodes/libctf."""
    data = tool.read_bytes()
    return data[:4] == b"\x7fELF" and any(
        lib in data for lib in (b"libbfd-2.", b"libopcodes-2.", b"libctf-arm64", b"libctf-nobfd-arm64")
    )


def _check_cross(prefix: Path, dest: Path, log: Log) -> None:
    machine = _run([f"{prefix}gcc", "-dumpmachine"], "cross gcc -dumpmachine").strip()
    if machine != CROSS_TRIPLET:
        raise ToolchainError(f"{prefix}gcc targets {machine!r}, not {CROSS_TRIPLET}")
    probe = dest / "cuplug-probe.cpp"
    probe.write_text('#include <vector>\nextern "C" int f(void) { return (int)std::vector<int>(3).size(); }\n')
    _run([f"{prefix}g++", "-c", "-fPIC", "-O2", str(probe), "-o", str(dest / "cuplug-probe.o")], "cross g++ -c")
    for f in (probe, dest / "cuplug-probe.o"):
        f.unlink()
    log(f"cross: {CROSS_TRIPLET}-gcc 12 ready at {prefix}gcc")


def _overlay_profile(major: str, host: Toolchain, overlay: Path) -> str:
    """nvcc.profile of the cross overlay: the x86_64 tools, the sbsa-linux target's headers and libraries."""
    tk = os.path.relpath(host.root, overlay / "bin")
    t = f"$(TOP)/{CROSS_TARGET_DIR}"
    if major == "cuda13":
        tools = (
            f"HOST_TK            = $(_HERE_)/{tk}\n"
            "CICC_PATH          = $(HOST_TK)/nvvm/bin\n"
            "NVVMIR_LIBRARY_DIR = $(HOST_TK)/nvvm/libdevice\n"
            "LD_LIBRARY_PATH   += $(HOST_TK)/lib:\n"
            "PATH              += $(CICC_PATH):$(HOST_TK)/bin:\n"
            f'SYSTEM_INCLUDES   +=  "-isystem" "{t}/include/cccl" $(_SPACE_)\n'
        )
    else:  # Debian's layout: root is usr/, nvcc and cicc in lib/nvidia-cuda-toolkit/bin, the rest in bin
        tools = (
            f"HOST_TK            = $(_HERE_)/{tk}\n"
            "CICC_PATH          = $(HOST_TK)/lib/nvidia-cuda-toolkit/bin\n"
            "NVVMIR_LIBRARY_DIR = $(HOST_TK)/lib/cuda/nvvm/libdevice\n"
            "PATH              += $(CICC_PATH):$(HOST_TK)/bin:\n"
        )
    return (
        "# Written by cuplug: the x86_64 nvcc of this major, cross-compiling for aarch64.\n"
        "# Device code and headers are the host toolkit's (arch-independent); host-side\n"
        f"# libraries are the aarch64 ones in {CROSS_TARGET_DIR}/lib.\n"
        "TOP                = $(_HERE_)/..\n"
        f"{tools}"
        f'INCLUDES          +=  "-I{t}/include" $(_SPACE_)\n'
        f'LIBRARIES         =+ $(_SPACE_) "-L{t}/lib/stubs" "-L{t}/lib"\n'
    )


def _target_libs_cuda12(dest: Path, log: Log) -> list[Path]:
    """libcudart_static.a & co. for aarch64 from Debian trixie arm64, into ``dest``."""
    lock = read_deb_lock(toolchains_dir() / "cuda12-aarch64.txt")
    debs = fetch_debs(lock, _downloads(lock), log)
    raw = dest.parent / "debs"
    _fresh_dir(raw)
    for deb in debs:
        log(f"cuda12/aarch64: unpacking {deb.name} (libraries only)")
        members: tuple[str, ...]
        if deb.name.startswith("nvidia-cuda-dev_"):
            members = ("*libcudart_static.a", "*libcudadevrt.a", "*libculibos.a", "*stubs/libcuda.so", "*libcudart.so")
        else:  # libcudart12: the shared runtime, only so CMake's FindCUDAToolkit finds CUDA::cudart
            members = ("*libcudart.so.12*",)
        _unpack(deb, raw, members)
    src = raw / "usr" / "lib" / "aarch64-linux-gnu"
    if not (src / "libcudart_static.a").is_file():
        raise ToolchainError(f"cuda12/aarch64: {src} holds no libcudart_static.a; check cuda12-aarch64.txt")
    shutil.copytree(src, dest, symlinks=True, dirs_exist_ok=True)
    shutil.rmtree(raw)
    return [dest / "libcudart_static.a"]


def _target_libs_cuda13(dest: Path, log: Log, python: str = sys.executable) -> list[Path]:
    """libcudart_static.a & co. for aarch64 from PyPI's manylinux2014_aarch64 wheel, into ``dest``."""
    site = dest.parent / "site"
    _fresh_dir(site)
    log("cuda13/aarch64: pip install of the pinned aarch64 nvidia-cuda-runtime wheel (2.3 MB)")
    pip_install_locked(
        python,
        site,
        toolchains_dir() / "cuda13-aarch64.txt",
        "pip install of the aarch64 CUDA 13 runtime (retry; check that PyPI is reachable)",
        platform="manylinux2014_aarch64",
    )
    src = site / "nvidia" / "cu13" / "lib"
    shutil.copytree(src, dest, symlinks=True, dirs_exist_ok=True)
    shutil.rmtree(site)
    if not (dest / "libcudart.so").exists():
        (dest / "libcudart.so").symlink_to("libcudart.so.13")
    return [dest / "libcudart_static.a"]


def install_cross(major: str, log: Log = print, arch: str = "aarch64") -> Toolchain:
    """The ``major`` toolchain cross-compiling for ``arch`` (aarch64): x86_64 nvcc, cross gcc, aarch64 cudart."""
    if arch != "aarch64":
        raise ToolchainError(f"cross builds target aarch64 only, not {arch!r}")
    host = INSTALLERS[major](log)
    prefix = install_cross_compiler(log)
    host_lock = toolchains_dir() / ("cuda12.txt" if major == "cuda12" else "cuda13.txt")
    target_lock = toolchains_dir() / f"{major}-aarch64.txt"
    key = hashlib.sha256(host_lock.read_bytes() + target_lock.read_bytes() + _OVERLAY_LAYOUT).hexdigest()[:12]
    dest = cache_root() / "toolchains" / f"{major}-aarch64-{key}"
    cmake_file = _cmake_dir() / f"{CROSS_TRIPLET}.cmake"
    tc = Toolchain(
        major=major,
        version=host.version,
        root=dest,
        nvcc=dest / "bin" / "nvcc",
        cuobjdump=host.cuobjdump,
        cmake_args=(
            f"-DCUDAToolkit_ROOT={dest}",
            f"-DCMAKE_TOOLCHAIN_FILE={cmake_file}",
            f"-DCUPLUG_CROSS_PREFIX={prefix}",
        ),
        arch=arch,
    )
    if _reusable(f"{major}/aarch64", dest, log):
        return tc
    _fresh_dir(dest)
    lib = dest / CROSS_TARGET_DIR / "lib"
    lib.mkdir(parents=True)
    (dest / CROSS_TARGET_DIR / "lib64").symlink_to("lib")
    host_include = host.root / "include"
    (dest / CROSS_TARGET_DIR / "include").symlink_to(os.path.relpath(host_include, dest / CROSS_TARGET_DIR))
    (_target_libs_cuda12 if major == "cuda12" else _target_libs_cuda13)(lib, log)
    bindir = dest / "bin"
    bindir.mkdir()
    host_nvcc = host.nvcc.resolve()
    try:  # nvcc reads nvcc.profile beside its real path (/proc/self/exe): a symlink would not do
        os.link(host_nvcc, bindir / "nvcc")
    except OSError:
        shutil.copy2(host_nvcc, bindir / "nvcc")
    if (host_nvcc.parent / "crt").is_dir():
        (bindir / "crt").symlink_to(os.path.relpath(host_nvcc.parent / "crt", bindir))
    (bindir / "nvcc.profile").write_text(_overlay_profile(major, host, dest))
    _check_headers(tc, (host_include, host_include / "cccl"))
    _check_nvcc(tc, log)
    _check_cross_nvcc(tc, prefix, dest, log)
    (dest / ".complete").write_text(host_lock.read_text() + target_lock.read_text())
    return tc


_OVERLAY_LAYOUT = b"cuplug cross overlay 1"  # bump when the overlay's layout or profile changes


def _cmake_dir() -> Path:
    from .resources import cmake_dir

    return cmake_dir()


def _check_cross_nvcc(tc: Toolchain, prefix: Path, dest: Path, log: Log) -> None:
    """One kernel through the overlay nvcc with the cross g++: the object must be AArch64."""
    probe = dest / "cuplug-probe.cu"
    probe.write_text("__global__ void k(float* x) { x[threadIdx.x] += 1.0f; }\n")
    obj = dest / "cuplug-probe.o"
    _run(
        [
            str(tc.nvcc),
            "-ccbin",
            f"{prefix}g++",
            "-c",
            "-arch=sm_80",
            "-Xcompiler",
            "-fPIC",
            str(probe),
            "-o",
            str(obj),
        ],
        f"{tc.major}/aarch64: nvcc -ccbin {prefix}g++",
    )
    machine = int.from_bytes(obj.read_bytes()[18:20], "little")
    for f in (probe, obj):
        f.unlink()
    if machine != 183:  # EM_AARCH64
        raise ToolchainError(f"{tc.major}/aarch64: the probe object has e_machine {machine}, not AArch64 (183)")
    log(f"{tc.major}/aarch64: nvcc {tc.version} cross-compiles with {prefix}g++ ({tc.nvcc})")


def install_emulation_root(log: Log) -> Path:
    """An aarch64 Debian bookworm tree with Python 3.11, to run aarch64 wheels under ``qemu-aarch64 -L``.

    For tests only (``toolchains/python-bookworm-arm64.txt``): ``<root>/usr/bin/python3.11`` is the
    interpreter, ``<root>/usr/share/python-wheels/pip-*.whl`` the pip to run from its wheel.
    """
    lock_file = toolchains_dir() / "python-bookworm-arm64.txt"
    dest = cache_root() / "toolchains" / f"python-bookworm-arm64-{_digest(lock_file)}"
    if _reusable("emulation root", dest, log):
        return dest
    lock = read_deb_lock(lock_file)
    debs = fetch_debs(lock, _downloads(lock), log)
    _fresh_dir(dest)
    for deb in debs:
        _unpack(deb, dest)
    _relative_symlinks(dest)
    if not (dest / "usr" / "bin" / "python3.11").is_file():
        raise ToolchainError(f"{dest} lacks usr/bin/python3.11; check {lock_file.name}")
    (dest / ".complete").write_text(lock_file.read_text())
    log(f"emulation root: aarch64 Python 3.11 ready at {dest}")
    return dest


INSTALLERS: dict[str, Callable[[Log], Toolchain]] = {"cuda12": install_cuda12, "cuda13": install_cuda13}


def install(major: str, log: Log = print, arch: str = "x86_64") -> Toolchain:
    """Installs (or reuses) the toolchain of one CUDA major (``cuda12``/``cuda13``) building for ``arch``."""
    if major not in INSTALLERS:
        raise ToolchainError(f"unknown CUDA major {major!r}; choose one of {sorted(INSTALLERS)}")
    _check_arch(arch)
    if arch != "x86_64":
        return install_cross(major, log, arch)
    return INSTALLERS[major](log)
