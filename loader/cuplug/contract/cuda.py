"""CUDA's compatibility facts, one place: what a driver can run, and how CUDA names versions and GPUs.

The loader judges artifacts with these, the build kit writes ``min_driver`` with them,
and the tools show versions through them. No I/O, no imports beyond the standard
library's core (this runs on every ``cuplug.load()``).
"""

from __future__ import annotations

# The oldest GPU the backends are built for (DESIGN.md, "Variants").
MIN_CAPABILITY = (7, 5)

# PTX ISA version -> the CUDA version (cuDriverGetVersion) whose driver JIT-compiles it: the PTX ISA
# release notes ("PTX ISA version x.y ... introduced in CUDA a.b"). An ISA missing here is newer than
# this cuplug knows: it is treated as needing a driver newer than any (never JIT-ed on a guess).
PTX_ISA_DRIVER: dict[str, int] = {
    "7.0": 11000,
    "7.1": 11010,
    "7.2": 11020,
    "7.3": 11030,
    "7.4": 11040,
    "7.5": 11050,
    "7.6": 11060,
    "7.7": 11070,
    "7.8": 11080,
    "8.0": 12000,
    "8.1": 12010,
    "8.2": 12020,
    "8.3": 12030,
    "8.4": 12040,
    "8.5": 12050,
    "8.6": 12070,
    "8.7": 12080,
    "8.8": 12090,
    "9.0": 13000,
    "9.1": 13010,
    "9.2": 13020,
}


def ptx_driver_needed(isa: str | None) -> int | None:
    """The driver version that can JIT this PTX ISA, or None when unknown (newer than the table)."""
    return PTX_ISA_DRIVER.get(isa or "")


def runtime_min_driver(cuda_version: str) -> int:
    """The oldest driver a CUDA runtime of ``cuda_version`` ("12.4") runs on.

    CUDA's minor version compatibility (CUDA 11 and later): a runtime of major M runs on any
    driver of major M or newer, so the rule, not a table, serves a CUDA 14 as well.
    """
    major = cuda_version.split(".", 1)[0]
    if not major.isdigit():
        raise ValueError(f"not a CUDA version: {cuda_version!r}")
    return int(major) * 1000


def version_str(v: int | None) -> str | None:
    """cuDriverGetVersion 12040 -> "12.4"; None for an unknown or impossible value."""
    return None if v is None or v <= 0 else f"{v // 1000}.{(v % 1000) // 10}"


def parse_target(target: str) -> tuple[int, int, bool]:
    """'sm_86' -> (8, 6, False); 'sm_90a' / 'sm_100f' -> (9, 0, True) / (10, 0, True); 'compute_75' -> (7, 5, False).
    ValueError for anything else. (contract/targets.py has the kinds and their rules.)"""
    from .targets import parse

    t = parse(target)
    return t.major, t.minor, t.kind.suffix != ""


def is_target(text: object) -> bool:
    """A name like sm_80, sm_90a, compute_75."""
    if not isinstance(text, str):
        return False
    try:
        parse_target(text)
    except ValueError:
        return False
    return True


def capability_str(target: str) -> str:
    """'sm_86' -> '8.6'."""
    major, minor, _ = parse_target(target)
    return f"{major}.{minor}"
