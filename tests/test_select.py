"""Selection is a pure function: facts in, ordered candidates with reasons out (rank), and the whole decision
(decide) from the policy, the driver's facts and what is installed."""

from __future__ import annotations

import pytest

from cuplug.contract import reasons
from cuplug.contract.errors import ConfigError
from cuplug.contract.manifest import Artifact
from cuplug.runtime import policy, select
from cuplug.runtime.discovery import Discovery, InstalledPackage, Refused
from cuplug.runtime.driver import Device, ProbeResult
from cuplug.runtime.select import rank

BASE = Artifact(
    backend="vector",
    variant="sm80",
    file="sm80/libcuplug_vector.so",
    sha256="0" * 64,
    size=1000,
    sass=("sm_80",),
    ptx=(),
    ptx_isa=None,
    cuda_version="12.4",
    min_driver=12000,
    abi=1,
    cuda="cuda12",
)


def make_variant(**overrides) -> Artifact:
    return BASE._replace(**overrides)


def matrix(cuda="cuda12", version="12.4", isa="8.4", min_driver=12000, newest="90"):
    return [
        make_variant(variant="sm75", sass=("sm_75",), cuda=cuda, cuda_version=version, min_driver=min_driver),
        make_variant(variant="sm80", sass=("sm_80",), cuda=cuda, cuda_version=version, min_driver=min_driver),
        make_variant(
            variant="ptx",
            sass=(),
            ptx=("compute_75",),
            ptx_isa=isa,
            cuda=cuda,
            cuda_version=version,
            min_driver=min_driver,
            size=900,
        ),
        make_variant(
            variant="fatbin",
            sass=("sm_75", "sm_80", "sm_86", "sm_89", "sm_90"),
            ptx=(f"compute_{newest}",),
            ptx_isa=isa,
            cuda=cuda,
            cuda_version=version,
            min_driver=min_driver,
            size=5000,
        ),
    ]


def order(cands):
    return [c.label for c in cands if c.accepted]


class TestOrder:
    def test_exact_dedicated_sass_before_fatbin(self):
        assert order(rank(matrix(), (8, 0), 12040)) == ["cuda12/sm80", "cuda12/fatbin", "cuda12/ptx", "cpu"]

    def test_same_major_lower_minor_then_ptx(self):
        got = rank(matrix(), (8, 6), 12040)
        assert order(got) == ["cuda12/fatbin", "cuda12/sm80", "cuda12/ptx", "cpu"]  # fatbin has sm_86 exactly

    def test_sm90_only_fatbin_and_ptx(self):
        got = rank(matrix(), (9, 0), 12040)
        assert order(got) == ["cuda12/fatbin", "cuda12/ptx", "cpu"]
        sm80 = next(c for c in got if c.variant == "sm80")
        assert sm80.code == reasons.NO_COMPATIBLE_ARTIFACT and "different major" in sm80.reason

    def test_future_gpu_runs_ptx_only(self):
        got = rank(matrix(), (12, 0), 12040)
        assert order(got) == ["cuda12/ptx", "cuda12/fatbin", "cpu"]  # both via PTX; smaller first

    def test_sm_a_targets_only_on_exact_arch(self):
        a = make_variant(variant="sm90a", sass=("sm_90a",))
        assert rank([a], (9, 0), 12040)[0].variant == "sm90a"
        assert not rank([a], (9, 1), 12040)[0].accepted or rank([a], (9, 1), 12040)[0].variant == "cpu"


class TestGates:
    def test_runtime_newer_than_driver(self):
        got = rank(matrix(cuda="cuda13", version="13.0", isa="9.0", min_driver=13000), (9, 0), 12040)
        assert order(got) == ["cpu"]
        assert {c.code for c in got if not c.accepted} == {reasons.DRIVER_TOO_OLD}
        assert "driver is 12.4" in got[0].reason

    def test_ptx_isa_newer_than_driver(self):
        got = rank(matrix(isa="8.5"), (9, 0), 12040)
        ptx = next(c for c in got if c.variant == "ptx")
        assert ptx.code == reasons.DRIVER_TOO_OLD and "PTX ISA 8.5 needs driver CUDA 12.5" in ptx.reason
        assert order(got) == ["cuda12/fatbin", "cpu"]

    def test_capability_below_minimum(self):
        got = rank(matrix(), (7, 0), 12040)
        assert order(got) == ["cpu"]
        assert all(c.code == reasons.CAPABILITY_TOO_LOW for c in got if not c.accepted)

    def test_device_problem_rejects_all(self):
        got = rank(matrix(), None, None, device_problem=(reasons.NO_DRIVER, "no libcuda"))
        assert order(got) == ["cpu"] and all(c.code == reasons.NO_DRIVER for c in got[:-1])


class TestPolicy:
    def test_forced_variant_goes_first_even_if_rules_reject_it(self):
        got = rank(matrix(), (9, 0), 12040, forced="sm75")
        assert got[0].variant == "sm75" and got[0].code == reasons.FORCED
        assert order(got)[1:] == ["cuda12/fatbin", "cuda12/ptx", "cpu"]

    def test_forced_cpu(self):
        assert [c.variant for c in rank(matrix(), (9, 0), 12040, forced="cpu")] == ["cpu"]

    def test_both_extras_newer_cuda_wins_within_a_tier(self):
        arts = matrix() + matrix(cuda="cuda13", version="13.0", isa="9.0", min_driver=13000, newest="121")
        got = order(rank(arts, (9, 0), 13000))
        assert got[:2] == ["cuda13/fatbin", "cuda12/fatbin"]
        assert got[2:4] == ["cuda13/ptx", "cuda12/ptx"]


@pytest.mark.parametrize("cc", [(7, 5), (8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0)])
def test_deterministic_and_total(cc):
    arts = matrix() + matrix(cuda="cuda13", version="13.0", isa="9.0", min_driver=13000)
    first, second = rank(arts, cc, 13000), rank(list(reversed(arts)), cc, 13000)
    assert [c.label for c in first] == [c.label for c in second]
    assert len(first) == len(arts) + 1 and first[-1].variant == "cpu"
    assert all(c.reason for c in first)


# ---- the whole decision (select.decide): policy, driver facts and installed packages in, one Decision out


def _found(*artifacts, error=None, problems=(), refused=(), extras=("cuda12", "cuda13")) -> Discovery:
    pkg = InstalledPackage(
        "cuda12", "cuplug_cuda12", "/site/cuplug_cuda12", tuple(artifacts), error, "cuplug_cuda12", problems
    )
    packages = (pkg,) if artifacts or error or problems else ()
    return Discovery("vector", None, packages, tuple(refused), None, None, extras)


def _probe(cc=(9, 0), driver=12040, code=reasons.OK, reason="", devices=1) -> ProbeResult:
    devs = tuple(Device(i, "GPU", cc, 1 << 30, f"GPU-{i}") for i in range(devices))
    return ProbeResult(code, reason, driver_found=True, driver_version=driver, devices=devs)


def _decide(env=None, probe=None, found=None):
    return select.decide("vector", policy.from_env(env or {}), probe, found if found is not None else _found(*matrix()))


class TestDecide:
    def test_the_best_candidate_is_the_decision_and_the_cpu_comes_last(self):
        d = _decide(probe=_probe())
        assert d.chosen.label == "cuda12/fatbin" and (d.code, d.reason) == (d.chosen.code, d.chosen.reason)
        assert [c.label for c in d.to_try] == ["cuda12/fatbin", "cuda12/ptx"] and d.cpu.variant == "cpu"
        assert d.candidates[-1] is d.cpu and d.forced is None

    def test_the_kill_switch_decides_alone(self):
        d = _decide({"CUPLUG_DISABLE_CUDA": "1"}, probe=None)
        assert d.code == reasons.DISABLED and [c.variant for c in d.candidates] == ["cpu"]
        assert d.reason == "CUPLUG_DISABLE_CUDA=1: CUDA disabled, libcuda.so.1 not opened" and d.to_try == ()

    def test_a_forced_variant_is_first_and_named(self):
        d = _decide({"CUPLUG_BACKEND": "sm75"}, probe=_probe())
        assert d.forced is d.chosen and d.chosen.variant == "sm75" and d.code == reasons.FORCED
        d = _decide({"CUPLUG_BACKEND": "cpu"}, probe=None)
        assert d.chosen is d.cpu and d.forced is d.cpu and d.code == reasons.FORCED and d.to_try == ()

    @pytest.mark.parametrize(
        ("forced", "ok"),
        [("sm80", True), ("cuda12:sm80", True), ("CUDA12:SM80", True), ("cuda13:sm80", False), ("bogus", False)],
    )
    def test_a_forced_variant_nobody_installed_is_a_config_error(self, forced, ok):
        if ok:
            assert _decide({"CUPLUG_BACKEND": forced}, probe=_probe()).code == reasons.FORCED
            return
        with pytest.raises(ConfigError) as err:
            _decide({"CUPLUG_BACKEND": forced}, probe=_probe())
        assert str(err.value).startswith(f"CUPLUG_BACKEND={forced!r}: no installed artifact of backend 'vector' is ")
        assert "installed: cuda12:fatbin, cuda12:ptx, cuda12:sm75, cuda12:sm80; or cpu, auto" in str(err.value)

    @pytest.mark.parametrize(
        ("probe", "code"),
        [
            (ProbeResult(reasons.NO_DRIVER, "libcuda.so.1 not found"), reasons.NO_DRIVER),
            (_probe(devices=0), reasons.NO_DEVICE),  # CUPLUG_DEVICE=0 of no device
            (_probe(cc=(7, 0)), reasons.CAPABILITY_TOO_LOW),
        ],
    )
    def test_a_forced_variant_never_wins_over_a_device_problem(self, probe, code):
        """CUPLUG_BACKEND overrides the ranking rules, not the facts: with no driver, no device or a GPU below
        the minimum there is nothing to run a CUDA variant on, so the forced one is rejected like every other
        and the CPU serves with the device's reason (forcing cannot make load() dlopen a CUDA library then)."""
        d = _decide({"CUPLUG_BACKEND": "sm75"}, probe=probe)
        assert d.code == code and d.chosen is d.cpu and d.forced is None and d.to_try == ()
        sm75 = next(c for c in d.candidates if c.variant == "sm75")
        assert not sm75.accepted and sm75.code == code and sm75.tier == select.TIER_REJECTED

    @pytest.mark.parametrize("major", ["cuda12", "cuda13"])
    def test_a_forced_cuda_major_forces_that_majors_variant_only(self, major):
        """CUPLUG_BACKEND=cudaNN:fatbin with both extras installed forces that major's fatbin; the other
        major's fatbin is ranked by the rules like any candidate (cuda13 would otherwise win a tie)."""
        arts = matrix() + matrix(cuda="cuda13", version="13.0", isa="9.0", min_driver=13000)
        d = _decide({"CUPLUG_BACKEND": f"{major}:fatbin"}, probe=_probe(driver=13000), found=_found(*arts))
        assert d.chosen.label == f"{major}/fatbin" and d.code == reasons.FORCED
        assert [c.label for c in d.candidates if c.code == reasons.FORCED] == [f"{major}/fatbin"]
        other = next(c for c in d.candidates if c.label == f"{'cuda13' if major == 'cuda12' else 'cuda12'}/fatbin")
        assert other.accepted and other.code == reasons.OK and other.tier == select.TIER_EXACT_SASS

    def test_a_forced_variant_when_nothing_is_installed_names_none(self):
        with pytest.raises(ConfigError, match="installed: none; or cpu"):
            _decide({"CUPLUG_BACKEND": "sm80"}, probe=_probe(), found=_found())

    def test_a_failed_probe_is_the_reason(self):
        d = _decide(probe=ProbeResult(reasons.NO_DRIVER, "libcuda.so.1 not found"))
        assert (d.code, d.reason) == (reasons.NO_DRIVER, "libcuda.so.1 not found") and d.chosen is d.cpu

    def test_the_device_asked_for_must_exist_and_say_its_capability(self):
        d = _decide({"CUPLUG_DEVICE": "1"}, probe=_probe())
        assert (d.code, d.reason) == (reasons.NO_DEVICE, "CUPLUG_DEVICE=1 but the driver shows 1 device(s)")
        assert _decide({"CUPLUG_DEVICE": "1"}, probe=_probe(devices=2)).chosen.label == "cuda12/fatbin"
        blind = ProbeResult(
            reasons.OK, "", driver_version=12040, devices=(Device(0, "GPU", None, None, None, "attr 75 failed"),)
        )
        d = _decide(probe=blind)
        assert (d.code, d.reason) == (reasons.DRIVER_INIT_FAILED, "device 0: attr 75 failed")
        blind = blind._replace(devices=(Device(0, "GPU", None, None, None),))
        assert _decide(probe=blind).reason == "device 0: capability unknown"

    def test_without_artifacts_the_reason_says_what_to_install(self):
        d = _decide(probe=_probe(), found=_found())
        assert d.code == reasons.NO_BACKEND_INSTALLED
        assert (
            d.reason
            == "no CUDA artifact of backend 'vector' installed (pip install 'vector[cuda12]' or 'vector[cuda13]')"
        )
        d = _decide(probe=_probe(), found=_found(extras=()))
        assert d.reason.endswith("(install the CUDA extra of the package that provides 'vector')")
        refused = Refused("zzz_cuda12", "/site/zzz.dist-info", "cuplug.backends: vector = zzz", "not cuplug's")
        d = _decide(probe=_probe(), found=_found(refused=[refused, refused]))
        assert d.reason.endswith("; not trusted: zzz_cuda12")

    def test_unusable_manifests_are_the_reason_when_nothing_else_is_installed(self):
        d = _decide(probe=_probe(), found=_found(error="manifest.json is not valid JSON"))
        assert (d.code, d.reason) == (
            reasons.ARTIFACT_CORRUPT,
            "no usable manifest: cuplug_cuda12: manifest.json is not valid JSON",
        )
        d = _decide(probe=_probe(), found=_found(problems=("entry 0: bad", "entry 1: worse")))
        assert d.reason == "no usable manifest: cuplug_cuda12: entry 0: bad; cuplug_cuda12: entry 1: worse"

    @pytest.mark.parametrize(
        ("cc", "extra", "code"),
        [
            # below CC 7.5 every artifact is capability-too-low; a driver too old is named before no compatible code
            (
                (7, 0),
                {"variant": "ptx70", "sass": (), "ptx": ("compute_70",), "ptx_isa": "8.5"},
                reasons.CAPABILITY_TOO_LOW,
            ),
            ((8, 0), {"variant": "sm90", "sass": ("sm_90",)}, reasons.DRIVER_TOO_OLD),
            ((8, 0), None, reasons.NO_COMPATIBLE_ARTIFACT),
        ],
    )
    def test_when_every_artifact_is_rejected_the_most_actionable_reason_is_named(self, cc, extra, code):
        arts = [make_variant(variant="sm90only", sass=("sm_90",))]  # no compatible code on CC 8.0 or 7.0
        if code == reasons.DRIVER_TOO_OLD:
            arts.append(make_variant(variant="sm80new", sass=("sm_80",), cuda_version="12.9", min_driver=12090))
        if code == reasons.CAPABILITY_TOO_LOW:
            arts = [*matrix(), make_variant(**extra)]
        elif extra:
            arts.append(make_variant(**extra))
        d = _decide(probe=_probe(cc, 12040), found=_found(*arts))
        codes = {c.code for c in d.candidates if not c.accepted}
        assert d.code == code and d.chosen is d.cpu and len(codes) == (2 if code == reasons.DRIVER_TOO_OLD else 1)
        example = next(c for c in d.candidates if c.code == code)
        assert d.reason == "every installed artifact rejected; e.g. " + example.reason


# ---- what each candidate says: the operator reads these in `cuplug explain` / `doctor`


def _one(artifact, cc, driver=12040, **kw):
    return rank([artifact], cc, driver, **kw)[0]


class TestArchitectureRules:
    @pytest.mark.parametrize(
        ("sass", "cc", "accepted"),
        [
            (("sm_80",), (8, 6), True),  # same major, lower minor: runs
            (("sm_86",), (8, 0), False),  # same major, higher minor: does not
            (("sm_90",), (8, 6), False),  # a higher major never runs, whatever its minor
            (("sm_75",), (8, 0), False),  # nor a lower major
            (("sm_80",), (7, 5), False),
        ],
    )
    def test_sass_runs_only_on_its_major_at_a_minor_at_least_its_own(self, sass, cc, accepted):
        c = _one(make_variant(variant="v", sass=sass, ptx=()), cc)
        assert c.accepted is accepted and c.artifact is not None
        assert c.code == (reasons.OK if accepted else reasons.NO_COMPATIBLE_ARTIFACT)

    def test_the_highest_lower_minor_is_the_one_named(self):
        # sm_87 is Jetson Orin's: a Tegra GPU's SASS serves no desktop 8.9 (contract/targets.py, [tegra])
        c = _one(make_variant(variant="v", sass=("sm_80", "sm_86", "sm_87")), (8, 9))
        assert c.reason == "SASS of a lower minor sm_86 for CC 8.9"
        assert _one(make_variant(variant="v", sass=("sm_86", "sm_90")), (9, 0)).reason == "exact SASS sm_90 for CC 9.0"

    def test_ptx_runs_on_its_own_target_and_above_never_below(self):
        ptx = make_variant(variant="ptx", sass=(), ptx=("compute_86",), ptx_isa="8.4")
        assert _one(ptx, (8, 6)).accepted and _one(ptx, (9, 0)).accepted
        below = _one(ptx, (8, 0))
        assert not below.accepted and below.code == reasons.NO_COMPATIBLE_ARTIFACT

    def test_a_ptx_target_too_high_does_not_hide_a_lower_one(self):
        # manifests list targets as strings: compute_120 sorts before compute_80
        ptx = make_variant(variant="ptx", sass=(), ptx=("compute_120", "compute_80"), ptx_isa="8.4")
        c = _one(ptx, (9, 0))
        assert c.accepted and c.reason.startswith("PTX compute_80 ")

    def test_the_minimum_capability_itself_is_supported(self):
        c = _one(make_variant(variant="sm75", sass=("sm_75",)), (7, 5))
        assert c.accepted and c.code == reasons.OK
        low = _one(make_variant(variant="sm75", sass=("sm_75",)), (7, 2))
        assert (low.code, low.reason) == (reasons.CAPABILITY_TOO_LOW, "CC 7.2 is below the minimum 7.5")

    def test_without_a_driver_version_nothing_is_judged(self):
        c = _one(make_variant(), (8, 0), None)
        assert (c.accepted, c.code, c.reason) == (False, reasons.NO_DEVICE, "no device facts")


class TestReasonTexts:
    def test_an_accepted_candidate_says_its_rule_and_the_device(self):
        assert _one(make_variant(sass=("sm_80",)), (8, 6)).reason == "SASS of a lower minor sm_80 for CC 8.6"
        ptx = make_variant(variant="ptx", sass=(), ptx=("compute_75",), ptx_isa="8.4")
        assert _one(ptx, (8, 6)).reason == (
            "PTX compute_75 (ISA 8.4) JIT-compiled for CC 8.6; first launch pays the JIT"
        )

    def test_a_rejected_candidate_says_why_for_each_target(self):
        arts = make_variant(sass=("sm_75", "sm_86", "sm_90a"), ptx=("compute_90",), ptx_isa="8.4")
        c = _one(arts, (8, 0))
        assert c.reason == (
            "sm_75 SASS cannot run on CC 8.0: different major; sm_86 SASS needs CC >= 8.6; "
            "sm_90a SASS runs only on exactly CC 9.0; compute_90 PTX needs CC >= 9.0"
        )
        c = _one(make_variant(sass=("sm_90a",), ptx=()), (9, 1))
        assert c.reason == "sm_90a SASS runs only on exactly CC 9.0; no PTX"
        assert _one(make_variant(sass=(), ptx=()), (8, 0)).reason == "no SASS; no PTX"

    def test_more_than_three_targets_are_cut_short(self):
        c = _one(make_variant(sass=("sm_86", "sm_87", "sm_89", "sm_90"), ptx=()), (8, 0))
        assert c.reason == (
            "sm_86 SASS needs CC >= 8.6; sm_87 SASS needs CC >= 8.7; sm_89 SASS needs CC >= 8.9; ...; no PTX"
        )
        c = _one(make_variant(sass=("sm_86", "sm_87", "sm_89"), ptx=()), (8, 0))
        assert c.reason.endswith("sm_89 SASS needs CC >= 8.9; no PTX")

    def test_a_forced_candidate_says_what_the_rules_would_have_said(self):
        arts = matrix()
        ok = rank(arts, (8, 0), 12040, forced="sm80")[0]
        assert ok.reason == "CUPLUG_BACKEND=sm80: forced (would be accepted: exact SASS sm_80 for CC 8.0)"
        bad = rank(arts, (9, 0), 12040, forced="sm75")[0]
        assert bad.reason.startswith("CUPLUG_BACKEND=sm75: forced (rules say: sm_75 SASS cannot run on CC 9.0")

    def test_an_unreadable_manifest_is_a_rejected_candidate(self):
        got = rank(matrix(), (9, 0), 12040, unusable_packages=[("cuda13", "manifest.json is not valid JSON")])
        broken = [c for c in got if c.variant == "manifest"]
        assert len(broken) == 1 and not broken[0].accepted and broken[0].code == reasons.ARTIFACT_CORRUPT
        assert got[-1].variant == "cpu" and got.index(broken[0]) == len(got) - 2

    def test_the_fallback_example_is_a_candidate_of_the_code_named(self):
        # cuda12's artifact (listed first) has no code for CC 8.0; cuda13's needs a newer driver: that is named
        arts = [
            make_variant(variant="sm90", sass=("sm_90",), cuda="cuda12"),
            make_variant(variant="sm80", sass=("sm_80",), cuda="cuda13", cuda_version="13.0", min_driver=13000),
        ]
        d = _decide(probe=_probe((8, 0), 12040), found=_found(*arts))
        assert d.code == reasons.DRIVER_TOO_OLD
        assert d.reason == (
            "every installed artifact rejected; e.g. built with the CUDA 13.0 runtime, which needs a driver "
            "for CUDA >= 13.0; the driver is 12.4"
        )
        assert d.forced is None and d.chosen is d.cpu
        # nothing forced: no candidate is called forced, whatever code the first one carries
        d = _decide(probe=_probe((8, 0), 12040), found=_found(arts[1]))
        assert d.candidates[0].code == reasons.DRIVER_TOO_OLD and d.forced is None
