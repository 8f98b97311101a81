"""The `cuplug` command (tools.cli) in process: probe's checks and exit codes, doctor's forms, the
arguments refused, on the CPU twin with no driver or the fake one (the subprocess forms of the same
commands are in tests/test_driver_and_cli.py and tests/test_operator_tools.py).
"""

from __future__ import annotations

import json

import pytest

from cuplug.contract import reasons
from cuplug.runtime import api, driver
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
