"""glibc symbol versions of a built library: which imports need a glibc newer than manylinux_2_17's floor, and the
message that names them and the fix (used by the gate and by the kit's wheel repair, before auditwheel)."""

from __future__ import annotations

import io

from .rules import GLIBC_PINNED, MAX_GLIBC


def glibc_needs(data: bytes) -> list[tuple[str, str]]:
    """(symbol, version) of every imported symbol bound to a GLIBC_x.y version newer than MAX_GLIBC, e.g.
    ("expf", "GLIBC_2.27"); ValueError when it is not a readable ELF."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile
    from elftools.elf.gnuversions import GNUVerNeedSection, GNUVerSymSection

    try:
        elf = ELFFile(io.BytesIO(data))
        dynsym = elf.get_section_by_name(".dynsym")
        versym = next((s for s in elf.iter_sections() if isinstance(s, GNUVerSymSection)), None)
        need = next((s for s in elf.iter_sections() if isinstance(s, GNUVerNeedSection)), None)
        if dynsym is None or versym is None or need is None:
            return []
        names = {aux["vna_other"]: aux.name for _, auxes in need.iter_versions() for aux in auxes}
        found = []
        # (.dynsym is a SymbolTableSection, which pyelftools types as a Section; if not, AttributeError says so)
        for i, sym in enumerate(dynsym.iter_symbols()):  # type: ignore[attr-defined]
            ndx = versym.get_symbol(i)["ndx"]  # an int, or VER_NDX_LOCAL / VER_NDX_GLOBAL
            version = names.get(ndx & 0x7FFF) if isinstance(ndx, int) else None
            if sym.name and sym["st_shndx"] == "SHN_UNDEF" and version and glibc_version(version) > MAX_GLIBC:
                found.append((sym.name, version))
    except (ELFError, AttributeError) as exc:
        raise ValueError(f"not a readable ELF file ({exc})") from exc
    return sorted(found)


def glibc_version(version: str) -> tuple[int, ...]:
    """GLIBC_2.27 -> (2, 27); any other version name -> () (never newer)."""
    head, _, tail = version.partition("_")
    parts = tail.split(".")
    return tuple(int(p) for p in parts) if head == "GLIBC" and all(p.isdigit() for p in parts) else ()


def glibc_problem(member: str, needs: list[tuple[str, str]]) -> str:
    """One message for a library's too-new glibc symbols: the file, each symbol@version, and the fix."""
    pinned = [f"{s}@{v}" for s, v in needs if s in GLIBC_PINNED]
    unpinnable = [f"{s}@{v}" for s, v in needs if s not in GLIBC_PINNED]
    floor = f"{MAX_GLIBC[0]}.{MAX_GLIBC[1]}"
    text = f"{member} needs glibc symbols newer than manylinux_{MAX_GLIBC[0]}_{MAX_GLIBC[1]}'s glibc {floor}:"
    if pinned:
        text += (
            f" {', '.join(pinned)} have an old version the kit pins: build it with cuplug_add_cpu_backend() or "
            "cuplug_add_cuda_backend() (they force-include cuplug/glibc_floor.h), or compile with "
            "-include cuplug/glibc_floor.h;"
        )
    if unpinnable:
        text += (
            f" {', '.join(unpinnable)} did not exist in glibc {floor}: call a function glibc {floor} has, or "
            "compile that code into the library (a static library of its own);"
        )
    return text.rstrip(";")
