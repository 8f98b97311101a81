"""The shipping gate (build.gate, its rules in build.rules), in process, on wheels made in the test.

A wheel never holds the driver, the shared CUDA runtime or libnvidia-*; a library needs only the C
and C++ runtimes and exports exactly the ABI; an RPATH never leaves the wheel; tags are py3-none and
manylinux no newer than 2.17 for one CPU; a manifest matches its members byte for byte.
"""

from __future__ import annotations

import json
import subprocess
import zipfile
from pathlib import Path

import pytest

from cuplug.contract import manifest
from cuplug.kit import gate, rules
from cuplug.kit.process import BuildError

TAG = "py3-none-manylinux_2_17_x86_64"


@pytest.mark.parametrize(
    ("member", "bad"),
    [
        ("pkg/libcuda.so.1", True),
        ("pkg/libcuda.so", True),
        ("libcudart.so.12", True),
        ("a/b/libnvidia-ml.so.1", True),
        ("pkg/libcudart_static.a", False),
        ("pkg/mylibcuda.so", False),
        ("pkg/libcuplug_vector.so", False),
        ("libcuda.so.1/README", False),
    ],
)
def test_forbidden_libraries(member, bad):
    assert gate.forbidden(member) is bad


@pytest.mark.parametrize(
    ("soname", "ok"),
    [
        ("libc.so.6", True),
        ("libm.so.6", True),
        ("libstdc++.so.6", True),
        ("libgcc_s.so.1", True),
        ("ld-linux-x86-64.so.2", True),
        ("ld-linux-aarch64.so.1", True),
        ("libcudart.so.12", False),
        ("libcuda.so.1", False),
        ("libfoo.so", False),
        ("libc.so", False),
    ],
)
def test_allowed_needed(soname, ok):
    assert gate.needed_allowed(soname) is ok


@pytest.mark.parametrize(
    ("tag", "parsed"),
    [
        ("manylinux_2_17_x86_64", ((2, 17), "x86_64")),
        ("manylinux_2_28_aarch64", ((2, 28), "aarch64")),
        ("manylinux2014_x86_64", ((2, 17), "x86_64")),
        ("manylinux2014_aarch64", ((2, 17), "aarch64")),
        ("linux_x86_64", None),
        ("manylinux_2_17_armv7l", None),
        ("manylinux_x_17_x86_64", None),
        ("manylinux2010_x86_64", None),
        ("musllinux_1_2_x86_64", None),
        ("manylinux_2_17", None),  # no architecture
        ("manylinux_2_x_x86_64", None),
        ("xmanylinux_2_17_x86_64", None),
        ("linux_2_17_x86_64", None),  # the platform is named, not just compared
        ("manylinux_2_17_x86_64_v2", None),
    ],
)
def test_platform_tags(tag, parsed):
    assert gate.platform_tag(tag) == parsed


@pytest.mark.parametrize(
    ("member", "rpath", "inside"),
    [
        ("pkg/lib/a.so", "$ORIGIN", True),
        ("pkg/lib/a.so", "$ORIGIN/.", True),
        ("pkg/lib/a.so", "$ORIGIN/../x", True),
        ("pkg/lib/a.so", "$ORIGIN/../..", True),
        ("pkg/lib/a.so", "$ORIGIN/../../..", False),
        ("a.so", "$ORIGIN/..", False),
        ("pkg/a.so", "$ORIGIN/x/../../..", False),
        ("pkg/a.so", "/usr/lib", False),
        ("pkg/a.so", "lib", False),
        ("pkg/a.so", "$ORIGIN/-x/..", True),  # names that sort before ".." are directories too
        ("pkg/a.so", "$ORIGIN/+x/../..", True),
        ("pkg/a.so", "$ORIGIN/./././..", True),
        ("pkg/a.so", "$ORIGIN//..//..", False),
    ],
)
def test_rpath_inside(member, rpath, inside):
    assert gate.rpath_inside(member, rpath) is inside


def test_wheel_tags_with_and_without_a_variant_label():
    assert gate.wheel_tags(f"a-1-{TAG}.whl") == ("py3", "none", ["manylinux_2_17_x86_64"])
    assert gate.wheel_tags("a-1-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64-sm90.whl")[2] == [
        "manylinux2014_x86_64",
        "manylinux_2_17_x86_64",
    ]


def _wheel(tmp_path: Path, name: str, members: dict[str, bytes]) -> Path:
    path = tmp_path / name
    with zipfile.ZipFile(path, "w") as zf:
        for member, data in members.items():
            zf.writestr(member, data)
    return path


@pytest.mark.parametrize(
    ("tag", "words"),
    [
        ("cp311-cp311-manylinux_2_17_x86_64", "must be py3-none"),
        ("py3-abi3-manylinux_2_17_x86_64", "must be py3-none"),
        ("py3-none-linux_x86_64", "not a manylinux tag"),
        ("py3-none-manylinux_2_28_x86_64", "newer than manylinux_2_17"),
        ("py3-none-manylinux_2_17_x86_64.manylinux_2_17_aarch64", "several CPU architectures"),
        ("py39-none-manylinux_2_17_x86_64", "must be py3-none"),
        ("py3-zzz-manylinux_2_17_x86_64", "must be py3-none"),
    ],
)
def test_tags_are_refused(tmp_path, tag, words):
    problems = gate.check_wheel(_wheel(tmp_path, f"x-1-{tag}.whl", {"x/__init__.py": b""}))
    assert any(words in p for p in problems), problems


def test_every_platform_tag_is_checked_and_each_problem_said_once(tmp_path):
    name = "x-1-py3-none-linux_x86_64.manylinux_2_28_x86_64.whl"
    assert gate.check_wheel(_wheel(tmp_path, name, {"x/__init__.py": b""})) == [
        "platform tag linux_x86_64 is not a manylinux tag (run auditwheel repair)",
        "platform tag manylinux_2_28_x86_64 is newer than manylinux_2_17",
    ]
    assert gate.check_wheel(_wheel(tmp_path, "y-1-py3-none-linux_x86_64.whl", {"y/__init__.py": b""})) == [
        "platform tag linux_x86_64 is not a manylinux tag (run auditwheel repair)"  # and no architecture problem
    ]


@pytest.mark.parametrize("tag", ["manylinux_2_5_x86_64", "manylinux_2_12_x86_64", "manylinux2014_x86_64"])
def test_older_manylinux_tags_are_fine(tmp_path, tag):
    assert gate.check_wheel(_wheel(tmp_path, f"x-1-py3-none-{tag}.whl", {"x/__init__.py": b""})) == []


def test_a_clean_wheel_passes_and_every_planted_fault_is_named(tmp_path, cpu_lib_path):
    lib = cpu_lib_path.read_bytes()
    good = {"x/__init__.py": b"", "x/lib/libx.so": lib}
    assert gate.check_wheel(_wheel(tmp_path, f"good-1-{TAG}.whl", good)) == []
    assert (
        gate.check_wheel(_wheel(tmp_path, "g2-1-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl", good)) == []
    )
    bad = {**good, "x/lib/libcudart.so.12": lib, "x/libnvidia-ml.so.1": lib, "x/broken.so": b"not an elf"}
    problems = gate.check_wheel(_wheel(tmp_path, f"bad-1-{TAG}.whl", bad))
    assert sum("never bundled" in p for p in problems) == 2 and any(
        "broken.so: not a readable ELF" in p for p in problems
    )
    arm = gate.check_wheel(_wheel(tmp_path, "arm-1-py3-none-manylinux_2_17_aarch64.whl", good))
    assert any("an x86_64 library in a wheel tagged for ['aarch64']" in p for p in arm), arm


@pytest.fixture(scope="module")
def rpath_libs(tmp_path_factory, cpu_lib_path):
    out = tmp_path_factory.mktemp("rpath")
    src = out / "x.c"
    src.write_text("int x(void) { return 1; }\n")
    libs = {}
    for name, rpath in (("inside", "$ORIGIN/../lib"), ("escapes", "$ORIGIN/../../.."), ("absolute", "/opt/cuda/lib64")):
        for tag, dtags in (("", "--enable-new-dtags"), ("-rpath", "--disable-new-dtags")):  # RUNPATH, old RPATH
            path = out / f"{name}{tag}.so"
            subprocess.run(
                ["cc", "-shared", "-fPIC", "-o", str(path), str(src), f"-Wl,-rpath,{rpath}", f"-Wl,{dtags}"], check=True
            )
            libs[name + tag] = path.read_bytes()
    return libs


@pytest.mark.parametrize("tag", ["", "-rpath"])
def test_an_rpath_that_leaves_the_wheel_is_refused(tmp_path, rpath_libs, tag):
    """Both DT_RUNPATH (what linkers write today) and the older DT_RPATH are read."""
    ok = gate.check_wheel(_wheel(tmp_path, f"in-1-{TAG}.whl", {"x/sub/a.so": rpath_libs["inside" + tag]}))
    assert ok == []
    for name in ("escapes", "absolute"):
        problems = gate.check_wheel(_wheel(tmp_path, f"{name}-1-{TAG}.whl", {"x/sub/a.so": rpath_libs[name + tag]}))
        rpath = {"escapes": "$ORIGIN/../../..", "absolute": "/opt/cuda/lib64"}[name]
        assert problems == [f"x/sub/a.so: RPATH/RUNPATH {rpath!r} points outside the package"], (name, problems)


def _manifest_wheel(tmp_path: Path, lib: bytes, **change: object) -> Path:
    entry = {
        "backend": "vector",
        "variant": "sm80",
        "file": "sm80/libcuplug_vector.so",
        "sha256": manifest.sha256_hex(lib),
        "size": len(lib),
        "sass": ["sm_80"],
        "ptx": [],
        "ptx_isa": None,
        "cuda_version": "12.4",
        "min_driver": 12000,
        "abi": 2,
        **change,
    }
    doc = json.dumps({"schema": 1, "cuda": "cuda12", "artifacts": [entry]}).encode()
    members = {"p/manifest.json": doc, "p/sm80/libcuplug_vector.so": lib}
    return _wheel(tmp_path, f"p-1-{TAG}.whl", members)


def test_the_manifest_must_match_the_members(tmp_path, cpu_lib_path):
    lib = cpu_lib_path.read_bytes()
    assert gate.check_wheel(_manifest_wheel(tmp_path, lib)) == []
    for change, words in (
        ({"sha256": "ab" * 32}, "size/sha256 differ"),
        ({"size": len(lib) + 1}, "size/sha256 differ"),
        ({"file": "missing/lib.so"}, "missing from the wheel"),
        ({"variant": "Bad Name"}, "manifest entry 0"),
    ):
        problems = gate.check_wheel(_manifest_wheel(tmp_path, lib, **change))
        assert any(words in p for p in problems), (change, problems)


def test_a_manifest_that_cannot_be_read_is_a_problem_not_a_crash(tmp_path, cpu_lib_path):
    for doc in (b"{not json", b'{"schema": 99}', b"[]", b'{"schema": 1, "artifacts": {}}'):
        wheel = _wheel(tmp_path, f"p-1-{TAG}.whl", {"p/manifest.json": doc})
        problems = gate.check_wheel(wheel)
        assert len(problems) == 1 and problems[0].startswith("p/manifest.json: "), (doc, problems)


def test_every_entry_of_a_manifest_is_checked(tmp_path, cpu_lib_path):
    """A missing file does not hide a changed one after it."""
    lib = cpu_lib_path.read_bytes()
    entry = {"backend": "vector", "sass": [], "ptx": [], "ptx_isa": None, "cuda_version": "12.4", "min_driver": 12000}
    arts = [
        {**entry, "variant": "sm75", "file": "sm75/lib.so", "sha256": manifest.sha256_hex(lib), "size": len(lib)},
        {**entry, "variant": "sm80", "file": "sm80/lib.so", "sha256": "ab" * 32, "size": len(lib)},
    ]
    doc = json.dumps({"schema": 1, "cuda": "cuda12", "artifacts": [{**a, "abi": 2} for a in arts]}).encode()
    problems = gate.check_wheel(_wheel(tmp_path, f"p-1-{TAG}.whl", {"p/manifest.json": doc, "p/sm80/lib.so": lib}))
    assert problems == [
        "p/manifest.json names sm75/lib.so, missing from the wheel",
        "p/sm80/lib.so: size/sha256 differ from p/manifest.json (changed after the build)",
    ]


def test_only_a_packages_top_level_manifest_is_a_backend_manifest(tmp_path):
    members = {"p/__init__.py": b"", "p/data/manifest.json": b"{an unrelated data file"}
    assert gate.check_wheel(_wheel(tmp_path, f"p-1-{TAG}.whl", members)) == []


def test_linkage_of_a_real_library(cpu_lib_path, rpath_libs, tmp_path):
    gate.check_linkage(cpu_lib_path)
    other = tmp_path / "x.so"
    other.write_bytes(rpath_libs["inside"])
    with pytest.raises(BuildError, match="beyond/short of the ABI") as exc:
        gate.check_linkage(other)
    assert "'x'" in str(exc.value) and "'cuplug_backend_call'" in str(exc.value)  # the extra and the missing


def test_linkage_names_only_what_differs_from_the_abi(tmp_path):
    src = tmp_path / "abi.c"
    src.write_text("".join(f"void {name}(void) {{}}\n" for name in (*rules.EXPORTED, "cuplug_debug_dump")))
    so = tmp_path / "extra.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(so), str(src)], check=True)
    with pytest.raises(BuildError, match=r"exports \['cuplug_debug_dump'\] beyond/short of the ABI$"):
        gate.check_linkage(so)


def test_check_wheels_names_every_bad_wheel(tmp_path):
    good = _wheel(tmp_path, f"a-1-{TAG}.whl", {"a/__init__.py": b""})
    bad = _wheel(tmp_path, "b-1-cp311-cp311-linux_x86_64.whl", {"b/__init__.py": b""})
    seen: list[str] = []
    gate.check_wheels([good], seen.append)
    assert seen and seen[0].startswith("ok: a-1-")
    big = _wheel(tmp_path, f"c-1-{TAG}.whl", {"c/__init__.py": b"", "c/data.bin": bytes(1_234_567)})  # stored
    gate.check_wheels([big], seen.append)
    assert seen[-1] == f"ok: c-1-{TAG}.whl ({big.stat().st_size / 1e6:.2f} MB)" and "(1.23 MB)" in seen[-1]
    with pytest.raises(BuildError, match=r"b-1-cp311.*\n.*py3-none"):
        gate.check_wheels([good, bad], seen.append)


def test_the_rules_table_is_the_rules():
    table = dict(gate.rules_table())
    assert table["forbidden in a wheel"] == ", ".join(rules.FORBIDDEN_LIBRARIES)
    assert "libcuda.so*" in rules.FORBIDDEN_LIBRARIES and rules.DRIVER_LIBRARY == "libcuda.so*"
    assert rules.MAX_GLIBC == (2, 17) and "2.17" in table["wheel tags"]


# A backend whose error macro ends the process, as llm.c's cudaCheck does: it exports exactly the ABI (so only the
# new rule can refuse it) and calls exit(1), _exit or abort on an error path.
EXITING_C = (
    "#include <stdio.h>\n#include <stdlib.h>\n#include <unistd.h>\n"
    '#define check(ok) do { if (!(ok)) { fprintf(stderr, "failed\\n"); {call}; } } while (0)\n'
    + "".join(f"int {name}(long v) {{ check(v >= 0); return 0; }}\n" for name in sorted(rules.EXPORTED))
)


@pytest.fixture(scope="module")
def exiting_libs(tmp_path_factory):
    from conftest import build_shared_library

    out = tmp_path_factory.mktemp("exiting")
    libs = {}
    for name, call in (
        ("exit", "exit(1)"),
        ("_exit", "_exit(1)"),
        ("abort", "abort()"),
        ("quick_exit", "quick_exit(1)"),
        ("status", "return -5"),
    ):
        src = out / f"{name}.c"
        src.write_text(EXITING_C.replace("{call}", call))
        libs[name] = build_shared_library(src, out / f"lib{name}.so")
    return libs


@pytest.mark.parametrize("call", ["exit", "_exit", "abort", "quick_exit"])
def test_a_library_that_can_end_the_process_is_refused(tmp_path, exiting_libs, call):
    """A backend that calls exit() (or _exit, abort, quick_exit) ends the Python process that loaded it with no
    message: the build (check_linkage) and the wheel gate (check_wheel) both refuse it, naming the file, the
    symbol and the fix (return a status); the same library returning a status passes both."""
    so = exiting_libs[call]
    with pytest.raises(BuildError) as exc:
        gate.check_linkage(so)
    assert str(exc.value).startswith(f"{so}: imports {call}: a call of it ends the Python process"), exc.value
    assert "cuplug_op_fail" in str(exc.value) and "CUPLUG_E_DEVICE" in str(exc.value)
    problems = gate.check_wheel(_wheel(tmp_path, f"p-1-{TAG}.whl", {"p/sm80/libcuplug_p.so": so.read_bytes()}))
    assert problems == [f"p/sm80/libcuplug_p.so: {gate.ending_problem([call])}"], problems
    gate.check_linkage(exiting_libs["status"])
    assert (
        gate.check_wheel(_wheel(tmp_path, f"q-1-{TAG}.whl", {"q/libq.so": exiting_libs["status"].read_bytes()})) == []
    )


def test_cuplugs_own_libraries_import_nothing_that_ends_the_process(cpu_lib_path):
    """The CPU twin passes (it is checked in every wheel); the rule names the symbols by their bare name,
    whatever version a library binds ('exit@GLIBC_2.2.5'), and nothing that merely starts like one."""
    gate.check_linkage(cpu_lib_path)
    assert gate.process_ending(
        ["exit@GLIBC_2.2.5", "abort", "__cxa_guard_abort@CXXABI_1.3", "exit_group", "atexit"]
    ) == [
        "abort",
        "exit",
    ]
    assert dict(gate.rules_table())["a library may not import"].startswith(", ".join(rules.PROCESS_ENDING))
