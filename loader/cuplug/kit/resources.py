"""Where cuplug's build inputs live: in the installed package, or in a source checkout.

The wheel carries the CMake module, the ABI headers, the default variant
matrix and the toolchain locks under ``cuplug/data/`` in the same layout as
the repository's ``backends/`` (so ``cmake/cuplug.cmake`` finds ``../include``
either way); a checkout uses the repository's files directly.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE_DATA = Path(__file__).resolve().parents[1] / "data"
_CHECKOUT = Path(__file__).resolve().parents[3]


def _installed() -> bool:
    return (PACKAGE_DATA / "cmake" / "cuplug.cmake").is_file()


def backends_dir() -> Path:
    """The directory holding ``cmake/``, ``include/``, ``common/`` and ``variants.json``."""
    return PACKAGE_DATA if _installed() else _CHECKOUT / "backends"


def cmake_dir() -> Path:
    """For ``-Dcuplug_DIR=`` / ``include()``: holds ``cuplug.cmake`` and ``cuplugConfig.cmake``."""
    return backends_dir() / "cmake"


def toolchains_dir() -> Path:
    """The lock files (``cuda12.txt``, ``cuda13.txt``, ``sysroot-bullseye.txt``)."""
    return PACKAGE_DATA / "toolchains" if _installed() else _CHECKOUT / "toolchains"


def default_matrix() -> Path:
    return backends_dir() / "variants.json"


def template_dir() -> Path:
    """The project `cuplug new-backend` copies: the `scan` example (examples/scan in a checkout)."""
    return PACKAGE_DATA / "template" if _installed() else _CHECKOUT / "examples" / "scan"
