"""Per-device decisions (issue 33, part 4): on a machine whose GPUs differ, doctor and explain() show what the
decision chooses for each device, and load(device=i) / CUPLUG_DEVICE=i decide for that one, on the fake driver."""

from __future__ import annotations

import json
import re

import pytest

from conftest import env_for, needs_wheels, run_cli, run_json

pytestmark = needs_wheels

EXPLAIN = (
    "import json, cuplug; out = []\n"
    "for i in range({n}):\n"
    "    t = cuplug.explain(device=i); out.append([t.decision.label, t.decision_code, t.decision_reason])\n"
    "print(json.dumps(out))"
)


@pytest.mark.parametrize(
    ("devices", "want"),
    [
        ("8.6,8.9", ["sm_86", "sm_89"]),
        ("9.0,12.0", ["sm_90", "sm_120"]),
        ("8.7", ["sm_87"]),  # an Orin-like Tegra: its own SASS, never sm_80's
    ],
)
def test_each_device_gets_its_own_decision(site, fake_driver_dir, devices, want):
    env = env_for(site, fake_driver_dir, FAKE_CUDA_DEVICES=devices)
    got = run_json(EXPLAIN.format(n=len(want)), env)
    for (label, code, reason), sass in zip(got, want, strict=True):
        assert label == "cuda13/fatbin" and code == "ok" and f"exact SASS {sass}" in reason, (label, code, reason)
    doc = json.loads(run_cli(["doctor", "--json", "--no-load"], env).stdout)
    assert [(d["index"], d["variant"], d["code"]) for d in doc["per_device"]] == [
        (i, "fatbin", "ok") for i in range(len(want))
    ]
    text = run_cli(["doctor", "--no-load"], env).stdout
    if len(want) > 1:
        for i, sass in enumerate(want):
            cc = devices.split(",")[i]
            assert re.search(rf"decision device {i} +: cuda13/fatbin for CC {cc} \(ok: exact SASS {sass}", text), text
    else:
        assert "decision device" not in text  # one device: the decision line says it all


LOAD = (
    "import json, cuplug; b = cuplug.load({arg}); t = b.trace\n"
    "print(json.dumps([b.variant, t.decision_code, [a.label for a in t.attempts]]))"
)


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_load_takes_the_decision_of_the_device_it_is_given(site, fake_driver_dir, how):
    env = env_for(site, fake_driver_dir, FAKE_CUDA_DEVICES="9.0,7.0")
    for device, first_attempt in ((0, "cuda13/fatbin"), (1, None)):
        extra = {"CUPLUG_DEVICE": str(device)} if how == "environment" else {}
        arg = f"device={device}" if how == "argument" else ""
        variant, code, attempts = run_json(LOAD.format(arg=arg), {**env, **extra})
        if first_attempt is None:
            # a CC 7.0 GPU is older than any architecture built: the CPU, with that reason, nothing CUDA tried
            assert (variant, code) == ("cpu", "capability-too-low") and "cuda13/fatbin" not in attempts
        else:
            # the CC 9.0 GPU's decision is tried first (the fake driver cannot run its kernels: what it tries is
            # what this checks)
            assert attempts[0] == first_attempt, attempts
    doc = json.loads(run_cli(["doctor", "--json", "--no-load"], env).stdout)
    assert [(d["index"], d["code"]) for d in doc["per_device"]] == [(0, "ok"), (1, "capability-too-low")]
