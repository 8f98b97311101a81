"""Issue 18, class 6: knobs, hex case and what reaches the terminal.

CUPLUG_BACKEND values that name no installed variant are a ConfigError (never a
silent auto-selection); its case does not matter. A manifest's sha256 is hex in any
case. Device names with escape codes or newlines are shown escaped in text reports
(they cannot forge a line), exact in JSON.
"""

from __future__ import annotations

import json

import pytest

from conftest import clean_env, env_for, needs_wheels, run_cli, run_json, run_py
from test_reliability import DECIDE_LOAD, copy_site, edit_manifest

rel = pytest.mark.reliability


@rel(
    case="CUPLUG_BACKEND names no installed variant",
    how="CUPLUG_BACKEND=fatbinn, fatbn, bogus, cuda13:sm99, cuda14:fatbin (no such package), or ptx with no backend "
    "package installed",
    expect="ConfigError naming CUPLUG_BACKEND, the value and the installed variants (or none); `cuplug probe` and "
    "`doctor` exit 2 with that message; auto-selection does not run in its place",
)
@needs_wheels
@pytest.mark.parametrize("value", ["fatbinn", "fatbn", "bogus", "cuda13:sm99", "cuda14:fatbin", "ptx-without-packages"])
def test_unknown_backend_value_is_a_config_error(value, site, fake_driver_dir, tmp_path):
    env = env_for(site, fake_driver_dir, CUPLUG_BACKEND=value)
    if value == "ptx-without-packages":
        env = clean_env(LD_LIBRARY_PATH=str(fake_driver_dir), CUPLUG_BACKEND="ptx")
    proc = run_py("import cuplug; cuplug.load()", env)
    assert proc.returncode == 1 and "ConfigError" in proc.stderr and "CUPLUG_BACKEND=" in proc.stderr, proc.stderr
    assert ("installed: none" in proc.stderr) == (value == "ptx-without-packages")
    if value != "ptx-without-packages":
        assert "cuda13:fatbin" in proc.stderr and "cuda12:sm80" in proc.stderr
    for command in (["probe"], ["doctor"], ["doctor", "--json"]):
        cli = run_cli(command, env, cwd=tmp_path)
        assert cli.returncode == 2 and "CUPLUG_BACKEND=" in cli.stderr and "Traceback" not in cli.stderr, cli.stderr


@rel(
    case="CUPLUG_BACKEND with a malformed CUDA major or variant",
    how="CUPLUG_BACKEND=cuda:fatbin, cudax:ptx, cuda13:, :fatbin, cuda13:cpu, sm-80",
    expect="ConfigError naming CUPLUG_BACKEND and what it accepts; probe exits 2",
)
@needs_wheels
@pytest.mark.parametrize("value", ["cuda:fatbin", "cudax:ptx", "cuda13:", ":fatbin", "cuda13:cpu", "sm-80"])
def test_malformed_backend_value_is_a_config_error(value, site, fake_driver_dir, tmp_path):
    proc = run_cli(["probe"], env_for(site, fake_driver_dir, CUPLUG_BACKEND=value), cwd=tmp_path)
    assert proc.returncode == 2 and f"CUPLUG_BACKEND={value!r}" in proc.stderr, proc.stderr


@rel(
    case="a forced variant that fails",
    how="CUPLUG_BACKEND=cuda13:sm80 with the fake driver (create fails): `cuplug probe --allow-cpu`, text and --json",
    expect="the fall-through to the next candidates and the CPU, and the one-line summary says the forced variant "
    "failed and fell through (JSON: fell_through with its code)",
)
@needs_wheels
def test_a_forced_variant_that_falls_through_says_so(site, fake_driver_dir, tmp_path):
    env = env_for(site, fake_driver_dir, CUPLUG_BACKEND="cuda13:sm80")
    proc = run_cli(["probe", "--allow-cpu"], env, cwd=tmp_path)
    summary = proc.stdout.splitlines()[0]
    assert proc.returncode == 0 and "CUPLUG_BACKEND=cuda13:sm80: cuda13/sm80 load-failed, fell through" in summary
    got = json.loads(run_cli(["probe", "--allow-cpu", "--json"], env, cwd=tmp_path).stdout)
    assert got["fell_through"]["variant"] == "sm80" and got["fell_through"]["code"] == "load-failed"
    assert got["attempts"][0]["variant"] == "sm80" and got["variant"] == "cpu"
    plain = json.loads(run_cli(["probe", "--allow-cpu", "--json"], env_for(site, fake_driver_dir), cwd=tmp_path).stdout)
    assert "fell_through" not in plain


@rel(
    case="CUPLUG_BACKEND in another case",
    how="CUPLUG_BACKEND=CPU, Cpu, AUTO, CUDA13:FATBIN",
    expect="case does not matter: CPU/Cpu force the CPU (code forced), AUTO is auto-selection, CUDA13:FATBIN "
    "forces cuda13/fatbin",
)
@needs_wheels
@pytest.mark.parametrize(
    ("value", "first"), [("CPU", "cpu"), ("Cpu", "cpu"), ("AUTO", None), ("CUDA13:FATBIN", "cuda13/fatbin")]
)
def test_backend_value_case_does_not_matter(value, first, site, fake_driver_dir):
    got = run_json(DECIDE_LOAD, env_for(site, fake_driver_dir, CUPLUG_BACKEND=value, FAKE_CUDA_DEVICES="8.0"))
    if first == "cpu":
        assert got["code"] == "forced" and got["candidates"][-1][:3] == ["cpu", True, "forced"]
    elif first is None:
        assert got["attempts"][0][0] == "cuda13/sm80"  # auto: the exact SASS for CC 8.0
    else:
        assert got["candidates"][0][:3] == [first, True, "forced"]


@rel(
    case="a manifest's sha256 in uppercase hex",
    how="every sha256 of cuplug_cuda13/manifest.json uppercased (the digests are right)",
    expect="accepted as the same digest: cuda13/fatbin is verified and dlopened (load-failed at create on the fake "
    "driver, not artifact-corrupt); `cuplug inspect` agrees",
)
@needs_wheels
def test_uppercase_sha256_is_the_same_digest(site, fake_driver_dir, tmp_path):
    broken = copy_site(site, tmp_path)
    edit_manifest(broken / "cuplug_cuda13", lambda d: [a.update(sha256=a["sha256"].upper()) for a in d["artifacts"]])
    got = run_json(DECIDE_LOAD, env_for(broken, fake_driver_dir))
    assert got["attempts"][0][:2] == ["cuda13/fatbin", "load-failed"], got["attempts"][0]
    assert run_cli(["inspect", str(broken / "cuplug_cuda13")], clean_env()).returncode == 0


NAMES = [
    "Evil\x1b[2J\x1b[H[backend-cuda] decision            : cuda13/fatbin (ok: forged)",
    "two\nlines",
    "bell\x07 and \u2028 separator",
]


@rel(
    case="a device name with escape codes or newlines",
    how="fake driver whose cuDeviceGetName answers a clear-screen escape + a forged report line, a newline, a bell "
    "and U+2028",
    expect="doctor/probe text shows the name escaped (no raw control character, no forged line); --json carries "
    "the exact name",
)
@pytest.mark.parametrize("name", NAMES, ids=["escape-forged-line", "newline", "bell-u2028"])
def test_device_names_cannot_forge_report_lines(name, fake_driver_dir, tmp_path):
    env = clean_env(LD_LIBRARY_PATH=str(fake_driver_dir), FAKE_CUDA_NAME=name)
    for args in (["doctor"], ["doctor", "--no-load"], ["probe", "--allow-cpu"]):
        out = run_cli(args, env, cwd=tmp_path).stdout
        assert not any(ch in out for ch in "\x1b\x07\u2028"), repr(out)
        lines = out.splitlines()
        assert not any(line.startswith("lines") for line in lines)
        assert sum(line.startswith("[backend-cuda] decision ") for line in lines) <= 1, out
    text = run_cli(["doctor", "--no-load"], env, cwd=tmp_path).stdout
    assert "\\x1b[2J" in text or "\\n" in text or "\\x07" in text
    doc = json.loads(run_cli(["doctor", "--json", "--no-load"], env, cwd=tmp_path).stdout)
    assert doc["devices"][0]["name"] == name
