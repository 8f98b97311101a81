"""The environment knobs (runtime.policy), in process: what each value means, and every value refused.

A knob's bad value is a ConfigError that names the variable and what it accepts, never a silent
default; case never matters; the CUDA major in CUPLUG_BACKEND is any cudaNN.
"""

from __future__ import annotations

import pytest

from cuplug.contract.errors import ConfigError
from cuplug.runtime import policy


def test_an_empty_environment_is_auto_on_device_0():
    p = policy.from_env({})
    assert (p.disable_cuda, p.disabled_by, p.require_cuda, p.forced, p.forced_cuda, p.device) == (
        False,
        None,
        False,
        None,
        None,
        0,
    )


@pytest.mark.parametrize("value", ["1", "true", "TRUE", "Yes", "on", " 1 "])
@pytest.mark.parametrize("name", ["CUPLUG_DISABLE_CUDA", "BACKEND_CUDA_DISABLE"])
def test_either_kill_switch_disables_and_is_named(name, value):
    p = policy.from_env({name: value})
    assert p.disable_cuda and p.disabled_by == name


@pytest.mark.parametrize("value", ["", "0", "false", "No", "OFF"])
def test_false_values_leave_cuda_on(value):
    p = policy.from_env({"CUPLUG_DISABLE_CUDA": value, "BACKEND_CUDA_DISABLE": value, "CUPLUG_REQUIRE_CUDA": value})
    assert not p.disable_cuda and p.disabled_by is None and not p.require_cuda


def test_the_first_kill_switch_is_the_one_named():
    p = policy.from_env({"CUPLUG_DISABLE_CUDA": "1", "BACKEND_CUDA_DISABLE": "1"})
    assert p.disabled_by == "CUPLUG_DISABLE_CUDA"
    assert (
        policy.from_env({"CUPLUG_DISABLE_CUDA": "0", "BACKEND_CUDA_DISABLE": "1"}).disabled_by == "BACKEND_CUDA_DISABLE"
    )


@pytest.mark.parametrize("name", ["CUPLUG_DISABLE_CUDA", "BACKEND_CUDA_DISABLE", "CUPLUG_REQUIRE_CUDA"])
@pytest.mark.parametrize("value", ["2", "yes please", "enabled", "-1"])
def test_a_flag_that_is_no_flag_is_an_error_naming_it(name, value):
    with pytest.raises(ConfigError, match=rf"{name}={value!r}: expected 1/0"):
        policy.from_env({name: value})


@pytest.mark.parametrize("value", ["1", "True"])
def test_require_cuda(value):
    assert policy.from_env({"CUPLUG_REQUIRE_CUDA": value}).require_cuda


@pytest.mark.parametrize(
    ("value", "forced", "cuda"),
    [
        ("auto", None, None),
        ("AUTO", None, None),
        ("", None, None),
        ("  ", None, None),
        ("cpu", "cpu", None),
        ("Cpu", "cpu", None),
        ("fatbin", "fatbin", None),
        ("CUDA13:FATBIN", "fatbin", "cuda13"),
        ("cuda12:sm80", "sm80", "cuda12"),
        ("cuda14:ptx", "ptx", "cuda14"),
        (" sm_90a ", "sm_90a", None),
        ("0", "0", None),
    ],
)
def test_backend_values(value, forced, cuda):
    p = policy.from_env({"CUPLUG_BACKEND": value})
    assert (p.forced, p.forced_cuda, p.raw_forced) == (forced, cuda, value)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("cuda:fatbin", "before ':' must name a CUDA major"),
        ("cudax:ptx", "before ':' must name a CUDA major"),
        ("cuda1234:ptx", "before ':' must name a CUDA major"),
        (":fatbin", "before ':' must name a CUDA major"),
        ("gpu13:ptx", "before ':' must name a CUDA major"),
        ("cuda13:", "expected auto, cpu, or a variant name"),
        ("cuda13:cpu", "expected auto, cpu, or a variant name"),
        ("cuda13:auto", "expected auto, cpu, or a variant name"),
        ("sm-80", "expected auto, cpu, or a variant name"),
        ("_fatbin", "expected auto, cpu, or a variant name"),
        ("v" * 33, "expected auto, cpu, or a variant name"),
        ("cuda13:sm80:x", "expected auto, cpu, or a variant name"),
    ],
)
def test_malformed_backend_values_name_the_variable(value, says):
    with pytest.raises(ConfigError) as err:
        policy.from_env({"CUPLUG_BACKEND": value})
    assert f"CUPLUG_BACKEND={value!r}" in str(err.value) and says in str(err.value)


def test_a_32_character_variant_is_the_longest():
    assert policy.from_env({"CUPLUG_BACKEND": "v" * 32}).forced == "v" * 32


@pytest.mark.parametrize(
    ("env", "arg", "index"),
    [("0", None, 0), (" 3 ", None, 3), ("9999", None, 9999), ("1", 2, 2), ("5", "0", 0), ("", None, 0)],
)
def test_device_index(env, arg, index):
    assert policy.from_env({"CUPLUG_DEVICE": env}, arg).device == index


def test_device_argument_without_the_variable():
    assert policy.from_env({}, 7).device == 7 and policy.from_env({}).device == 0


@pytest.mark.parametrize("value", ["-1", "1.5", "x", "0x1", "10000", "١", True, False, " ", "1 2"])
def test_a_device_that_is_no_index_is_an_error(value):
    env, arg = ({"CUPLUG_DEVICE": value}, None) if isinstance(value, str) and value != " " else ({}, value)
    if value == " ":
        env, arg = {}, " "
    with pytest.raises(ConfigError, match=r"CUPLUG_DEVICE/device=.*expected a device index"):
        policy.from_env(env, arg)


def test_relevant_env_lists_cuplugs_and_cudas_variables_only():
    env = {
        "CUPLUG_BACKEND": "cpu",
        "CUDA_VISIBLE_DEVICES": "1",
        "HOME": "/root",
        "LD_LIBRARY_PATH": "/x",
        "CUPLUG_X": "y",
    }
    assert policy.relevant_env(env) == {"CUPLUG_BACKEND": "cpu", "CUDA_VISIBLE_DEVICES": "1", "LD_LIBRARY_PATH": "/x"}
    assert list(policy.relevant_env({k: "1" for k in reversed(policy.KNOBS)})) == list(policy.KNOBS)


def test_os_environ_is_the_default(monkeypatch):
    monkeypatch.setenv("CUPLUG_DEVICE", "4")
    monkeypatch.setenv("CUPLUG_BACKEND", "cuda13:ptx")
    p = policy.from_env()
    assert (p.device, p.forced, p.forced_cuda) == (4, "ptx", "cuda13")
    assert policy.relevant_env()["CUPLUG_DEVICE"] == "4"
