"""The element types of ABI v2, one table: name, DLPack (code, bits), size, and how Python spells each.

A row per dtype the backends know (backends/common/cuplug_ops.h holds the same
twelve in the same order: bit i of an op's dtype set is row i here). Not yet: fp8 (e4m3, e5m2),
complex, int16; DLPack names them, no backend of cuplug's computes with them.
"""

from __future__ import annotations

import sys

# DLPack type codes (DLDataTypeCode) and device types (DLDeviceType).
DL_INT, DL_UINT, DL_FLOAT, DL_BFLOAT, DL_BOOL = 0, 1, 2, 4, 6
DEVICE_CPU, DEVICE_CUDA, DEVICE_CUDA_HOST = 1, 2, 3
HOST_DEVICES = (DEVICE_CPU, DEVICE_CUDA_HOST)


class DType:
    """One element type: ``name`` (NumPy's spelling), DLPack ``code``/``bits``, ``itemsize``, and its
    buffer-protocol format (``""`` where Python has none: bfloat16), its ``__cuda_array_interface__``
    typestr, and the ``array.array`` typecode that can hold it (``""``: none)."""

    __slots__ = ("array_code", "bits", "code", "format", "is_float", "itemsize", "name", "typestr")

    def __init__(self, name: str, code: int, bits: int, fmt: str, typestr: str, array_code: str) -> None:
        self.name = name
        self.code = code
        self.bits = bits
        self.itemsize = bits // 8
        self.format = fmt
        self.typestr = typestr
        self.array_code = array_code
        self.is_float = code in (DL_FLOAT, DL_BFLOAT)

    def __repr__(self) -> str:
        return f"cuplug.dtype({self.name!r})"

    def __str__(self) -> str:
        return self.name


TABLE = (
    DType("float16", DL_FLOAT, 16, "e", "<f2", ""),
    DType("bfloat16", DL_BFLOAT, 16, "", "", ""),
    DType("float32", DL_FLOAT, 32, "f", "<f4", "f"),
    DType("float64", DL_FLOAT, 64, "d", "<f8", "d"),
    DType("int8", DL_INT, 8, "b", "|i1", "b"),
    DType("uint8", DL_UINT, 8, "B", "|u1", "B"),
    DType("int32", DL_INT, 32, "i", "<i4", "i"),
    DType("int64", DL_INT, 64, "q", "<i8", "q"),
    DType("uint16", DL_UINT, 16, "H", "<u2", "H"),
    DType("uint32", DL_UINT, 32, "I", "<u4", "I"),
    DType("uint64", DL_UINT, 64, "Q", "<u8", "Q"),
    DType("bool", DL_BOOL, 8, "?", "|b1", ""),  # array.array has no bool
)
BY_NAME = {d.name: d for d in TABLE}
BY_DLPACK = {(d.code, d.bits): d for d in TABLE}
BY_TYPESTR = {d.typestr: d for d in TABLE if d.typestr}
# Buffer-protocol formats, with the byte-order and size prefixes memoryview may carry ("<f", "=f", "@f").
BY_FORMAT: dict[str, DType] = {}
for _d in TABLE:
    if _d.format:
        for _prefix in ("", "<", "=", "@"):
            BY_FORMAT[_prefix + _d.format] = _d
BY_FORMAT.update({p + "l": BY_NAME["int64"] for p in ("", "<", "=", "@")})  # C long on LP64
BY_FORMAT.update({p + "L": BY_NAME["uint64"] for p in ("", "<", "=", "@")})  # unsigned long on LP64
BY_FORMAT.update({"|i1": BY_NAME["int8"], "|u1": BY_NAME["uint8"], "c": BY_NAME["uint8"]})
del _d, _prefix


def from_name(name: object) -> DType:
    """A DType from its name, a NumPy/PyTorch dtype (``torch.float16``, ``np.dtype('f2')``) or a DType."""
    if isinstance(name, DType):
        return name
    text = str(name).removeprefix("torch.")
    try:
        return BY_NAME[text]
    except KeyError:
        pass
    np = sys.modules.get("numpy")
    if np is not None and not isinstance(name, str):  # np.float16, np.dtype("f2"), np.dtype(">f4")
        try:
            d = np.dtype(name)
        except TypeError:
            d = None
        if d is not None and d.name in BY_NAME:
            if d.byteorder not in ("=", "|", "<"):
                raise ValueError(f"dtype {name!r} is not in this machine's byte order")
            return BY_NAME[d.name]
    np_name = getattr(name, "name", None)  # other dtype objects with a NumPy-style name
    if isinstance(np_name, str) and np_name in BY_NAME:
        return BY_NAME[np_name]
    raise ValueError(f"unknown dtype {name!r}; cuplug knows {', '.join(BY_NAME)}")
