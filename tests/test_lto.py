"""LTO-IR variants (issue 33 part 3, docs/lto.md) on the CPU machine.

What is real here: the kit builds `vector`'s LTO variant with the pinned CUDA 13 and 12 toolchains; NVIDIA's
nvJitLink (the pinned wheels, toolchains/nvjitlink.txt) links it for GPUs of several capabilities, and cuobjdump
reads the container cuplug wraps the cubin in; the loader, on the fake driver, decides, links, caches and hands the
image to the library's registration; the registration swap itself (backends/common/cuplug_lto_image.cpp) runs
against a stand-in for the CUDA runtime's. Only running the linked kernels needs a GPU (tests/test_gpu_targets.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, env_for, planted_site, run_cli, run_json
from cuplug.contract import fatbin, manifest, reasons, targets
from cuplug.runtime import jitlink, select
from test_select import make_variant

MATRIX = {
    "schema": 1,
    "min_arch": "75",
    "variants": {"lto": {"sass": ["75"], "ptx": [], "lto": ["75"], "about": "LTO-IR test variant"}},
}


# ---- the contract: the kind, its rule, the version rule, the container --------------------------------------


def test_lto_targets_parse_and_describe():
    t = targets.parse("lto_75")
    assert (t.kind.name, t.kind.image, t.cc) == ("lto_XX", "lto", (7, 5))
    for bad in ("lto_90a", "lto_100f", "lto_7", "lto_"):
        with pytest.raises(ValueError):
            targets.parse(bad)
    assert targets.describe(["sm_75", "lto_75"]) == "7.5-7.x, LTO-IR >= 7.5 (linked at load by nvJitLink)"
    assert targets.why_not(targets.parse("lto_90"), (8, 6)) == "lto_90 LTO-IR needs CC >= 9.0"


@pytest.mark.parametrize(
    ("built_with", "found", "words"),
    [
        ("13.0", (13, 0), None),
        ("13.0", (13, 2), None),  # newer of the same major: fine
        ("12.4", (12, 9), None),
        ("13.0", None, "none found (pip install 'nvidia-nvjitlink>=13.0,<14')"),
        ("12.4", None, "pip install 'nvidia-nvjitlink-cu12>=12.4,<13'"),
        ("12.4", (12, 3), "found 12.3"),  # older than the compiler
        ("12.4", (13, 0), "needs nvJitLink 12.x >= 12.4, found 13.0"),  # another major
        ("13.1", (13, 0), "found 13.0"),
    ],
)
def test_which_nvjitlink_may_link_which_lto_ir(built_with, found, words):
    why = targets.jitlink_problem(built_with, found)
    assert (why is None) if words is None else (words in why)


def _cubin(arch: int = 90, size: int = 100) -> bytes:
    return b"\x7fELF" + bytes([2, 1, 1, 0x33, 8]) + bytes(size - 9)


def test_the_container_of_a_linked_cubin_reads_back():
    data = fatbin.container(_cubin(90, 101), 90)
    assert len(data) % 8 == 0 and fatbin.containers(data) == [data]
    (entry,) = fatbin.parse(data)
    assert (entry.kind, entry.arch, entry.version, entry.compressed, entry.payload_size) == (2, 90, (1, 8), False, 104)
    assert fatbin.device_code(data).sass == ("sm_90",)
    with pytest.raises(fatbin.FatbinError, match="not a cubin"):
        fatbin.container(b"MZ" + bytes(100), 90)
    assert fatbin.containers(bytes(16) + data) == [data]  # alignment padding before it
    with pytest.raises(fatbin.FatbinError):
        fatbin.containers(b"\x01" * 16)
    with pytest.raises(fatbin.FatbinError, match="runs past"):
        fatbin.containers(data[:-8])
    with pytest.raises(fatbin.FatbinError, match="after the last container"):
        fatbin.containers(data + bytes(8))


# ---- the selection: where an LTO variant ranks, and why it is skipped --------------------------------------


def _lto(**kw):
    fields = {"variant": "lto", "sass": ("sm_75",), "ptx": (), "ptx_isa": None, "lto": ("lto_75",)}
    return make_variant(**{**fields, "cuda": "cuda13", "cuda_version": "13.0", **kw})


@pytest.mark.parametrize("cc", [(8, 0), (8, 6), (8, 7), (9, 0), (10, 3), (12, 1)])
def test_an_lto_variant_is_linked_for_exactly_the_gpu(cc):
    c = select.judge(_lto(), cc, 13000, {13: (13, 0)})
    assert c.accepted and c.tier == select.TIER_LTO and c.link_for == cc[0] * 10 + cc[1], c.reason
    assert f"linked for sm_{cc[0]}{cc[1]}" in c.reason and "nvJitLink 13.0" in c.reason


def test_its_own_sass_serves_as_built_and_without_nvjitlink_it_is_skipped_with_the_fix():
    exact = select.judge(_lto(), (7, 5), 13000, {})
    assert exact.accepted and exact.tier == select.TIER_EXACT_SASS and exact.link_for is None
    skipped = select.judge(_lto(), (9, 0), 13000, {})
    assert not skipped.accepted and skipped.code == reasons.NVJITLINK_UNAVAILABLE
    assert "pip install 'nvidia-nvjitlink>=13.0,<14'" in skipped.reason
    old = select.judge(_lto(cuda_version="13.1"), (9, 0), 13000, {13: (13, 0)})
    assert old.code == reasons.NVJITLINK_UNAVAILABLE and "found 13.0" in old.reason
    other_major = select.judge(_lto(), (9, 0), 13000, {12: (12, 9)})
    assert other_major.code == reasons.NVJITLINK_UNAVAILABLE
    cuda12 = _lto(cuda="cuda12", cuda_version="12.4", sass=("sm_75",))
    blackwell = select.judge(cuda12, (12, 0), 13000, {12: (12, 4)})  # nvJitLink 12.4 knows no sm_120
    assert blackwell.code == reasons.NVJITLINK_UNAVAILABLE
    assert "nvJitLink 12.4 cannot link for sm_120: CUDA 12.8 is the first to know it" in blackwell.reason
    assert select.judge(cuda12, (12, 0), 13000, {12: (12, 8)}).link_for == 120
    thor = select.judge(cuda12, (11, 0), 13000, {12: (12, 9)})  # sm_110 came with CUDA 13: no 12.x links it
    assert thor.code == reasons.NVJITLINK_UNAVAILABLE and "this LTO-IR is CUDA 12's" in thor.reason
    too_old_gpu = select.judge(_lto(lto=("lto_90",), sass=("sm_90",)), (8, 6), 13000, {13: (13, 0)})
    assert too_old_gpu.code == reasons.NO_COMPATIBLE_ARTIFACT and "sm_90 SASS" in too_old_gpu.reason


def test_lto_ranks_after_every_sass_and_before_ptx():
    sm80 = make_variant(variant="sm80", sass=("sm_80",), cuda="cuda13", cuda_version="13.0")
    ptx = make_variant(variant="ptx", sass=(), ptx=("compute_75",), ptx_isa="9.0", cuda="cuda13", cuda_version="13.0")
    order = [c.variant for c in select.rank([ptx, _lto(), sm80], (8, 6), 13000, jitlink={13: (13, 0)}) if c.accepted]
    assert order == ["sm80", "lto", "ptx", "cpu"]
    without = select.rank([ptx, _lto()], (9, 0), 13000, jitlink={})
    assert [c.variant for c in without if c.accepted] == ["ptx", "cpu"]
    assert next(c for c in without if c.variant == "lto").code == reasons.NVJITLINK_UNAVAILABLE


def test_when_only_an_lto_variant_could_serve_the_decision_names_nvjitlink():
    from cuplug.runtime.policy import from_env
    from test_select import _found, _probe

    probe, found = _probe(driver=13000), _found(_lto())
    d = select.decide("vector", from_env({}), probe, found, {})
    assert d.code == reasons.NVJITLINK_UNAVAILABLE and "nvidia-nvjitlink" in d.reason
    assert select.decide("vector", from_env({}), probe, found, {13: (13, 0)}).chosen.variant == "lto"


def test_without_pyelftools_the_decision_skips_the_lto_candidate_naming_it(monkeypatch):
    """A --no-deps install has nvJitLink but not pyelftools: the decision (doctor, explain) says the LTO candidate
    cannot be linked here and why, where it used to accept it and let the load fail."""
    import sys

    from cuplug.contract import fatbin
    from cuplug.runtime import loading
    from test_select import _found, _probe

    class Linker:
        version = (13, 0)

    monkeypatch.setattr(loading, "_safe_discover", lambda backend: _found(_lto()))
    monkeypatch.setattr(loading, "_safe_jitlinks", lambda found: {13: Linker()})

    def decide(devices: int):
        return loading._decide("vector", loading.policy.from_env({}), {}, lambda: _probe(driver=13000, devices=devices))

    assert fatbin.reader_missing() is None  # the test environment has it
    with monkeypatch.context() as without:
        for name in [m for m in sys.modules if m == "elftools" or m.startswith("elftools.")] + ["elftools"]:
            without.setitem(sys.modules, name, None)
        missing = fatbin.reader_missing()
        assert missing is not None and "needs pyelftools" in missing and "pip install 'pyelftools>=0.31'" in missing
        skipped = select.judge(_lto(), (9, 0), 13000, {13: missing})
        assert skipped.code == reasons.NVJITLINK_UNAVAILABLE and missing in skipped.reason and skipped.link_for is None
        trace = decide(1)
        assert trace.decision_code == reasons.NVJITLINK_UNAVAILABLE and "needs pyelftools" in trace.decision_reason
        assert all(d.code == reasons.NVJITLINK_UNAVAILABLE for _, d in trace.per_device())
    trace = decide(2)  # pyelftools back: the same facts link it
    assert trace.decision.variant == "lto" and trace.decision.link_for == 90
    # doctor's per-device rows are judged with the same nvJitLink facts (they said "none found" before)
    assert [(dev.index, d.chosen.variant) for dev, d in trace.per_device()] == [(0, "lto"), (1, "lto")]


# ---- finding nvJitLink the way cuda-pathfinder does, without loading it --------------------------------------


def _wheel(site: Path, sub: str, major: int, dist: str) -> Path:
    lib = site / sub / f"libnvJitLink.so.{major}"
    lib.parent.mkdir(parents=True)
    lib.write_bytes(b"\x7fELF")
    (site / f"{dist}.dist-info").mkdir()
    return lib


def test_nvjitlink_is_found_in_nvidias_wheels_and_toolkits_by_major(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    lib13 = _wheel(one, "nvidia/cu13/lib", 13, "nvidia_nvjitlink-13.0.88")
    lib12 = _wheel(two, "nvidia/nvjitlink/lib", 12, "nvidia_nvjitlink_cu12-12.4.127")
    found = jitlink.find(13, path=[b"/bytes", str(two), str(one)], env={})  # sys.path may hold bytes
    assert (found.path, found.version, found.full) == (str(lib13), (13, 0), "13.0.88")
    newer = _wheel(tmp_path / "newer", "nvidia/cu13/lib", 13, "nvidia_nvjitlink-13.2.51")
    assert jitlink.find(13, path=[str(one), str(tmp_path / "newer")], env={}).path == str(newer)  # the newest
    assert jitlink.find(12, path=[str(one), str(two)], env={}).path == str(lib12)
    assert jitlink.find(14, path=[str(one), str(two)], env={}) is None
    toolkit = tmp_path / "cuda" / "lib64"
    toolkit.mkdir(parents=True)
    (toolkit / "libnvJitLink.so.12.6.85").write_bytes(b"\x7fELF")
    (toolkit / "libnvJitLink.so.12").symlink_to("libnvJitLink.so.12.6.85")
    found = jitlink.find(12, path=[], env={"CUDA_HOME": str(tmp_path / "cuda")})
    assert (found.version, found.full, found.how) == ((12, 6), "12.6.85", "$CUDA_HOME")
    # among equal versions, the first in the search order: a wheel on sys.path before $CUDA_HOME's toolkit
    (toolkit / "libnvJitLink.so.13.0.88").write_bytes(b"\x7fELF")
    (toolkit / "libnvJitLink.so.13").symlink_to("libnvJitLink.so.13.0.88")
    found = jitlink.find(13, path=[str(one)], env={"CUDA_HOME": str(tmp_path / "cuda")})
    assert (found.path, found.full) == (str(lib13), "13.0.88"), found
    # a dist-info of another major says nothing about this file, and its name no version: passed over
    _wheel(tmp_path / "three", "nvidia/cu13/lib", 13, "nvidia_nvjitlink_cu12-12.4.127")
    assert jitlink.find(13, path=[str(tmp_path / "three")], env={}) is None


# ---- the registration swap, against a stand-in for the runtime's __cudaRegisterFatBinary ----------------------

HARNESS = r"""
#include "cuplug_lto_image.cpp"
static void* g_seen;
extern "C" void** __real___cudaRegisterFatBinary(void* w) { g_seen = w; return (void**)w; }
extern "C" __attribute__((visibility("default"))) const void* harness_register(void* w) {
  __wrap___cudaRegisterFatBinary(w); return g_seen; }
extern "C" __attribute__((visibility("default"))) int harness_arch() { return cuplug_lto_linked_arch; }
"""


def _harness(tmp_path: Path) -> Path:
    if shutil.which("c++") is None:
        pytest.skip("needs a host C++ compiler")
    (tmp_path / "h.cpp").write_text(HARNESS)
    so = tmp_path / "libharness.so"
    common = ROOT / "backends" / "common"
    subprocess.run(
        ["c++", "-shared", "-fPIC", "-O1", f"-I{common}", "-o", str(so), str(tmp_path / "h.cpp")], check=True
    )
    return so


SWAP = (
    "import ctypes, json, sys\n"
    "class W(ctypes.Structure):\n"
    "    _fields_ = [('magic', ctypes.c_int), ('version', ctypes.c_int), ('data', ctypes.c_void_p), ('o', ctypes.c_void_p)]\n"
    "lib = ctypes.CDLL(sys.argv[1]); lib.harness_register.restype = ctypes.c_void_p\n"
    "built = W(0x466243b1, int(sys.argv[2]), 1234, 5678)\n"
    "seen = W.from_address(lib.harness_register(ctypes.byref(built)))\n"
    "data = ctypes.string_at(seen.data, 64) if seen.data != 1234 else b''\n"
    "print(json.dumps({'built': ctypes.addressof(seen) == ctypes.addressof(built), 'magic': seen.magic,\n"
    "                  'version': seen.version, 'arch': lib.harness_arch(), 'head': data.hex()}))\n"
)


def _swap(so: Path, image: str | None, version: int = 2) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "CUPLUG_LTO_IMAGE"}
    if image is not None:
        env["CUPLUG_LTO_IMAGE"] = image
    argv = [sys.executable, "-c", SWAP, str(so), str(version)]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
    return json.loads(proc.stdout)


def test_the_registration_takes_the_linked_image_and_only_a_whole_one(tmp_path):
    so = _harness(tmp_path)
    image = tmp_path / "linked.fatbin"
    data = fatbin.container(_cubin(90, 200), 90)
    image.write_bytes(data)
    swapped = _swap(so, str(image))
    assert swapped["built"] is False and swapped["version"] == 1 and swapped["magic"] == 0x466243B1
    assert swapped["arch"] == 90 and bytes.fromhex(swapped["head"]) == data[:64]
    torn = [("short", data[:40]), ("torn", data[:100]), ("long", data + bytes(8)), ("two", data + data)]
    compressed = bytearray(data)
    compressed[16 + 16] = 1  # an entry claiming a compressed payload
    for name, content in [("missing", None), ("empty", b""), ("garbage", b"\x01" * 100), *torn,
                          ("compressed", bytes(compressed))]:  # fmt: skip
        path = tmp_path / name
        if content is not None:
            path.write_bytes(content)
        kept = _swap(so, str(path))
        assert kept["built"] is True and kept["arch"] == 0, name  # the built image, and the ping says null
    assert _swap(so, None)["built"] is True
    assert _swap(so, str(tmp_path))["built"] is True  # a directory
    # a whole-program image's registration (version 1: a linked static library's own) is never the one swapped
    assert _swap(so, str(image), version=1)["built"] is True


# ---- the real thing: the kit builds it, nvJitLink links it, cuobjdump reads it, the loader serves it ----------


@pytest.fixture(scope="module")
def jitlink_site() -> Path:
    from cuplug.kit import toolchain

    return toolchain.install_nvjitlink(lambda _msg: None)


def _build(major: str, out: Path, matrix: dict = MATRIX) -> subprocess.CompletedProcess[str]:
    if shutil.which("c++") is None:
        pytest.skip("needs a host C++ compiler")
    (out.parent / f"{out.name}.json").write_text(json.dumps(matrix))
    args = ["--cuda", major, "--source", str(ROOT / "backends"), "--out", str(out), "--backend", "vector"]
    args += ["--matrix", str(out.parent / f"{out.name}.json")]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(
        [sys.executable, "-m", "cuplug.kit", "variants", *args], capture_output=True, text=True, env=env, timeout=900
    )


@pytest.fixture(scope="module")
def built13(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("lto13") / "build"
    proc = _build("cuda13", out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def _kernels(tc, path: Path) -> list[str]:
    out = subprocess.run([str(tc.cuobjdump), "-symbols", str(path)], capture_output=True, text=True, check=True)
    return sorted(line.split()[-1] for line in out.stdout.splitlines() if "STO_ENTRY" in line)


@pytest.mark.parametrize("major", ["cuda13", "cuda12"])
def test_the_kit_builds_an_lto_variant_and_nvjitlink_links_it_for_each_gpu(major, built13, tmp_path, jitlink_site):
    from cuplug.kit import toolchain

    tc = toolchain.install(major, lambda _msg: None)
    build = built13
    if major == "cuda12":
        build = tmp_path / "build"
        proc = _build(major, build)
        assert proc.returncode == 0, proc.stderr[-3000:]
    (art,) = manifest.read_strict(build, major)
    assert (art.sass, art.ptx, art.lto) == (("sm_75",), (), ("lto_75",))
    so = build / art.file
    found = jitlink.find(int(major[4:]), path=[str(jitlink_site)], env={})
    assert found is not None and found.version[0] == int(major[4:])
    built_kernels = _kernels(tc, so)
    assert len(built_kernels) > 10
    os.environ["CUPLUG_CACHE_DIR"] = str(tmp_path / "cache")
    try:
        for arch in (90, 87, 86):  # Hopper, a Tegra (Orin), a desktop minor no SASS of the variant is for
            linked, data = jitlink.image_for(str(so), f"{major}-{arch}", arch, found)
            assert not linked.cached and linked.arch == arch and Path(linked.path).read_bytes() == data
            listed = subprocess.run([str(tc.cuobjdump), "-lelf", linked.path], capture_output=True, text=True).stdout
            assert f"sm_{arch}.cubin" in listed, listed
            assert _kernels(tc, Path(linked.path)) == built_kernels  # every kernel, linked for that GPU
        again, data = jitlink.image_for(str(so), f"{major}-90", 90, found)
        assert (
            again.cached
            and again.sha256
            == hashlib.sha256(data).hexdigest()
            == hashlib.sha256(Path(again.path).read_bytes()).hexdigest()
        )
        for torn in (data[:100], data + bytes(8), fatbin.container(data[16 + 64 :], 86)):  # torn, padded, other SM
            Path(again.path).write_bytes(torn)  # is linked again
            assert not jitlink.image_for(str(so), f"{major}-90", 90, found)[0].cached
        (tmp_path / "not-a-dir").write_text("")  # a cache that cannot be written: linked all the same
        os.environ["CUPLUG_CACHE_DIR"] = str(tmp_path / "not-a-dir")
        unkept, data = jitlink.image_for(str(so), f"{major}-86", 86, found)
        assert unkept.path == "" and not unkept.cached and fatbin.parse(data)[0].arch == 86
    finally:
        del os.environ["CUPLUG_CACHE_DIR"]
    if major == "cuda13":
        with pytest.raises(jitlink.JitLinkError, match="sm_999"):
            jitlink.link(found, fatbin.elf_section(so.read_bytes(), fatbin.RELOCATABLE_SECTION), 999)


def test_a_clean_rebuild_of_the_cuda13_lto_variant_is_byte_identical(tmp_path):
    """nvcc names a relocatable module's symbols from random numbers unless seeded: cuplug.cmake gives each .cu of
    an LTO variant its own -frandom-seed, so a clean build in the same directory gives the same bytes (unseeded,
    two such builds differed in about 20 kB of __nv_relfatbin). CUDA 12.4 has no such option (docs/lto.md)."""
    out, built = tmp_path / "build", []
    for _ in range(2):
        shutil.rmtree(out, ignore_errors=True)
        proc = _build("cuda13", out)
        assert proc.returncode == 0, proc.stderr[-3000:]
        (art,) = manifest.read_strict(out, "cuda13")
        built.append((out / art.file).read_bytes())
    assert built[0] == built[1]


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ({"sass": [], "ptx": [], "lto": ["75"]}, "an LTO variant lists its SASS"),
        ({"sass": ["75"], "ptx": ["75"], "lto": ["75"]}, "and no PTX"),
        ({"sass": ["75"], "ptx": [], "lto": ["70"]}, "CUDA 13 compiles for CC >= 7.5 only"),
        ({"sass": ["75"], "ptx": [], "lto": "75"}, "use a list"),
    ],
)
def test_the_kit_refuses_an_lto_variant_it_cannot_build(spec, words, tmp_path):
    from cuplug.kit import artifacts

    matrix = {**MATRIX, "variants": {"lto": spec}}
    with pytest.raises(artifacts.BuildError, match=words):
        artifacts.expected_lto(matrix, "lto", [75, 80, 90], "13.0")


def _lto_site(site: Path, built: Path, out: Path) -> Path:
    """The installed backend wheels with cuda13's artifacts replaced by the LTO variant alone (cuda12's none)."""
    shutil.copytree(site, out, symlinks=True)
    for package, keep in (("cuplug_cuda13", True), ("cuplug_cuda12", False)):
        doc = json.loads((out / package / "manifest.json").read_text())
        doc["artifacts"] = []
        if keep:
            (art,) = manifest.read_strict(built, "cuda13")
            (out / package / "lto").mkdir()
            shutil.copyfile(built / art.file, out / package / art.file)
            doc["artifacts"] = [art.to_json()]
        (out / package / "manifest.json").write_text(json.dumps(doc))
    return out


LOAD = (
    "import json, cuplug\n"
    "b = cuplug.load(); t = b.trace\n"
    "c = t.decided.candidates[0]\n"
    "print(json.dumps({'served': b.variant, 'code': t.decision_code, 'reason': t.decision_reason,\n"
    "                  'first': [c.label, c.code, c.reason, c.link_for],\n"
    "                  'attempts': [[a.label, a.code, a.reason] for a in t.attempts]}))"
)


def test_the_loader_links_an_lto_variant_for_the_gpu_and_says_why_not_without_nvjitlink(
    site, built13, fake_driver_dir, jitlink_site, tmp_path
):
    lto_site = _lto_site(site, built13, tmp_path / "site")
    cache = tmp_path / "cache"
    without = run_json(LOAD, env_for(lto_site, fake_driver_dir, CUPLUG_CACHE_DIR=str(cache)))
    assert without["served"] == "cpu" and without["code"] == reasons.NVJITLINK_UNAVAILABLE
    assert "pip install 'nvidia-nvjitlink>=13.0,<14'" in without["reason"]
    assert not (cache / "lto").exists()
    doctor = run_cli(["doctor", "--no-load"], env_for(lto_site, fake_driver_dir, CUPLUG_CACHE_DIR=str(cache)))
    assert "LTO-IR >= 7.5 (linked at load by nvJitLink)" in doctor.stdout, doctor.stdout
    assert "nvjitlink-unavailable" in doctor.stdout
    report = json.loads(run_cli(["doctor", "--json", "--no-load"], env_for(lto_site, fake_driver_dir)).stdout)
    from importlib import resources

    from jsonschema import Draft202012Validator

    schema = json.loads(resources.files("cuplug").joinpath("schemas/doctor.schema.json").read_text())
    assert not list(Draft202012Validator(schema).iter_errors(report))
    path = f"{lto_site}{os.pathsep}{jitlink_site}"
    for devices, arch in (("9.0", 90), ("8.7", 87)):
        env = env_for(lto_site, fake_driver_dir, CUPLUG_CACHE_DIR=str(cache), FAKE_CUDA_DEVICES=devices)
        env["PYTHONPATH"] = path
        got = run_json(LOAD, env)
        label, code, reason, link_for = got["first"]
        assert (label, code, link_for) == ("cuda13/lto", reasons.OK, arch), got
        assert f"linked for sm_{arch}" in reason and "nvJitLink 13.0" in reason
        # The fake driver runs no CUDA runtime: create() fails after the link, and the CPU serves.
        assert got["served"] == "cpu" and got["attempts"][0][0] == "cuda13/lto", got
        images = [fatbin.parse(p.read_bytes()) for p in (cache / "lto").glob("*.fatbin")]
        assert any(len(e) == 1 and e[0].arch == arch and e[0].kind == fatbin.KIND_ELF for e in images), images
    stamps = {p: p.stat().st_mtime_ns for p in (cache / "lto").glob("*.fatbin")}
    env["PYTHONPATH"] = path
    run_json(LOAD, env)  # the same GPU again: the cached image, nothing linked (nor written)
    assert {p: p.stat().st_mtime_ns for p in (cache / "lto").glob("*.fatbin")} == stamps and len(stamps) == 2


def test_inspect_reads_the_lto_ir_and_names_a_manifest_that_hides_it(built13, tmp_path):
    from cuplug.tools import inspection

    (ok,) = inspection.inspect_target(str(built13))
    assert ok.ok and ok.found["lto"] == ["lto_75"] and ok.found["sass"] == ["sm_75"], ok
    assert "LTO  lto_75 (linked at load by nvJitLink)" in inspection.format_findings([ok])
    lying = tmp_path / "lying"
    shutil.copytree(built13, lying, ignore=shutil.ignore_patterns("CMakeFiles", "*.ninja*", "cuplug-kit"))
    doc = json.loads((lying / "manifest.json").read_text())
    del doc["artifacts"][0]["lto"]
    (lying / "manifest.json").write_text(json.dumps(doc))
    (bad,) = inspection.inspect_target(str(lying))
    assert not bad.ok and "lto: file has ['lto_75'], manifest says []" in bad.problems


@pytest.mark.parametrize("fault", ["garbage-nvjitlink", "no-lto-ir", "torn-lto-ir"])
def test_a_broken_nvjitlink_or_lto_ir_rejects_the_candidate_with_the_step_named(
    fault, site, built13, fake_driver_dir, jitlink_site, tmp_path
):
    """What can be wrong at load on a machine without a GPU: an nvJitLink that is no library (a wheel's dist-info
    over garbage), an artifact whose manifest says LTO-IR but whose file holds none (the built sm75's bytes), or LTO-IR
    bytes garbled. Each rejects the LTO candidate (load-failed, naming the link), caches nothing, and the CPU serves."""
    lto_site = _lto_site(site, built13, tmp_path / "site")
    linker = jitlink_site
    if fault == "garbage-nvjitlink":
        linker = tmp_path / "fake-nvjitlink"
        _wheel(linker, "nvidia/cu13/lib", 13, "nvidia_nvjitlink-13.0.88").write_bytes(b"\x7fELF" + bytes(200))
    member = "cuplug_cuda13/lto/libcuplug_vector.so"
    data = (lto_site / member).read_bytes()
    if fault == "no-lto-ir":
        data = next(site.glob("cuplug_cuda13/sm75/libcuplug_vector.so")).read_bytes()
    if fault == "torn-lto-ir":  # the LTO-IR's payload overwritten, its container headers intact
        section = fatbin.elf_section(data, fatbin.RELOCATABLE_SECTION)
        at = data.find(section) + 16 + 200
        data = data[:at] + bytes(len(section) - 400) + data[at + len(section) - 400 :]
    if fault != "garbage-nvjitlink":
        lto_site = planted_site(lto_site, tmp_path / "planted", member, data)
    env = env_for(lto_site, fake_driver_dir, CUPLUG_CACHE_DIR=str(tmp_path / "cache"))
    env["PYTHONPATH"] = f"{lto_site}{os.pathsep}{linker}"
    got = run_json(LOAD, env)
    assert got["served"] == "cpu" and got["first"][0] == "cuda13/lto", got
    label, code, reason = got["attempts"][0]
    assert (label, code) == ("cuda13/lto", reasons.LOAD_FAILED), got
    assert reason.startswith("linking its LTO-IR for sm_90 failed: "), reason
    assert not list((tmp_path / "cache").glob("lto/*.fatbin"))


def _opens_image_during_dlopen(so: Path, tmp_path: Path) -> bool:
    """Whether dlopen of ``so`` (no GPU needed: the CUDA runtime registers its image without the driver) reads
    CUPLUG_LTO_IMAGE: the variable names a FIFO, and a reader opening it is what lets this writer's open succeed."""
    import errno
    import time

    fifo = tmp_path / f"image-{so.parent.name}"
    os.mkfifo(fifo)
    env = {**os.environ, "CUPLUG_LTO_IMAGE": str(fifo)}
    code = "import ctypes, sys; ctypes.CDLL(sys.argv[1]); print('loaded')"
    child = subprocess.Popen([sys.executable, "-c", code, str(so)], env=env, stdout=subprocess.PIPE, text=True)
    opened = False
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and child.poll() is None:
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # EOF for the reader: no image, the built one
                opened = True
                break
            except OSError as exc:
                if exc.errno != errno.ENXIO:  # ENXIO: nobody has it open for reading yet
                    raise
                time.sleep(0.05)
        out, _ = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
    assert out.strip() == "loaded"  # and the library loaded with its built image all the same
    return opened


def test_the_kit_built_lto_variant_reads_its_image_at_dlopen_and_other_variants_never_do(built13, site, tmp_path):
    """The --wrap took in the library the kit built (stripped: no symbol says so), and only there."""
    (art,) = manifest.read_strict(built13, "cuda13")
    assert _opens_image_during_dlopen(built13 / art.file, tmp_path)
    assert not _opens_image_during_dlopen(next(site.glob("cuplug_cuda13/sm75/libcuplug_vector.so")), tmp_path)
