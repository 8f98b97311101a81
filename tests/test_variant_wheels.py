"""Variant wheels (PEP 825): made from the manifest, gated, read by the loader, chosen by uv, ignored by pip.

`nox -s tests` builds them (`_variant_wheels`: the matrix packaging/variant-wheels.json, one build
directory per CUDA major) into CUPLUG_TEST_VARIANT_WHEELS: per major the all-variant wheel, one
variant wheel per dedicated SASS variant (sm75, sm80, sm90; each with the ptx variant), the null
variant (ptx) and ``cuplug_cudaNN-0.1.0-variants.json``.

uv is steered without a GPU through the override variables of the NVIDIA provider that uv 0.13.8
vendors (NV_VARIANT_PROVIDER_FORCE_SM_ARCH, NV_VARIANT_PROVIDER_FORCE_CUDA_DRIVER_VERSION); no
provider plugin is installed or stubbed. The index is an http.server on 127.0.0.1 inside the test,
stopped by the fixture and, failing that, by a timer.
"""

from __future__ import annotations

import hashlib
import html
import http.server
import json
import os
import re
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import pytest

from conftest import WHEELS, clean_env

VARIANT_WHEELS = os.environ.get("CUPLUG_TEST_VARIANT_WHEELS", "")
DEPS = os.environ.get("CUPLUG_TEST_DEPS", "")
needs_variant_wheels = pytest.mark.skipif(
    not (VARIANT_WHEELS and WHEELS), reason="needs the variant wheels (nox -s tests builds them)"
)
MAJORS = ("cuda12", "cuda13")
LABELS = ("null", "sm75", "sm80", "sm90")
# PEP 825: {distribution}-{version}(-{build tag})?-{python tag}-{abi tag}-{platform tag}(-{variant label})?.whl
PEP825_NAME = re.compile(
    r"^(?P<name>[^\s-]+?)-(?P<ver>[^\s-]+?)(-(?P<build>\d[^-]*))?-(?P<py>[^\s\d-][^\s-]*)-(?P<abi>[^\s-]+)"
    r"-(?P<plat>[^\s-]+)(-(?P<label>[0-9a-z_.]+))?\.whl$"
)


def _variant_set(major: str) -> dict[str | None, Path]:
    found: dict[str | None, Path] = {}
    for w in Path(VARIANT_WHEELS).glob(f"cuplug_{major}-*.whl"):
        m = PEP825_NAME.match(w.name)
        assert m, w.name
        found[m.group("label")] = w
    return found


def _read(wheel: Path, suffix: str) -> dict:
    with zipfile.ZipFile(wheel) as zf:
        (name,) = [n for n in zf.namelist() if n.endswith(suffix) and n.count("/") == 1]
        return json.loads(zf.read(name))


# --- made from the manifest (no wheels needed) ---


def _art(variant: str, sass: list[str], ptx: list[str], min_driver: int):
    from cuplug.contract.manifest import Artifact

    return Artifact(
        "vector", variant, f"{variant}/lib.so", "0" * 64, 64, tuple(sass), tuple(ptx), None, "12.4", min_driver, 2
    )


def test_properties_and_plan_come_from_the_manifest():
    from cuplug.kit import variants

    arts = [
        _art("fatbin", ["sm_75", "sm_80", "sm_90"], ["compute_90"], 12000),
        _art("ptx", [], ["compute_75"], 12040),
        _art("sm75", ["sm_75"], [], 12000),
        _art("sm90", ["sm_90"], [], 12000),
    ]
    planned = {p.label: [a.variant for a in p.artifacts] for p in variants.plan(arts)}
    assert planned == {"sm75": ["sm75", "ptx"], "sm90": ["sm90", "ptx"], "null": ["ptx"]}
    assert variants.properties_of([arts[3], arts[1]]) == {
        "nvidia": {"cuda_version_lower_bound": ["12.4"], "sm_arch": ["75_virtual", "90_real"]}
    }
    assert variants.properties_of([_art("a", ["sm_90a"], [], 13000)]) == {
        "nvidia": {"cuda_version_lower_bound": ["13.0"], "sm_arch": ["90a_real"]}
    }
    with pytest.raises(variants.VariantError, match="no dedicated SASS"):
        variants.plan([arts[0], arts[1]])
    # an LTO variant (SASS of its device link, LTO-IR for any later GPU) rides along like PTX and defines no wheel
    lto = _art("lto", ["sm_75"], [], 12000)._replace(lto=("lto_75",))
    planned = {p.label: [a.variant for a in p.artifacts] for p in variants.plan([*arts, lto])}
    assert planned == {"sm75": ["sm75", "ptx", "lto"], "sm90": ["sm90", "ptx", "lto"], "null": ["ptx", "lto"]}
    assert variants.properties_of([arts[3], arts[1], lto]) == variants.properties_of([arts[3], arts[1]])
    with pytest.raises(variants.VariantError, match="no dedicated SASS"):
        variants.plan([lto])


@pytest.mark.parametrize(
    ("name", "base", "label"),
    [
        ("a-1-py3-none-any.whl", "a-1-py3-none-any.whl", None),
        ("a-1-py3-none-any-sm90.whl", "a-1-py3-none-any.whl", "sm90"),
        ("a-1-2-py3-none-any.whl", "a-1-2-py3-none-any.whl", None),  # a build tag starts with a digit
        ("a-1-2-py3-none-any-null.whl", "a-1-2-py3-none-any.whl", "null"),
    ],
)
def test_split_label_follows_pep825_grammar(name, base, label):
    from cuplug.kit import variants
    from cuplug.kit.gate import wheel_tags

    assert variants.split_label(name) == (base, label)
    assert wheel_tags(name) == ("py3", "none", ["any"])


# --- variant_check: what doctor can say (synthetic dist-infos, no wheels needed) ---


def _dist_info(site: Path, label: str | None, sass: list[str], ptx: list[str], bound: str = "13.0") -> Path:
    di = site / "cuplug_cuda13-0.1.0.dist-info"
    pkg = site / "cuplug_cuda13"
    di.mkdir(parents=True)
    pkg.mkdir()
    (di / "entry_points.txt").write_text("[cuplug.backends]\ncuplug_cuda13 = cuplug_cuda13\n")
    arts = [{"variant": "x", "sass": sass, "ptx": ptx, "min_driver": int(float(bound) * 1000)}]
    (pkg / "manifest.json").write_text(json.dumps({"schema": 1, "artifacts": arts}))
    if label is not None:
        sm = [f"{s[3:]}_real" for s in sass] + [f"{p[8:]}_virtual" for p in ptx]
        props = {} if label == "null" else {"nvidia": {"cuda_version_lower_bound": [bound], "sm_arch": sorted(sm)}}
        (di / "variant.json").write_text(json.dumps({"variants": {label: props}}))
    return di


@pytest.mark.parametrize(
    ("label", "sass", "ptx", "cc", "driver", "code", "words"),
    [
        ("sm90", ["sm_90"], ["compute_75"], (9, 0), 13000, "fits", "exact SASS sm_90"),
        ("sm80", ["sm_80"], ["compute_75"], (8, 6), 13000, "fits", "same-major SASS sm_80"),
        # the environment copied from an A100 to an H200: the installer's choice no longer fits
        ("sm80", ["sm_80"], ["compute_75"], (9, 0), 13000, "fallthrough", "PTX compute_75"),
        ("sm90", ["sm_90"], [], (8, 0), 13000, "no-fit", "CPU"),
        ("sm90", ["sm_90"], ["compute_75"], (9, 0), 12080, "no-fit", "needs a driver for CUDA >= 13.0"),
        ("null", [], ["compute_75"], (12, 0), 13000, "fits", "no variant wheel matched"),
        (None, [], [], (9, 0), 13000, "plain", "all-variant wheel"),
        ("sm90", ["sm_90"], ["compute_75"], None, None, "no-device", "no CUDA device"),
    ],
)
def test_variant_check_says_what_is_installed_and_whether_it_fits(tmp_path, label, sass, ptx, cc, driver, code, words):
    from cuplug.tools import variant_check

    di = _dist_info(tmp_path, label, sass, ptx)
    status = variant_check.check(di, cc, driver)
    assert status.code == code and status.label == label, status
    assert words.lower() in status.reason.lower(), status.reason
    assert status.distribution == "cuplug_cuda13" and status.version == "0.1.0"
    if code in ("fallthrough", "no-fit"):
        assert "reinstall" in status.reason and status.fallthrough


def test_variant_check_never_raises(tmp_path):
    from cuplug.runtime import driver
    from cuplug.tools import variant_check

    di = _dist_info(tmp_path, "sm90", ["sm_90"], [])
    (di / "variant.json").write_text("{not json")
    assert variant_check.check(di, (9, 0), 13000).code == "unreadable"
    probe = driver.ProbeResult("ok", "", True, None, 13000, (driver.Device(0, "H200", (9, 0), 1, "GPU-x"),))
    rows = variant_check.report(probe, paths=[str(tmp_path)])
    assert [r["code"] for r in rows] == ["unreadable"]
    assert variant_check.report(probe, paths=[str(tmp_path)], packages=[tmp_path / "other"]) == []
    assert len(variant_check.report(None, paths=[str(tmp_path)], packages=[tmp_path / "cuplug_cuda13"])) == 1
    assert variant_check.report(driver.ProbeResult("no-driver", "x"), paths=[str(tmp_path / "nothing")]) == []
    assert variant_check.format_report(rows)[0].startswith("variant wheel cuplug_cuda13: all-variant unreadable")


# --- the built set ---


@needs_variant_wheels
@pytest.mark.parametrize("major", MAJORS)
def test_variant_set_passes_the_gate_and_pep825(major):
    from cuplug.kit import variants

    found = _variant_set(major)
    assert sorted(found, key=str) == sorted([None, *LABELS], key=str), sorted(found, key=str)
    for label, w in found.items():
        assert "-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64" in w.name, w.name
        if label is None:
            assert not [n for n in zipfile.ZipFile(w).namelist() if n.endswith("variant.json")]
            continue
        doc = _read(w, ".dist-info/variant.json")
        assert variants.validate(doc, label) == [], doc
        assert list(doc["variants"]) == [label]
    proc = subprocess.run(
        [sys.executable, "-m", "cuplug.kit", "check", *map(str, found.values())], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    index = json.loads((Path(VARIANT_WHEELS) / f"cuplug_{major}-0.1.0-variants.json").read_text())
    assert variants.validate(index) == []
    assert index["variants"] == {
        label: _read(w, ".dist-info/variant.json")["variants"][label] for label, w in found.items() if label
    }
    # What each wheel holds: its own cubin and the PTX fall-through; null the PTX alone.
    for label, w in found.items():
        held = sorted(a["variant"] for a in _read(w, "/manifest.json")["artifacts"])
        if label is None:
            assert held == ["fatbin", "ptx", "sm75", "sm80", "sm90"]
        else:
            assert held == (["ptx"] if label == "null" else sorted([label, "ptx"]))
            assert w.stat().st_size < found[None].stat().st_size / 2


@needs_variant_wheels
@pytest.mark.parametrize("major", MAJORS)
def test_variantlib_reads_and_merges_them_as_we_do(major):
    """variantlib 0.2.2 (WheelNext's reference library) parses every variant.json with the label of its file
    name and merges them into the same index (its schema URL is its own; the content is compared)."""
    from variantlib.variant_dist_info import VariantDistInfo
    from variantlib.variants_json import VariantsJson

    merged = None
    for label, w in _variant_set(major).items():
        if label is None:
            continue
        with zipfile.ZipFile(w) as zf:
            (name,) = [n for n in zf.namelist() if n.endswith(".dist-info/variant.json")]
            info = VariantDistInfo(zf.read(name), label)
        assert info.variant_label == label
        if merged is None:
            merged = info
        else:
            merged.merge(info)
    assert merged is not None
    ours = VariantsJson(json.loads((Path(VARIANT_WHEELS) / f"cuplug_{major}-0.1.0-variants.json").read_text()))
    theirs, mine = json.loads(merged.to_str()), json.loads(ours.to_str())
    assert theirs == mine


@needs_variant_wheels
@pytest.mark.parametrize("major", MAJORS)
def test_variant_properties_agree_with_cuplug_inspect(major):
    """The properties of every variant wheel = what `cuplug inspect` reads from its files (SASS -> XX_real,
    PTX -> XX_virtual), with the driver bound from its manifest; and every file matches the manifest."""
    for label, w in _variant_set(major).items():
        if label is None:
            continue
        proc = subprocess.run(
            [sys.executable, "-m", "cuplug", "inspect", str(w), "--json"], capture_output=True, text=True
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        found = json.loads(proc.stdout)["artifacts"]
        assert found and all(f["ok"] for f in found), found
        props = _read(w, ".dist-info/variant.json")["variants"][label]
        if label == "null":
            assert props == {} and {f["variant"] for f in found} == {"ptx"}
            continue
        sm = {f"{s[3:]}_real" for f in found for s in f["found"]["sass"]}
        sm |= {f"{p[8:]}_virtual" for f in found for p in f["found"]["ptx"]}
        assert sorted(sm) == props["nvidia"]["sm_arch"], (label, sm, props)
        need = max(a["min_driver"] for a in _read(w, "/manifest.json")["artifacts"])
        assert props["nvidia"]["cuda_version_lower_bound"] == [f"{need // 1000}.{need % 1000 // 10}"]


@needs_variant_wheels
def test_gate_refuses_a_variant_wheel_whose_properties_lie(tmp_path):
    from cuplug.kit.gate import check_wheel

    src = _variant_set("cuda13")["sm80"]
    dest = tmp_path / src.name.replace("-sm80.whl", "-sm90.whl")
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dest, "w") as zout:
        for item in zin.infolist():
            zout.writestr(item, zin.read(item))
    problems = check_wheel(dest)
    assert any("exactly the file name's label 'sm90'" in p for p in problems), problems


@needs_variant_wheels
@pytest.mark.parametrize("change", ["member altered", "member added", "member removed"])
def test_gate_refuses_a_variant_wheel_whose_record_is_not_its_files(tmp_path, change):
    """A variant wheel's RECORD is rewritten after its label and variant.json are added: the gate compares it
    with the files, so a member altered, added or dropped after that (RECORD untouched) fails the check; an
    installer would otherwise write files whose digests nobody vouched for."""
    from cuplug.kit.gate import check_wheel

    src = _variant_set("cuda13")["sm80"]
    dest = tmp_path / src.name
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dest, "w") as zout:
        for item in zin.infolist():
            data = zin.read(item)
            if item.filename.endswith(".dist-info/METADATA"):
                if change == "member removed":
                    continue
                if change == "member altered":
                    data += b"\nA line added after the build.\n"
            zout.writestr(item, data)
        if change == "member added":
            zout.writestr("cuplug_cuda13/planted.txt", b"not in RECORD")
    assert check_wheel(src) == []
    problems = check_wheel(dest)
    assert [p for p in problems if "RECORD does not list exactly the files of the wheel" in p], problems


# --- installed: the loader treats a variant wheel like any backend wheel ---


def _venv(where: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
    return where / "bin"


def _uv() -> str:
    uv = pytest.importorskip("uv", reason="uv==0.13.8 is a test dependency (noxfile TEST_DEPS)")
    return str(uv.find_uv_bin())


def _uv_env(tmp: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in clean_env().items() if not k.startswith(("UV_", "NV_VARIANT_", "PIP_", "VIRTUAL_ENV"))}
    return {**env, "UV_CACHE_DIR": str(tmp / "uv-cache"), "UV_NO_CONFIG": "1", "UV_PYTHON_DOWNLOADS": "never", **extra}


def _main_wheel() -> Path:
    (w,) = sorted(Path(WHEELS).glob("cuplug-0.1.0-*.whl"))
    return w


def _installed_label(bindir: Path, dist: str) -> str | None:
    site = next((bindir.parent / "lib").glob("python3*/site-packages"))
    (di,) = site.glob(f"{dist}-*.dist-info")
    return (
        next(iter(json.loads((di / "variant.json").read_text())["variants"]))
        if (di / "variant.json").exists()
        else None
    )


def _doctor(bindir: Path, cwd: Path, env: dict[str, str]) -> dict:
    proc = subprocess.run(
        [str(bindir / "cuplug"), "doctor", "--json", "--no-load"], capture_output=True, text=True, cwd=cwd, env=env
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@needs_variant_wheels
def test_installed_variant_wheel_is_what_the_loader_selects_from(tmp_path, fake_driver_dir):
    bindir = _venv(tmp_path / "venv")
    sm90 = _variant_set("cuda13")["sm90"]
    deps = sorted(Path(DEPS).glob("pyelftools-*.whl")) if DEPS else []
    # Installed as on an H200 (uv's NVIDIA provider forced to CC 9.0, driver 13.0).
    h200 = _uv_env(
        tmp_path, NV_VARIANT_PROVIDER_FORCE_SM_ARCH="9.0", NV_VARIANT_PROVIDER_FORCE_CUDA_DRIVER_VERSION="13.0"
    )
    proc = subprocess.run(
        [_uv(), "pip", "install", "--python", str(bindir / "python"), "--preview-features", "wheel-variants",
         "--offline", "--no-index", str(_main_wheel()), str(sm90), *map(str, deps)],
        capture_output=True, text=True, env=h200,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert _installed_label(bindir, "cuplug_cuda13") == "sm90"
    # uv checks a local variant wheel against the machine too: without a (forced) sm_90 it refuses it.
    refused = subprocess.run(
        [_uv(), "pip", "install", "--python", str(bindir / "python"), "--preview-features", "wheel-variants",
         "--offline", "--no-index", "--reinstall", str(sm90)],
        capture_output=True, text=True, env=_uv_env(tmp_path),
    )  # fmt: skip
    assert refused.returncode != 0 and "unsupported wheel variants" in refused.stderr, refused.stderr
    gpu = clean_env(LD_LIBRARY_PATH=str(fake_driver_dir), FAKE_CUDA_DEVICES="9.0", FAKE_CUDA_DRIVER_VERSION="13000")
    doc = _doctor(bindir, tmp_path, gpu)
    cands = {c["variant"]: c for c in doc["candidates"] if c["variant"] != "cpu"}
    assert set(cands) == {"sm90", "ptx"}, cands  # exactly what the variant wheel holds
    assert doc["decision"]["variant"] == "sm90" and doc["decision"]["code"] == "ok", doc["decision"]
    assert "exact SASS sm_90" in doc["decision"]["reason"]
    # The same environment on an A100-class device: the PTX fall-through, and variant_check says why.
    moved = {**gpu, "FAKE_CUDA_DEVICES": "8.0"}
    doc = _doctor(bindir, tmp_path, moved)
    assert doc["decision"]["variant"] == "ptx", doc["decision"]
    code = (
        "import json, cuplug, cuplug.tools.variant_check as v; from cuplug.runtime.driver import probe;"
        "print(json.dumps(v.report(probe())))"
    )
    proc = subprocess.run([str(bindir / "python"), "-c", code], capture_output=True, text=True, cwd=tmp_path, env=moved)
    assert proc.returncode == 0, proc.stderr
    (row,) = json.loads(proc.stdout)
    assert row["label"] == "sm90" and row["code"] == "fallthrough" and row["fits"] is False, row
    assert "PTX compute_75" in row["reason"] and "reinstall" in row["reason"], row


# --- an index: uv picks the variant, pip the all-variant wheel ---


class _Index(http.server.ThreadingHTTPServer):
    daemon_threads = True


def _index_handler(files: dict[str, Path]):
    projects: dict[str, list[str]] = {}
    for name in files:
        project = re.sub(r"[-_.]+", "-", name.split("-")[0]).lower()
        projects.setdefault(project, []).append(name)

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _send(self, body: bytes, ctype: str, head: bool) -> None:
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head:
                self.wfile.write(body)

        def _serve(self, head: bool) -> None:
            parts = [p for p in self.path.split("?")[0].split("/") if p]
            if parts[:1] == ["simple"] and len(parts) == 2 and parts[1] in projects:  # PEP 503 project page
                links = "".join(
                    f'<a href="/files/{html.escape(n)}#sha256={hashlib.sha256(files[n].read_bytes()).hexdigest()}">'
                    f"{html.escape(n)}</a><br>\n"
                    for n in sorted(projects[parts[1]])
                )
                return self._send(f"<!DOCTYPE html><html><body>\n{links}</body></html>".encode(), "text/html", head)
            if parts[:1] == ["files"] and len(parts) == 2 and parts[1] in files:
                ctype = "application/json" if parts[1].endswith(".json") else "application/octet-stream"
                return self._send(files[parts[1]].read_bytes(), ctype, head)
            self.send_error(404)

        def do_GET(self) -> None:
            self._serve(False)

        def do_HEAD(self) -> None:
            self._serve(True)

    return Handler


@pytest.fixture(scope="module")
def index_url():
    """A PEP 503 index on 127.0.0.1 with cuplug, pyelftools, both backend wheels, their variant wheels and the
    *-variants.json files; shut down after the module, or after 600 s by a timer whatever happens."""
    if not (VARIANT_WHEELS and WHEELS):
        pytest.skip("needs the variant wheels (nox -s tests builds them)")
    paths = [_main_wheel(), *Path(VARIANT_WHEELS).glob("*.whl"), *Path(VARIANT_WHEELS).glob("*-variants.json")]
    paths += sorted(Path(DEPS).glob("pyelftools-*.whl")) if DEPS else []
    server = _Index(("127.0.0.1", 0), _index_handler({p.name: p for p in paths}))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    timer = threading.Timer(600, server.shutdown)
    timer.daemon = True
    timer.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple"
    finally:
        timer.cancel()
        server.shutdown()
        server.server_close()
        thread.join(10)


@needs_variant_wheels
@pytest.mark.parametrize(
    ("extra", "sm", "driver", "label"),
    [
        ("cuda13", "9.0", "13.0", "sm90"),  # an H100/H200
        ("cuda13", "8.6", "13.0", "sm80"),  # sm_80 SASS runs on 8.6
        ("cuda13", "7.5", "13.0", "sm75"),
        ("cuda13", "12.0", "13.0", "null"),  # Blackwell: no dedicated variant, the PTX-only one
        ("cuda12", "9.0", "12.4", "sm90"),
        ("cuda12", "9.0", "12.2", "null"),  # every cuda12 SASS variant carries ISA 8.4 PTX: needs 12.4
    ],
)
def test_uv_installs_the_variant_for_a_forced_device(index_url, tmp_path, extra, sm, driver, label):
    bindir = _venv(tmp_path / "venv")
    env = _uv_env(tmp_path, NV_VARIANT_PROVIDER_FORCE_SM_ARCH=sm, NV_VARIANT_PROVIDER_FORCE_CUDA_DRIVER_VERSION=driver)
    proc = subprocess.run(
        [_uv(), "pip", "install", "--python", str(bindir / "python"), "--preview-features", "wheel-variants",
         "--index-url", index_url, f"cuplug[{extra}]"],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert _installed_label(bindir, f"cuplug_{extra}") == label, proc.stderr
    doc = _doctor(bindir, tmp_path, clean_env())
    held = {c["variant"] for c in doc["candidates"] if c["variant"] != "cpu"}
    assert held == ({"ptx"} if label == "null" else {label, "ptx"}), held


@needs_variant_wheels
def test_pip_installs_the_all_variant_wheel_from_the_same_index(index_url, tmp_path):
    bindir = _venv(tmp_path / "venv")
    env = {k: v for k, v in clean_env().items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull  # no machine-wide find-links or extra indexes
    proc = subprocess.run(
        [str(bindir / "python"), "-m", "pip", "install", "-q", "--index-url", index_url, "cuplug[cuda13]"],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert _installed_label(bindir, "cuplug_cuda13") is None
    doc = _doctor(bindir, tmp_path, clean_env())
    held = {c["variant"] for c in doc["candidates"] if c["variant"] != "cpu"}
    assert held == {"fatbin", "ptx", "sm75", "sm80", "sm90"}, held
