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

ENTRY_HEADER = 64  # what the toolkits write: the reader needs >= 32 (the fields it reads)
# The format's numbers as nvcc writes them, typed here on purpose: the reader's own constants are what is tested.
MAGIC, SASS, PTX = 0xBA55ED50, 2, 1


def entry(
    kind: int, arch: int, major: int = 0, minor: int = 0, payload: int = 16, compressed: int = 0, header: int = 64
) -> bytes:
    head = struct.pack("<HHIQIIHHI", kind, 0x0101, header, payload, compressed, 0, minor, major, arch)
    return head + b"\0" * (header - len(head)) + b"\xab" * payload


def container(*entries: bytes, version: int = 1, header: int = 16) -> bytes:
    body = b"".join(entries)
    return struct.pack("<IHHQ", MAGIC, version, header, len(body)) + b"\0" * (header - 16) + body


def test_the_format_constants_are_nvccs():
    assert (fatbin.MAGIC, fatbin.KIND_ELF, fatbin.KIND_PTX) == (MAGIC, SASS, PTX)


def test_kinds_archs_and_the_ptx_isa():
    code = fatbin.device_code(container(entry(SASS, 80), entry(SASS, 75), entry(PTX, 90, 8, 4)))
    assert code.sass == ("sm_75", "sm_80") and code.ptx == ("compute_90",) and code.ptx_isa == "8.4"
    assert [e.target for e in code.entries] == ["sm_80", "sm_75", "compute_90"]
    assert [e.kind for e in code.entries] == [SASS, SASS, PTX]


def test_the_sass_entries_version_is_not_an_isa():
    code = fatbin.device_code(container(entry(SASS, 90, 1, 7)))
    assert code.ptx == () and code.ptx_isa is None and code.entries[0].version == (1, 7)


@pytest.mark.parametrize("kind", [0, 3, 4])
def test_other_kinds_are_neither_sass_nor_ptx(kind):
    code = fatbin.device_code(container(entry(kind, 90, 7, 0), entry(PTX, 75, 9, 0)))
    assert code.sass == () and code.ptx == ("compute_75",) and code.ptx_isa == "9.0" and len(code.entries) == 2
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


def test_a_container_right_after_one_that_needs_no_padding():
    first = container(entry(SASS, 75, payload=8))  # 16 + 64 + 8 = 88 bytes: the next starts at 88
    code = fatbin.device_code(first + container(entry(SASS, 80), entry(PTX, 80, 8, 4)))
    assert code.sass == ("sm_75", "sm_80") and code.ptx == ("compute_80",) and len(code.entries) == 3


@pytest.mark.parametrize(
    "tail",
    [
        b"\xff" * 16,  # garbage after a container
        b"\0" * 7 + b"\x01" + b"\0" * 8,  # padding is 8 zero bytes, not 7
        b"\0" * 8 + b"\xff" * 16,  # garbage after padding
    ],
)
def test_what_follows_a_container_is_padding_or_another_container(tail):
    first = container(entry(SASS, 75, payload=8))
    with pytest.raises(fatbin.FatbinError, match=rf"offset {len(first) + (8 if tail[:8] == bytes(8) else 0)}: magic"):
        fatbin.parse(first + tail)


def test_an_entry_of_just_the_fields_read_fills_its_container():
    (e,) = fatbin.parse(container(entry(SASS, 80, payload=0, header=32)))
    assert (e.target, e.payload_size) == ("sm_80", 0)
    second = entry(PTX, 80, 8, 4, payload=0, header=32)  # the next entry starts at 16 + 64 + 4 = 84
    assert [e.target for e in fatbin.parse(container(entry(SASS, 75, payload=4), second))] == ["sm_75", "compute_80"]
    with pytest.raises(fatbin.FatbinError, match="offset 84: truncated entry header"):
        fatbin.parse(container(entry(SASS, 75, payload=4), second[:31]))


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
        (struct.pack("<IHHQ", fatbin.MAGIC, 0, 16, 0), "container version 0"),  # only version 1 is understood
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


def test_a_second_entry_that_does_not_fit_is_refused_where_it_starts():
    """The bounds hold at any offset (here 52: a first entry of a 32-byte header and 4 bytes of payload):
    a header one byte short, or a payload one byte past the container, is a FatbinError naming offset 52."""
    first = entry(SASS, 75, payload=4, header=32)
    with pytest.raises(fatbin.FatbinError, match=r"^offset 52: truncated entry header$"):
        fatbin.parse(container(first, entry(PTX, 80, 8, 4, payload=0, header=32)[:31]))
    overrun = bytearray(entry(PTX, 80, 8, 4, payload=11))
    struct.pack_into("<Q", overrun, 8, 12)  # says 12 bytes of payload, the container holds 11
    with pytest.raises(
        fatbin.FatbinError, match=r"^offset 52: entry header 64 B \+ payload 12 B exceed the container$"
    ):
        fatbin.parse(container(first, bytes(overrun)))


def test_a_container_ending_one_byte_past_an_8_byte_boundary_is_padded_to_the_next():
    first = container(entry(SASS, 75, payload=1))  # 16 + 64 + 1 = 81 bytes: the next starts at 88
    code = fatbin.device_code(first + b"\0" * 7 + container(entry(SASS, 80)))
    assert code.sass == ("sm_75", "sm_80") and len(code.entries) == 2


def test_an_entry_exactly_filling_its_container():
    assert len(fatbin.parse(container(entry(SASS, 80, payload=0)))) == 1


def test_read_elf_on_what_is_no_elf_with_a_fatbin(tmp_path, cpu_lib_path):
    assert fatbin.read_elf(str(cpu_lib_path)) is None  # a CPU library: no .nv_fatbin
    assert fatbin.read_elf(cpu_lib_path.read_bytes()) is None
    with pytest.raises(fatbin.FatbinError, match="not a readable ELF"):
        fatbin.read_elf(b"\x7fELF" + b"\x02\x01\x01" + b"\0" * 9)
    with pytest.raises(fatbin.FatbinError, match=r"^cannot read the file: No such file or directory$"):
        fatbin.read_elf(str(tmp_path / "missing.so"))


def _nv_fatbin_header(data: bytes) -> int:
    """The file offset of the .nv_fatbin section's header (ELF64)."""
    import io

    from elftools.elf.elffile import ELFFile

    elf = ELFFile(io.BytesIO(data))
    index = next(i for i, sec in enumerate(elf.iter_sections()) if sec.name == ".nv_fatbin")
    return elf["e_shoff"] + index * elf["e_shentsize"]


def test_read_elf_of_a_built_cuda_backend_and_of_one_whose_section_lies(site):
    lib = next((site / "cuplug_cuda13" / "sm80").glob("*.so"))
    code = fatbin.read_elf(str(lib))
    assert code.sass == ("sm_80",) and code.ptx == () and code.ptx_isa is None
    data = bytearray(lib.read_bytes())
    at = _nv_fatbin_header(bytes(data))
    offset, size = struct.unpack_from("<QQ", data, at + 24)
    assert fatbin.read_elf(bytes(data)) == code
    for claim in (len(data) - offset + 1, 1 << 40):  # one byte past the end, and far past it
        struct.pack_into("<Q", data, at + 32, claim)
        with pytest.raises(fatbin.FatbinError, match=rf"^\.nv_fatbin claims {claim} bytes at offset {offset}, past"):
            fatbin.read_elf(bytes(data))
    struct.pack_into("<Q", data, at + 32, len(data) - offset)  # exactly to the end: read, then parsed
    with pytest.raises(fatbin.FatbinError, match=r"magic|runs past|exceed|truncated"):
        fatbin.read_elf(bytes(data))
    struct.pack_into("<Q", data, at + 32, size)
    for sh_type in (14, 15, 7):  # SHT_INIT_ARRAY, SHT_FINI_ARRAY, SHT_NOTE: a type that lies still has its bytes
        struct.pack_into("<I", data, at + 4, sh_type)
        assert fatbin.read_elf(bytes(data)) == code
    struct.pack_into("<I", data, at + 4, 8)  # SHT_NOBITS: no bytes in the file, whatever its size says
    struct.pack_into("<Q", data, at + 32, 1 << 40)
    with pytest.raises(fatbin.FatbinError, match=r"^no fat binary container in the section$"):
        fatbin.read_elf(bytes(data))


def test_without_pyelftools_reading_a_section_names_the_missing_dependency(monkeypatch):
    """A --no-deps install (seen on the GPU machine: an LTO variant refused with a bare ModuleNotFoundError): the
    error names pyelftools and the requirement cuplug declares."""
    import sys

    for name in [m for m in sys.modules if m == "elftools" or m.startswith("elftools.")] + ["elftools"]:
        monkeypatch.setitem(sys.modules, name, None)  # None in sys.modules: the import fails
    with pytest.raises(fatbin.MissingDependency, match=r"needs pyelftools.*pip install 'pyelftools>=0\.31'"):
        fatbin.elf_section(b"\x7fELF", fatbin.RELOCATABLE_SECTION)
    from cuplug.tools import inspection  # `cuplug inspect` says it of this environment, not of the file

    (problem,) = inspection._check("lib.so", b"\x7fELF", None).problems
    assert problem.startswith("cannot read it here: reading ELF sections needs pyelftools"), problem
