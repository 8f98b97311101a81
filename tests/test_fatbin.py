"""cuplug's `.nv_fatbin` reader (contract.fatbin), in process, on containers built byte by byte.

The layout it reads is the one the CUDA 12.4 and 13.0 toolkits write (tests/test_operator_tools.py
checks it against cuobjdump on every built artifact); here each field's meaning is pinned down: the
entry's kind says SASS or PTX, its arch the target, its version the PTX ISA, several containers and
their padding are walked, and anything that does not fit is a FatbinError, never another exception.
"""

from __future__ import annotations

import struct

import pytest

from cuplug.contract import fatbin

ENTRY_HEADER = 64  # what the toolkits write: the reader needs >= 36 (the fields it reads)


def entry(kind: int, arch: int, major: int = 0, minor: int = 0, payload: int = 16, compressed: int = 0) -> bytes:
    head = struct.pack("<HHIQIIHHI", kind, 0x0101, ENTRY_HEADER, payload, compressed, 0, minor, major, arch)
    return head + b"\0" * (ENTRY_HEADER - len(head)) + b"\xab" * payload


def container(*entries: bytes, version: int = 1, header: int = 16) -> bytes:
    body = b"".join(entries)
    return struct.pack("<IHHQ", fatbin.MAGIC, version, header, len(body)) + b"\0" * (header - 16) + body


SASS, PTX = fatbin.KIND_ELF, fatbin.KIND_PTX


def test_kinds_archs_and_the_ptx_isa():
    code = fatbin.device_code(container(entry(SASS, 80), entry(SASS, 75), entry(PTX, 90, 8, 4)))
    assert code.sass == ("sm_75", "sm_80") and code.ptx == ("compute_90",) and code.ptx_isa == "8.4"
    assert [e.target for e in code.entries] == ["sm_80", "sm_75", "compute_90"]
    assert [e.kind for e in code.entries] == [SASS, SASS, PTX]


def test_the_sass_entries_version_is_not_an_isa():
    code = fatbin.device_code(container(entry(SASS, 90, 1, 7)))
    assert code.ptx == () and code.ptx_isa is None and code.entries[0].version == (1, 7)


def test_other_kinds_are_neither_sass_nor_ptx():
    code = fatbin.device_code(container(entry(4, 90), entry(PTX, 75, 9, 0)))
    assert code.sass == () and code.ptx == ("compute_75",) and len(code.entries) == 2
    assert code.entries[0].target == "sm_90"  # named like SASS, counted as neither


def test_entry_fields():
    (e,) = fatbin.parse(container(entry(PTX, 120, 9, 1, payload=40, compressed=33)))
    assert (e.kind, e.arch, e.version, e.compressed, e.payload_size) == (PTX, 120, (9, 1), True, 40)
    (e,) = fatbin.parse(container(entry(SASS, 86, payload=8)))
    assert not e.compressed and e.payload_size == 8


def test_several_containers_with_padding_between():
    first = container(entry(SASS, 75, payload=12))  # 16 + 64 + 12 = 92 bytes: padded to 96
    section = first + b"\0" * 4 + b"\0" * 8 + container(entry(SASS, 80), entry(PTX, 80, 8, 4))
    code = fatbin.device_code(section)
    assert code.sass == ("sm_75", "sm_80") and code.ptx == ("compute_80",)


def test_a_longer_container_header_is_skipped():
    code = fatbin.device_code(container(entry(SASS, 90), header=24))
    assert code.sass == ("sm_90",)


def test_several_ptx_isas_are_refused():
    with pytest.raises(fatbin.FatbinError, match="several ISA"):
        fatbin.device_code(container(entry(PTX, 75, 8, 4), entry(PTX, 90, 8, 5)))


@pytest.mark.parametrize(
    ("section", "words"),
    [
        (b"", "no fat binary container"),
        (b"\0" * 64, "no fat binary container"),
        (struct.pack("<IHHQ", 0xDEADBEEF, 1, 16, 0), "magic"),
        (struct.pack("<IHHQ", fatbin.MAGIC, 2, 16, 0), "container version 2"),
        (struct.pack("<IHHQ", fatbin.MAGIC, 1, 8, 0), "header size 8"),
        (struct.pack("<IHHQ", fatbin.MAGIC, 1, 16, 1000) + b"\0" * 10, "runs past the section"),
        (container(entry(SASS, 80))[:-20], "runs past the section"),
    ],
)
def test_what_does_not_fit_is_a_fatbin_error(section, words):
    with pytest.raises(fatbin.FatbinError, match=words):
        fatbin.parse(section)


def test_entries_that_do_not_fit_their_container():
    good = entry(SASS, 80)
    short_header = struct.pack("<IHHQ", fatbin.MAGIC, 1, 16, 20) + good[:20]
    with pytest.raises(fatbin.FatbinError, match="truncated entry header"):
        fatbin.parse(short_header)
    small = bytearray(good)
    struct.pack_into("<I", small, 4, 8)  # an entry header smaller than its own fields
    with pytest.raises(fatbin.FatbinError, match="exceed the container"):
        fatbin.parse(container(bytes(small)))
    big = bytearray(good)
    struct.pack_into("<Q", big, 8, 10_000)  # a payload past the container
    with pytest.raises(fatbin.FatbinError, match="exceed the container"):
        fatbin.parse(container(bytes(big)))


def test_an_entry_exactly_filling_its_container():
    assert len(fatbin.parse(container(entry(SASS, 80, payload=0)))) == 1


def test_read_elf_on_what_is_no_elf_with_a_fatbin(tmp_path, cpu_lib_path):
    assert fatbin.read_elf(str(cpu_lib_path)) is None  # a CPU library: no .nv_fatbin
    assert fatbin.read_elf(cpu_lib_path.read_bytes()) is None
    with pytest.raises(fatbin.FatbinError, match="not a readable ELF"):
        fatbin.read_elf(b"\x7fELF" + b"\x02\x01\x01" + b"\0" * 9)
    with pytest.raises(fatbin.FatbinError, match="cannot read the file"):
        fatbin.read_elf(str(tmp_path / "missing.so"))
