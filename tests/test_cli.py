"""The `cuplug` command (tools.cli) in process: probe's checks and exit codes, doctor's forms, the
arguments refused, on the CPU twin with no driver or the fake one (the subprocess forms of the same
commands are in tests/test_driver_and_cli.py and tests/test_operator_tools.py).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from types import SimpleNamespace

import pytest

from conftest import clean_env, run_cli
from cuplug.contract import reasons
from cuplug.runtime import api, driver, loading
from cuplug.tools import cli


@pytest.fixture
def no_driver(monkeypatch):
    for name in (
        "CUPLUG_DISABLE_CUDA",
        "BACKEND_CUDA_DISABLE",
        "CUPLUG_REQUIRE_CUDA",
        "CUPLUG_BACKEND",
        "CUPLUG_DEVICE",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(driver, "LIBCUDA", "/nonexistent/libcuda.so.1")
    return monkeypatch


def run(argv, capsys) -> tuple[int, str, str]:
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_probe_without_a_driver_names_the_step_and_allow_cpu_accepts_the_cpu(no_driver, capsys):
    code, out, _ = run(["probe"], capsys)
    assert code == reasons.EXIT_CODES[reasons.NO_DRIVER] == 10
    assert "cuplug probe: cpu on cpu: vector add of 1048579 elements ok, 3 op(s) run on their samples" in out
    assert "CPU fallback, reason no-driver" in out and out.rstrip().endswith("cuplug probe: exit 10")
    code, out, _ = run(["probe", "--allow-cpu", "--json"], capsys)
    doc = json.loads(out)
    assert code == 0 and doc["ok"] and doc["exit_code"] == 0 and doc["variant"] == "cpu" and doc["code"] == "no-driver"
    assert set(doc["ops"]) == {"add", "scale_add", "sum"} and doc["attempts"][-1]["code"] == "ok"


@pytest.mark.parametrize(("env", "code"), [({"CUPLUG_DISABLE_CUDA": "1"}, 20), ({"CUPLUG_BACKEND": "cpu"}, 0)])
def test_probe_exit_codes_of_the_knobs(no_driver, capsys, env, code):
    for k, v in env.items():
        no_driver.setenv(k, v)
    assert run(["probe"], capsys)[0] == code


def test_probe_checks_the_add_on_the_host(no_driver, capsys):
    """The probe's whole point: a backend that answers wrongly fails it (exit 17), even with --allow-cpu."""
    real = api.Backend.run

    def wrong(self, op, *args, **kwargs):
        out = real(self, op, *args, **kwargs)
        if op == "add" and len(out) > 5:
            out[5] += 1
        return out

    no_driver.setattr(api.Backend, "run", wrong)
    code, out, _ = run(["probe", "--allow-cpu"], capsys)
    assert code == reasons.EXIT_KERNEL_FAILED and "FAILED (vector add: wrong result at 5" in out


def test_doctor_forms(no_driver, capsys):
    code, out, _ = run(["doctor", "--json"], capsys)
    doc = json.loads(out)
    assert code == 0 and doc["schema"] == "cuplug.doctor/1" and doc["decision"]["code"] == "no-driver"
    assert doc["loaded"]["ok"] and doc["loaded"]["variant"] == "cpu" and doc["loaded"]["attempts"][-1]["code"] == "ok"
    assert doc["driver"]["found"] is False and doc["variants"] == []
    code, out, _ = run(["doctor", "--json", "--no-load"], capsys)
    doc = json.loads(out)
    assert code == 0 and "loaded" not in doc and doc["attempts"] == []
    code, out, _ = run(["doctor"], capsys)
    assert code == 0 and "[backend-cuda] loaded              : cpu on" in out and "[backend-cuda] decision" in out
    code, out, _ = run(["doctor", "--no-load"], capsys)
    assert code == 0 and "loaded" not in out and "[backend-cuda] decision            : cpu (no-driver:" in out


def test_doctor_with_cuda_disabled_says_the_driver_was_not_asked(no_driver, capsys):
    no_driver.setenv("CUPLUG_DISABLE_CUDA", "1")
    doc = json.loads(run(["doctor", "--json", "--no-load"], capsys)[1])
    assert doc["driver"] is None and doc["decision"]["code"] == "disabled"


def test_doctor_of_an_unknown_backend_fails_with_its_reason(no_driver, capsys):
    code, out, _ = run(["doctor", "--backend", "nosuch"], capsys)
    assert code == 1 and "[nosuch-cuda] load failed         : no CPU backend 'nosuch'" in out


@pytest.mark.parametrize(
    "argv",
    [
        ["probe", "--timeout", "0"],
        ["probe", "--timeout", "-1"],
        ["probe", "--timeout", "nan"],
        ["doctor", "--timeout", "x"],
        ["probe", "--timeout", "86401"],
    ],
)
def test_timeouts_that_are_no_timeouts_are_usage_errors(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2 and "--timeout" in capsys.readouterr().err


def test_a_config_error_is_exit_2_naming_the_variable(no_driver, capsys):
    no_driver.setenv("CUPLUG_DEVICE", "-1")
    code, _, err = run(["probe"], capsys)
    assert code == 2 and "CUPLUG_DEVICE" in err and "Traceback" not in err


def test_an_internal_error_is_exit_1_without_a_traceback(no_driver, capsys):
    def boom(*_a, **_k):
        raise RuntimeError("boom")

    from cuplug.runtime import loading

    no_driver.setattr(loading, "load", boom)
    code, _, err = run(["probe"], capsys)
    assert code == 1 and "cuplug: load: internal error: RuntimeError: boom" in err


def test_exit_help_is_the_table(capsys):
    with pytest.raises(SystemExit):
        cli.main(["probe", "--help"])
    out = capsys.readouterr().out
    assert cli.PROBE_EXIT_HELP in out.replace("\n\n", "\n") or all(
        line in out for line in cli.PROBE_EXIT_HELP.splitlines()
    )


def test_timeout_parser_accepts_the_bounds():
    assert cli._timeout("0.5") == 0.5 and cli._timeout(str(cli.MAX_TIMEOUT)) == cli.MAX_TIMEOUT


def test_say_escapes_what_could_forge_a_line():
    assert cli._say("a\x1b[2Jb\nc\u2028d") == "a\\x1b[2Jb\nc\\u2028d"


# ---- probe on a CUDA variant (the CPU library behind a cuda13/sm80 face: the fake driver cannot run kernels) --


@pytest.fixture
def gpu(no_driver):
    """The loader answers with cuda13/sm80 on an "H200 stand-in" (the CPU library behind it, whatever the backend's
    name); its CPU twin is the real CPU backend. Returns the backends it handed out, the stand-in first."""
    real = loading.load
    handed: list = []

    def load(name="vector", env=None, **kw):
        if env is not None:  # the CPU twin the probe compares with
            handed.append(real("vector", env=env, **kw))
            return handed[-1]
        b = real("vector", env={**os.environ, "CUPLUG_BACKEND": "cpu"}, **kw)
        info = {**b.info(), "variant": "sm80", "device": {"name": "H200 stand-in"}}
        b.variant, b.cuda, b.info = "sm80", "cuda13", lambda: info
        b.trace = SimpleNamespace(
            decision_code=reasons.OK,
            decision_reason="exact SASS",
            attempts=[],
            fell_through=None,
            policy=SimpleNamespace(raw_forced=None),
        )
        handed.append(b)
        return b

    no_driver.setattr(loading, "load", load)
    return handed


def test_a_gpu_that_checks_out_exits_0_without_allow_cpu(gpu, capsys):
    code, out, _ = run(["probe"], capsys)
    assert code == reasons.EXIT_OK
    assert out.startswith(
        "cuplug probe: cuda13/sm80 on H200 stand-in: vector add of 1048579 elements ok, "
        "3 op(s) checked against the CPU twin in "
    )
    assert "CPU fallback" not in out and out.rstrip().endswith("cuplug probe: exit 0")
    assert len(gpu) == 2 and all(b.closed for b in gpu)  # the backend and its CPU twin, both closed


def test_a_gpu_op_that_disagrees_with_its_cpu_twin_fails_the_probe(gpu, monkeypatch, capsys):
    """Every op runs on its sample on the GPU and on the CPU twin; a different answer is exit 17 naming the op."""
    real_run = api.Backend.run

    def run_op(self, op, *args, **kwargs):
        if op == "scale_add" and self.variant != "cpu":
            kwargs["alpha"] = kwargs.get("alpha", 1.0) * 2 + 1
        return real_run(self, op, *args, **kwargs)

    monkeypatch.setattr(api.Backend, "run", run_op)
    code, out, _ = run(["probe", "--json", "--allow-cpu"], capsys)
    doc = json.loads(out)
    assert code == reasons.EXIT_KERNEL_FAILED and not doc["ok"] and doc["exit_code"] == code
    assert doc["error"].startswith("op scale_add on its sample: scale_add: output 0: element ")
    assert "the CPU twin gives" in doc["error"] and all(b.closed for b in gpu)


def test_probe_of_another_backend_runs_its_ops_but_no_vector_add(gpu, capsys):
    code, out, _ = run(["probe", "--backend", "scan"], capsys)
    assert code == 0 and out.startswith(
        "cuplug probe: cuda13/sm80 on H200 stand-in: backend scan ok, 3 op(s) checked against the CPU twin (total "
    )
    doc = json.loads(run(["probe", "--backend", "scan", "--json"], capsys)[1])
    assert "add_ms" not in doc and set(doc["ops"]) == {"add", "scale_add", "sum"}


def test_probe_reports_milliseconds(no_driver, capsys):
    """add_ms and each op's time to the microsecond, total_ms to 0.1 ms (a clock that ticks 1.2345678 ms a read)."""
    ticks = iter(range(100))
    no_driver.setattr(cli, "time", SimpleNamespace(perf_counter=lambda: next(ticks) * 0.0012345678))
    doc = json.loads(run(["probe", "--json", "--allow-cpu"], capsys)[1])
    assert doc["add_ms"] == 1.235 and doc["ops"] == {"add": 1.235, "scale_add": 1.235, "sum": 1.235}
    assert doc["total_ms"] == 11.1  # 9 reads: start, the add's two, two per op


def test_probe_total_is_in_milliseconds(no_driver, capsys):
    """total_ms is the wall time in milliseconds: from the first of the probe's clock reads (a second apart) to
    its last, 9 s later, is 9000 ms (not 9009 or 8991)."""
    ticks = iter(range(100))
    no_driver.setattr(cli, "time", SimpleNamespace(perf_counter=lambda: float(next(ticks))))
    doc = json.loads(run(["probe", "--json", "--allow-cpu"], capsys)[1])
    assert doc["add_ms"] == 1000.0 and doc["total_ms"] == 9000.0


def test_each_op_is_timed_on_its_own(no_driver, capsys):
    """Each op's time is from its own start to its own end: with a clock whose reads double (1, 2, 4 ... ms), the
    add takes 2 ms, the three ops 8, 32 and 128 ms, and the whole probe 511 ms."""
    ticks = iter(range(100))
    no_driver.setattr(cli, "time", SimpleNamespace(perf_counter=lambda: 2 ** next(ticks) / 1e3))
    doc = json.loads(run(["probe", "--json", "--allow-cpu"], capsys)[1])
    assert doc["add_ms"] == 2.0 and doc["ops"] == {"add": 8.0, "scale_add": 32.0, "sum": 128.0}
    assert doc["total_ms"] == 511.0


def test_probe_finds_a_result_below_the_sum_as_well_as_above(no_driver, capsys):
    """An add that drops y (returns x) is as wrong as one that adds too much: the first element where y is not 0."""
    real = api.Backend.run

    def x_only(self, op, *args, **kwargs):
        out = real(self, op, *args, **kwargs)
        if op == "add" and len(out) > 5:
            for i in range(len(out)):
                out[i] = args[0][i]
        return out

    no_driver.setattr(api.Backend, "run", x_only)
    doc = json.loads(run(["probe", "--json"], capsys)[1])
    assert doc["error"] == "vector add: wrong result at 1: 1.0 != 4.0" and doc["exit_code"] == 17


@pytest.mark.parametrize("variant", ["ampere", "sm80", "volta_tc"])
def test_a_gpu_variant_of_any_name_is_no_cpu_fallback(gpu, no_driver, capsys, variant):
    """Variant names are the author's ([a-z0-9][a-z0-9_]*): one that sorts before "cpu" is a GPU variant all the
    same: exit 0 without --allow-cpu, no CPU-fallback line."""
    inner = loading.load

    def load(name="vector", env=None, **kw):
        b = inner(name, env=env, **kw)
        if env is None:
            b.variant = variant
        return b

    no_driver.setattr(loading, "load", load)
    code, out, _ = run(["probe"], capsys)
    assert code == reasons.EXIT_OK and out.startswith(f"cuplug probe: cuda13/{variant} on H200 stand-in: vector add ")
    assert "CPU fallback" not in out and "3 op(s) checked against the CPU twin" in out
    assert len(gpu) == 2 and gpu[1].variant == "cpu"  # the twin was loaded: the ops really were compared


@pytest.mark.parametrize("name", ["".join(["vec", "tor"]), "zeta"])
def test_probe_says_which_backend_it_checked(gpu, capsys, name):
    """--backend vector on a command line (a string built at run time, as sys.argv's are) is the vector add; any
    other name, one sorting after "vector" too, is "backend NAME", its ops run but no vector add timed."""
    code, out, _ = run(["probe", "--backend", name], capsys)
    what, took = (
        ("vector add of 1048579 elements ok", " in ") if name == "vector" else (f"backend {name} ok", " (total ")
    )
    assert code == 0 and out.startswith(
        f"cuplug probe: cuda13/sm80 on H200 stand-in: {what}, 3 op(s) checked against the CPU twin{took}"
    )


def test_json_output_is_one_canonical_form(no_driver, tmp_path, capsys):
    """probe, doctor and warmup print their JSON indented by two spaces, keys in the order built: the same facts
    give the same bytes (operators diff them across machines; the docs show this form)."""
    no_driver.setenv("CUDA_CACHE_PATH", str(tmp_path / "cache"))
    for argv in (
        ["probe", "--json", "--allow-cpu"],
        ["doctor", "--json", "--no-load"],
        ["doctor", "--json"],
        ["warmup", "--json"],
    ):
        out = run(argv, capsys)[1]
        assert out == json.dumps(json.loads(out), indent=2) + "\n", argv


def test_probe_adds_2_20_plus_3_elements_once_on_the_cpu(no_driver, capsys):
    """The vector add spans many blocks and a scalar tail, as --help says; a CPU fallback has no twin to load."""
    calls, loads = [], []
    real_run, real_load = api.Backend.run, loading.load
    no_driver.setattr(api.Backend, "run", lambda self, *a, **k: calls.append(a) or real_run(self, *a, **k))
    no_driver.setattr(loading, "load", lambda *a, **k: loads.append(a) or real_load(*a, **k))
    assert run(["probe", "--allow-cpu"], capsys)[0] == 0
    op, x, y = calls[0]
    assert op == "add" and len(x) == len(y) == (1 << 20) + 3 and len(loads) == 1


def test_probe_names_what_the_backend_returned_and_what_the_host_computed(no_driver, capsys):
    real = api.Backend.run

    def off_by_one(self, op, *args, **kwargs):
        out = real(self, op, *args, **kwargs)
        if op == "add" and len(out) > 5:
            out[5] += 1  # x[5] + y[5] = 5 + 1
        return out

    no_driver.setattr(api.Backend, "run", off_by_one)
    doc = json.loads(run(["probe", "--json"], capsys)[1])
    assert doc["error"] == "vector add: wrong result at 5: 7.0 != 6.0" and doc["exit_code"] == 17


@pytest.mark.parametrize("where", [4096, (1 << 20) - 1, (1 << 20) + 2])
def test_probe_checks_every_element_of_the_add_up_to_the_scalar_tail(no_driver, capsys, where):
    """Every one of the 2^20+3 sums is compared, not a prefix: a wrong element past the first block, in the
    last full block or in the 3-element scalar tail fails the probe (exit 17) naming its index."""
    real = api.Backend.run

    def wrong_at(self, op, *args, **kwargs):
        out = real(self, op, *args, **kwargs)
        if op == "add" and len(out) > where:
            out[where] += 1
        return out

    no_driver.setattr(api.Backend, "run", wrong_at)
    doc = json.loads(run(["probe", "--json", "--allow-cpu"], capsys)[1])
    assert doc["exit_code"] == 17 and doc["error"].startswith(f"vector add: wrong result at {where}: "), doc


def test_a_forced_cpu_passes_the_probe_without_allow_cpu(no_driver, capsys):
    """CUPLUG_BACKEND=cpu is the operator's own choice, not a fallback: `cuplug probe` exits 0 (code `forced`,
    docs/reference/codes.md) without --allow-cpu, says the CPU serves because it was forced, and never opens
    the driver; a wrong CPU result still fails it (17)."""
    no_driver.setenv("CUPLUG_BACKEND", "cpu")
    no_driver.setattr(driver, "probe", lambda: pytest.fail("the driver was asked"))
    code, out, _ = run(["probe"], capsys)
    assert code == reasons.EXIT_OK == reasons.EXIT_CODES[reasons.FORCED]
    assert "cuplug probe: CPU fallback, reason forced: CUPLUG_BACKEND=cpu" in out
    assert out.rstrip().endswith("cuplug probe: exit 0")
    doc = json.loads(run(["probe", "--json"], capsys)[1])
    assert doc["ok"] and doc["exit_code"] == 0 and doc["variant"] == "cpu" and doc["code"] == reasons.FORCED
    real = api.Backend.run

    def wrong(self, op, *args, **kwargs):
        out = real(self, op, *args, **kwargs)
        if op == "add":
            out[0] += 1
        return out

    no_driver.setattr(api.Backend, "run", wrong)
    assert run(["probe"], capsys)[0] == reasons.EXIT_KERNEL_FAILED


def test_a_kernel_that_fails_fails_the_probe_with_17_naming_the_step(no_driver, capsys):
    from cuplug.contract.errors import BackendError

    def fails(self, op, *args, **kwargs):
        raise BackendError("launch failed: an illegal memory access", -1)

    no_driver.setattr(api.Backend, "run", fails)
    code, out, err = run(["probe", "--allow-cpu"], capsys)
    assert code == reasons.EXIT_KERNEL_FAILED and not err
    assert "FAILED (vector add: launch failed: an illegal memory access)" in out


def test_probe_says_when_a_forced_variant_fell_through(no_driver, site, fake_driver_dir, capsys):
    """CUPLUG_BACKEND=cuda13:sm80 that cannot load (the fake driver runs no kernel): the CPU served, and the
    probe says so, exiting with the forced variant's failure (load-failed, 16), in text and in JSON."""
    no_driver.setattr(driver, "LIBCUDA", str(fake_driver_dir / "libcuda.so.1"))
    no_driver.setattr(sys, "path", [*sys.path, str(site)])
    for name in ("FAKE_CUDA_DEVICES", "FAKE_CUDA_DRIVER_VERSION", "FAKE_CUDA_INIT_ERROR", "CUDA_VISIBLE_DEVICES"):
        no_driver.delenv(name, raising=False)
    no_driver.setenv("CUPLUG_BACKEND", "cuda13:sm80")
    code, out, _ = run(["probe"], capsys)
    lines = out.splitlines()
    assert code == reasons.EXIT_CODES[reasons.LOAD_FAILED] == 16
    assert lines[0].endswith("(CUPLUG_BACKEND=cuda13:sm80: cuda13/sm80 load-failed, fell through)")
    assert lines[1].startswith("cuplug probe: forced cuda13/sm80 failed: ") and len(lines[1]) > 45
    assert lines[2].startswith("cuplug probe: CPU fallback, reason load-failed: cuda13/sm80: ")
    code, out, _ = run(["probe", "--json"], capsys)
    doc = json.loads(out)
    assert code == 16 and doc["fell_through"]["code"] == "load-failed" and doc["fell_through"]["variant"] == "sm80"
    assert run(["probe", "--allow-cpu"], capsys)[0] == 0  # --allow-cpu accepts the correct CPU result


# ---- doctor ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("device", "shown"),
    [
        ({"memory_total": 16 << 30, "memory_free": 3 << 29, "temperature_c": 41}, ", 1.5/16.0 GiB free, 41 C"),
        ({"memory_total": 16 << 30, "temperature_c": 0}, ", 0.0/16.0 GiB free, 0 C"),  # free unknown: none free
        ({"memory_total": 1, "memory_free": "?"}, ""),  # a free memory that is no number: no memory shown
        ({"memory_total": 1, "memory_free": 1}, ", 0.0/0.0 GiB free"),  # any known total is shown
        ({"memory_total": 0, "memory_free": 0}, ""),  # 0: the device does not say
        ({"memory_total": -1, "memory_free": 0}, ""),  # a negative total is no answer either
        ({"memory_total": 3 << 29, "memory_free": 1 << 29}, ", 0.5/1.5 GiB free"),  # a MIG slice: tenths shown
        ({"memory_total": None, "temperature_c": None}, ""),
    ],
)
def test_doctor_shows_the_devices_memory_and_temperature_when_known(no_driver, capsys, device, shown):
    info = {"backend": "vector", "device": {"name": "H200", **device}}
    no_driver.setattr(api.Backend, "info", lambda self: info)
    code, out, _ = run(["doctor"], capsys)
    assert code == 0 and out.splitlines()[-1] == f"[backend-cuda] loaded              : cpu on H200{shown}"


def test_doctor_survives_a_backend_that_reports_no_device(no_driver, capsys):
    no_driver.setattr(api.Backend, "info", lambda self: {"backend": "vector", "device": "cpu"})
    code, out, _ = run(["doctor"], capsys)
    assert code == 0 and out.splitlines()[-1] == "[backend-cuda] loaded              : cpu on None"


def test_doctor_of_an_invalid_setting_is_exit_2_naming_it(no_driver, capsys):
    no_driver.setenv("CUPLUG_DEVICE", "-1")
    for argv in (["doctor"], ["doctor", "--json"]):
        code, out, err = run(argv, capsys)
        assert code == 2 and not out and err.startswith("cuplug: decide and load: ") and "CUPLUG_DEVICE" in err


def test_doctor_lists_the_installed_variant_wheels(no_driver, site, capsys):
    """Each installed backend wheel's variant (PEP 825) and whether it fits: a row in the text and in JSON."""
    no_driver.setattr(sys, "path", [*sys.path, str(site)])
    for argv in (["doctor"], ["doctor", "--no-load"]):
        code, out, _ = run(argv, capsys)
        rows = [line for line in out.splitlines() if " variant wheel " in line]
        assert (
            code == 0
            and len(rows) == 2
            and all(r.startswith("[backend-cuda] variant wheel cuplug_cuda1") for r in rows)
        )
    for argv in (["doctor", "--json"], ["doctor", "--json", "--no-load"]):
        code, out, _ = run(argv, capsys)
        doc = json.loads(out)
        assert code == 0 and sorted(v["distribution"] for v in doc["variants"]) == ["cuplug_cuda12", "cuplug_cuda13"]


# ---- inspect, warmup, new-backend --------------------------------------------------------------------------


@pytest.fixture
def pkg(site, tmp_path):
    import shutil

    dest = tmp_path / "cuplug_cuda13"
    shutil.copytree(site / "cuplug_cuda13", dest)
    return dest


def _lie_about_sm80(pkg) -> None:
    doc = json.loads((pkg / "manifest.json").read_text())
    next(a for a in doc["artifacts"] if a["variant"] == "sm80")["sass"] = ["sm_86"]
    (pkg / "manifest.json").write_text(json.dumps(doc))


def test_inspect_text_and_json_and_their_exit_codes(pkg, capsys):
    code, out, _ = run(["inspect", str(pkg)], capsys)
    assert code == 0 and out.rstrip().endswith("cuplug inspect: 4/4 artifacts match") and "ok        " in out
    _lie_about_sm80(pkg)
    code, out, _ = run(["inspect", str(pkg)], capsys)
    assert code == reasons.EXIT_CODES[reasons.ARTIFACT_CORRUPT] == 15
    assert out.rstrip().endswith("cuplug inspect: 3/4 artifacts match")
    assert "! sass: file has ['sm_80'], manifest says ['sm_86']" in out
    code, out, _ = run(["inspect", "--json", str(pkg)], capsys)
    doc = json.loads(out)
    assert code == 15 and doc["ok"] is False and [a["variant"] for a in doc["artifacts"] if not a["ok"]] == ["sm80"]
    assert out == json.dumps(doc, indent=2) + "\n"  # the one JSON form every tool prints


def test_inspect_of_what_it_does_not_understand_is_exit_2(tmp_path, capsys):
    code, out, err = run(["inspect", str(tmp_path)], capsys)
    assert code == 2 and not out and err == f"cuplug inspect: {tmp_path} holds no manifest.json\n"


@pytest.mark.parametrize(
    ("tty", "no_color", "ok", "painted"),
    [
        (True, None, True, "\x1b[32m{}\x1b[0m"),
        (True, None, False, "\x1b[31m{}\x1b[0m"),
        (True, "", True, "\x1b[32m{}\x1b[0m"),  # NO_COLOR counts when it is set to something
        (True, "1", True, "{}"),
        (True, "1", False, "{}"),
        (False, None, True, "{}"),
        (False, None, False, "{}"),
    ],
)
def test_inspect_paints_its_verdict_only_on_a_terminal_without_no_color(
    pkg, monkeypatch, capsys, tty, no_color, ok, painted
):
    if not ok:
        _lie_about_sm80(pkg)
    monkeypatch.delenv("NO_COLOR", raising=False)
    if no_color is not None:
        monkeypatch.setenv("NO_COLOR", no_color)
    monkeypatch.setattr(sys.stdout, "isatty", lambda: tty)
    out = run(["inspect", str(pkg)], capsys)[1]
    verdict = f"cuplug inspect: {4 if ok else 3}/4 artifacts match"
    assert out.splitlines()[-1] == painted.format(verdict)
    assert out.count("\x1b") == (0 if painted == "{}" else 2)  # only the verdict is painted


def test_warmup_without_a_gpu_says_why_in_text_and_json(no_driver, tmp_path, capsys):
    no_driver.setenv("CUDA_CACHE_PATH", str(tmp_path / "cache"))
    code, out, _ = run(["warmup"], capsys)
    assert code == reasons.EXIT_CODES[reasons.NO_DRIVER] and out.startswith("cuplug warmup: no GPU to compile for: ")
    code, out, _ = run(["warmup", "--json"], capsys)
    doc = json.loads(out)
    assert code == 10 and doc["code"] == "no-driver" and doc["results"] == [] and doc["error"].startswith("no GPU")


def test_warmup_exits_with_the_code_of_its_report(no_driver, capsys):
    from cuplug.tools import warmup

    report = {"error": None, "results": [], "cache_problem": "CUDA_CACHE_DISABLE is set", "code": "ok"}
    no_driver.setattr(warmup, "run", lambda backend: (report, warmup.EXIT_CACHE_UNUSABLE))
    code, out, _ = run(["warmup"], capsys)
    assert code == 1 and "nothing cached: CUDA_CACHE_DISABLE is set" in out


def test_new_backend_writes_the_project_where_asked(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, out, err = run(["new-backend", "histo"], capsys)
    assert code == 0 and not err and (tmp_path / "histo" / "pyproject.toml").is_file()
    assert out.startswith(
        f"cuplug new-backend: wrote {sum(f.is_file() for f in (tmp_path / 'histo').rglob('*'))} files into "
    )
    assert f"into {tmp_path / 'histo'}\n  next: cd {tmp_path / 'histo'} && nox -s wheels tests" in out
    assert run(["new-backend", "histo", "--package", "histokit"], capsys)[0] == 0  # default: ./PACKAGE
    assert (tmp_path / "histokit" / "pyproject.toml").is_file()
    assert run(["new-backend", "histo", "--package", "hk2", "--dir", "elsewhere"], capsys)[0] == 0
    assert (tmp_path / "elsewhere" / "pyproject.toml").is_file() and not (tmp_path / "hk2").exists()


def test_new_backend_refusals_are_exit_2_with_the_reason(tmp_path, capsys):
    code, out, err = run(["new-backend", "vector", "--dir", str(tmp_path / "v")], capsys)
    assert code == 2 and not out and err.startswith("cuplug new-backend: ") and "vector" in err
    assert "cannot write" not in err and not (tmp_path / "v").exists()
    (tmp_path / "file").write_text("")
    code, out, err = run(["new-backend", "histo", "--dir", str(tmp_path / "file" / "sub")], capsys)
    assert code == 2 and not out and err.startswith("cuplug new-backend: cannot write the project: ")


# ---- the command itself --------------------------------------------------------------------------------------


def test_a_command_is_required(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main([])
    assert exc.value.code == 2 and "required: command" in capsys.readouterr().err


def test_the_default_timeouts_are_the_ones_help_states():
    """A hung probe or doctor is reported after 10 s (an operator's answer in seconds), a hung warmup (the JIT
    takes long) after 600 s."""
    parser = cli.build_parser()
    assert [parser.parse_args([c]).timeout for c in ("probe", "doctor", "warmup")] == [10.0, 10.0, 600.0]
    assert parser.parse_args(["probe"]).backend == "vector" and cli._timeout("86400") == 86400.0


def test_cmake_dir_exits_0_after_printing_it(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--cmake-dir"])
    assert exc.value.code == 0 and capsys.readouterr().out.strip().endswith("cmake")


@pytest.mark.parametrize(("error", "code"), [(RuntimeError("disk on fire"), 1), (None, 2)])
def test_what_a_command_raises_is_an_exit_code_and_one_line(monkeypatch, capsys, tmp_path, error, code):
    from cuplug.contract.errors import ConfigError
    from cuplug.tools import inspection

    def boom(_target):
        raise error or ConfigError("CUPLUG_BACKEND='x' is not a variant")

    monkeypatch.setattr(inspection, "inspect_target", boom)
    want = "internal error: RuntimeError: disk on fire" if code == 1 else "CUPLUG_BACKEND='x' is not a variant"
    assert run(["inspect", str(tmp_path)], capsys) == (code, "", f"cuplug inspect: {want}\n")


# ---- a step that hangs or dies ---------------------------------------------------------------------------------


def test_a_step_that_does_not_finish_in_time_ends_the_process_with_10(monkeypatch, capsys):
    """Exit 10 (driver-init-failed) at once, naming the step and what to check: a hung driver never hangs us."""

    class Exited(Exception):
        pass

    def _exit(code):
        exits.append(code)
        raise Exited

    exits: list[int] = []
    release = threading.Event()
    monkeypatch.setattr(os, "_exit", _exit)

    def body(steps):
        steps.step = "decide (driver probe)"
        release.wait(10)
        return 0

    t0 = time.monotonic()
    with pytest.raises(Exited):
        cli._Steps(0.25).run(body)
    release.set()
    assert exits == [reasons.EXIT_CODES[reasons.DRIVER_INIT_FAILED]] and time.monotonic() - t0 < 5
    assert capsys.readouterr().err == (
        "cuplug: step 'decide (driver probe)' did not finish within 0.25 s; "
        "the driver or GPU is not answering (check nvidia-smi, dmesg; a slow but working machine: --timeout)\n"
    )


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the exit is the point
def test_a_step_that_ends_without_an_answer_is_exit_1():
    def body(_steps):
        raise SystemExit(0)  # not an Exception: a library that exits under us

    assert cli._Steps(5).run(body) == 1


def test_warmup_never_hangs_on_a_stuck_driver(fake_driver_dir, tmp_path):
    env = clean_env(LD_LIBRARY_PATH=str(fake_driver_dir), FAKE_CUDA_INIT_SLEEP_MS="60000")
    t0 = time.monotonic()
    proc = run_cli(["warmup", "--timeout", "0.5"], env, cwd=tmp_path)
    assert proc.returncode == 10 and time.monotonic() - t0 < 20 and not proc.stdout
    assert "step 'warmup (probe, load, JIT)' did not finish within 0.5 s" in proc.stderr
