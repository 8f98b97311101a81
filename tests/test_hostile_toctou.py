"""Issue 18, class 1: the bytes that were verified are the bytes that are mapped.

A planted library (its constructor writes a marker file) is renamed over the artifact,
or written over it in place as `cp` does, while other processes load in a loop. The
loader reads the artifact once into a sealed memfd, hashes those bytes and dlopens
/proc/self/fd/N: the planted constructor never runs, no load dies of SIGBUS, and a
read that met the planted bytes is artifact-corrupt.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import build_shared_library, clean_env, env_for, needs_wheels, run_json, run_py
from test_reliability import copy_site, edit_manifest

rel = pytest.mark.reliability
FATBIN13 = Path("cuplug_cuda13") / "fatbin" / "libcuplug_vector.so"
PLANTED_C = r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void planted(void) {
    const char* m = getenv("PLANT_MARKER");
    FILE* f = fopen(m ? m : "/tmp/cuplug-planted-ran", "a");
    if (f) { fputs("planted constructor ran\n", f); fclose(f); }
}
int cuplug_backend_abi_version(void) { return 1; }
"""

VICTIM = r"""
import json, sys, cuplug
exec(sys.argv[2] if len(sys.argv) > 2 else "")  # a test may swap in another verify (see test_the_race_detects)
counts = {"loads": 0, "corrupt": 0, "genuine": 0, "other": []}
for _ in range(int(sys.argv[1])):
    b = cuplug.load()
    first = b.trace.attempts[0]
    counts["loads"] += 1
    if first.code == "artifact-corrupt":
        counts["corrupt"] += 1
    elif first.code == "load-failed" and "cuplug_backend_create" in first.reason:
        counts["genuine"] += 1  # the genuine bytes were mapped; the fake driver cannot serve cudart
    else:
        counts["other"].append([first.code, first.reason[:200]])
    b.close()
print(json.dumps(counts))
"""

ATTACKER = r"""
import os, shutil, sys, time
target, genuine, planted, mode, stop = sys.argv[1:6]
g, p = open(genuine, "rb").read(), open(planted, "rb").read()
swaps = 0
while not os.path.exists(stop):
    for data in (p, g):
        if mode == "rename":
            tmp = target + ".tmp"
            with open(tmp, "wb") as f:
                f.write(data)
            os.rename(tmp, target)
        else:  # in place, as cp does: O_TRUNC, then write
            with open(target, "r+b") as f:
                f.truncate(0)
                f.write(data)
        swaps += 1
        time.sleep(0.001)  # leaves windows in which the genuine bytes are read whole, so both outcomes occur
print(swaps)
"""


def run_victims(env: dict[str, str], processes: int, loads: int, prelude: str = "") -> tuple[list, list[int]]:
    """``processes`` fresh processes, two at a time, each running load() ``loads`` times."""
    results, codes = [], []
    for _ in range(processes // 2):
        wave = [
            subprocess.Popen(
                [sys.executable, "-c", VICTIM, str(loads), prelude],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(2)
        ]
        for v in wave:
            results.append(v.communicate(timeout=240))
            codes.append(v.returncode)
    return results, codes


@pytest.fixture(scope="module")
def planted_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("planted") / "planted.c"
    src.write_text(PLANTED_C)
    return build_shared_library(src, src.with_suffix(".so"))


def _only_cuda13_fatbin(site: Path, tmp_path: Path) -> Path:
    """A site whose one CUDA artifact is cuda13/fatbin (each load() tries exactly it, then the CPU)."""
    broken = copy_site(site, tmp_path)
    shutil.rmtree(broken / "cuplug_cuda12")
    edit_manifest(
        broken / "cuplug_cuda13", lambda d: d.update(artifacts=[a for a in d["artifacts"] if a["variant"] == "fatbin"])
    )
    return broken


@rel(
    case="artifact swapped or rewritten while loads run (TOCTOU)",
    how="a planted library (constructor writes a marker) renamed over the cuda13 fatbin, or written over it in "
    "place as `cp` does, in a tight loop by another process, while 40 fresh processes (2 at a time) run load() "
    "25 times each",
    expect="0 planted constructors, 0 crashes (no SIGBUS/SIGSEGV); a read that met planted bytes is artifact-corrupt, "
    "the others map the genuine bytes; >= 1,000 loads per mode",
)
@needs_wheels
@pytest.mark.parametrize("mode", ["rename", "rewrite-in-place"])
def test_toctou_race_never_maps_planted_bytes(mode, site, fake_driver_dir, planted_lib, tmp_path, record_property):
    broken = _only_cuda13_fatbin(site, tmp_path)
    target = broken / FATBIN13
    genuine = tmp_path / "genuine.so"
    shutil.copy(target, genuine)
    marker, stop = tmp_path / "planted-ran", tmp_path / "stop"
    env = env_for(broken, fake_driver_dir, PLANT_MARKER=str(marker))
    attacker = subprocess.Popen(
        [sys.executable, "-c", ATTACKER, str(target), str(genuine), str(planted_lib), mode.split("-")[0], str(stop)],
        stdout=subprocess.PIPE,
        text=True,
    )
    t0 = time.monotonic()
    results, codes = run_victims(env, 40, 25)
    stop.touch()
    swaps = int(attacker.communicate(timeout=60)[0])
    seconds = time.monotonic() - t0
    assert codes == [0] * 40, (codes, [err[-2000:] for _, err in results if err])  # no signal, no exception
    counts = [json.loads(out) for out, _ in results]
    loads = sum(c["loads"] for c in counts)
    corrupt = sum(c["corrupt"] for c in counts)
    genuine_n = sum(c["genuine"] for c in counts)
    record_property("loads", loads)
    record_property("attacker_swaps", swaps)
    record_property("artifact_corrupt", corrupt)
    record_property("genuine_mapped", genuine_n)
    record_property("planted_constructors", 0 if not marker.exists() else len(marker.read_text().splitlines()))
    record_property("crashes", sum(1 for c in codes if c != 0))
    record_property("seconds", round(seconds, 1))
    assert not marker.exists(), marker.read_text()
    assert loads == 1000 and all(not c["other"] for c in counts), counts
    assert corrupt > 0 and genuine_n > 0, counts  # the race was really run: both outcomes were met
    assert swaps > 100


SEALED = r"""
import fcntl, json, os, cuplug
a, b = cuplug.load(), cuplug.load()
maps = open("/proc/self/maps").read()
fd_paths = {}
for fd in os.listdir("/proc/self/fd"):
    try:
        fd_paths[int(fd)] = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        pass
memfds = [fd for fd, p in fd_paths.items() if p.startswith("/memfd:cuplug:libcuplug_vector_cpu.so")]
seals = fcntl.fcntl(memfds[0], fcntl.F_GET_SEALS)
want = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL
try:
    os.write(memfds[0], b"x")
    writable = True
except OSError:
    writable = False
print(json.dumps({
    "path": str(a.path), "same_handle": a._core.lib.lib._handle == b._core.lib.lib._handle,
    "memfds": len(memfds), "sealed": seals & want == want, "writable": writable,
    "real_path_mapped": str(a.path) in maps, "memfd_mapped": "/memfd:cuplug:libcuplug_vector_cpu.so" in maps,
    "sum": a.run("sum", memoryview(bytearray(b"\0\0\x80?" * 3)).cast("f")),
}))
"""


@rel(
    case="what is mapped is the sealed copy, loaded once",
    how="cuplug.load() twice in one process; /proc/self/maps, /proc/self/fd and F_GET_SEALS inspected",
    expect="the CPU twin is mapped from one sealed memfd (write refused), never from its path; both loads share "
    "the linker's handle; Backend.path is the real file",
)
def test_mapping_is_one_sealed_memfd(cpu_lib_path):
    got = run_json(SEALED, clean_env())
    assert got["path"] == str(cpu_lib_path) and got["sum"] == 3.0
    assert got["memfd_mapped"] and not got["real_path_mapped"], got
    assert got["memfds"] == 1 and got["same_handle"] and got["sealed"] and not got["writable"], got


NO_PROC = r"""
import json, os, sys, cuplug, cuplug.runtime.verify as v
if sys.argv[1] == "no-proc":
    v.PROC_SELF_FD = "/nonexistent-proc/self/fd"
else:
    os.memfd_create = None  # as on a kernel or seccomp profile without memfd_create
b = cuplug.load()
maps = open("/proc/self/maps").read()
copies = [line.split()[-1] for line in maps.splitlines() if "cuplug-verified-" in line]
print(json.dumps({"variant": b.variant, "copies": sorted(set(copies)), "path": str(b.path),
                  "sum": b.run("sum", memoryview(bytearray(b"\0\0\x80?" * 2)).cast("f")),
                  "mode": oct(os.stat(copies[0]).st_mode & 0o777) if copies else None,
                  "dirmode": oct(os.stat(os.path.dirname(copies[0])).st_mode & 0o777) if copies else None}))
"""


@rel(
    case="/proc/self/fd unusable (not mounted), or no memfd_create",
    how="verify.PROC_SELF_FD pointed at a missing directory before load(); or os.memfd_create taken away",
    expect="the verified bytes are mapped from a private copy (file 0500 in a 0700 directory), removed at exit; "
    "never the original path",
)
@pytest.mark.parametrize("missing", ["no-proc", "no-memfd"])
def test_without_proc_a_private_copy_is_mapped(missing, cpu_lib_path):
    got = run_json(NO_PROC.replace("sys.argv[1]", repr(missing)), clean_env())
    assert got["variant"] == "cpu" and got["sum"] == 2.0 and got["path"] == str(cpu_lib_path)
    assert len(got["copies"]) == 1 and got["mode"] == "0o500" and got["dirmode"] == "0o700", got
    assert not os.path.exists(got["copies"][0])  # removed when the process ended


@needs_wheels
def test_artifact_deleted_or_rewritten_after_load_changes_nothing(site, fake_driver_dir, tmp_path):
    """Once mapped, the artifact's file can go: the mapping is the sealed copy (no SIGBUS on rewrite)."""
    broken = _only_cuda13_fatbin(site, tmp_path)
    code = textwrap.dedent(
        f"""
        import json, cuplug, cuplug.runtime.verify as v, cuplug.runtime.discovery as d
        art = next(p for p in d.discover().packages if p.artifacts).artifacts[0]
        image = v.verified(art)
        import cuplug.runtime.library as library
        lib = library.BackendLibrary(image.load_path)
        open({str(broken / FATBIN13)!r}, "r+b").truncate(10)   # what cp does first
        try:
            v.verified(art)
            again = "verified"
        except cuplug.ArtifactError as e:
            again = e.code
        print(json.dumps([lib.abi_version(), str(image.load_path).startswith("/proc/self/fd/"), again]))
        """
    )
    proc = run_py(code, env_for(broken, fake_driver_dir))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [2, True, "artifact-corrupt"]  # ABI v2


# The loader as it was before issue 18: hash the file by path, close it, dlopen the path again.
PATH_LOADER = """
import hashlib, os, cuplug.runtime.verify as v
def by_path(a):
    p = v.resolve_inside(a.package_dir, a.file)
    if hashlib.sha256(open(p, 'rb').read()).hexdigest() != a.sha256:
        raise v._corrupt(os.path.basename(p) + ': sha256 differs from the manifest (file altered)')
    return v.Verified(p, p, a.sha256, 'path')
v.verified = by_path
"""


@rel(
    case="control: the same race against the loader before issue 18",
    how="the race above with verify replaced by the old mechanism (hash the file by path, dlopen the path again), "
    "40 fresh processes of one load each (up to 5 rounds)",
    expect="caught: the planted constructor runs or a load dies of a signal (the test would notice a TOCTOU window)",
)
@needs_wheels
@pytest.mark.parametrize("mode", ["rename", "rewrite-in-place"])
def test_the_race_catches_a_loader_that_dlopens_the_path(
    mode, site, fake_driver_dir, planted_lib, tmp_path, record_property
):
    """The control: the same race against the old mechanism (verify by path, dlopen the path) is caught."""
    broken = _only_cuda13_fatbin(site, tmp_path)
    target = broken / FATBIN13
    genuine = tmp_path / "genuine.so"
    shutil.copy(target, genuine)
    marker, stop = tmp_path / "planted-ran", tmp_path / "stop"
    env = env_for(broken, fake_driver_dir, PLANT_MARKER=str(marker))
    attacker = subprocess.Popen(
        [sys.executable, "-c", ATTACKER, str(target), str(genuine), str(planted_lib), mode.split("-")[0], str(stop)],
        stdout=subprocess.PIPE,
        text=True,
    )
    caught = crashed = rounds = 0
    while rounds < 5 and not (caught or crashed):
        _, codes = run_victims(env, 40, 1, PATH_LOADER)
        rounds += 1
        crashed += sum(1 for c in codes if c < 0)
        caught = len(marker.read_text().splitlines()) if marker.exists() else 0
    stop.touch()
    attacker.communicate(timeout=60)
    record_property("old_loader_processes", 40 * rounds)
    record_property("planted_constructors", caught)
    record_property("crashes", crashed)
    assert caught or crashed, "the race never hit the old loader: the test would not notice a TOCTOU window"
