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

from .resources import toolchains_dir

Log = Callable[[str], None]

DEBIAN_MIRROR = "http://deb.debian.org/debian"
DEBIAN_KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")


class ToolchainError(RuntimeError):
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


def cache_root() -> Path:
    """``$CUPLUG_CACHE_DIR``, else ``$XDG_CACHE_HOME/cuplug``, else ``~/.cache/cuplug``."""
    if os.environ.get("CUPLUG_CACHE_DIR"):
        return Path(os.environ["CUPLUG_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "cuplug"


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:12]


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _run(cmd: list[str], step: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
    try:
        proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, check=False)
    except FileNotFoundError as exc:
        raise ToolchainError(f"{step}: `{cmd[0]}` is not installed ({exc})") from exc
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip()[-2000:]
        raise ToolchainError(f"{step} failed (exit {proc.returncode}): {' '.join(cmd)}\n{tail}")
    return proc.stdout


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


def read_deb_lock(path: Path) -> DebLock:
    """Reads a ``toolchains/*.txt`` Debian lock: ``# suite:``/``# components:`` and rows."""
    suite = components = ""
    rows = []
    for line in path.read_text().splitlines():
        if line.startswith("# suite:"):
            suite = line.split(":", 1)[1].strip()
        elif line.startswith("# components:"):
            components = line.split(":", 1)[1].strip()
        elif line.strip() and not line.startswith("#"):
            name, version, sha = line.split()
            rows.append((name, version, sha))
    if not suite or not rows:
        raise ToolchainError(f"{path}: lock file lacks '# suite:' or package rows")
    return DebLock(suite, components or "main", tuple(rows))


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
        f'APT::Architecture "amd64";\n{sandbox}'
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
    missing = [r for r in lock.packages if not _matching_deb(downloads, r)]
    if missing:
        env = _private_apt(cache_root() / f"apt-{lock.suite}", lock, log)
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
        deb = _matching_deb(downloads, row)
        if deb is None or sha256_file(deb) != row[2]:
            if deb is not None:
                deb.unlink()
            raise ToolchainError(
                f"{row[0]}={row[1]}: sha256 does not match the lock (download corrupted?); "
                "it was removed, run the command again"
            )
        debs.append(deb)
    return debs


def _matching_deb(directory: Path, row: tuple[str, str, str]) -> Path | None:
    name, version, _ = row
    quoted = version.replace(":", "%3a")
    for deb in directory.glob(f"{name}_*.deb"):
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
    if (dest / ".complete").exists():
        log(f"cuda12: reusing {dest}")
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
    if (dest / ".complete").exists():
        log(f"cuda13: reusing {dest}")
        return tc
    _fresh_dir(dest)
    log("cuda13: pip install of the pinned CUDA 13.0.2 wheels (about 105 MB)")
    _run(
        [
            python,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--require-hashes",
            "--only-binary=:all:",
            "--disable-pip-version-check",
            "--no-compile",
            "--target",
            str(dest / "site"),
            "-r",
            str(lock_file),
        ],
        "pip install of the CUDA 13 toolchain (retry; check that PyPI is reachable)",
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


def install_sysroot(log: Log) -> Path:
    """A bullseye glibc 2.31 sysroot for linking (never for running)."""
    lock_file = toolchains_dir() / "sysroot-bullseye.txt"
    dest = cache_root() / "toolchains" / f"sysroot-bullseye-{_digest(lock_file)}"
    if (dest / ".complete").exists():
        log(f"sysroot: reusing {dest}")
        return dest
    debs = fetch_debs(read_deb_lock(lock_file), cache_root() / "downloads" / "debian-bullseye", log)
    _fresh_dir(dest)
    for deb in debs:
        _unpack(deb, dest)
    # Absolute symlinks (libdl.so -> /lib/...) would lead ld back to the host glibc.
    for link in dest.rglob("*"):
        if link.is_symlink() and os.readlink(link).startswith("/"):
            target = dest / os.readlink(link).lstrip("/")
            link.unlink()
            link.symlink_to(os.path.relpath(target, link.parent))
    (dest / ".complete").write_text(lock_file.read_text())
    log(f"sysroot: glibc 2.31 sysroot ready at {dest}")
    return dest


INSTALLERS: dict[str, Callable[[Log], Toolchain]] = {"cuda12": install_cuda12, "cuda13": install_cuda13}


def install(major: str, log: Log = print) -> Toolchain:
    """Installs (or reuses) the toolchain of one CUDA major: ``cuda12`` or ``cuda13``."""
    if major not in INSTALLERS:
        raise ToolchainError(f"unknown CUDA major {major!r}; choose one of {sorted(INSTALLERS)}")
    return INSTALLERS[major](log)
