"""A CPU twin that calls libm builds to manylinux_2_17 (issue 32, part 3), and the gate names the file, the symbol
and the fix when a library needs a newer glibc.

cuplug/glibc_floor.h (force-included by cuplug_add_cpu_backend and cuplug_add_cuda_backend) pins every glibc symbol
that a newer glibc versions anew while keeping its 2.17-era version; its list is the pinned sysroots' own,
read here from their libm.so.6 and libc.so.6, and equal to the gate's table (rules.GLIBC_PINNED).
"""

from __future__ import annotations

import re
import subprocess
import zipfile

import pytest

from conftest import ROOT, build_shared_library
from cuplug.kit import gate, glibc, rules, wheel

HEADER = ROOT / "backends" / "include" / "cuplug" / "glibc_floor.h"
TWIN = r"""
#include <math.h>
float f(float x) { return expf(x) + logf(x) + powf(x, 2.0f) + exp2f(x) + log2f(x); }
double g(double x) { return exp(x) + log(x) + pow(x, 3.0) + exp2(x) + log2(x) + lgamma(x); }
"""


def _pinned_in_header() -> set[str]:
    return set(re.findall(r"CUPLUG_PIN\((\w+)\)", HEADER.read_text().split("#define CUPLUG_PIN", 1)[1]))


def _sysroot_table(libdir) -> set[str]:
    """Symbols of libm/libc whose default version is newer than the floor while an older one is exported."""
    from elftools.elf.elffile import ELFFile
    from elftools.elf.gnuversions import GNUVerDefSection, GNUVerSymSection

    found = set()
    for lib in ("libm.so.6", "libc.so.6"):
        with open(libdir / lib, "rb") as fh:
            elf = ELFFile(fh)
            verdef = next(s for s in elf.iter_sections() if isinstance(s, GNUVerDefSection))
            versym = next(s for s in elf.iter_sections() if isinstance(s, GNUVerSymSection))
            names = {vd["vd_ndx"]: next(aux).name for vd, aux in verdef.iter_versions()}
            by_name: dict[str, list[tuple[str, bool]]] = {}
            for i, sym in enumerate(elf.get_section_by_name(".dynsym").iter_symbols()):
                ndx = versym.get_symbol(i)["ndx"]
                if sym.name and sym["st_shndx"] != "SHN_UNDEF" and isinstance(ndx, int):
                    by_name.setdefault(sym.name, []).append((names.get(ndx & 0x7FFF, ""), not ndx & 0x8000))
            for name, versions in by_name.items():
                newest = [glibc.glibc_version(v) for v, default in versions if default and v.startswith("GLIBC_")]
                old = [glibc.glibc_version(v) for v, default in versions if not default and v.startswith("GLIBC_")]
                if newest and newest[0] > rules.MAX_GLIBC and any(o <= rules.MAX_GLIBC for o in old):
                    found.add(name)
    return found - set(rules.PROCESS_ENDING)  # quick_exit: refused by the gate anyway


def test_the_header_and_the_gate_pin_the_same_symbols():
    assert _pinned_in_header() == set(rules.GLIBC_PINNED)


@pytest.mark.parametrize("arch", ["x86_64", "aarch64"])
def test_the_pins_are_the_pinned_sysroots_own_table(arch):
    from cuplug.kit import toolchain

    try:
        root = toolchain.install_sysroot(lambda *_: None, arch)
    except toolchain.ToolchainError as exc:
        pytest.skip(f"the {arch} sysroot is not installable here: {exc}")
    libdir = root / "lib" / toolchain.ARCHES[arch][1]
    assert _sysroot_table(libdir) == _pinned_in_header()


def _twin(tmp_path, *flags):
    src = tmp_path / "twin.c"
    src.write_text(TWIN)
    out = tmp_path / f"twin{len(flags)}.so"
    build_shared_library(src, out, "-O2", *flags, "-lm")
    return out


def test_a_twin_calling_libm_needs_only_the_floor_with_the_header(tmp_path):
    plain = glibc.glibc_needs(_twin(tmp_path).read_bytes())
    if not plain:
        pytest.skip("this machine's glibc is old enough that nothing needs pinning")
    assert ("expf", "GLIBC_2.27") in plain and ("pow", "GLIBC_2.29") in plain
    pinned = _twin(tmp_path, "-include", str(HEADER))
    assert glibc.glibc_needs(pinned.read_bytes()) == []
    # and the pinned entries are the old ones
    syms = subprocess.run(["nm", "-D", str(pinned)], capture_output=True, text=True, check=True).stdout
    assert re.search(r"expf@GLIBC_2\.(2\.5|17)\b", syms), syms


def test_the_gate_names_the_file_the_symbol_and_the_fix(tmp_path):
    lib = _twin(tmp_path)
    if not glibc.glibc_needs(lib.read_bytes()):
        pytest.skip("this machine's glibc is old enough that nothing needs pinning")
    whl = tmp_path / "twin-1-py3-none-linux_x86_64.whl"
    with zipfile.ZipFile(whl, "w") as zf:
        zf.writestr("twin/libtwin.so", lib.read_bytes())
        zf.writestr("twin/__init__.py", "")
    problems = gate.check_wheel(whl)
    text = "\n".join(problems)
    assert "twin/libtwin.so needs glibc symbols newer than manylinux_2_17's glibc 2.17" in text
    assert "expf@GLIBC_2.27" in text and "cuplug/glibc_floor.h" in text
    with pytest.raises(wheel.WheelError, match=r"twin/libtwin\.so needs glibc symbols newer.*expf@GLIBC_2\.27"):
        wheel.repair_wheel(whl, tmp_path / "out", run=lambda *a, **k: pytest.fail("auditwheel ran"))
