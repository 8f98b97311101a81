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
# Wheel tags: no CPython extension inside, so py3-none; manylinux no newer than MAX_GLIBC.
PYTHON_TAG, ABI_TAG = "py3", "none"
MAX_GLIBC = (2, 17)
ARCHS: tuple[str, ...] = ("x86_64", "aarch64")  # platform-tag suffixes == ELF machines (contract.elfarch)
LEGACY_MANYLINUX = {"manylinux2014": (2, 17)}  # PEP 599's name for manylinux_2_17
