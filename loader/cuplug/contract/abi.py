"""The backend C ABI v2 (backends/include/cuplug/backend.h) as data: version, status codes, types,
entry points and their signatures (the ctypes types themselves in ``abi_types``, made on first use).

The runtime binds a loaded library with these (``runtime.library``); the build kit
checks that a built library exports exactly :data:`SYMBOLS`.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # made on first use at run time (see __getattr__ below)
    from .abi_types import ABI_TYPES as ABI_TYPES
    from .abi_types import CAttr as CAttr
    from .abi_types import CDtype as CDtype
    from .abi_types import CTensor as CTensor

ABI_VERSION = 2

# Status codes of backend.h.
OK = 0
E_INVALID_ARGUMENT = -1
E_UNKNOWN_OP = -2
E_BAD_BUFFER = -3
E_OUT_OF_MEMORY = -4
E_DEVICE = -5
E_NO_KERNEL_IMAGE = -6
E_BUFFER_TOO_SMALL = -7
E_WRONG_DEVICE = -8

ATTR_INT64, ATTR_FLOAT64 = 0, 1

MAX_NDIM = 32  # CUPLUG_MAX_NDIM of backends/common/cuplug_common.h: the most dimensions a tensor may have


# Every entry point: (return type, argument types), by name (ABI_TYPES below). Data, so the build kit can
# read the symbol list without ctypes, and the runtime binds a function when it is first used: a load()
# that ends at create() and ping() never builds the tensor types (1.5 ms of ctypes class creation).
SIGNATURES: dict[str, tuple[str | None, tuple[str, ...]]] = {
    "cuplug_backend_abi_version": ("int", ()),
    "cuplug_backend_create": ("handle", ("str",)),
    "cuplug_backend_last_create_error": ("int", ("str", "int")),
    "cuplug_backend_ping": ("int", ("handle", "str", "int")),
    "cuplug_backend_call": (
        "int",
        ("handle", "str", "tensor*", "int", "tensor*", "int", "attr*", "int", "u64"),
    ),
    "cuplug_backend_stream_wait": ("int", ("handle", "u64", "u64")),
    "cuplug_backend_alloc": ("i64", ("handle", "dtype", "int", "i64*")),
    "cuplug_backend_upload": ("int", ("handle", "i64", "handle", "i64")),
    "cuplug_backend_download": ("int", ("handle", "i64", "handle", "i64")),
    "cuplug_backend_tensor": ("int", ("handle", "i64", "tensor*")),
    "cuplug_backend_free": ("int", ("handle", "i64")),
    "cuplug_backend_sync": ("int", ("handle",)),
    "cuplug_backend_last_error": ("int", ("handle", "str", "int")),
    "cuplug_backend_destroy": (None, ("handle",)),
}
SYMBOLS = tuple(SIGNATURES)
_TYPES = ("CDtype", "CTensor", "CAttr", "ABI_TYPES")


def __getattr__(name: str) -> object:
    """The ctypes types (CDtype, CTensor, CAttr) and ABI_TYPES (type name -> ctypes type), made on first use."""
    if name not in _TYPES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from . import abi_types

    for n in _TYPES:
        globals()[n] = getattr(abi_types, n)
    return globals()[name]
