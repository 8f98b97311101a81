"""`cuplug doctor --json` against its JSON Schema, `cuplug inspect` against cuobjdump, `cuplug warmup`.

All in subprocesses on the real built artifacts; the fake driver stands in for the GPU.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import zipfile
from importlib import resources
from pathlib import Path

import pytest

from conftest import ROOT, WHEELS, clean_env, env_for, needs_wheels, run_cli

BUILT = sorted((ROOT / "build" / "backends").glob("cuda1*/*/libcuplug_vector.so"))


@pytest.fixture(scope="module")
def doctor_schema() -> dict:
    return json.loads(resources.files("cuplug").joinpath("schemas/doctor.schema.json").read_text())


def _validate(doc: dict, schema: dict) -> None:
    import jsonschema

    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(doc, schema, cls=jsonschema.Draft202012Validator)


@pytest.mark.parametrize("scenario", ["no-driver", "fake-9.0", "fake-old-driver", "disabled", "no-load", "forced"])
@needs_wheels
def test_doctor_json_matches_its_schema(scenario, site, fake_driver_dir, doctor_schema):
    env = {
        "no-driver": env_for(site),
        "fake-9.0": env_for(site, fake_driver_dir),
        "fake-old-driver": env_for(site, fake_driver_dir, FAKE_CUDA_DRIVER_VERSION="12040"),
        "disabled": env_for(site, fake_driver_dir, CUPLUG_DISABLE_CUDA="1"),
        "no-load": env_for(site, fake_driver_dir),
        "forced": env_for(site, fake_driver_dir, CUPLUG_BACKEND="sm80"),
    }
    args = ["doctor", "--json", *(["--no-load"] if scenario == "no-load" else [])]
    proc = run_cli(args, env[scenario])
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    _validate(doc, doctor_schema)
    assert ("loaded" in doc) == (scenario != "no-load")
    if scenario == "fake-9.0":  # the fall-through shows each step, in order, ending at the CPU
        attempts = doc["loaded"]["attempts"]
        assert attempts[0]["variant"] == "fatbin" and attempts[-1] == {
            "variant": "cpu",
            "cuda": None,
            "code": "ok",
            "reason": "loaded",
        }


def test_schema_rejects_a_wrong_document(doctor_schema):
    import jsonschema

    bad = {
        "schema": "cuplug.doctor/1",
        "driver": {"found": True, "path": None, "version": 13000},
        "devices": [{"index": 0, "name": "x", "capability": "9", "memory_bytes": 1}],
        "candidates": [],
        "decision": {"backend": "vector", "variant": "cpu", "code": "fine", "reason": ""},
    }
    errors = list(jsonschema.Draft202012Validator(doctor_schema).iter_errors(bad))
    assert len(errors) >= 3, errors  # capability pattern, empty candidates, unknown code


def _cuobjdump_facts(so: Path) -> dict:
    from cuplug.kit import toolchain

    tc = toolchain.install(so.parent.parent.name, lambda _msg: None)  # cached by build_backends
    listing = subprocess.run(
        [str(tc.cuobjdump), "--list-elf", "--list-ptx", str(so)], capture_output=True, text=True, check=True
    ).stdout
    sass = re.findall(r"^ELF file\s+\d+: .*\.(sm_\d+)\.cubin$", listing, re.M)
    ptx = [f"compute_{a}" for a in re.findall(r"^PTX file\s+\d+: .*\.sm_(\d+)\.ptx$", listing, re.M)]
    isa = None
    if ptx:
        text = subprocess.run([str(tc.cuobjdump), "-ptx", str(so)], capture_output=True, text=True).stdout
        isa = re.search(r"^\s*\.version\s+(\d+\.\d+)", text, re.M).group(1)
    return {"sass": sorted(sass, key=lambda t: int(t[3:])), "ptx": ptx, "ptx_isa": isa}


@pytest.mark.skipif(not BUILT, reason="needs build/backends from `nox -s build_backends`")
@pytest.mark.parametrize("so", BUILT, ids=[f"{p.parent.parent.name}-{p.parent.name}" for p in BUILT])
def test_inspect_agrees_with_cuobjdump(so):
    proc = run_cli(["inspect", "--json", str(so)], clean_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (finding,) = json.loads(proc.stdout)["artifacts"]
    assert finding["found"] == {**_cuobjdump_facts(so), "lto": []}  # no LTO-IR (tests/test_lto.py has a variant with)
    assert finding["expected"] == finding["found"]  # the manifest beside it agrees too


@needs_wheels
@pytest.mark.parametrize("target", ["wheel", "installed", "all-installed"])
def test_inspect_wheels_and_installed_packages(target, site):
    wheel = next(Path(WHEELS).glob("cuplug_cuda12-*.whl"))
    args = {"wheel": [str(wheel)], "installed": ["cuda13"], "all-installed": []}[target]
    proc = run_cli(["inspect", "--json", *args], env_for(site))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["ok"] and len(doc["artifacts"]) == (8 if target == "all-installed" else 4)


@needs_wheels
def test_inspect_reports_a_lying_manifest(site, tmp_path):
    pkg = tmp_path / "cuplug_cuda13"
    shutil.copytree(site / "cuplug_cuda13", pkg)
    m = json.loads((pkg / "manifest.json").read_text())
    for a in m["artifacts"]:
        if a["variant"] == "sm80":
            a["sass"] = ["sm_86"]
    (pkg / "manifest.json").write_text(json.dumps(m))
    proc = run_cli(["inspect", str(pkg)], clean_env())
    assert proc.returncode == 15, proc.stdout
    assert "sass: file has ['sm_80'], manifest says ['sm_86']" in proc.stdout


@needs_wheels
def test_inspect_reports_a_swapped_file_in_a_wheel(tmp_path):
    src = next(Path(WHEELS).glob("cuplug_cuda13-*.whl"))
    dest = tmp_path / src.name
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dest, "w") as zout:
        for item in zin.infolist():
            name = item.filename
            data = zin.read(name if not name.endswith("sm75/libcuplug_vector.so") else name.replace("sm75", "sm80"))
            zout.writestr(item, data)
    proc = run_cli(["inspect", "--json", str(dest)], clean_env())
    assert proc.returncode == 15
    bad = [f for f in json.loads(proc.stdout)["artifacts"] if not f["ok"]]
    assert [f["variant"] for f in bad] == ["sm75"]


def test_inspect_usage_errors(tmp_path):
    assert run_cli(["inspect", str(tmp_path / "missing.so")], clean_env()).returncode == 2
    assert run_cli(["inspect", str(tmp_path)], clean_env()).returncode == 2  # no manifest.json
    plain = tmp_path / "plain.so"
    plain.write_bytes(b"not an elf at all")
    proc = run_cli(["inspect", str(plain)], clean_env())
    assert proc.returncode == 15 and "unreadable device code" in proc.stdout


def test_warmup_without_gpu_says_so(tmp_path):
    proc = run_cli(["warmup"], clean_env(CUDA_CACHE_PATH=str(tmp_path / "cache")))
    assert proc.returncode == 10 and "no GPU to compile for" in proc.stdout


@needs_wheels
def test_warmup_with_a_driver_that_cannot_serve(site, fake_driver_dir, tmp_path):
    proc = run_cli(["warmup", "--json"], env_for(site, fake_driver_dir, CUDA_CACHE_PATH=str(tmp_path / "c")))
    doc = json.loads(proc.stdout)
    assert proc.returncode == 16 and [r["label"] for r in doc["results"]] == ["cuda13/ptx", "cuda12/ptx"]
    assert all("CUPLUG_REQUIRE_CUDA" in r["error"] for r in doc["results"])


@pytest.mark.reliability(
    case="PTX newer than the driver can JIT",
    how="fake driver reporting CUDA 12.2: cuda12's PTX ISA 8.4 needs 12.4",
    expect="the ptx artifacts rejected at selection (no dlopen, no JIT attempt); `cuplug warmup` exit 14 says why",
)
@needs_wheels
def test_warmup_with_ptx_too_new_for_the_driver(site, fake_driver_dir, tmp_path):
    # CUDA 12.2 driver: cuda13 needs 13.0, cuda12's PTX ISA 8.4 needs 12.4: nothing to JIT.
    proc = run_cli(["warmup"], env_for(site, fake_driver_dir, FAKE_CUDA_DRIVER_VERSION="12020"))
    assert proc.returncode == 14 and "no usable PTX variant" in proc.stdout, proc.stdout


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"CUDA_CACHE_DISABLE": "1"}, "CUDA_CACHE_DISABLE is set"),
        ({"CUDA_CACHE_PATH": "/proc/cuplug-ro"}, "not writable"),
    ],
)
def test_warmup_names_a_cache_that_cannot_keep_anything(env, needle):
    from cuplug.tools import warmup

    assert needle in (warmup.cache_problem(env) or "")


def test_warmup_cache_is_usable_by_default(tmp_path):
    from cuplug.tools import warmup

    assert warmup.cache_problem({"CUDA_CACHE_PATH": str(tmp_path / "new" / "dir")}) is None
    assert warmup.cache_dir({}) == Path.home() / ".nv" / "ComputeCache"


@pytest.mark.parametrize("command", ["probe", "doctor", "inspect", "warmup"])
def test_help_explains_and_fits_80_columns(command):
    proc = run_cli([command, "--help"], clean_env(COLUMNS="80"))
    assert proc.returncode == 0
    long_lines = [line for line in proc.stdout.splitlines() if len(line) > 80]
    assert not long_lines, long_lines
    if command != "doctor":
        assert "exit codes" in proc.stdout


def test_cmake_dir_points_at_the_installed_cmake_module():
    proc = run_cli(["--cmake-dir"], clean_env())
    d = Path(proc.stdout.strip())
    assert proc.returncode == 0 and (d / "cuplugConfig.cmake").is_file() and (d / "cuplug.cmake").is_file()
    assert "site-packages" in str(d) and (d.parent / "include" / "cuplug" / "backend.h").is_file()
