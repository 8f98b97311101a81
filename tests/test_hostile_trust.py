"""Issue 18, class 2: who may serve a backend.

Planted distributions (a dist-info with entry points, METADATA, RECORD, and files) try
to serve `vector`, to take a CPU twin, or to stand in for an installed package from
beside the script. Only packages the owner of the backend name declares as extras are
trusted; their files are found through their own dist-info and RECORD; nothing is
imported to decide; doctor says why each registration was not trusted.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import clean_env, env_for, needs_wheels, run_cli, run_json, run_py
from test_reliability import DECIDE_LOAD, FATBIN13, copy_site

rel = pytest.mark.reliability
MARKER_INIT = "open({marker!r}, 'a').write('imported\\n')\n"


def plant_distribution(
    site: Path,
    name: str,
    files: dict[str, bytes],
    entry_points: str = "",
    requires: tuple[str, ...] = (),
    version: str = "0.1.0",
) -> Path:
    """A dist-info for ``name`` in ``site`` with ``files`` (relative to site) recorded in its RECORD."""
    dist = name.replace("-", "_")
    info = site / f"{dist}-{version}.dist-info"
    info.mkdir(parents=True)
    for rel_path, data in files.items():
        (site / rel_path).parent.mkdir(parents=True, exist_ok=True)
        (site / rel_path).write_bytes(data)
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires
    )
    (info / "METADATA").write_text(meta + "\nA description.\n")
    if entry_points:
        (info / "entry_points.txt").write_text(entry_points)
    lines = []
    for rel_path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        lines.append(f"{rel_path},sha256={digest},{len(data)}")
    lines.append(f"{info.name}/RECORD,,")
    (info / "RECORD").write_text("\n".join(lines) + "\n")
    return info


def fatbin_package(site: Path, module: str, cuda: str = "cuda13", **changes: object) -> dict[str, bytes]:
    """A backend package ``module`` holding a copy of the real cuda13 fatbin, with a manifest that agrees."""
    data = (site / FATBIN13).read_bytes()
    manifest = json.loads((site / "cuplug_cuda13" / "manifest.json").read_text())
    entry = next(a for a in manifest["artifacts"] if a["variant"] == "fatbin")
    entry.update(changes)
    doc = {"schema": 1, "cuda": cuda, "artifacts": [entry]}
    return {
        f"{module}/__init__.py": b"",
        f"{module}/manifest.json": json.dumps(doc).encode(),
        f"{module}/{entry['file']}": data,
    }


def maps_has(code_tail: str = "") -> str:
    return DECIDE_LOAD.replace("print(", "maps = open('/proc/self/maps').read(); print(" + code_tail, 1)


@rel(
    case="an unrelated package registers in cuplug.backends and claims `vector`",
    how="planted distributions `zzz_unrelated` (cuda_version 99.0, min_driver 0) and `cuplug_cuda14` (an official-"
    "looking name), each a copy of the real fatbin with a manifest that agrees",
    expect="neither is a candidate nor mapped; doctor text and --json list each as not trusted, naming cuplug's "
    "extras as the rule; cuda13/fatbin is still tried first",
)
@needs_wheels
@pytest.mark.parametrize("dist", ["zzz_unrelated", "cuplug_cuda14"])
def test_unrelated_backend_package_is_not_trusted(dist, site, fake_driver_dir, tmp_path):
    planted = copy_site(site, tmp_path)
    plant_distribution(
        planted,
        dist,
        fatbin_package(site, dist, cuda_version="99.0", min_driver=0),
        entry_points=f"[cuplug.backends]\n{dist} = {dist}\n",
    )
    got = run_json(DECIDE_LOAD, env_for(planted, fake_driver_dir))
    assert got["attempts"][0][0] == "cuda13/fatbin" and "99.0" not in json.dumps(got), got["attempts"][0]
    assert len(got["candidates"]) == 9  # 8 trusted artifacts + cpu, nothing of the planted package
    doc = json.loads(run_cli(["doctor", "--json", "--no-load"], env_for(planted, fake_driver_dir)).stdout)
    (refused,) = [r for r in doc["refused"] if r["distribution"] == dist]
    assert "does not declare it as an extra" in refused["reason"] and refused["registration"].startswith(
        "cuplug.backends"
    )
    assert all(p["distribution"] in ("cuplug_cuda12", "cuplug_cuda13") for p in doc["packages"])
    text = run_cli(["doctor", "--no-load"], env_for(planted, fake_driver_dir)).stdout
    assert f"[backend-cuda] not trusted         : {dist}" in text


@rel(
    case="a package planted beside the running script",
    how="a folder `cuplug_cuda13/` (planted library + agreeing manifest) next to the script, and in a second run a "
    "`cuplug_cuda13-9.9.dist-info` as well, the script run from that directory",
    expect="the installed package (found through its dist-info on the search path) is used; the planted one is "
    "never read or mapped (sys.path[0] is not searched for distributions)",
)
@needs_wheels
@pytest.mark.parametrize("with_dist_info", [False, True], ids=["folder", "folder+dist-info"])
def test_package_beside_the_script_is_ignored(with_dist_info, site, fake_driver_dir, tmp_path):
    here = tmp_path / "app"
    here.mkdir()
    files = fatbin_package(site, "cuplug_cuda13", cuda_version="99.0", min_driver=0)
    if with_dist_info:
        plant_distribution(
            here, "cuplug_cuda13", files, "[cuplug.backends]\ncuplug_cuda13 = cuplug_cuda13\n", version="9.9"
        )
    else:
        for rel_path, data in files.items():
            (here / rel_path).parent.mkdir(parents=True, exist_ok=True)
            (here / rel_path).write_bytes(data)
    script = here / "app.py"
    script.write_text(maps_has(f"json.dumps({str(here)!r} in maps)); print("))
    proc = subprocess.run(
        [sys.executable, str(script)], env=env_for(site, fake_driver_dir), cwd=here, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    planted_mapped, result = proc.stdout.splitlines()
    assert planted_mapped == "false"
    assert "99.0" not in result and json.loads(result)["attempts"][0][0] == "cuda13/fatbin"
    doc = json.loads(
        subprocess.run(
            [sys.executable, "-m", "cuplug", "doctor", "--json", "--no-load"],
            env=env_for(site, fake_driver_dir),
            cwd=here,
            capture_output=True,
            text=True,
        ).stdout
    )
    assert all(str(here) not in p["path"] for p in doc["packages"]), doc["packages"]


def _twin_owner(site: Path, owner: str, backend: str, cpu_so: Path, value: str | None = None, **kw) -> Path:
    module = value or owner
    files = {
        f"{module.replace('.', '/')}/__init__.py": b"",
        f"{module.replace('.', '/')}/libcuplug_{backend}_cpu.so": cpu_so.read_bytes(),
    }
    files.update(kw.pop("extra_files", {}))
    return plant_distribution(site, owner, files, entry_points=f"[cuplug.cpu_backends]\n{backend} = {module}\n", **kw)


LOAD_NAMED = (
    "import json, cuplug\n"
    "try:\n"
    "    b = cuplug.load({name!r}); print(json.dumps(['ok', b.variant, str(b.path), b.run('sum', memoryview(bytearray(b'\\0\\0\\x80?' * 2)).cast('f'))]))\n"
    "except cuplug.CuplugError as e:\n"
    "    print(json.dumps(['error', type(e).__name__, getattr(e, 'code', None), str(e)]))\n"
)


@rel(
    case="CPU twins: another distribution claims a backend's name, or the twin is altered",
    how="`aaa_evil` registers `vector` in cuplug.cpu_backends; for an author's backend `scanx` owned by `scanxkit`, "
    "`aaa_evil` claims `scanx` too; `scanxkit`'s twin altered after install, or missing from its RECORD",
    expect="`vector` stays cuplug's (the claim is listed as not trusted); two claimants: neither trusted, "
    "BackendNotAvailable naming both, the planted twin's constructor never runs; an altered twin is "
    "artifact-corrupt (verified against the owner's RECORD like a CUDA artifact), never loaded",
)
@pytest.mark.parametrize("case", ["vector-claimed", "single-owner", "two-claimants", "altered", "not-in-record"])
def test_cpu_twin_belongs_to_the_owner(case, cpu_lib_path, tmp_path):
    from conftest import build_shared_library
    from test_hostile_toctou import PLANTED_C

    site = tmp_path / "site"
    site.mkdir()
    marker = tmp_path / "planted-ran"
    src = tmp_path / "planted.c"
    src.write_text(PLANTED_C)
    planted = build_shared_library(src, tmp_path / "planted.so")
    env = clean_env(PYTHONPATH=str(site), PLANT_MARKER=str(marker))
    if case == "vector-claimed":
        _twin_owner(site, "aaa_evil", "vector", planted)
        got = run_json(LOAD_NAMED.format(name="vector"), env)
        assert got[0] == "ok" and got[2] == str(cpu_lib_path) and got[3] == 2.0, got
        doc = json.loads(run_cli(["doctor", "--json", "--no-load"], env).stdout)
        assert [r["distribution"] for r in doc["refused"]] == ["aaa_evil"] and "cuplug's own" in doc["refused"][0][
            "reason"
        ]
        assert doc["cpu_backend"]["path"] == str(cpu_lib_path)
    else:
        _twin_owner(site, "scanxkit", "scanx", cpu_lib_path)
        if case == "two-claimants":
            _twin_owner(site, "aaa_evil", "scanx", planted)
        if case == "altered":
            so = site / "scanxkit" / "libcuplug_scanx_cpu.so"
            data = bytearray(so.read_bytes())
            data[len(data) // 2] ^= 1
            so.write_bytes(bytes(data))
        if case == "not-in-record":
            record = next(site.glob("scanxkit-*.dist-info")) / "RECORD"
            record.write_text("".join(line + "\n" for line in record.read_text().splitlines() if ".so," not in line))
        got = run_json(LOAD_NAMED.format(name="scanx"), env)
        if case == "single-owner":
            assert got[0] == "ok" and got[1] == "cpu" and got[2] == str(site / "scanxkit" / "libcuplug_scanx_cpu.so")
        elif case == "two-claimants":
            assert got[:2] == ["error", "BackendNotAvailable"] and "aaa_evil" in got[3] and "scanxkit" in got[3], got
            doc = json.loads(run_cli(["doctor", "--json", "--no-load", "--backend", "scanx"], env).stdout)
            assert sorted(r["distribution"] for r in doc["refused"]) == ["aaa_evil", "scanxkit"]
        elif case == "altered":
            assert got[:3] == ["error", "BackendNotAvailable", "artifact-corrupt"] and "sha256" in got[3], got
        else:
            assert got[:2] == ["error", "BackendNotAvailable"] and "RECORD does not list" in got[3], got
    assert not marker.exists()


@rel(
    case="entry-point values that are not a plain module",
    how="cuplug_cuda12's `cuplug.backends` value set to `evilparent.sub` (evilparent/__init__.py writes a marker "
    "when imported), `.rel`, `missing_pkg.sub` or `a:b`; explain(), load() and doctor run",
    expect="nothing is imported (the marker stays absent); the package is a rejected `cuda12/manifest` candidate "
    "(artifact-corrupt) with the reason; cuda13 is used; no exception",
)
@needs_wheels
@pytest.mark.parametrize("value", ["evilparent.sub", ".rel", "missing_pkg.sub", "a:b"])
def test_entry_point_values_are_never_imported(value, site, fake_driver_dir, tmp_path):
    planted = copy_site(site, tmp_path)
    marker = tmp_path / "imported"
    (planted / "evilparent" / "sub").mkdir(parents=True)
    (planted / "evilparent" / "__init__.py").write_text(MARKER_INIT.format(marker=str(marker)))
    (planted / "evilparent" / "sub" / "__init__.py").write_text("")
    eps = next(planted.glob("cuplug_cuda12-*.dist-info")) / "entry_points.txt"
    eps.write_text(f"[cuplug.backends]\ncuplug_cuda12 = {value}\n")
    env = env_for(planted, fake_driver_dir)
    got = run_json(DECIDE_LOAD, env)
    broken = [c for c in got["candidates"] if c[0] == "cuda12/manifest"]
    assert broken and broken[0][1:3] == [False, "artifact-corrupt"], got["candidates"]
    assert got["attempts"][0][0] == "cuda13/fatbin"
    assert run_py("import cuplug; cuplug.explain(); print(cuplug.explain())", env).returncode == 0
    assert run_cli(["doctor"], env).returncode == 0
    assert not marker.exists()


@needs_wheels
def test_doctor_json_with_refused_packages_matches_the_schema(site, fake_driver_dir, tmp_path):
    from importlib import resources

    import jsonschema

    schema = json.loads(resources.files("cuplug").joinpath("schemas/doctor.schema.json").read_text())
    planted = copy_site(site, tmp_path)
    plant_distribution(
        planted, "zzz_unrelated", fatbin_package(site, "zzz_unrelated"), "[cuplug.backends]\nzzz = zzz_unrelated\n"
    )
    shutil.rmtree(planted / "cuplug_cuda12")
    doc = json.loads(run_cli(["doctor", "--json"], env_for(planted, fake_driver_dir)).stdout)
    jsonschema.validate(doc, schema, cls=jsonschema.Draft202012Validator)
    assert doc["refused"] and doc["cpu_backend"]["path"]


@needs_wheels
def test_a_bundle_installed_beside_its_script_finds_its_backends(tmp_path, fake_driver_dir):
    """cuplug and its extras installed with `pip install --target` into the script's own directory (a bundle):
    sys.path[0] is then where cuplug runs from, so its backends there are trusted and found."""
    from conftest import WHEELS

    app = tmp_path / "bundle"
    wheels = [str(p) for p in Path(WHEELS).glob("cuplug*.whl")]
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", str(app), *wheels],
        check=True,
    )
    (app / "app.py").write_text(DECIDE_LOAD.replace("print(", "print(json.dumps(cuplug.__file__)); print(", 1))
    env = clean_env(LD_LIBRARY_PATH=str(fake_driver_dir))
    proc = subprocess.run(
        [sys.executable, "-S", str(app / "app.py")], env=env, cwd=tmp_path, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    where, result = proc.stdout.splitlines()
    assert json.loads(where).startswith(str(app))
    got = json.loads(result)
    assert got["attempts"][0][0] == "cuda13/fatbin" and got["variant"] == "cpu", got["attempts"]


def _without_record_lines(dist_info: Path, keep) -> None:
    record = dist_info / "RECORD"
    record.write_text("".join(line + "\n" for line in record.read_text().splitlines() if keep(line)))


@needs_wheels
def test_a_backend_manifest_its_record_does_not_list_is_not_used(site, fake_driver_dir, tmp_path):
    """A package's files are the ones its installer recorded: a manifest.json lying in a trusted package's
    directory that its RECORD does not list (dropped there afterwards) is not read; the package is a rejected
    `cuda13/manifest` candidate saying so, and cuda12 serves."""
    planted = copy_site(site, tmp_path)
    _without_record_lines(
        next(planted.glob("cuplug_cuda13-*.dist-info")),
        lambda line: not line.startswith("cuplug_cuda13/manifest.json,"),
    )
    got = run_json(DECIDE_LOAD, env_for(planted, fake_driver_dir))
    broken = [c for c in got["candidates"] if c[0] == "cuda13/manifest"]
    assert broken and broken[0][1:3] == [False, "artifact-corrupt"], got["candidates"]
    assert "RECORD does not list cuplug_cuda13/manifest.json" in broken[0][3], broken
    assert not [c for c in got["candidates"] if c[0].startswith("cuda13/") and c[0] != "cuda13/manifest"]
    assert got["attempts"][0][0] == "cuda12/fatbin", got["attempts"]


@needs_wheels
@pytest.mark.parametrize("target", ["outside", "the site itself"])
def test_a_package_directory_that_resolves_outside_its_site_is_not_used(target, site, fake_driver_dir, tmp_path):
    """A trusted package's directory (site/cuplug_cuda13) replaced by a symlink to a directory outside the site,
    or to the site itself (its manifest.json planted at the site's top), is not read: a rejected
    `cuda13/manifest` candidate naming where it resolves to; nothing of it is tried."""
    planted = copy_site(site, tmp_path)
    pkg = planted / "cuplug_cuda13"
    if target == "outside":
        elsewhere = tmp_path / "elsewhere" / "cuplug_cuda13"
        elsewhere.parent.mkdir()
        shutil.move(pkg, elsewhere)
        pkg.symlink_to(elsewhere, target_is_directory=True)
        resolved = elsewhere
    else:
        shutil.copy(pkg / "manifest.json", planted / "manifest.json")
        for sub in ("fatbin", "ptx", "sm75", "sm80", "sm90"):
            if (pkg / sub).is_dir():
                shutil.copytree(pkg / sub, planted / sub)
        shutil.rmtree(pkg)
        pkg.symlink_to(planted, target_is_directory=True)
        resolved = planted
    got = run_json(DECIDE_LOAD, env_for(planted, fake_driver_dir))
    broken = [c for c in got["candidates"] if c[0] == "cuda13/manifest"]
    assert broken and broken[0][1:3] == [False, "artifact-corrupt"], got["candidates"]
    assert f"resolves to {resolved}, outside {planted}" in broken[0][3], broken
    assert not [c for c in got["candidates"] if c[0].startswith("cuda13/") and c[0] != "cuda13/manifest"]
    assert got["attempts"][0][0] == "cuda12/fatbin", got["attempts"]


@pytest.mark.parametrize("missing", ["size", "sha256", "both"])
def test_a_cpu_twin_needs_both_its_sha256_and_its_size_in_the_record(missing, cpu_lib_path, tmp_path):
    """The CPU twin is verified against the sha256 and the size its owner's RECORD holds: a RECORD line with
    either one missing leaves nothing to verify it against, so it is never loaded (BackendNotAvailable saying
    so), whichever one is missing."""
    site = tmp_path / "site"
    site.mkdir()
    info = _twin_owner(site, "scanxkit", "scanx", cpu_lib_path)
    record = info / "RECORD"
    lines = []
    for line in record.read_text().splitlines():
        if line.startswith("scanxkit/libcuplug_scanx_cpu.so,"):
            path, digest, size = line.split(",")
            line = ",".join([path, "" if missing != "size" else digest, "" if missing != "sha256" else size])
        lines.append(line)
    record.write_text("\n".join(lines) + "\n")
    got = run_json(LOAD_NAMED.format(name="scanx"), clean_env(PYTHONPATH=str(site)))
    assert got[:2] == ["error", "BackendNotAvailable"], got
    assert "RECORD has no sha256 and size for scanxkit/libcuplug_scanx_cpu.so" in got[3], got
