"""The manylinux_2_17_aarch64 wheels, cross-built on x86_64, run under qemu-user.

An aarch64 Python 3.11 (Debian bookworm arm64, pinned in toolchains/python-bookworm-arm64.txt)
runs through ``qemu-aarch64 -L <tree>``; no binfmt_misc is needed: the venv's ``python`` is a
shell script that execs qemu with ``-0 "$0"``, so ``sys.executable``, console scripts and
subprocesses of the guest all work. The wheels are pip-installed into that venv by the guest's
own pip; an aarch64 build of tests/fake_cuda/fake_libcuda.c (the cached cross gcc) plays the
driver. The real aarch64 CUDA artifacts are verified and dlopened by the guest; the fake driver
cannot serve cudart, so create() fails (load-failed) and the CPU twin serves, as on x86_64.

`nox -s tests` builds the aarch64 wheels and sets CUPLUG_TEST_WHEELS_AARCH64 when qemu-aarch64
is on PATH; .ci/run installs qemu-user where it can (root + apt-get).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from importlib import resources
from pathlib import Path

import pytest

from conftest import clean_env, run_json

WHEELS_AARCH64 = os.environ.get("CUPLUG_TEST_WHEELS_AARCH64", "")
DEPS = os.environ.get("CUPLUG_TEST_DEPS", "")
QEMU = shutil.which("qemu-aarch64") or shutil.which("qemu-aarch64-static")

pytestmark = [
    pytest.mark.aarch64_emulated,
    pytest.mark.skipif(QEMU is None, reason="needs qemu-aarch64 (Debian: apt-get install qemu-user)"),
    pytest.mark.skipif(not WHEELS_AARCH64, reason="needs the aarch64 wheels (nox -s tests builds them with qemu)"),
]

# Runs the same in the guest and on the host: every op of the CPU twin on the same inputs.
# ABI v2 derives each op's sample call from its signature (cuplug.runtime.samples); ABI v1's ops are
# (operand count, returns a scalar). Either way the ops come from Backend.ops, never a typed list.
OPS_SCRIPT = r"""
import array, json, cuplug
b = cuplug.load()
assert b.variant == "cpu", b.variant
out = {}
try:
    from cuplug.runtime import samples
except ImportError:
    samples = None
for name in sorted(b.ops):
    if samples is not None and not isinstance(b.ops[name], tuple):
        out[name] = [o.values() for o in samples.run_sample(b, b.ops[name])]
        continue
    count, scalar = b.ops[name]
    n = 4099  # a float4 body and a scalar tail
    xs = [array.array("f", [((i * (7 + k)) % 13 - 6) * 0.25 for i in range(n)]) for k in range(count)]
    r = b.run(name, *xs, alpha=1.5, beta=-0.25)
    out[name] = r if scalar else list(r)
print(json.dumps({"arch": __import__("platform").machine(), "ops": out}))
"""

DECIDE_LOAD = (
    "import json, cuplug; b = cuplug.load(); t = b.trace; print(json.dumps({'variant': b.variant, "
    "'code': t.decision_code, 'attempts': [[f'{a.cuda}/{a.variant}', a.code, a.reason] for a in t.attempts], "
    "'candidates': [[c.label, c.accepted, c.code, c.reason] for c in t.candidates]}))"
)


def _wheel(prefix: str, where: str) -> Path:
    found = sorted(Path(where).glob(f"{prefix}-*.whl"))
    assert len(found) == 1, (prefix, found)
    return found[0]


@pytest.fixture(scope="module")
def arm_root() -> Path:
    from cuplug.kit import toolchain

    return toolchain.install_emulation_root(lambda _msg: None)


@pytest.fixture(scope="module")
def arm_venv(arm_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An aarch64 venv with cuplug[cuda12,cuda13] installed by the guest's pip; returns its bin/."""
    venv = tmp_path_factory.mktemp("arm") / "venv"
    real = arm_root / "usr" / "bin" / "python3.11"
    subprocess.run([QEMU, "-L", str(arm_root), str(real), "-m", "venv", "--without-pip", str(venv)], check=True)
    bindir = venv / "bin"
    for name in ("python", "python3", "python3.11"):
        (bindir / name).unlink()
    (bindir / "python").write_text(
        "#!/bin/sh\n# this venv's aarch64 python, through qemu-user\n"
        f'exec "{QEMU}" -L "{arm_root}" -0 "$0" "{real}" "$@"\n'
    )
    (bindir / "python").chmod(0o755)
    for name in ("python3", "python3.11"):
        (bindir / name).symlink_to("python")
    pip = next((arm_root / "usr" / "share" / "python-wheels").glob("pip-*.whl")) / "pip"
    find = [a for d in (WHEELS_AARCH64, DEPS) if d for a in ("--find-links", d)]
    proc = subprocess.run(
        [str(bindir / "python"), str(pip), "install", "-q", "--no-index", *find, "cuplug[cuda12,cuda13]"],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return bindir


@pytest.fixture(scope="module")
def arm_fake_driver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/fake_cuda/fake_libcuda.c cross-compiled for aarch64, as <dir>/libcuda.so.1."""
    from cuplug.kit import toolchain

    prefix = toolchain.install_cross_compiler(lambda _msg: None)
    out = tmp_path_factory.mktemp("fake_cuda_arm")
    src = Path(__file__).resolve().parent / "fake_cuda" / "fake_libcuda.c"
    subprocess.run(
        [f"{prefix}gcc", "-shared", "-fPIC", "-O1", "-Wall", "-o", str(out / "libcuda.so.1"), str(src), "-ldl"],
        check=True,
    )
    return out


def _guest(bindir: Path, code: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(bindir / "python"), "-c", code], capture_output=True, text=True, env=env, cwd=cwd, timeout=180
    )


def _guest_json(bindir: Path, code: str, env: dict[str, str], cwd: Path) -> dict:
    proc = _guest(bindir, code, env, cwd)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_wheels_are_aarch64_and_pass_the_gate():
    wheels = sorted(Path(WHEELS_AARCH64).glob("*.whl"))
    assert {w.name.split("-")[0] for w in wheels} == {"cuplug", "cuplug_cuda12", "cuplug_cuda13"}
    tail = "-manylinux2014_aarch64.manylinux_2_17_aarch64.whl"  # cuplug's own: its abi3 C dispatcher inside
    assert all(w.name.endswith(("-cp311-abi3" if w.name.startswith("cuplug-") else "-py3-none") + tail) for w in wheels)
    proc = subprocess.run(
        [sys.executable, "-m", "cuplug.kit", "check", *map(str, wheels)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    for w in wheels:
        with zipfile.ZipFile(w) as zf:
            libs = [n for n in zf.namelist() if n.endswith(".so")]
            assert libs and all(zf.read(n)[18:20] == (183).to_bytes(2, "little") for n in libs), w.name
            for m in (n for n in zf.namelist() if n.endswith("/manifest.json")):
                assert {a["arch"] for a in json.loads(zf.read(m))["artifacts"]} == {"aarch64"}


def test_cpu_twin_runs_every_op_like_the_x86_64_twin(arm_venv, tmp_path):
    guest = _guest_json(arm_venv, OPS_SCRIPT, clean_env(CUPLUG_BACKEND="cpu"), tmp_path)
    host = run_json(OPS_SCRIPT, clean_env(CUPLUG_BACKEND="cpu"))
    assert guest["arch"] == "aarch64" and host["arch"] == "x86_64"
    assert guest["ops"] and sorted(guest["ops"]) == sorted(host["ops"])
    for op in host["ops"]:  # -ffp-contract=off on both: the same bits, not merely close
        assert guest["ops"][op] == host["ops"][op], op


def test_the_c_dispatcher_serves_in_the_guest(arm_venv, tmp_path):
    code = (
        "import json, cuplug; b = cuplug.load(); t = b.empty(4); u = b.empty(4); r = b.empty(4)\n"
        "b.run('add', t, u, out=r); b.run('add', t, u, out=r)\n"
        "print(json.dumps([type(b.run).__name__, b.run.stats()['fast_calls']]))"
    )
    assert _guest_json(arm_venv, code, clean_env(CUPLUG_BACKEND="cpu"), tmp_path) == ["Dispatcher", 1]


def test_real_aarch64_artifacts_verify_and_dlopen_in_the_guest(arm_venv, tmp_path):
    code = (
        "import json, cuplug.runtime.discovery as d, cuplug.runtime.verify as v, cuplug.runtime.library as a; out = [];\n"
        "for p in d.discover().packages:\n"
        "  for art in p.artifacts:\n"
        "    lib = a.BackendLibrary(v.verify(art)); out.append([p.cuda, art.variant, art.arch, lib.abi_version()])\n"
        "print(json.dumps(out))"
    )
    got = _guest_json(arm_venv, code, clean_env(), tmp_path)
    assert len(got) == 8 and {g[2] for g in got} == {"aarch64"}, got
    assert {(g[0], g[1]) for g in got} == {
        (c, v) for c in ("cuda12", "cuda13") for v in ("fatbin", "ptx", "sm75", "sm80")
    }


@pytest.mark.parametrize(
    ("caps", "driver", "first"),
    [
        ("9.0", "13000", "cuda13/fatbin"),  # Grace Hopper: exact sm_90 SASS
        ("8.7", "13000", "cuda13/fatbin"),  # Jetson Orin: the fatbin's exact sm_87 (sm80's SASS cannot serve it)
        ("8.7", "12040", "cuda12/fatbin"),  # Orin on a CUDA 12 driver (JetPack 6)
        ("8.0", "12040", "cuda12/sm80"),
    ],
)
def test_selection_in_the_guest(arm_venv, arm_fake_driver, tmp_path, caps, driver, first):
    env = clean_env(LD_LIBRARY_PATH=str(arm_fake_driver), FAKE_CUDA_DEVICES=caps, FAKE_CUDA_DRIVER_VERSION=driver)
    got = _guest_json(arm_venv, DECIDE_LOAD, env, tmp_path)
    accepted = [c[0] for c in got["candidates"] if c[1]]
    assert accepted[0] == first, got["candidates"]
    if caps == "8.7":  # Jetson Orin is a Tegra GPU: sm80's SASS does not serve it (contract/targets.py, [tegra])
        assert not any(a.endswith("/sm80") for a in accepted), accepted
        sm80 = next(c for c in got["candidates"] if c[0].endswith("/sm80"))
        assert "Tegra" in sm80[3], sm80
    # The fake driver cannot serve cudart: each real aarch64 artifact is dlopened, create() fails cleanly.
    assert got["variant"] == "cpu" and got["code"] == "load-failed", got
    assert [a[1] for a in got["attempts"]][:-1] == ["load-failed"] * (len(accepted) - 1)


def test_doctor_json_in_the_guest_validates(arm_venv, arm_fake_driver, tmp_path):
    import jsonschema

    env = clean_env(LD_LIBRARY_PATH=str(arm_fake_driver), FAKE_CUDA_DEVICES="8.7")
    proc = subprocess.run(
        [str(arm_venv / "cuplug"), "doctor", "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    schema = json.loads(resources.files("cuplug").joinpath("schemas/doctor.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(doc)
    assert doc["devices"][0]["capability"] == "8.7"
    assert {p["cuda"] for p in doc["packages"]} == {"cuda12", "cuda13"}
    assert all("/venv/lib/python3.11/site-packages/" in p["path"] for p in doc["packages"])
    assert doc["loaded"]["ok"] and doc["loaded"]["variant"] == "cpu"


def _unpacked(wheel: Path, dest: Path) -> Path:
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(dest)
    return dest


@pytest.mark.reliability(
    case="backend wheel of the wrong CPU architecture",
    how="the aarch64 cuplug_cuda13 wheel's files on an x86_64 sys.path (and the reverse in the guest); "
    "once more with the manifest's arch field removed",
    expect="every artifact refused with artifact-corrupt naming both architectures, before any dlopen; CPU",
)
@pytest.mark.parametrize("manifest_arch", ["kept", "removed"])
def test_wrong_arch_artifact_refused_before_dlopen_on_x86_64(tmp_path, fake_driver_dir, manifest_arch):
    site = _unpacked(_wheel("cuplug_cuda13", WHEELS_AARCH64), tmp_path / "site")
    if manifest_arch == "removed":  # an older manifest: the ELF header alone must catch it
        mpath = site / "cuplug_cuda13" / "manifest.json"
        data = json.loads(mpath.read_text())
        for a in data["artifacts"]:
            del a["arch"]
        mpath.write_text(json.dumps(data))
    env = clean_env(PYTHONPATH=str(site), LD_LIBRARY_PATH=str(fake_driver_dir), FAKE_CUDA_DEVICES="9.0")
    got = run_json(DECIDE_LOAD, env)
    cuda13 = [a for a in got["attempts"] if a[0].startswith("cuda13/")]
    # artifact-corrupt, not load-failed: verify refused each file, dlopen never saw it.
    assert cuda13 and all(a[1] == "artifact-corrupt" for a in cuda13), got
    # The reason names both CPUs (from the manifest, or from the ELF header: e_machine 183 is AArch64).
    assert all("x86_64" in a[2] and ("aarch64" in a[2] or "183" in a[2]) for a in cuda13), cuda13
    assert got["variant"] == "cpu"


def test_wrong_arch_artifact_refused_in_the_guest(arm_venv, arm_fake_driver, tmp_path):
    x86 = os.environ.get("CUPLUG_TEST_WHEELS", "")
    if not x86:
        pytest.skip("needs the x86_64 wheels too")
    # One site holding the aarch64 cuplug and the x86_64 cuplug_cuda13: cuplug looks in its own site
    # directory first, so that is the backend package it finds (the venv's aarch64 one comes after).
    site = _unpacked(_wheel("cuplug", WHEELS_AARCH64), tmp_path / "site")
    _unpacked(_wheel("cuplug_cuda13", x86), site)
    env = clean_env(PYTHONPATH=str(site), LD_LIBRARY_PATH=str(arm_fake_driver), FAKE_CUDA_DEVICES="9.0")
    got = _guest_json(arm_venv, DECIDE_LOAD, env, tmp_path)
    refused = [a for a in got["attempts"] if a[1] == "artifact-corrupt"]
    assert refused and all(a[0].startswith("cuda13/") for a in refused), got
    assert all("x86_64" in a[2] and "aarch64" in a[2] for a in refused), refused
    assert got["variant"] == "cpu"
