"""Selection is a pure function: facts in, ordered candidates with reasons out."""

from __future__ import annotations

import pytest

from cuplug.contract import reasons
from cuplug.contract.manifest import Artifact
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
