"""The CPU architecture of an ELF file (its e_machine) and of this machine, in one vocabulary.

The build writes ``arch`` into each manifest entry from the built file's ELF
header, never from a typed value; the loader compares it, and the file's own
header, with this machine's architecture before dlopen.
"""

from __future__ import annotations

import os
import struct

# e_machine -> the name `uname -m` gives on Linux (and that wheel platform tags use).
MACHINES = {
    3: "i686",
    8: "mips",
    20: "ppc",
    21: "ppc64",
    22: "s390x",
    40: "arm",
    62: "x86_64",
    183: "aarch64",
    243: "riscv64",
}
# uname spellings of the same CPUs on other systems.
_ALIASES = {"amd64": "x86_64", "arm64": "aarch64", "x64": "x86_64"}


def machine_of(head: bytes) -> str | None:
    """The architecture an ELF header (its first 20 bytes or more) is for; None if not an ELF."""
    if len(head) < 20 or head[:4] != b"\x7fELF":
        return None
    order = "<" if head[5] == 1 else ">"
    (e_machine,) = struct.unpack_from(f"{order}H", head, 18)
    return MACHINES.get(e_machine, f"e_machine {e_machine}")


def file_arch(path: str) -> str | None:
    with open(path, "rb") as f:
        return machine_of(f.read(20))


def host_arch() -> str:
    """This machine's architecture: ``x86_64``, ``aarch64``, ..."""
    m = os.uname().machine.lower()  # what platform.machine() reads, without importing platform
    return _ALIASES.get(m, m)
