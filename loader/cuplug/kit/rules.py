"""The shipping gate's rules, as data: one table each (``gate`` applies them, ``wheel`` builds to them).

The docs' table of them (docs/reference/gate.md) is generated from here.
"""

from __future__ import annotations

from cuplug.contract import abi

# The driver: the system's own, never bundled (auditwheel repair --exclude takes this pattern).
DRIVER_LIBRARY = "libcuda.so*"
# File names a wheel never holds: the driver, the shared CUDA runtime (backends link it statically),
# the rest of the driver's libraries.
FORBIDDEN_LIBRARIES: tuple[str, ...] = (DRIVER_LIBRARY, "libcudart.so*", "libnvidia-*.so*")
# What a backend library may need at run time (NEEDED): the C and C++ runtimes, nothing of CUDA's.
ALLOWED_NEEDED: tuple[str, ...] = (
    "libc.so.*",
    "libm.so.*",
    "libdl.so.*",
    "libpthread.so.*",
    "librt.so.*",
    "libstdc++.so.*",
    "libgcc_s.so.*",
    "ld-linux-x86-64.so.2",
    "ld-linux-aarch64.so.1",
)
# What a library exports: exactly the ABI's entry points (contract.abi), nothing else.
EXPORTED = frozenset(abi.SYMBOLS)
# What a library may not import (undefined in its dynamic symbol table): the calls that end the host
# process. A backend runs inside someone's Python; exit() there (llm.c's cudaCheck macro does it on any CUDA
# error) kills it with no message and no traceback, where a status would raise an exception naming the op.
# No exemption: none of cuplug's own artifacts imports any of them, the CUDA static runtime included
# (`nm -D --undefined-only` on every variant of both majors and the CPU twin, 2026-12-04; libcudart_static.a
# references none either), so whatever imports one came from the backend's own code.
PROCESS_ENDING: tuple[str, ...] = ("exit", "_exit", "_Exit", "quick_exit", "abort")
# Wheel tags: no CPython extension inside, so py3-none; manylinux no newer than MAX_GLIBC.
PYTHON_TAG, ABI_TAG = "py3", "none"
# A wheel with a CPython extension (cuplug's own: Backend.run's C dispatcher) holds it on the stable ABI
# of 3.11 only, so one wheel still serves every CPython >= 3.11: tags cp311-abi3, file *.abi3.so.
EXTENSION_SUFFIX = ".abi3.so"
EXTENSION_PYTHON_TAG, EXTENSION_ABI_TAG = "cp311", "abi3"
MAX_GLIBC = (2, 17)
# The glibc symbols a newer glibc versions anew that backends/include/cuplug/glibc_floor.h pins to their
# manylinux_2_17 versions (tests/test_glibc_floor.py keeps the two lists, and the pinned sysroots, agreeing).
GLIBC_PINNED: tuple[str, ...] = (
    "exp", "exp2", "log", "log2", "pow", "expf", "exp2f", "logf", "log2f", "powf", "lgamma", "lgammaf", "lgammal",
    "glob", "glob64", "fmemopen",
)  # fmt: skip
ARCHS: tuple[str, ...] = ("x86_64", "aarch64")  # platform-tag suffixes == ELF machines (contract.elfarch)
LEGACY_MANYLINUX = {"manylinux2014": (2, 17)}  # PEP 599's name for manylinux_2_17
