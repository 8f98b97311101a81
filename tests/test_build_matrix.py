"""The variant matrix expands to the right targets, and bad entries are named (pure, no toolkit);
the device-code check on libraries made with the pinned nvcc (several .cu files pass; a device
link's kernel-less images, the same object twice, mixed targets and relocatable code are refused).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from cuplug.contract import fatbin
from cuplug.contract.elfarch import host_arch
from cuplug.kit import artifacts, gate

ROOT = Path(__file__).resolve().parents[1]

MATRIX = json.loads((ROOT / "backends" / "variants.json").read_text())
CUDA13_ARCHS = [75, 80, 86, 87, 88, 89, 90, 100, 103, 110, 120, 121]


def test_matrix_expansion():
    assert artifacts.expected_targets(MATRIX, "sm75", CUDA13_ARCHS) == (["sm_75"], [])
    assert artifacts.expected_targets(MATRIX, "ptx", CUDA13_ARCHS) == ([], ["compute_75"])
    sass, ptx = artifacts.expected_targets(MATRIX, "fatbin", [50, 60, 75, 80, 90])
    assert sass == ["sm_75", "sm_80", "sm_90"] and ptx == ["compute_90"]


def test_unknown_variant_and_arch_are_named():
    with pytest.raises(artifacts.BuildError, match="unknown variant 'sm99'"):
        artifacts.expected_targets(MATRIX, "sm99", CUDA13_ARCHS)
    bad = {**MATRIX, "variants": {"sm95": {"sass": ["95"], "ptx": []}}}
    with pytest.raises(artifacts.BuildError, match="arch 95 is not supported"):
        artifacts.expected_targets(bad, "sm95", CUDA13_ARCHS)


def _described(tmp_path, monkeypatch, cpu_lib_path, variant, found):
    """describe() of one built variant whose device code reads as ``found`` (sass, ptx, isa); the library is
    the real CPU twin (it links and exports as a backend must), the toolchain a stand-in: no toolkit."""
    from cuplug.kit.toolchain import Toolchain

    so = tmp_path / variant / "libcuplug_vector.so"
    so.parent.mkdir()
    shutil.copyfile(cpu_lib_path, so)
    monkeypatch.setattr(artifacts, "read_device_code", lambda tc, path, lto=False: (*found, []))
    tc = Toolchain("cuda13", "13.0", tmp_path, tmp_path / "nvcc", tmp_path / "cuobjdump", arch=host_arch())
    spec = artifacts.BuildSpec(tc, ROOT / "backends", tmp_path, log=lambda _msg: None)
    return artifacts.describe(spec, variant, MATRIX, [75, 80, 90])


@pytest.mark.parametrize(
    ("variant", "found", "words"),
    [
        # the SASS is right, the PTX is not what the matrix declares: the build stops, naming both
        ("fatbin", (["sm_75", "sm_80", "sm_90"], ["compute_80"], "9.0"), "PTX ['compute_80'], the matrix declares"),
        ("fatbin", (["sm_75", "sm_80", "sm_90"], [], None), "PTX [], the matrix declares SASS"),
        ("ptx", ([], [], None), "holds SASS [] PTX [], the matrix declares SASS [] PTX ['compute_75']"),
        ("sm80", (["sm_80"], ["compute_80"], "9.0"), "holds SASS ['sm_80'] PTX ['compute_80']"),
        ("sm80", (["sm_75"], [], None), "holds SASS ['sm_75'] PTX []"),
    ],
)
def test_a_built_variant_whose_ptx_or_sass_differs_from_the_matrix_fails_the_build(
    tmp_path, monkeypatch, cpu_lib_path, variant, found, words
):
    """The manifest's device-code facts are read from the built file and must be what the matrix declares,
    PTX as much as SASS: a fatbin without its newest PTX would leave future GPUs on the CPU, a stray PTX in a
    dedicated SASS variant would make it a PTX wheel; either is a BuildError, never a manifest entry."""
    with pytest.raises(artifacts.BuildError, match=re.escape(words)):
        _described(tmp_path, monkeypatch, cpu_lib_path, variant, found)


def test_a_built_variant_that_matches_the_matrix_is_described_from_its_file(tmp_path, monkeypatch, cpu_lib_path):
    art = _described(
        tmp_path, monkeypatch, cpu_lib_path, "fatbin", (["sm_75", "sm_80", "sm_90"], ["compute_90"], "9.0")
    )
    assert (art.sass, art.ptx, art.ptx_isa, art.file) == (
        ("sm_75", "sm_80", "sm_90"),
        ("compute_90",),
        "9.0",
        "fatbin/libcuplug_vector.so",
    )
    assert art.size == cpu_lib_path.stat().st_size and art.cuda_version == "13.0"


def test_missing_compiler_is_named(tmp_path):
    with pytest.raises(artifacts.BuildError, match=r"host C/C\+\+ compiler"):
        spec = artifacts.BuildSpec(None, ROOT / "backends", tmp_path, env={**os.environ, "PATH": str(tmp_path)})
        artifacts.build_backend(spec)


def test_linkage_check_rejects_extra_exports_and_dependencies(tmp_path, cpu_lib_path):
    gate.check_linkage(cpu_lib_path)  # the real CPU backend passes
    src = tmp_path / "leak.c"
    src.write_text("int cuplug_backend_abi_version(void){return 1;} int helper(void){return 2;}")
    so = tmp_path / "libleak.so"

    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(so), str(src)], check=True)
    with pytest.raises(artifacts.BuildError, match="helper"):
        gate.check_linkage(so)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(so), str(src), "-lz"], check=False)
    if so.exists() and "libz" in subprocess.run(["readelf", "-d", str(so)], capture_output=True, text=True).stdout:
        with pytest.raises(artifacts.BuildError, match="needs"):
            gate.check_linkage(so)


def test_build_summary_says_what_ninja_did():
    assert artifacts.build_summary("ninja: no work to do.\n") == "up to date (nothing compiled or linked)"
    out = (
        "[1/4] Building CUDA object CMakeFiles/cuplug_scan_sm80.dir/scan_kernels.cu.o\n"
        "[2/4] Building CUDA object CMakeFiles/cuplug_scan_sm75.dir/scan_kernels.cu.o\n"
        "[3/4] Linking CXX shared library sm80/libcuplug_scan.so\n"
        "[4/4] Linking CXX shared library sm75/libcuplug_scan.so\n"
    )
    assert artifacts.build_summary(out) == "compiled 2 objects (scan_kernels.cu x2), linked 2 libraries"


# Libraries made directly with the pinned nvcc and the host linker, without cuplug's ABI:
# read_device_code looks at the device code only.
KERNEL = "namespace {ns} {{ __global__ void k(float* p) {{ p[threadIdx.x] += 1.0f; }} }}\nvoid launch_{ns}(float* p) {{ {ns}::k<<<1, 32>>>(p); }}\n"
# Internal linkage only: the same object links twice without a host symbol clash.
STATIC_KERNEL = "static __global__ void twice(float* p) { p[threadIdx.x] *= 2.0f; }\n__attribute__((used)) static void* keep = (void*)twice;\n"


def _toolchain(major: str):
    from cuplug.kit import toolchain

    if shutil.which("c++") is None:
        pytest.skip("needs a host C++ compiler")
    return toolchain.install(major, lambda _msg: None)  # cached by `nox -s build_backends`


def _gencode(*targets: str) -> list[str]:
    """sm_80 -> SASS, compute_80 -> PTX."""
    flags = []
    for t in targets:
        arch = t.split("_")[1]
        flags += ["-gencode", f"arch=compute_{arch},code={t}"]
    return flags


def _object(tc, tmp: Path, name: str, text: str, targets: tuple[str, ...], *extra: str) -> Path:
    (tmp / f"{name}.cu").write_text(text)
    obj = tmp / f"{name}.o"
    subprocess.run(
        [str(tc.nvcc), "-c", "-Xcompiler=-fPIC", *_gencode(*targets), *extra, str(tmp / f"{name}.cu"), "-o", str(obj)],
        check=True,
        capture_output=True,
    )
    return obj


def _link(tmp: Path, *objects: Path) -> Path:
    so = tmp / "libtest.so"
    subprocess.run(["c++", "-shared", "-o", str(so), *map(str, objects)], check=True)
    return so


def test_several_sources_each_with_its_fat_binary_pass(tmp_path):
    tc = _toolchain("cuda13")
    targets = ("sm_75", "sm_80", "compute_80")
    objects = [_object(tc, tmp_path, ns, KERNEL.format(ns=ns), targets) for ns in ("one", "two", "three")]
    so = _link(tmp_path, *objects)
    images = artifacts.list_images(tc, so)
    # One fat binary per source: three sm_80 images, each with its own kernel, which is fine.
    assert [im.target for im in images].count("sm_80") == 3
    assert sorted(im.kernels for im in images if im.target == "sm_80") == [
        ("_ZN3one1kEPf",),
        ("_ZN3two1kEPf",),
        ("_ZN5three1kEPf",),
    ]
    assert artifacts.read_device_code(tc, so) == (["sm_75", "sm_80"], ["compute_80"], "9.0", [])
    code = fatbin.read_elf(str(so))  # what `cuplug inspect` reports agrees
    assert (list(code.sass), list(code.ptx), code.ptx_isa) == (["sm_75", "sm_80"], ["compute_80"], "9.0")


@pytest.mark.parametrize("major", ["cuda12", "cuda13"])
def test_one_step_nvcc_shared_is_named_as_a_device_link(major, tmp_path):
    """What the old 'embedded more than once (one-step nvcc -shared?)' was about: nvcc's link step
    runs nvlink, which adds a kernel-less image per architecture."""
    tc = _toolchain(major)
    (tmp_path / "one.cu").write_text(KERNEL.format(ns="one"))
    so = tmp_path / "libonestep.so"
    subprocess.run(
        [
            str(tc.nvcc),
            "-shared",
            "-Xcompiler=-fPIC",
            *_gencode("sm_75", "sm_80"),
            str(tmp_path / "one.cu"),
            "-o",
            str(so),
        ],
        check=True,
        capture_output=True,
    )
    with pytest.raises(artifacts.BuildError, match=r"2 device images hold no kernel \(sm_75, sm_80\)") as err:
        artifacts.read_device_code(tc, so)
    assert "one-step `nvcc -shared`" in str(err.value) and "link with the host compiler" in str(err.value)
    if major == "cuda13":  # CUDA 13 cubins name the tool that made them
        assert "made by nvlink" in str(err.value)


def test_the_same_object_linked_twice_is_refused(tmp_path):
    tc = _toolchain("cuda13")
    obj = _object(tc, tmp_path, "twice", STATIC_KERNEL, ("sm_80",))
    with pytest.raises(
        artifacts.BuildError, match=r"the same sm_80 image \(kernels twice\(float\*\)\) is embedded 2 times"
    ):
        artifacts.read_device_code(tc, _link(tmp_path, obj, obj))


def test_kernels_built_for_different_targets_are_named(tmp_path):
    tc = _toolchain("cuda13")
    one = _object(tc, tmp_path, "one", KERNEL.format(ns="one"), ("sm_80",))
    two = _object(tc, tmp_path, "two", KERNEL.format(ns="two"), ("sm_75", "sm_80"))
    with pytest.raises(artifacts.BuildError, match=r"one::k\(float\*\) has sm_80; two::k\(float\*\) has sm_75,sm_80"):
        artifacts.read_device_code(tc, _link(tmp_path, one, two))


def test_relocatable_device_code_is_refused(tmp_path):
    tc = _toolchain("cuda13")
    objs = [_object(tc, tmp_path, ns, KERNEL.format(ns=ns), ("sm_80",), "-rdc=true") for ns in ("one", "two")]
    dlink = tmp_path / "dlink.o"
    subprocess.run(
        [str(tc.nvcc), "-dlink", "-Xcompiler=-fPIC", *_gencode("sm_80"), *map(str, objs), "-o", str(dlink)],
        check=True,
        capture_output=True,
    )
    with pytest.raises(artifacts.BuildError, match=r"relocatable device code.*the ptx variant would be empty"):
        artifacts.read_device_code(tc, _link(tmp_path, *objs, dlink))


def test_the_kits_old_name_is_an_alias_of_it():
    """cuplug.kit was cuplug.build (issue 32, part 7): `python -m cuplug.build`, `from cuplug.build import x` and
    `import cuplug.build.x` go on working, each name the kit's own module object."""
    import subprocess
    import sys

    import cuplug.build.gate

    import cuplug.build
    import cuplug.kit.gate
    from cuplug.build import toolchain

    assert cuplug.build.gate is cuplug.kit.gate and toolchain is sys.modules["cuplug.kit.toolchain"]
    out = subprocess.run([sys.executable, "-m", "cuplug.build", "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "toolchain" in out.stdout and "variants" in out.stdout


def test_a_target_the_toolkit_cannot_build_is_named_with_its_fix():
    """A matrix may list the contract's kinds (90a, 100f); what a toolkit cannot build is refused before CMake
    runs, with the fix (contract/targets.buildable)."""

    def variant(*sass: str) -> dict:
        return {**MATRIX, "variants": {"v": {"sass": list(sass), "ptx": []}}}

    assert artifacts.expected_targets(variant("90a", "100f"), "v", CUDA13_ARCHS, "13.0") == (["sm_90a", "sm_100f"], [])
    cases = [
        (variant("101"), "13.0", "CUDA 13 renamed sm_101 to sm_110; declare sm_110"),
        (variant("100f"), "12.4", "sm_XXf targets need CUDA >= 12.9"),
        (variant("72"), "13.0", "CUDA 13 compiles for CC >= 7.5 only"),
        (variant("90b"), "13.0", "not a CUDA target"),
    ]
    for matrix, version, why in cases:
        with pytest.raises(artifacts.BuildError, match=re.escape(why)):
            artifacts.expected_targets(matrix, "v", [*CUDA13_ARCHS, 101], version)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        (None, "cannot read the variant matrix"),  # no such file
        ("{not json", "cannot read the variant matrix"),
        ("[1, 2]", "expected {'schema': 1, 'min_arch'"),
        ('{"schema": 2, "min_arch": "75", "variants": {}}', "expected {'schema': 1"),
        ('{"schema": 1, "variants": {"v": {"sass": ["75"], "ptx": []}}}', "'min_arch': '75'"),  # no min_arch
        ('{"schema": 1, "min_arch": "sm_75", "variants": {}}', "'min_arch': '75'"),
        ('{"schema": 1, "min_arch": "75", "variants": []}', "'variants': {...}"),
        ('{"schema": true, "min_arch": "75", "variants": {}}', "expected {'schema': 1"),  # true == 1 in Python
        ('{"schema": 1.0, "min_arch": "75", "variants": {}}', "expected {'schema': 1"),
        ('{"schema": 1, "min_arch": "\u00b2", "variants": {}}', "'min_arch': '75'"),  # "²".isdigit() is True
        ("[" * 100000, "cannot read the variant matrix"),  # nesting past the recursion limit
    ],
)
def test_a_bad_matrix_file_is_refused_naming_its_shape(tmp_path, text, words):
    """What CMake would stop on (or Python would raise on) is named before any toolkit runs."""
    path = tmp_path / "matrix.json"
    if text is not None:
        path.write_text(text)
    with pytest.raises(artifacts.BuildError, match=re.escape(words)):
        artifacts.load_matrix(path)
    assert artifacts.load_matrix(ROOT / "backends" / "variants.json") == MATRIX
