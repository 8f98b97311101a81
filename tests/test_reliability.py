"""Faults, bad input and hostile files (issue 9): each case a distinct, stated outcome.

Every test here carries a ``reliability`` mark whose case/how/expect become a row
of docs/reliability.md (ci/reliability_table.py reads them back from the JUnit XML).
The loader runs in subprocesses against the real installed artifacts and the fake
driver; a planted file gets a manifest entry that matches its bytes, so the fault
is met where it would be in the field (at dlopen, not at verification).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import HERE, ROOT, build_shared_library, clean_env, env_for, needs_wheels, run_cli, run_json, run_py

DECIDE_LOAD = (
    "import json, cuplug; b = cuplug.load(); t = b.trace; r = b.run('sum', memoryview(bytearray(16))"
    ".cast('f')); print(json.dumps({'variant': b.variant, 'code': t.decision_code, 'sum': r, "
    "'attempts': [[f'{a.cuda}/{a.variant}', a.code, a.reason] for a in t.attempts], "
    "'candidates': [[c.label, c.accepted, c.code, c.reason] for c in t.candidates]}))"
)
FATBIN13 = Path("cuplug_cuda13") / "fatbin" / "libcuplug_vector.so"
rel = pytest.mark.reliability


# ---- helpers ----------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def odd_backends(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """tests/fake_backends/odd_backend.c built three ways (see its header)."""
    out = tmp_path_factory.mktemp("odd")
    kinds = {
        "abi99": ["-DODD_ABI_VERSION=99"],
        "create-null": ["-DODD_CREATE_NULL"],
        "missing-symbols": ["-DODD_MISSING_SYMBOLS"],
    }
    built = {}
    for kind, flags in kinds.items():
        built[kind] = build_shared_library(
            HERE / "fake_backends" / "odd_backend.c",
            out / f"{kind}.so",
            "-fvisibility=hidden",
            *flags,
            f"-I{ROOT / 'backends' / 'include'}",
        )
    return built


def copy_site(site: Path, tmp_path: Path) -> Path:
    broken = tmp_path / "site"
    shutil.copytree(site, broken, symlinks=True)
    return broken


def edit_manifest(package: Path, edit) -> None:
    path = package / "manifest.json"
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))


def plant(site: Path, rel_file: Path, data: bytes) -> None:
    """Replaces an artifact with `data` and makes the manifest agree with it (size, sha256)."""
    (site / rel_file).write_bytes(data)
    name = str(Path(*rel_file.parts[1:]))

    def agree(doc):
        for a in doc["artifacts"]:
            if a["file"] == name:
                a["size"], a["sha256"] = len(data), hashlib.sha256(data).hexdigest()

    edit_manifest(site / rel_file.parts[0], agree)


def outcome(site: Path, fake_driver_dir: Path, **env: str) -> dict:
    return run_json(DECIDE_LOAD, env_for(site, fake_driver_dir, **env))


def attempt_codes(got: dict) -> dict[str, str]:
    return {label: code for label, code, _ in got["attempts"]}


def assert_refused_then_required(site: Path, fake_driver_dir: Path, code: str) -> None:
    """With CUPLUG_REQUIRE_CUDA=1 the same fault is an error naming the code (the CPU fallback is refused)."""
    proc = run_py("import cuplug; cuplug.load()", env_for(site, fake_driver_dir, CUPLUG_REQUIRE_CUDA="1"))
    assert proc.returncode == 1 and "BackendNotAvailable" in proc.stderr, proc.stderr
    assert "CUPLUG_REQUIRE_CUDA=1" in proc.stderr


# ---- driver and device --------------------------------------------------------------------------------


@rel(
    case="two GPUs of different capability",
    how="fake driver with devices 9.0 and 7.5; CUPLUG_DEVICE=0 and =1",
    expect="each device gets its own best artifact: cuda13/fatbin on 9.0, cuda13/sm75 on 7.5",
)
@needs_wheels
def test_two_gpus_of_different_capability_choose_per_device(site, fake_driver_dir):
    code = "import json, cuplug; print(json.dumps([cuplug.decide(device=i).candidates[0].label for i in (0, 1)]))"
    assert run_json(code, env_for(site, fake_driver_dir, FAKE_CUDA_DEVICES="9.0,7.5")) == [
        "cuda13/fatbin",
        "cuda13/sm75",
    ]
    got = outcome(site, fake_driver_dir, FAKE_CUDA_DEVICES="9.0,7.5", CUPLUG_DEVICE="1")
    assert got["attempts"][0][0] == "cuda13/sm75"


@rel(
    case="capability below 7.5",
    how="fake driver with one CC 7.0 device, both extras installed",
    expect="capability-too-low for every artifact, CPU fallback, `cuplug probe` exit 12",
)
@needs_wheels
def test_capability_below_minimum(site, fake_driver_dir, tmp_path):
    got = outcome(site, fake_driver_dir, FAKE_CUDA_DEVICES="7.0")
    assert got["code"] == "capability-too-low" and got["variant"] == "cpu" and got["sum"] == 0.0
    # explain() alone (nothing loaded) names the CPU as the decision, with the same code.
    code = "import json, cuplug; t = cuplug.explain(); print(json.dumps([t.decision.label, t.decision_code]))"
    assert run_json(code, env_for(site, fake_driver_dir, FAKE_CUDA_DEVICES="7.0")) == ["cpu", "capability-too-low"]
    assert {c[2] for c in got["candidates"] if c[0] != "cpu"} == {"capability-too-low"}
    env = env_for(site, fake_driver_dir, FAKE_CUDA_DEVICES="7.0")
    assert run_cli(["probe"], env, cwd=tmp_path).returncode == 12


@rel(
    case="zero devices",
    how="fake driver whose device list is empty",
    expect="no-device, CPU fallback, `cuplug probe` exit 11",
)
@needs_wheels
def test_zero_devices(site, fake_driver_dir, tmp_path):
    got = outcome(site, fake_driver_dir, FAKE_CUDA_DEVICES="")
    assert got["code"] == "no-device" and got["variant"] == "cpu"
    assert run_cli(["probe"], env_for(site, fake_driver_dir, FAKE_CUDA_DEVICES=""), cwd=tmp_path).returncode == 11


@rel(
    case="CUDA_VISIBLE_DEVICES names a UUID",
    how="fake driver with 9.0 and 8.6; the 8.6 card's UUID",
    expect="the driver's renumbering is used as is: device 0 is the 8.6 card; cuda13/fatbin chosen for "
    "its exact sm_86 SASS",
)
@needs_wheels
def test_visible_devices_uuid_selects_that_card(site, fake_driver_dir):
    uuid = "GPU-abababab-abab-abab-abab-abababab" + "ab01"
    code = (
        "import json, cuplug; d = cuplug.decide(); c = d.candidates[0]; "
        "print(json.dumps([len(d.probe.devices), d.probe.devices[0].capability, c.label, c.reason]))"
    )
    env = env_for(site, fake_driver_dir, FAKE_CUDA_DEVICES="9.0,8.6", CUDA_VISIBLE_DEVICES=uuid)
    count, capability, label, reason = run_json(code, env)
    assert (count, capability, label) == (1, [8, 6], "cuda13/fatbin") and "sm_86" in reason, reason


@rel(
    case="JIT cache disabled or read-only",
    how="CUDA_CACHE_DISABLE=1, or CUDA_CACHE_PATH under /proc",
    expect="the decision is unchanged; `cuplug warmup` reports that nothing can be cached",
)
@needs_wheels
@pytest.mark.parametrize(
    "env", [{"CUDA_CACHE_DISABLE": "1"}, {"CUDA_CACHE_PATH": "/proc/cuplug-cache"}], ids=["disabled", "read-only"]
)
def test_jit_cache_that_keeps_nothing(site, fake_driver_dir, env):
    assert outcome(site, fake_driver_dir, **env)["candidates"] == outcome(site, fake_driver_dir)["candidates"]
    report = json.loads(run_cli(["warmup", "--json"], env_for(site, fake_driver_dir, **env)).stdout)
    assert report["cache_problem"] and "compiles the PTX again" in report["cache_problem"], report


@rel(
    case="driver hangs",
    how="fake driver whose cuInit sleeps 60 s; `cuplug probe --timeout 2`",
    expect="exit 10 after about 2 s, naming the step that did not finish and what to check",
)
def test_probe_never_hangs_on_a_stuck_driver(fake_driver_dir, tmp_path):
    env = clean_env(LD_LIBRARY_PATH=str(fake_driver_dir), FAKE_CUDA_INIT_SLEEP_MS="60000")
    t0 = time.monotonic()
    proc = run_cli(["probe", "--timeout", "2"], env, cwd=tmp_path)
    assert proc.returncode == 10 and time.monotonic() - t0 < 20
    assert "did not finish within 2 s" in proc.stderr and "nvidia-smi" in proc.stderr, proc.stderr


# ---- hostile or broken artifacts ------------------------------------------------------------------------


def _truncate(site, odd):
    so = site / FATBIN13
    so.write_bytes(so.read_bytes()[:4096])


def _flip(site, odd):
    so = site / FATBIN13
    data = bytearray(so.read_bytes())
    data[len(data) // 2] ^= 0x01
    so.write_bytes(bytes(data))


def _elf32(site, odd):
    data = bytearray((site / FATBIN13).read_bytes())
    data[4] = 1  # EI_CLASS: ELFCLASS32
    plant(site, FATBIN13, bytes(data))


def _missing_file(site, odd):
    (site / FATBIN13).unlink()


def _abi99(site, odd):
    plant(site, FATBIN13, odd["abi99"].read_bytes())


def _missing_symbols(site, odd):
    plant(site, FATBIN13, odd["missing-symbols"].read_bytes())


def _create_null(site, odd):
    plant(site, FATBIN13, odd["create-null"].read_bytes())


ARTIFACT_FAULTS = {
    "truncated": (_truncate, "artifact-corrupt", "size", "cut to 4096 bytes, manifest unchanged"),
    "byte-flipped": (_flip, "artifact-corrupt", "sha256", "one bit of the middle byte flipped"),
    "wrong-elf-class": (_elf32, "artifact-corrupt", "64-bit", "EI_CLASS set to 32-bit, manifest made to agree"),
    "file-missing": (_missing_file, "artifact-corrupt", "does not exist", "the manifest names a deleted file"),
    "abi-differs": (_abi99, "abi-mismatch", "ABI v99", "a library reporting ABI v99, manifest made to agree"),
    "symbols-missing": (
        _missing_symbols,
        "load-failed",
        "lacks ABI symbols",
        "a library exporting only cuplug_backend_abi_version",
    ),
    "create-returns-null": (
        _create_null,
        "load-failed",
        "create refused on purpose",
        "a library whose create() returns NULL with a reason",
    ),
}


@rel(
    case="hostile or broken artifact",
    how="the cuda13 fatbin replaced (see id); fake driver with CC 9.0",
    expect="that artifact refused with its code and reason, the process alive, the next candidate tried, "
    "the CPU answering; with CUPLUG_REQUIRE_CUDA=1 an error instead",
)
@needs_wheels
@pytest.mark.parametrize("fault", list(ARTIFACT_FAULTS))
def test_broken_artifact_is_refused_with_its_code(fault, site, fake_driver_dir, odd_backends, tmp_path):
    mutate, code, needle, _ = ARTIFACT_FAULTS[fault]
    broken = copy_site(site, tmp_path)
    mutate(broken, odd_backends)
    got = outcome(broken, fake_driver_dir)
    label, first_code, reason = got["attempts"][0]
    assert (label, first_code) == ("cuda13/fatbin", code) and needle in reason, got["attempts"][0]
    assert got["code"] == code  # the best candidate's failure is the decision's reason
    assert got["variant"] == "cpu" and got["sum"] == 0.0
    assert len(got["attempts"]) > 2  # it went on: cuda12/fatbin and the rest were tried
    assert_refused_then_required(broken, fake_driver_dir, code)


@rel(
    case="manifest missing or of an unknown schema",
    how="cuplug_cuda13/manifest.json deleted, or its schema set to 99",
    expect="the package shown as a rejected `manifest` candidate (artifact-corrupt), cuda12 still used; "
    "with both packages broken the decision is artifact-corrupt, probe exit 15",
)
@needs_wheels
@pytest.mark.parametrize("how", ["missing", "schema-99"])
def test_unusable_manifest(how, site, fake_driver_dir, tmp_path):
    broken = copy_site(site, tmp_path)
    for package in ("cuplug_cuda13", "cuplug_cuda12"):
        if how == "missing":
            (broken / package / "manifest.json").unlink()
        else:
            edit_manifest(broken / package, lambda doc: doc.update(schema=99))
        got = outcome(broken, fake_driver_dir)
        assert ["cuda13/manifest", False, "artifact-corrupt"] == got["candidates"][-2][:3], got["candidates"]
        assert "manifest" in got["candidates"][-2][3]
        if package == "cuplug_cuda13":
            assert not any(c[0].startswith("cuda13/") and c[0] != "cuda13/manifest" for c in got["candidates"])
            assert got["attempts"][0][0] == "cuda12/fatbin"
    assert got["code"] == "artifact-corrupt" and got["variant"] == "cpu"
    assert run_cli(["probe"], env_for(broken, fake_driver_dir), cwd=tmp_path).returncode == 15


# ---- path safety ----------------------------------------------------------------------------------------


def _dotdot(site):
    edit_manifest(
        site / "cuplug_cuda13", lambda d: d["artifacts"][0].update(file="../cuplug_cuda12/fatbin/libcuplug_vector.so")
    )


def _absolute(site):
    target = str((site / "cuplug_cuda12" / "fatbin" / "libcuplug_vector.so").resolve())
    edit_manifest(site / "cuplug_cuda13", lambda d: d["artifacts"][0].update(file=target))


def _symlink_out(site):
    outside = site.parent / "outside.so"
    first = json.loads((site / "cuplug_cuda13" / "manifest.json").read_text())["artifacts"][0]["file"]
    so = site / "cuplug_cuda13" / first
    shutil.copy(so, outside)
    so.unlink()
    so.symlink_to(outside)


@rel(
    case="manifest `file` pointing outside its package",
    how="`../` in the path, an absolute path, or a symlink out",
    expect="artifact-corrupt before any open of that file; the next candidate tried",
)
@needs_wheels
@pytest.mark.parametrize("escape", [_dotdot, _absolute, _symlink_out], ids=["dotdot", "absolute", "symlink"])
def test_manifest_cannot_point_outside_its_package(escape, site, fake_driver_dir, tmp_path):
    broken = copy_site(site, tmp_path)
    escape(broken)
    got = outcome(broken, fake_driver_dir)
    bad = [a for a in got["attempts"] if a[1] == "artifact-corrupt"]
    assert (
        len(bad) == 1
        and bad[0][0].startswith("cuda13/")
        and ("inside the package" in bad[0][2] or "outside" in bad[0][2])
    ), got["attempts"]
    assert got["variant"] == "cpu" and len(got["attempts"]) > 2


@rel(
    case="a libcuplug_vector.so planted in the working directory, LD_LIBRARY_PATH and beside the script",
    how="the real cuda13 fatbin copied into one directory that is all three",
    expect="never mapped into the process (checked in /proc/self/maps); the installed files are used",
)
@needs_wheels
def test_planted_library_everywhere_is_ignored(site, fake_driver_dir, tmp_path):
    plant_dir = tmp_path / "plant"
    plant_dir.mkdir()
    shutil.copy(site / FATBIN13, plant_dir / "libcuplug_vector.so")
    script = plant_dir / "app.py"
    script.write_text(
        DECIDE_LOAD.replace(
            "print(",
            "print(json.dumps(str(__import__('pathlib').Path("
            "__file__).parent) in open('/proc/self/maps').read())); print(",
            1,
        )
    )
    env = env_for(site, fake_driver_dir)
    env["LD_LIBRARY_PATH"] = f"{plant_dir}:{fake_driver_dir}"
    proc = subprocess.run([sys.executable, str(script)], env=env, cwd=plant_dir, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == "false"


# ---- process faults -------------------------------------------------------------------------------------

FORK = """
import json, os, cuplug
b = cuplug.load()
{prepare}
pid = os.fork()
if pid == 0:
    try:
        r = b.run("sum", memoryview(bytearray(b"\\0\\0\\x80?" * 4)).cast("f"))
        msg = ["ran", r]
    except cuplug.CuplugError as e:
        msg = ["error", type(e).__name__, str(e)]
    b.close()  # never touches the parent's context
    fresh = cuplug.load()
    msg.append(fresh.run("sum", memoryview(bytearray(b"\\0\\0\\x80?" * 2)).cast("f")))
    os.write(1, (json.dumps(msg) + "\\n").encode())
    os._exit(0)
_, status = os.waitpid(pid, 0)
print(json.dumps([os.waitstatus_to_exitcode(status), b.run("sum", memoryview(bytearray(b"\\0\\0\\x80?" * 3)).cast("f"))]))
"""


@rel(
    case="fork() after load",
    how="cuplug.load(), os.fork(), the child uses the parent's backend, then loads anew",
    expect="CPU backend: works in the child; a CUDA backend: BackendError naming fork (no hang); "
    "a fresh load in the child works; the parent is unaffected",
)
@pytest.mark.parametrize("kind", ["cpu", "cuda-marked"])
def test_fork_after_load(kind):
    # A CUDA backend is simulated by marking the CPU instance as one: the guard is in the Python layer.
    prepare = "b.cuda = b._core.cuda = 'cuda13'" if kind == "cuda-marked" else ""
    proc = run_py(FORK.format(prepare=prepare), clean_env(), timeout=60)
    assert proc.returncode == 0, proc.stderr
    child, parent = (json.loads(line) for line in proc.stdout.strip().splitlines())
    if kind == "cpu":
        assert child == ["ran", 4.0, 2.0]
    else:
        assert child[:2] == ["error", "BackendError"] and "fork" in child[2] and child[3] == 2.0, child
    assert parent == [0, 3.0]


INTERRUPT = """
import array, signal, sys, time, cuplug
signal.signal(signal.SIGINT, signal.default_int_handler)  # a shell's background job starts with SIGINT ignored
b = cuplug.load()
x = array.array("f", [1.0]) * (1 << 25)
print("ready", flush=True)
try:
    while True:
        b.run("sum", x)
except KeyboardInterrupt:
    pass
print("interrupted", b.run("sum", array.array("f", [1.0, 2.0])), flush=True)
"""


@rel(
    case="Ctrl-C during a long run",
    how="SIGINT sent while run('sum') loops over 2^25 elements",
    expect="KeyboardInterrupt at the end of the current call; the same backend then gives right results",
)
def test_ctrl_c_leaves_the_backend_usable():
    proc = subprocess.Popen(
        [sys.executable, "-c", INTERRUPT], env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.strip() == "interrupted 3.0"


# The C ABI's fuzz test lives with the v2 ABI tests: tests/test_cpu_abi_v2.py::test_c_abi_fuzz.
