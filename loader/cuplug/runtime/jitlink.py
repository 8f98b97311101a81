"""nvJitLink at load (issue 33 part 3, docs/lto.md): find the library, link an LTO variant for the exact GPU, keep
the image.

An LTO variant holds each source's LTO-IR in ``__nv_relfatbin``. For a GPU of CC X.Y the loader links that LTO-IR
with ``-arch=sm_XY -lto`` into one cubin, wraps it in a fat binary container (contract/fatbin.py), keeps it in
``<cache>/lto/<key>.fatbin`` and hands the checked bytes, sealed in memory, to the backend's registration
(backends/common/cuplug_lto_image.cpp) while it dlopens the library. The key is the self-test's (device UUID,
driver version, artifact sha256) with the SM, nvJitLink's version and cuplug's: a new GPU, driver, build or
nvJitLink links again.
A cached image is reused without nvJitLink being loaded (a 98 MB library).

Finding nvJitLink follows cuda-pathfinder's order for NVIDIA's wheels, without importing it (the decision of every
``load()`` with an LTO variant installed looks, and must stay cheap): NVIDIA's PyPI wheel in a ``sys.path`` entry
(``nvidia/cu13/lib`` for CUDA 13, ``nvidia/nvjitlink/lib`` for CUDA 12), then ``$CONDA_PREFIX/lib``, then
``$CUDA_HOME``/``$CUDA_PATH`` ``lib64``; the newest found serves. Its version is read without loading it: from the
wheel's dist-info name, or from the real file's name (``libnvJitLink.so.12.4.127``).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import sys
import time

from ..contract import fatbin
from ..contract.cache import cache_root
from ..contract.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

# Where NVIDIA's wheel of each CUDA major puts the library, relative to its site directory (the default: CUDA 13's
# nvidia/cu<major>/lib); its dist-info (nvidia_nvjitlink[_cu12]-<version>.dist-info) says the version.
WHEEL_LIB_DIRS: dict[int, str] = {12: "nvidia/nvjitlink/lib"}
ENV_LIB_DIRS = (("CONDA_PREFIX", "lib"), ("CUDA_HOME", "lib64"), ("CUDA_PATH", "lib64"))
INPUT_FATBIN = 4  # nvJitLinkInputType NVJITLINK_INPUT_FATBIN: nvJitLink picks the LTO-IR out of each container


class JitLinkError(RuntimeError):
    """nvJitLink could not be loaded, or refused to link (the message holds its error log)."""


class Found(Record):
    """An nvJitLink library: its path, version (major, minor), full version text and where it was found."""

    __slots__ = ("path", "version", "full", "how")
    path: str
    version: tuple[int, int]
    full: str  # "13.0.88"
    how: str  # "wheel nvidia-nvjitlink 13.0.88 in /site" or "$CUDA_HOME"

    def text(self) -> str:
        return f"nvJitLink {self.full} ({self.how})"


def soname(major: int) -> str:
    return f"libnvJitLink.so.{major}"


def _parse_version(text: str) -> tuple[tuple[int, int], str] | None:
    parts = text.split(".")
    if len(parts) < 2 or not all(p.isdigit() for p in parts[:3]):
        return None
    return (int(parts[0]), int(parts[1])), ".".join(parts[:3])


def _wheel_version(site: str, major: int) -> tuple[tuple[int, int], str] | None:
    """The version in the dist-info name of NVIDIA's nvJitLink wheel of ``major`` installed in ``site``."""
    try:
        names = os.listdir(site)
    except OSError:
        return None
    for name in sorted(names):
        dist, _, rest = name.partition("-")
        if dist == "nvidia_nvjitlink" or dist.startswith("nvidia_nvjitlink_cu"):
            parsed = _parse_version(rest.removesuffix(".dist-info"))
            if parsed is not None and rest.endswith(".dist-info") and parsed[0][0] == major:
                return parsed
    return None


def find(major: int, path: list[str] | None = None, env: Mapping[str, str] | None = None) -> Found | None:
    """The newest nvJitLink of CUDA ``major`` in the places of the module docstring, or None; nothing is loaded (a
    library whose version neither its wheel's dist-info nor its file name says is passed over)."""
    env = os.environ if env is None else env
    name = soname(major)
    sub = WHEEL_LIB_DIRS.get(major, f"nvidia/cu{major}/lib")
    found: list[Found] = []
    for site in sys.path if path is None else path:
        if not isinstance(site, str):  # sys.path may hold anything; a bytes entry names no wheel here
            continue
        candidate = os.path.join(site or ".", sub, name)
        if os.path.isfile(candidate):
            parsed = _wheel_version(site or ".", major) or _file_version(candidate, major)
            if parsed is not None:
                found.append(Found(candidate, parsed[0], parsed[1], f"wheel in {site}"))
    for var, lib in ENV_LIB_DIRS:
        root = env.get(var)
        candidate = os.path.join(root, lib, name) if isinstance(root, str) and root else ""
        if candidate and os.path.isfile(candidate):
            parsed = _file_version(candidate, major)
            if parsed is not None:
                found.append(Found(candidate, parsed[0], parsed[1], f"${var}"))
    # the newest; among equals, the first in the search order (max keeps the first of equal keys)
    return max(found, key=lambda f: tuple(int(p) for p in f.full.split(".")), default=None)


def _file_version(path: str, major: int) -> tuple[tuple[int, int], str] | None:
    """From the real file's name, libnvJitLink.so.12.4.127 (a toolkit's symlinks lead there)."""
    real = os.path.basename(os.path.realpath(path))
    parsed = _parse_version(real.partition(".so.")[2])
    return parsed if parsed is not None and parsed[0][0] == major else None


def _log(lib: ctypes.CDLL, handle: ctypes.c_void_p) -> str:
    size = ctypes.c_size_t()
    if lib.nvJitLinkGetErrorLogSize(handle, ctypes.byref(size)) != 0 or size.value <= 1:
        return ""
    buf = ctypes.create_string_buffer(size.value)
    lib.nvJitLinkGetErrorLog(handle, buf)
    return buf.value.decode(errors="replace").strip()[-2000:]


def link(found: Found, containers: bytes, arch: int) -> bytes:
    """One cubin for ``sm_<arch>`` from the LTO-IR in ``containers`` (an ``__nv_relfatbin`` section)."""
    try:
        lib = ctypes.CDLL(found.path, mode=os.RTLD_LOCAL)
    except OSError as exc:
        raise JitLinkError(f"cannot load {found.path}: {exc}") from None
    options = [f"-arch=sm_{arch}".encode(), b"-lto"]
    handle = ctypes.c_void_p()
    rc = lib.nvJitLinkCreate(ctypes.byref(handle), len(options), (ctypes.c_char_p * len(options))(*options))
    if rc != 0:
        raise JitLinkError(f"nvJitLinkCreate(-arch=sm_{arch}) failed with {rc} (does {found.text()} know sm_{arch}?)")
    try:
        for i, piece in enumerate(fatbin.containers(containers)):  # one per source; nvJitLink takes them one by one
            rc = lib.nvJitLinkAddData(handle, INPUT_FATBIN, piece, len(piece), f"source{i}".encode())
            if rc != 0:
                raise JitLinkError(f"nvJitLinkAddData failed with {rc}: {_log(lib, handle)}")
        rc = lib.nvJitLinkComplete(handle)
        if rc != 0:
            raise JitLinkError(f"nvJitLinkComplete for sm_{arch} failed with {rc}: {_log(lib, handle)}")
        size_t = ctypes.c_size_t()
        if lib.nvJitLinkGetLinkedCubinSize(handle, ctypes.byref(size_t)) != 0:
            raise JitLinkError("nvJitLinkGetLinkedCubinSize failed")
        cubin = ctypes.create_string_buffer(size_t.value)
        if lib.nvJitLinkGetLinkedCubin(handle, cubin) != 0:
            raise JitLinkError("nvJitLinkGetLinkedCubin failed")
        return cubin.raw
    finally:
        lib.nvJitLinkDestroy(ctypes.byref(handle))


class Linked(Record):
    """The image an LTO variant registers: its file, SM, digest, and what making it took."""

    __slots__ = ("path", "arch", "sha256", "ms", "cached", "by")
    path: str  # the cache's file ("" where the cache could not be written)
    arch: int
    sha256: str
    ms: float  # linking and writing; 0 for a cached image
    cached: bool
    by: str  # Found.text()

    def text(self) -> str:
        how = "reused from the cache" if self.cached else f"linked by {self.by} in {self.ms:.0f} ms"
        return f"LTO-IR linked for sm_{self.arch}: {how}"


def cache_key(uuid: str | None, driver: int | None, artifact_sha256: str, arch: int, found: Found) -> str:
    from .. import __version__

    text = f"{uuid}|{driver}|{artifact_sha256}|sm_{arch}|{found.full}|{__version__}"
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _cached(path: str, arch: int) -> bytes | None:
    """The cached image if it is a whole container of one cubin for ``arch`` (a torn write is linked again)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
        entries = fatbin.parse(data)
        # exactly one container, nothing after it: what the registration accepts (cuplug_lto_image.cpp, image_arch)
        whole = fatbin.containers(data) == [data]
    except (OSError, fatbin.FatbinError):
        return None
    one = len(entries) == 1 and entries[0].kind == fatbin.KIND_ELF and not entries[0].compressed
    return data if whole and one and entries[0].arch == arch else None


def image_for(load_path: str, key: str, arch: int, found: Found) -> tuple[Linked, bytes]:
    """The linked image of the library at ``load_path`` for ``sm_<arch>`` and its bytes: from the cache, or linked
    now and kept there (best effort: a cache that cannot be written costs the next load a link, nothing else)."""
    path = os.path.join(cache_root(), "lto", f"{key}.fatbin")
    data = _cached(path, arch)
    if data is not None:
        return Linked(path, arch, hashlib.sha256(data).hexdigest(), 0.0, True, found.text()), data
    t0 = time.perf_counter()
    with open(load_path, "rb") as f:
        section = fatbin.elf_section(f.read(), fatbin.RELOCATABLE_SECTION)
    if not section or not fatbin.lto_targets(section):
        raise JitLinkError(f"no LTO-IR in the library (no {fatbin.RELOCATABLE_SECTION} section with lto_XX)")
    data = fatbin.container(link(found, section, arch), arch)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)  # whole or absent: a concurrent load reads one or the other
    except OSError:
        path = ""
    ms = (time.perf_counter() - t0) * 1e3
    return Linked(path, arch, hashlib.sha256(data).hexdigest(), ms, False, found.text()), data
