"""Issue 18, class 3: every failure is a reason, never an exception.

Manifests of the wrong type, range, size or kind of file; an artifact another user
cannot read; drivers that fail or lie (fake_libcuda.c's FAKE_CUDA_* lies); the
operator's tools on hostile input. load() ends at the CPU with a code, the tools exit
with their documented codes, and nothing prints a traceback.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import struct
import subprocess
import tempfile
import time
import zipfile
from pathlib import Path

import pytest

from conftest import HERE, build_shared_library, clean_env, env_for, needs_wheels, run_cli, run_json, run_py
from test_reliability import DECIDE_LOAD, copy_site

rel = pytest.mark.reliability
PROBE = "import json, cuplug; print(json.dumps(cuplug.probe()))"
M13 = Path("cuplug_cuda13") / "manifest.json"


def _raw_edit(old: str, new: str):
    def edit(site: Path) -> None:
        path = site / M13
        text = path.read_text()
        assert old in text, old
        path.write_text(text.replace(old, new, 1))

    return edit


def _entry_edit(**changes):
    """Changes the cuda13 fatbin's entry (JSON text, so values like Infinity can be written)."""

    def edit(site: Path) -> None:
        doc = json.loads((site / M13).read_text())
        entry = next(a for a in doc["artifacts"] if a["variant"] == "fatbin")
        text = json.dumps(doc)
        old = json.dumps(entry)
        for key in changes:
            entry[key] = f"@@{key}@@"
        new = json.dumps(entry)
        for key, raw in changes.items():
            new = new.replace(f'"@@{key}@@"', raw)
        (site / M13).write_text(text.replace(old, new))

    return edit


def _whole(text: str | bytes):
    def edit(site: Path) -> None:
        (site / M13).write_bytes(text if isinstance(text, bytes) else text.encode())

    return edit


def _fifo(site: Path) -> None:
    (site / M13).unlink()
    os.mkfifo(site / M13)


def _dev_zero(site: Path) -> None:
    (site / M13).unlink()
    (site / M13).symlink_to("/dev/zero")


# (mutation, entry-level?, a needle of the reason)
MANIFEST_FAULTS = {
    "size-infinity": (_entry_edit(size="Infinity"), False, "Infinity"),
    "size-bool": (_entry_edit(size="true"), True, "size True"),
    "size-huge": (_entry_edit(size=str(2**70)), True, "size"),
    "sass-string": (_entry_edit(sass='"sm_9x"'), True, "sass 'sm_9x'"),
    "ptx-isa-list": (_entry_edit(ptx_isa='["9.0"]'), True, "ptx_isa"),
    "min-driver-string": (_entry_edit(min_driver='"13000"'), True, "min_driver"),
    "file-nul": (_entry_edit(file='"fatbin/lib\\u0000cuplug.so"'), True, "NUL"),
    "file-300-chars": (_entry_edit(file=json.dumps("a/" * 150)), True, "255"),
    "artifacts-null": (_raw_edit('"artifacts": [', '"artifacts": null, "x": ['), False, "artifacts None"),
    "deep-json": (_whole("[" * 100_000 + "]" * 100_000), False, "deeply"),
    "deep-object": (_whole('{"schema": 1, "artifacts": ' + "[" * 100_000 + "]" * 100_000 + "}"), False, "deeply"),
    "not-utf8": (_whole(b'{"schema": 1, "artifacts": [\xff]}'), False, "not valid JSON"),
    "two-mib": (_whole('{"schema": 1, "pad": "' + "x" * (2 << 20) + '", "artifacts": []}'), False, "more than"),
    "fifo": (_fifo, False, "not a regular file"),
    "dev-zero": (_dev_zero, False, "not a regular file"),
}


@rel(
    case="manifest fields of the wrong type or range, or a manifest that is not a file",
    how='in cuplug_cuda13/manifest.json: size Infinity/true/2^70, sass "sm_9x", ptx_isa a list, min_driver a '
    "string, a NUL or 300-char file, artifacts null, 100k-deep JSON, not UTF-8, 2 MiB; the manifest a FIFO or "
    "/dev/zero",
    expect="load() returns (CPU) without an exception or a hang; a bad entry is a rejected `cuda13/manifest` "
    "candidate (artifact-corrupt) naming the field and the other entries stay usable; a bad manifest rejects its "
    "package; cuda12 is still tried",
)
@needs_wheels
@pytest.mark.parametrize("fault", list(MANIFEST_FAULTS))
def test_bad_manifest_is_a_rejected_candidate(fault, site, fake_driver_dir, tmp_path):
    mutate, entry_level, needle = MANIFEST_FAULTS[fault]
    broken = copy_site(site, tmp_path)
    mutate(broken)
    t0 = time.monotonic()
    got = run_json(DECIDE_LOAD, env_for(broken, fake_driver_dir))
    assert time.monotonic() - t0 < 60
    bad = [c for c in got["candidates"] if c[0] == "cuda13/manifest"]
    assert bad and bad[0][1:3] == [False, "artifact-corrupt"], got["candidates"]
    assert any(needle in c[3] for c in bad), (needle, bad)
    labels = [c[0] for c in got["candidates"]]
    assert ("cuda13/ptx" in labels) == entry_level and "cuda13/fatbin" not in labels
    assert got["variant"] == "cpu" and got["sum"] == 0.0
    assert got["attempts"][0][0] == "cuda12/fatbin", got["attempts"][0]
    assert run_cli(["doctor"], env_for(broken, fake_driver_dir)).returncode == 0
    inspect = run_cli(["inspect", "cuda13"], env_for(broken, fake_driver_dir))
    assert inspect.returncode == 15 and "Traceback" not in inspect.stderr, inspect.stdout + inspect.stderr


@pytest.fixture
def shared_dir():
    """A directory other users can read (tmp_path's parents are 0700)."""
    d = Path(tempfile.mkdtemp(prefix="cuplug-hostile-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _as_nobody(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``code`` run as uid/gid 65534 by an interpreter that user may execute, seeing the installed cuplug."""
    import sys

    import cuplug

    installed = str(Path(cuplug.__file__).resolve().parent.parent)
    env = {**env, "HOME": "/tmp", "PYTHONPATH": os.pathsep.join(p for p in (env.get("PYTHONPATH"), installed) if p)}
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    for python in (sys.executable, "/usr/bin/python3"):
        if (
            subprocess.run([*nobody, python, "-c", "import cuplug"], env=env, capture_output=True, cwd="/").returncode
            == 0
        ):
            return subprocess.run(
                [*nobody, python, "-c", code], env=env, capture_output=True, text=True, timeout=120, cwd="/"
            )
    pytest.skip("no Python interpreter that uid 65534 may run sees the installed cuplug")


@rel(
    case="an artifact or a manifest this user cannot read",
    how="the site copied to a world-readable directory; cuda13's fatbin (or its manifest) mode 0600, owned by root; "
    "load() run as uid 65534 through `setpriv --reuid=65534 --regid=65534 --clear-groups`",
    expect="the fatbin: artifact-corrupt `cannot be read by this user`, the next candidate tried; the manifest: a "
    "rejected `cuda13/manifest` candidate; the CPU answers, no exception",
)
@needs_wheels
@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv")
@pytest.mark.parametrize("what", ["artifact", "manifest"])
def test_unreadable_files_as_another_user(what, site, fake_driver_dir, shared_dir):
    broken = shared_dir / "site"
    shutil.copytree(site, broken, symlinks=True)
    shutil.copy(fake_driver_dir / "libcuda.so.1", shared_dir / "libcuda.so.1")
    for p in [shared_dir, broken, *broken.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    target = broken / (
        "cuplug_cuda13/fatbin/libcuplug_vector.so" if what == "artifact" else "cuplug_cuda13/manifest.json"
    )
    target.chmod(0o600)
    proc = _as_nobody(DECIDE_LOAD, env_for(broken, shared_dir))
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.splitlines()[-1])
    assert got["variant"] == "cpu" and got["sum"] == 0.0
    if what == "artifact":
        assert got["attempts"][0][:2] == ["cuda13/fatbin", "artifact-corrupt"]
        assert "cannot be read by this user" in got["attempts"][0][2] and len(got["attempts"]) > 2
    else:
        bad = [c for c in got["candidates"] if c[0] == "cuda13/manifest"]
        assert bad and "Permission denied" in bad[0][3], got["candidates"]
        assert got["attempts"][0][0] == "cuda12/fatbin"


@pytest.fixture(scope="module")
def odd_drivers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """fake_libcuda.c without its UUID entry points, and without any CUDA entry point."""
    built = {}
    for kind, flag in (("no-uuid", "-DFAKE_NO_UUID"), ("no-symbols", "-DFAKE_NO_SYMBOLS")):
        out = tmp_path_factory.mktemp(kind)
        build_shared_library(HERE / "fake_cuda" / "fake_libcuda.c", out / "libcuda.so.1", "-ldl", flag)
        built[kind] = out
    return built


DRIVER_LIES = {
    # id: (env, build, expected probe code, needle in the reason)
    "version-call-fails": ({"FAKE_CUDA_VERSION_ERROR": "999"}, None, "driver-init-failed", "cuDriverGetVersion failed"),
    "error-names-not-utf8": (
        {"FAKE_CUDA_INIT_ERROR": "999", "FAKE_CUDA_ERROR_NAME": "\udcff\udcfe\x1b[2J bad"},
        None,
        "driver-init-failed",
        "\\xff\\xfe",
    ),
    "no-uuid-entry-points": ({}, "no-uuid", "ok", "1 device"),
    "no-entry-points-at-all": ({}, "no-symbols", "driver-init-failed", "lacks cuInit"),
    "2^31-1-devices": ({"FAKE_CUDA_COUNT": str(2**31 - 1)}, None, "driver-init-failed", "2147483647 devices"),
    "negative-device-count": ({"FAKE_CUDA_COUNT": "-5"}, None, "driver-init-failed", "-5 devices"),
}


@rel(
    case="a driver that fails or lies",
    how="fake driver: cuDriverGetVersion fails; error names not UTF-8 (with an escape sequence); no "
    "cuDeviceGetUuid*; no CUDA entry point at all; 2^31-1 or -5 devices",
    expect="a probe result with the failing step's code and reason (never an exception, never a loop over 2^31 "
    "devices: answered within seconds); load() ends at the CPU; doctor text shows non-UTF-8 and escape bytes escaped",
)
@pytest.mark.parametrize("lie", list(DRIVER_LIES))
def test_lying_driver_is_a_probe_result(lie, fake_driver_dir, odd_drivers, tmp_path):
    env_extra, build, code, needle = DRIVER_LIES[lie]
    driver_dir = odd_drivers[build] if build else fake_driver_dir
    env = clean_env(LD_LIBRARY_PATH=str(driver_dir), **env_extra)
    t0 = time.monotonic()
    got = run_json(PROBE, env)
    assert time.monotonic() - t0 < 30
    assert got["code"] == code and needle in got["reason"], got
    if lie == "no-uuid-entry-points":
        assert got["devices"][0]["uuid"] is None and got["devices"][0]["capability"] == "9.0"
        assert "lacks cuDeviceGetUuid" in got["devices"][0]["problem"]
    proc = run_py("import cuplug; b = cuplug.load(); print(b.variant, b.trace.decision_code)", env)
    assert proc.returncode == 0 and proc.stdout.split()[0] == "cpu", proc.stderr
    doctor = run_cli(["doctor"], env, cwd=tmp_path)
    assert doctor.returncode == 0 and "Traceback" not in doctor.stderr
    assert "\x1b" not in doctor.stdout and "\udcff" not in doctor.stdout


@rel(
    case="`cuplug probe --timeout` out of range",
    how="--timeout 0, -1, nan, inf, 1e9, abc, to probe, doctor and warmup",
    expect="refused by the argument parser: exit 2 with a message saying what is expected; no traceback",
)
@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "1e9", "abc"])
def test_probe_timeout_must_be_a_real_duration(value, tmp_path):
    for command in ("probe", "doctor", "warmup"):
        proc = run_cli([command, "--timeout", value], clean_env(), cwd=tmp_path)
        assert proc.returncode == 2 and "--timeout" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
        assert "expected seconds" in proc.stderr or "not a number" in proc.stderr


@rel(
    case="`cuplug doctor` with a driver stuck in cuInit",
    how="fake driver whose cuInit sleeps 60 s; `cuplug doctor --timeout 2`, text and --json",
    expect="exit 10 after about 2 s, naming the step that did not finish and what to check (as `cuplug probe`)",
)
@pytest.mark.parametrize("args", [[], ["--json"]], ids=["text", "json"])
def test_doctor_never_hangs_on_a_stuck_driver(args, fake_driver_dir, tmp_path):
    env = clean_env(LD_LIBRARY_PATH=str(fake_driver_dir), FAKE_CUDA_INIT_SLEEP_MS="60000")
    t0 = time.monotonic()
    proc = run_cli(["doctor", "--timeout", "2", *args], env, cwd=tmp_path)
    assert proc.returncode == 10 and time.monotonic() - t0 < 20, (proc.returncode, proc.stderr)
    assert "did not finish within 2 s" in proc.stderr and "nvidia-smi" in proc.stderr


def _wheel_with_huge_member(src: Path, dest: Path) -> None:
    """A copy of a backend wheel whose sm75 member's headers claim 3 GiB (the data stays small)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dest, "w", zipfile.ZIP_STORED) as zout:
        for item in zin.infolist():
            zout.writestr(item.filename, zin.read(item.filename), zipfile.ZIP_STORED)
    data = bytearray(dest.read_bytes())
    huge = 3 << 30
    for sig, size_off in ((b"PK\x01\x02", 24), (b"PK\x03\x04", 22)):  # central directory, local header
        pos = 0
        while (pos := data.find(sig, pos)) >= 0:
            name_off = 46 if sig == b"PK\x01\x02" else 30
            n = struct.unpack_from("<H", data, pos + (28 if sig == b"PK\x01\x02" else 26))[0]
            name = bytes(data[pos + name_off : pos + name_off + n])
            if name.endswith(b"sm75/libcuplug_vector.so"):
                struct.pack_into("<I", data, pos + size_off, huge)
            pos += 4
    dest.write_bytes(bytes(data))


def _hostile_elf(src: Path, dest: Path) -> None:
    """An ELF whose section 1 has sh_offset 2^64-1: pyelftools raises OverflowError, not ELFError."""
    data = bytearray(src.read_bytes())
    shoff = struct.unpack_from("<Q", data, 40)[0]
    struct.pack_into("<Q", data, shoff + 64 + 24, 2**64 - 1)
    dest.write_bytes(bytes(data))


@rel(
    case="`cuplug inspect` on hostile input",
    how="a wheel whose member's zip headers claim 3 GiB; an ELF whose section header makes pyelftools raise "
    "OverflowError; a directory whose manifest is not JSON, has artifacts null, or an entry without `file`",
    expect="exit 15 with the problem per artifact (the 3 GiB member is never read), exit 0 for none; no traceback",
)
@needs_wheels
@pytest.mark.parametrize("target", ["3gib-member", "hostile-elf", "bad-json", "artifacts-null", "entry-without-file"])
def test_inspect_on_hostile_input(target, site, cpu_lib_path, tmp_path):
    from conftest import WHEELS

    if target == "3gib-member":
        path = tmp_path / "cuplug_cuda13-0.1.0-py3-none-any.whl"
        _wheel_with_huge_member(next(Path(WHEELS).glob("cuplug_cuda13-*.whl")), path)
        needle = "claims 3221225472 bytes"
    elif target == "hostile-elf":
        path = tmp_path / "hostile.so"
        _hostile_elf(cpu_lib_path, path)
        needle = "OverflowError"
    else:
        path = tmp_path / "pkg"
        shutil.copytree(site / "cuplug_cuda13", path)
        doc = json.loads((path / "manifest.json").read_text())
        if target == "bad-json":
            (path / "manifest.json").write_text('{"schema": 1, "artifacts": [')
            needle = "unusable manifest"
        elif target == "artifacts-null":
            (path / "manifest.json").write_text(json.dumps({**doc, "artifacts": None}))
            needle = "unusable manifest"
        else:
            del doc["artifacts"][0]["file"]
            (path / "manifest.json").write_text(json.dumps(doc))
            needle = "not a relative path"
    t0 = time.monotonic()
    proc = run_cli(["inspect", str(path)], clean_env())
    assert time.monotonic() - t0 < 60
    assert proc.returncode == 15 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    assert needle in proc.stdout, proc.stdout
    js = run_cli(["inspect", "--json", str(path)], clean_env())
    assert js.returncode == 15 and not json.loads(js.stdout)["ok"]


def test_ping_that_is_not_json_is_load_failed(tmp_path):
    """The loader's own parse of the ping answer: anything but a JSON object is load-failed, never an exception."""
    code = (
        "import json, cuplug.runtime.library as l\n"
        "out = []\n"
        "for text in ['not json', '[1, 2]', '[' * 100000, 'NaN', '{\"variant\": \"x\"}']:\n"
        "    try:\n"
        "        out.append(sorted(l.parse_ping(text)))\n"
        "    except (ValueError, RecursionError) as e:\n"
        "        out.append(type(e).__name__)\n"
        "print(json.dumps(out))"
    )
    got = run_json(code, clean_env())
    assert got[:4] == ["JSONDecodeError", "ValueError", "RecursionError", "ValueError"] and got[4] == ["variant"], got


def test_stat_helper_refuses_non_regular_files(tmp_path):
    """read_bounded: a FIFO does not block, a device is not read, a directory is refused."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    code = (
        "import json, cuplug.contract.manifest as m\nout = []\n"
        f"for p in [{str(fifo)!r}, '/dev/zero', {str(tmp_path)!r}, '/nonexistent']:\n"
        "    try:\n        m.read_bounded(p, 100); out.append('read')\n"
        "    except m.ManifestError as e:\n        out.append(str(e).split(' ', 1)[1])\n"
        "print(json.dumps(out))"
    )
    got = run_json(code, clean_env())
    assert got == ["is not a regular file"] * 3 + ["is missing"], got
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
