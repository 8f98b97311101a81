"""Another author's backend, built with nothing but the installed cuplug (issues 10 and 16).

A clean copy of examples/scan runs its own noxfile (build_backends, wheels, tests)
with cuplug taken from this run's wheels; then its wheels go into a fresh venv,
where cuplug.load("scan") falls back and explains like the reference backend; a
second run with nothing changed compiles nothing, and a changed .cu recompiles that
file only. `cuplug new-backend` makes a project under a new name that builds and
passes its tests untouched. A project with several .cu files and every option of
cuplug_add_cuda_backend() builds through `python -m cuplug.kit variants`, with the
right manifest facts; shared libraries in LINK_LIBRARIES are refused at configure
time. Slow (two toolkits, eight variants each): about two minutes a project.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, WHEELS, clean_env, needs_wheels

pytestmark = needs_wheels
DEPS = os.environ.get("CUPLUG_TEST_DEPS", "")
NOX_PYTHON = os.environ.get("CUPLUG_TEST_NOX_PYTHON")


def run_project_nox(project: Path, *sessions: str) -> subprocess.CompletedProcess[str]:
    if not NOX_PYTHON:
        pytest.skip("needs nox (run through `python3 ci/nox.py -s tests`)")
    env = clean_env(CUPLUG_FIND_LINKS=os.pathsep.join(d for d in (WHEELS, DEPS) if d))
    return subprocess.run(
        [NOX_PYTHON, "-m", "nox", "-f", str(project / "noxfile.py"), "-s", *(sessions or ("wheels", "tests"))],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )


@pytest.fixture(scope="module")
def scan_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """examples/scan copied without build outputs, built and tested by its own noxfile."""
    project = tmp_path_factory.mktemp("example") / "scan"
    shutil.copytree(
        ROOT / "examples" / "scan", project, ignore=shutil.ignore_patterns("build", "dist", ".nox", "__pycache__")
    )
    proc = run_project_nox(project)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return project


def test_example_builds_its_variants_and_wheels_with_installed_cuplug(scan_project):
    for major in ("cuda12", "cuda13"):
        manifest = json.loads((scan_project / "build" / major / "manifest.json").read_text())
        assert {a["variant"] for a in manifest["artifacts"]} == {"fatbin", "ptx", "sm75", "sm80"}
        assert {a["backend"] for a in manifest["artifacts"]} == {"scan"} and manifest["cuda"] == major
    names = sorted(p.name.split("-")[0] for p in (scan_project / "dist").glob("*.whl"))
    assert names == ["scankit", "scankit_cuda12", "scankit_cuda13"]
    assert all("manylinux_2_17_x86_64" in p.name for p in (scan_project / "dist").glob("*.whl"))


def _fresh_venv_with(project: Path, tmp_path: Path, requirement: str) -> Path:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    links = [a for d in (project / "dist", WHEELS, DEPS) if d for a in ("--find-links", str(d))]
    proc = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-index", *links, requirement],
        capture_output=True,
        text=True,
        env=clean_env(),
    )
    assert proc.returncode == 0, proc.stderr
    return venv / "bin"


LOAD_SCAN = (
    "import array, json, cuplug, scankit; b = scankit.load(); "
    "r = b.run('prefix_sum', array.array('f', [1.0, 2.0, 3.0, 4.0])); t = b.trace; "
    "print(json.dumps({'variant': b.variant, 'result': list(r), 'code': t.decision_code, "
    "'reason': t.decision_reason, 'labels': [c.label for c in t.candidates], "
    "'attempts': [a.code for a in t.attempts], 'text': t.text()}))"
)


def test_example_installs_and_falls_back_like_the_reference(scan_project, tmp_path, fake_driver_dir):
    bindir = _fresh_venv_with(scan_project, tmp_path, "scankit[cuda13]")
    plain = subprocess.run(
        [str(bindir / "python"), "-c", LOAD_SCAN], capture_output=True, text=True, env=clean_env(), cwd=tmp_path
    )
    assert plain.returncode == 0, plain.stderr
    got = json.loads(plain.stdout)
    assert got["variant"] == "cpu" and got["result"] == [1.0, 3.0, 6.0, 10.0] and got["code"] == "no-driver"
    assert "cuda13/fatbin" in got["labels"] and "no-driver" in got["text"]
    # A driver with an sm_90 device: the scan CUDA artifacts are chosen, tried (this fake driver cannot
    # serve the runtime: load-failed) and the CPU twin answers, each step in the trace.
    gpu = clean_env(LD_LIBRARY_PATH=str(fake_driver_dir), FAKE_CUDA_DEVICES="9.0")
    faked = subprocess.run(
        [str(bindir / "python"), "-c", LOAD_SCAN], capture_output=True, text=True, env=gpu, cwd=tmp_path
    )
    got = json.loads(faked.stdout)
    assert got["labels"][0] == "cuda13/fatbin" and got["attempts"][0] == "load-failed" and got["variant"] == "cpu"
    doctor = subprocess.run(
        [str(bindir / "cuplug"), "doctor", "--json", "--backend", "scan"],
        capture_output=True,
        text=True,
        env=gpu,
        cwd=tmp_path,
    )
    doc = json.loads(doctor.stdout)
    assert doc["decision"]["backend"] == "scan" and doc["loaded"]["ok"]
    assert [a["code"] for a in doc["loaded"]["attempts"]][-1] == "ok"
    # The reference backend is unaffected by the other package being installed.
    vector = subprocess.run(
        [str(bindir / "cuplug"), "probe", "--allow-cpu"], capture_output=True, text=True, env=clean_env(), cwd=tmp_path
    )
    assert vector.returncode == 0, vector.stdout + vector.stderr


def test_unknown_backend_name_is_a_clear_error(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", "import cuplug; cuplug.load('nosuch')"],
        capture_output=True,
        text=True,
        env=clean_env(),
        cwd=tmp_path,
    )
    assert proc.returncode == 1 and "cuplug.cpu_backends" in proc.stderr and "nosuch" in proc.stderr


def test_new_backend_project_builds_and_passes_its_tests_untouched(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "cuplug", "new-backend", "histo", "--dir", str(tmp_path / "histo")],
        capture_output=True,
        text=True,
        env=clean_env(),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    project = tmp_path / "histo"
    assert (project / "cuda" / "histo.cu").is_file() and (project / "histo" / "__init__.py").is_file()
    assert "scan" not in (project / "pyproject.toml").read_text()
    built = run_project_nox(project)
    assert built.returncode == 0, built.stdout[-4000:] + built.stderr[-4000:]
    assert len(list((project / "dist").glob("histo*.whl"))) == 3


@pytest.mark.parametrize(
    ("args", "needle"), [(["Bad-Name"], "lowercase"), (["vector"], "cuplug's own"), (["ok", "--dir", "."], "not empty")]
)
def test_new_backend_refuses_bad_names_and_places(args, needle, tmp_path):
    (tmp_path / "something").write_text("x")
    proc = subprocess.run(
        [sys.executable, "-m", "cuplug", "new-backend", *args],
        capture_output=True,
        text=True,
        env=clean_env(),
        cwd=tmp_path,
    )
    assert proc.returncode == 2 and needle in proc.stderr, proc.stderr


def test_example_manifests_agree_with_cuplug_inspect(scan_project):
    """Two .cu files, two fat binaries per library: the facts cuobjdump gave the manifest are what
    cuplug's own reader finds."""
    for major in ("cuda12", "cuda13"):
        proc = subprocess.run(
            [sys.executable, "-m", "cuplug", "inspect", "--json", str(scan_project / "build" / major)],
            capture_output=True,
            text=True,
            env=clean_env(),
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        doc = json.loads(proc.stdout)
        assert doc["ok"] and len(doc["artifacts"]) == 4
        assert all(a["found"] == a["expected"] for a in doc["artifacts"]), doc


def test_example_rebuild_with_nothing_changed_compiles_nothing(scan_project):
    """The reported bug: a second `nox -s wheels` (nox recreates its venv, so cuplug's headers are
    reinstalled) recompiled all eight variants. Now ninja finds everything up to date."""
    t0 = time.perf_counter()
    proc = run_project_nox(scan_project, "wheels")
    took = time.perf_counter() - t0
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    for major in ("cuda12", "cuda13"):
        assert f"cuplug.kit: {major}: up to date (nothing compiled or linked)" in out, out[-4000:]
    assert "Building C object" not in out and "Building CUDA object" not in out  # the CPU twin too
    print(f"second `nox -s wheels`, nothing changed: {took:.1f} s")


def test_example_changed_cu_recompiles_that_file_only(scan_project):
    kernels = scan_project / "cuda" / "scan_kernels.cu"
    kernels.write_text(kernels.read_text() + "// changed\n")
    python = scan_project / ".nox" / "wheels" / "bin" / "python"  # the venv the last run left
    cmd = [str(python), "-m", "cuplug.kit", "variants", "--cuda", "cuda13", "--source", "cuda"]
    proc = subprocess.run(
        [*cmd, "--out", "build/cuda13", "--backend", "scan"],
        cwd=scan_project,
        capture_output=True,
        text=True,
        env=clean_env(PATH=f"{python.parent}{os.pathsep}{os.environ['PATH']}"),
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "cuda13: compiled 4 objects (scan_kernels.cu x4), linked 4 libraries" in proc.stderr, proc.stderr


# A backend of several sources with every option of cuplug_add_cuda_backend(): the example's two
# .cu files (its op table and kernels), a third .cu and a host-only .cpp, each of which #errors
# unless the option that concerns it reached its compile line; a static library the link needs
# (--no-undefined); a CPU twin with the options of cuplug_add_cpu_backend(). OPTS_CASE picks a
# configuration that must be refused.
OPTS_CMAKE = """
cmake_minimum_required(VERSION 3.24)
project(opts LANGUAGES C CXX CUDA)
find_package(Python COMPONENTS Interpreter REQUIRED)
execute_process(COMMAND "${Python_EXECUTABLE}" -m cuplug --cmake-dir
                OUTPUT_VARIABLE cuplug_DIR OUTPUT_STRIP_TRAILING_WHITESPACE COMMAND_ERROR_IS_FATAL ANY)
find_package(cuplug 0.1 REQUIRED CONFIG)

add_library(helper STATIC helper.c)
set_target_properties(helper PROPERTIES POSITION_INDEPENDENT_CODE ON)
set(case "$ENV{OPTS_CASE}")
set(libs helper)
set(cpu_libs helper)
set(flags -DOPTS_FROM_CUDA_FLAGS=1)
if(case STREQUAL "imported-shared")
  add_library(vendor::foo SHARED IMPORTED)
  set_target_properties(vendor::foo PROPERTIES IMPORTED_LOCATION /opt/vendor/lib/libfoo.so.2)
  list(APPEND libs vendor::foo)
elseif(case STREQUAL "transitive")
  add_library(vendor_static STATIC IMPORTED)
  set_target_properties(vendor_static PROPERTIES IMPORTED_LOCATION /opt/vendor/lib/libvs.a
                        INTERFACE_LINK_LIBRARIES CUDA::cufft)
  list(APPEND libs vendor_static)
elseif(case MATCHES "^lib=(.*)$")
  list(APPEND libs "${CMAKE_MATCH_1}")
elseif(case MATCHES "^cpu-lib=(.*)$")
  list(APPEND cpu_libs "${CMAKE_MATCH_1}")
elseif(case MATCHES "^flag=(.*)$")
  list(APPEND flags "${CMAKE_MATCH_1}")
endif()

cuplug_add_cpu_backend(opts SOURCES scan_cpu.c cpu_opts.c INCLUDE_DIRS include
  COMPILE_DEFINITIONS OPTS_NEEDED=42 LINK_LIBRARIES ${cpu_libs} OUT_TARGETS cpu_target)
cuplug_add_cuda_backend(opts SOURCES scan.cu scan_kernels.cu opts.cu host.cpp MATRIX "${CUPLUG_MATRIX}"
  INCLUDE_DIRS include COMPILE_DEFINITIONS OPTS_NEEDED=42 SCAN_ITEMS_PER_THREAD=8
  CUDA_FLAGS ${flags} LINK_LIBRARIES ${libs} OUT_TARGETS opts_targets)
if(NOT opts_targets STREQUAL "cuplug_opts_two" OR NOT cpu_target STREQUAL "cuplug_opts_cpu")
  message(FATAL_ERROR "OUT_TARGETS: ${opts_targets} ${cpu_target}")
endif()
foreach(t IN LISTS opts_targets)
  target_compile_definitions(${t} PRIVATE OPTS_VIA_OUT_TARGETS=1)
endforeach()
if(case STREQUAL "later")
  target_link_libraries(cuplug_opts_two PRIVATE CUDA::cudart)
elseif(case STREQUAL "rdc")
  set_target_properties(cuplug_opts_two PROPERTIES CUDA_SEPARABLE_COMPILATION ON)
endif()
"""
OPTS_FILES = {
    "helper.c": "int opts_helper(int x) { return x + 1; }\n",
    "include/opts.h": "#pragma once\nint opts_fill(float* out, long long n, void* stream);\nint opts_host_value(void);\n",
    "opts.cu": """#include <cuda_runtime.h>
#include "opts.h"  // INCLUDE_DIRS
#if OPTS_NEEDED != 42
#error "OPTS_NEEDED comes from COMPILE_DEFINITIONS"
#endif
#ifndef OPTS_FROM_CUDA_FLAGS
#error "OPTS_FROM_CUDA_FLAGS comes from CUDA_FLAGS"
#endif
#ifndef OPTS_VIA_OUT_TARGETS
#error "OPTS_VIA_OUT_TARGETS comes from target_compile_definitions() on OUT_TARGETS"
#endif
extern "C" int opts_helper(int);  // LINK_LIBRARIES helper: the link has --no-undefined
namespace opts_kernels {
__global__ void fill(float* out, long long n) {
  long long i = blockIdx.x * 256ll + threadIdx.x;
  if (i < n) out[i] = (float)i;
}
}  // namespace opts_kernels
int opts_fill(float* out, long long n, void* stream) {
  opts_kernels::fill<<<(unsigned)((n + 255) / 256), 256, 0, (cudaStream_t)stream>>>(out, n);
  return opts_helper(opts_host_value());
}
""",
    "host.cpp": """// Host-only source of the CUDA backend: the host compiler builds it, cuda_runtime.h is found.
#include <cuda_runtime.h>
#include "opts.h"
#ifdef OPTS_FROM_CUDA_FLAGS
#error "CUDA_FLAGS reach CUDA sources only"
#endif
int opts_host_value(void) { return OPTS_NEEDED + (cudaSuccess == 0 ? 0 : 1); }
""",
    "cpu_opts.c": """#include "opts.h"
#if OPTS_NEEDED != 42
#error "OPTS_NEEDED comes from COMPILE_DEFINITIONS"
#endif
int opts_helper(int);
int opts_cpu_value(void) { return opts_helper(OPTS_NEEDED); }
""",
}
OPTS_MATRIX = {"schema": 1, "min_arch": "75", "variants": {"two": {"sass": ["75", "80"], "ptx": ["80"]}}}


def _opts_project(root: Path) -> Path:
    project = root / "opts"
    example = ROOT / "examples" / "scan"
    shutil.copytree(example / "cuda" / "include", project / "include")
    for src in ("cuda/scan.cu", "cuda/scan_kernels.cu", "cpu/scan_cpu.c"):
        shutil.copy(example / src, project / Path(src).name)
    for name, text in OPTS_FILES.items():
        (project / name).write_text(text)
    (project / "CMakeLists.txt").write_text(OPTS_CMAKE)
    (project / "matrix.json").write_text(json.dumps(OPTS_MATRIX))
    return project


def _variants(project: Path, out: Path, **env: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "cuplug.kit", "variants", "--cuda", "cuda13", "--source", str(project)]
    cmd += ["--out", str(out), "--backend", "opts", "--matrix", str(project / "matrix.json")]
    return subprocess.run(cmd, capture_output=True, text=True, env=clean_env(**env), timeout=900)


@pytest.fixture(scope="module")
def opts_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    project = _opts_project(tmp_path_factory.mktemp("opts"))
    proc = _variants(project, project / "build")
    assert proc.returncode == 0, proc.stderr[-4000:]
    return project / "build"


def test_several_cu_files_build_one_library_with_the_right_facts(opts_build):
    from cuplug.kit import artifacts, toolchain

    (entry,) = json.loads((opts_build / "manifest.json").read_text())["artifacts"]
    assert (entry["variant"], entry["sass"], entry["ptx"], entry["ptx_isa"]) == (
        "two",
        ["sm_75", "sm_80"],
        ["compute_80"],
        "9.0",
    )
    so = opts_build / "two" / "libcuplug_opts.so"
    images = artifacts.list_images(toolchain.install("cuda13", lambda _m: None), so)
    # scan.cu, scan_kernels.cu, opts.cu: one fat binary each, so three images per target
    assert sorted(im.target for im in images) == ["compute_80"] * 3 + ["sm_75"] * 3 + ["sm_80"] * 3
    proc = subprocess.run(
        [sys.executable, "-m", "cuplug", "inspect", "--json", str(so)], capture_output=True, text=True, env=clean_env()
    )
    (finding,) = json.loads(proc.stdout)["artifacts"]
    assert proc.returncode == 0 and finding["found"] == finding["expected"], proc.stdout
    assert (opts_build / "libcuplug_opts_cpu.so").is_file()


def _ninja_edge(build_ninja: str, output: str) -> str:
    """The `build <output>: ...` statement of build.ninja with its variable lines."""
    m = re.search(rf"^build {re.escape(output)}:.*?(?=^\S|\Z)", build_ninja, re.M | re.S)
    assert m, output
    return m[0]


def test_each_option_reaches_its_compile_or_link_line(opts_build):
    """The build succeeding already says so (each source #errors without its option); build.ninja
    shows where each one went."""
    ninja = (opts_build / "build.ninja").read_text()
    include = f"-I{opts_build.parent / 'include'}"
    cu = _ninja_edge(ninja, "CMakeFiles/cuplug_opts_two.dir/opts.cu.o")
    for needle in ("-DOPTS_NEEDED=42", "-DSCAN_ITEMS_PER_THREAD=8", "-DOPTS_FROM_CUDA_FLAGS=1", include):
        assert needle in cu, (needle, cu)
    cpp = _ninja_edge(ninja, "CMakeFiles/cuplug_opts_two.dir/host.cpp.o")
    assert "-DOPTS_NEEDED=42" in cpp and "OPTS_FROM_CUDA_FLAGS" not in cpp
    assert "libhelper.a" in _ninja_edge(ninja, "two/libcuplug_opts.so")
    cpu = _ninja_edge(ninja, "CMakeFiles/cuplug_opts_cpu.dir/cpu_opts.c.o")
    assert "-DOPTS_NEEDED=42" in cpu and include in cpu
    assert "libhelper.a" in _ninja_edge(ninja, "libcuplug_opts_cpu.so")


@pytest.mark.parametrize(
    ("case", "needles"),
    [
        (
            "lib=CUDA::cublas",
            [
                "cuplug_add_cuda_backend(opts): LINK_LIBRARIES: CUDA::cublas is a shared CUDA library",
                "its wheel must not depend on a shared library, and on a CUDA one least of all",
                "Use the _static variant: CUDA::cublas_static",
            ],
        ),
        ("lib=cublas", ["cublas is a shared CUDA library (linked as -lcublas", "CUDA::cublas_static"]),
        ("lib=/opt/vendor/libbar.so.1", ["/opt/vendor/libbar.so.1 is a shared library", "libbar.a"]),
        ("imported-shared", ["vendor::foo is a shared library (/opt/vendor/lib/libfoo.so.2)"]),
        ("transitive", ["CUDA::cufft is a shared CUDA library, linked through vendor_static", "CUDA::cufft_static"]),
        ("later", ["LINK_LIBRARIES of cuplug_opts_two: CUDA::cudart is a shared CUDA library", "linked already"]),
        ("cpu-lib=z", ["cuplug_add_cpu_backend(opts): LINK_LIBRARIES: z is a shared library"]),
        ("flag=-arch=sm_90", ["CUDA_FLAGS has -arch=sm_90", "variant matrix"]),
        ("rdc", ["cuplug_opts_two has CUDA_SEPARABLE_COMPILATION ON", "the ptx variant would be empty"]),
    ],
)
def test_shared_libraries_and_device_links_are_refused_at_configure_time(case, needles, opts_build):
    proc = _variants(opts_build.parent, opts_build.parent / "refused", OPTS_CASE=case)
    message = " ".join(proc.stderr.split())  # CMake wraps its messages
    assert proc.returncode == 1 and "cmake configure failed" in message, proc.stderr[-3000:]
    for needle in needles:
        assert needle in message, (needle, proc.stderr[-3000:])


def test_every_op_of_the_example_is_a_pytorch_op_that_opcheck_passes(scan_project, tmp_path):
    """cuplug.torch.register on the example's own backend (issue 30): torch.library.opcheck of each op
    (functional and .out), run()'s results, torch.compile(fullgraph=True), on its CPU twin."""
    pytest.importorskip("torch")
    import torch_opcheck

    report = torch_opcheck.check_project(str(scan_project / "dist"), "scankit", "scan", str(tmp_path))
    assert report, "the backend declares no op"
    for name, r in report.items():
        assert r == torch_opcheck.PASSED, name
