"""A reader for the CUDA fat binary container in an ELF's ``.nv_fatbin`` section.

NVIDIA documents the section names (``fatbinary_section.h``: ``.nv_fatbin``,
magic ``0xBA55ED50``) but not the entry layout; what follows is the layout as
the CUDA 12.4 and 13.0 toolkits write it, checked in the tests against
``cuobjdump --list-elf --list-ptx`` on every artifact cuplug builds.

The section holds one or more containers, each 8-byte aligned::

    container header (16 B):  u32 magic 0xBA55ED50 | u16 version (1) | u16 header size (16)
                              | u64 size of the entries that follow
    entry (header size B, then payload):
        +0  u16 kind            1 = PTX, 2 = ELF (SASS), 8 = LTO-IR (CUDA 13.0 and 12.4, in __nv_relfatbin)
        +2  u16 entry version   0x0101
        +4  u32 entry header size (offset of the payload)
        +8  u64 payload size (padded)
        +16 u32 compressed size (0: stored uncompressed)
        +24 u16 minor, u16 major  code version: the PTX ISA for PTX entries ([8,4] -> "8.4"),
                                   the cubin ELF ABI for ELF entries
        +28 u32 arch            SM number: 75 -> sm_75 / compute_75
        +40 u64 flags           0x1 64-bit, 0x10 Linux host, 0x2000/0x8000 compressed payload,
                                0x100000 arch-specific code (sm_90a, compute_90a), 0x200000 family code
                                (sm_100f, compute_100f): cuobjdump's "arch = sm_90a" comes from these two

Payloads are never decompressed: the facts cuplug needs (kind, arch, ISA) are
in the entry headers, so parsing is a walk over a few dozen headers.

An LTO variant (docs/lto.md) also has ``__nv_relfatbin``: each source's relocatable
containers, with its LTO-IR (kind 8), in the same layout. :func:`container` writes the
one-entry container of a cubin nvJitLink linked at load, the way nvcc's own are laid out.
"""

from __future__ import annotations

import struct

from .record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:  # neither typing nor collections is imported at run time: jitlink imports this inside load()
    from collections.abc import Iterator
    from typing import Any

MAGIC = 0xBA55ED50
KIND_PTX, KIND_ELF, KIND_LTO = 1, 2, 8
FATBIN_SECTION = ".nv_fatbin"  # the device code a library registers at load
RELOCATABLE_SECTION = "__nv_relfatbin"  # the device code of separate compilation (an LTO variant's LTO-IR)
_ELF_ENTRY_FLAGS = 0x11  # 64-bit, Linux host: what nvcc writes for an uncompressed cubin
FLAG_ARCH_SPECIFIC, FLAG_FAMILY = 0x100000, 0x200000  # measured: CUDA 12.4 (sm_90a) and 13.0 (sm_90a, sm_100a/f)
_FLAGS = struct.Struct("<Q")
_FLAGS_AT = 40
_CONTAINER = struct.Struct("<IHHQ")
_ENTRY = struct.Struct("<HHIQIIHHI")


class FatbinError(ValueError):
    """The section is not a fat binary container this reader understands."""


class MissingDependency(FatbinError):
    """What reads device code is not installed here (pyelftools): a fault of this environment, not of a file."""


class Entry(Record):
    __slots__ = ("kind", "arch", "version", "compressed", "payload_size", "suffix")
    kind: int
    arch: int
    version: tuple[int, int]  # (major, minor)
    compressed: bool
    payload_size: int
    suffix: str  # "a" (arch-specific), "f" (family) or ""

    @property
    def target(self) -> str:
        prefix = {KIND_PTX: "compute", KIND_LTO: "lto"}.get(self.kind, "sm")
        return f"{prefix}_{self.arch}{self.suffix}"


class DeviceCode(Record):
    __slots__ = ("sass", "ptx", "ptx_isa", "entries")
    sass: tuple[str, ...]  # sorted by arch: ("sm_75", "sm_80")
    ptx: tuple[str, ...]  # ("compute_75",)
    ptx_isa: str | None  # "8.4"; None without PTX
    entries: tuple[Entry, ...]


def _containers(section: bytes) -> Iterator[tuple[int, int, int]]:
    """(offset, header size, entries' size) of every container of a section, padding between them skipped."""
    off = 0
    while off + _CONTAINER.size <= len(section):
        magic, version, header_size, size = _CONTAINER.unpack_from(section, off)
        if magic != MAGIC:
            if not any(section[off : off + 8]):  # alignment padding between containers
                off += 8
                continue
            raise FatbinError(f"offset {off}: magic {magic:#x} is not {MAGIC:#x}")
        if version != 1 or header_size < _CONTAINER.size:
            raise FatbinError(f"offset {off}: container version {version}, header size {header_size} unknown")
        end = off + header_size + size
        if end > len(section):
            raise FatbinError(f"offset {off}: container of {size} B runs past the section ({len(section)} B)")
        yield off, header_size, size
        off = (end + 7) & ~7


def containers(section: bytes) -> list[bytes]:
    """The bytes of each container of a section, in order (an LTO variant's sources: one each); anything after
    the last container is a FatbinError (a torn or padded section is no set of containers)."""
    spans = list(_containers(section))
    end = (spans[-1][0] + spans[-1][1] + spans[-1][2] + 7) & ~7 if spans else 0
    if end < len(section):
        raise FatbinError(f"offset {end}: {len(section) - end} B after the last container")
    return [section[off : off + header_size + size] for off, header_size, size in spans]


def parse(section: bytes) -> list[Entry]:
    """Every entry of every container in a ``.nv_fatbin`` section."""
    entries: list[Entry] = []
    for off, header_size, size in _containers(section):
        pos, end = off + header_size, off + header_size + size
        while pos < end:
            if pos + _ENTRY.size > end:
                raise FatbinError(f"offset {pos}: truncated entry header")
            kind, _ver, ehs, psize, csize, _opt, minor, major, arch = _ENTRY.unpack_from(section, pos)
            if ehs < _ENTRY.size or pos + ehs + psize > end:
                raise FatbinError(f"offset {pos}: entry header {ehs} B + payload {psize} B exceed the container")
            flags = _FLAGS.unpack_from(section, pos + _FLAGS_AT)[0] if ehs >= _FLAGS_AT + _FLAGS.size else 0
            suffix = "a" if flags & FLAG_ARCH_SPECIFIC else "f" if flags & FLAG_FAMILY else ""
            entries.append(Entry(kind, arch, (major, minor), csize != 0, psize, suffix))
            pos += ehs + psize
    if not entries:
        raise FatbinError("no fat binary container in the section")
    return entries


def device_code(section: bytes) -> DeviceCode:
    """SASS and PTX targets and the PTX ISA of a section (several ISAs: FatbinError)."""
    entries = parse(section)
    sass = sorted({(e.arch, e.suffix) for e in entries if e.kind == KIND_ELF})
    ptx = sorted({(e.arch, e.suffix) for e in entries if e.kind == KIND_PTX})
    isas = sorted({e.version for e in entries if e.kind == KIND_PTX})
    if len(isas) > 1:
        raise FatbinError(f"PTX of several ISA versions: {isas}")
    return DeviceCode(
        tuple(f"sm_{a}{x}" for a, x in sass),
        tuple(f"compute_{a}{x}" for a, x in ptx),
        f"{isas[0][0]}.{isas[0][1]}" if isas else None,
        tuple(entries),
    )


def lto_targets(section: bytes) -> tuple[str, ...]:
    """The LTO-IR targets of a ``__nv_relfatbin`` section, sorted by arch: ("lto_75",)."""
    return tuple(f"lto_{a}" for a in sorted({e.arch for e in parse(section) if e.kind == KIND_LTO}))


def container(cubin: bytes, arch: int) -> bytes:
    """A fat binary container of one uncompressed cubin for ``sm_<arch>``, laid out as nvcc writes its own (the
    entry's code version is the cubin's ELF ABI version, as cuobjdump shows it: [1,8])."""
    if cubin[:4] != b"\x7fELF" or len(cubin) < 16:
        raise FatbinError("not a cubin (no ELF header)")
    payload = cubin + b"\0" * (-len(cubin) % 8)
    header = bytearray(64)
    _ENTRY.pack_into(header, 0, KIND_ELF, 0x0101, len(header), len(payload), 0, 0, cubin[8], 1, arch)
    _FLAGS.pack_into(header, _FLAGS_AT, _ELF_ENTRY_FLAGS)
    body = bytes(header) + payload
    return _CONTAINER.pack(MAGIC, 1, _CONTAINER.size, len(body)) + body


def _declared(project: str) -> str:
    """cuplug's requirement on ``project`` as its own dist-info declares it (``project`` where none says)."""
    from .distributions import own_distribution

    own = own_distribution()
    return (own.requirement(project) if own is not None else None) or project


def reader_missing() -> str | None:
    """Why ELF sections cannot be read here (pyelftools, cuplug's dependency, not installed: a --no-deps install),
    naming the fix; None when they can. A look in sys.modules, then on sys.path: pyelftools is not imported, nor is
    importlib.util (which would import functools and contextlib into load())."""
    import sys
    from importlib.machinery import PathFinder

    if "elftools" in sys.modules:
        if sys.modules["elftools"] is not None:  # None: an import of it is refused
            return None
    elif PathFinder.find_spec("elftools") is not None:
        return None
    return f"reading the LTO-IR out of the library needs pyelftools, not installed here: pip install '{_declared('pyelftools')}'"


def elf_section(data: bytes, name: str) -> bytes | None:
    """The bytes of section ``name`` of an ELF image (None: no such section); FatbinError for an unreadable one."""
    return elf_sections(data, (name,))[name]


def elf_sections(data: bytes, names: tuple[str, ...]) -> dict[str, bytes | None]:
    """The bytes of each section of ``names`` (None: no such section), the ELF parsed once; FatbinError for an
    unreadable one, MissingDependency without pyelftools."""
    import io

    try:
        from elftools.common.exceptions import ELFError
        from elftools.elf.elffile import ELFFile
    except ImportError as exc:  # a --no-deps install: say what is missing and how to get it
        raise MissingDependency(
            f"reading ELF sections needs pyelftools, a dependency of cuplug not installed here ({exc}): "
            f"pip install '{_declared('pyelftools')}'"
        ) from exc
    try:
        elf = ELFFile(io.BytesIO(data))
        return {name: _section_bytes(elf.get_section_by_name(name), name, len(data)) for name in names}
    except FatbinError:
        raise
    except (ELFError, Exception) as exc:  # hostile input: every parser failure is "unreadable"
        raise FatbinError(f"not a readable ELF file: {type(exc).__name__}: {exc}") from exc


def _section_bytes(section: Any, name: str, file_size: int) -> bytes | None:
    if section is None:
        return None
    size, offset = int(section["sh_size"]), int(section["sh_offset"])  # unsigned in ELF64
    if section["sh_type"] == "SHT_NOBITS":  # no bytes in the file (pyelftools would make sh_size zeros)
        return b""
    if offset + size > file_size:
        raise FatbinError(f"{name} claims {size} bytes at offset {offset}, past the end of the file")
    data: bytes = section.data()
    return data


def read_elf(data_or_path: bytes | str) -> DeviceCode | None:
    """The device code of a shared object (bytes or a path); None when it has no ``.nv_fatbin``.

    Any failure to read the ELF (pyelftools raises more than ELFError on hostile headers:
    struct.error, IndexError, ValueError, ...) or a section claiming more bytes than the
    file holds is a FatbinError, never another exception.
    """
    try:
        data = data_or_path if isinstance(data_or_path, bytes) else open(data_or_path, "rb").read()
    except OSError as exc:
        raise FatbinError(f"cannot read the file: {exc.strerror or exc}") from exc
    payload = elf_section(data, FATBIN_SECTION)
    if payload is None:
        return None
    return device_code(payload)
