"""The target kinds' rules (contract/targets.py, issue 33 part 1) against a table written out by hand from NVIDIA's
documents, for every compute capability from 7.5 to 12.1 and every kind; the selection built on them; what a
toolkit can build, with the fix named; the fatbin reader's a/f flags.

The expectations below are the oracle: each row is what the cited rule says for that target, spelled as the set of
GPUs it serves, not computed by the code under test.
"""

from __future__ import annotations

import pytest

from cuplug.contract import reasons, targets
from cuplug.runtime import select
from test_select import make_variant

CCS = [(7, 5), (8, 0), (8, 6), (8, 7), (8, 9), (9, 0), (10, 0), (10, 1), (10, 3), (11, 0), (12, 0), (12, 1)]
ALL = set(CCS)

RUNS_ON: dict[str, set[tuple[int, int]]] = {
    # sm_XX: the same major at an equal or higher minor, desktop GPUs only; a Tegra GPU (8.7, 10.1, 11.0) its own
    "sm_75": {(7, 5)},
    "sm_80": {(8, 0), (8, 6), (8, 9)},
    "sm_86": {(8, 6), (8, 9)},
    "sm_87": {(8, 7)},
    "sm_89": {(8, 9)},
    "sm_90": {(9, 0)},
    "sm_100": {(10, 0), (10, 3)},
    "sm_101": {(10, 1)},
    "sm_103": {(10, 3)},
    "sm_110": {(11, 0)},
    "sm_120": {(12, 0), (12, 1)},
    "sm_121": {(12, 1)},
    # sm_XXa: exactly XX
    "sm_90a": {(9, 0)},
    "sm_100a": {(10, 0)},
    "sm_103a": {(10, 3)},
    "sm_120a": {(12, 0)},
    "sm_121a": {(12, 1)},
    # sm_XXf: the family (compute_100f: 10.0 and 10.3; compute_120f: 12.0 and 12.1)
    "sm_100f": {(10, 0), (10, 3)},
    "sm_103f": {(10, 3)},
    "sm_110f": {(11, 0)},
    "sm_120f": {(12, 0), (12, 1)},
    # compute_XX: any later GPU (the driver JIT-compiles it), Tegra or not
    "compute_75": ALL,
    "compute_80": ALL - {(7, 5)},
    "compute_90": {cc for cc in CCS if cc >= (9, 0)},
    "compute_120": {(12, 0), (12, 1)},
    # compute_XXa / compute_XXf: as the SASS of their kind
    "compute_90a": {(9, 0)},
    "compute_100a": {(10, 0)},
    "compute_100f": {(10, 0), (10, 3)},
    "compute_120f": {(12, 0), (12, 1)},
    # lto_XX: any later GPU, Tegra or not (nvJitLink links it for exactly that GPU)
    "lto_75": ALL,
    "lto_90": {cc for cc in CCS if cc >= (9, 0)},
}


@pytest.mark.parametrize("cc", CCS, ids=lambda cc: f"{cc[0]}.{cc[1]}")
@pytest.mark.parametrize("target", sorted(RUNS_ON))
def test_each_kind_runs_where_its_rule_says(target, cc):
    t = targets.parse(target)
    assert targets.runs_on(t, cc) is (cc in RUNS_ON[target])
    if cc not in RUNS_ON[target]:
        assert targets.why_not(t, cc).startswith(target)


def test_every_kind_of_the_table_is_covered_above():
    assert {targets.parse(t).kind.name for t in RUNS_ON} == {k.name for k in targets.KINDS}


@pytest.mark.parametrize("cc", CCS, ids=lambda cc: f"{cc[0]}.{cc[1]}")
@pytest.mark.parametrize("target", sorted(t for t in RUNS_ON if t.startswith("sm_")))
def test_the_selection_accepts_a_sass_variant_exactly_where_it_runs(target, cc):
    c = select.judge(make_variant(variant="v", sass=(target,), ptx=()), cc, 13000)
    assert c.accepted is (cc in RUNS_ON[target]), c.reason
    assert c.code == (reasons.OK if c.accepted else reasons.NO_COMPATIBLE_ARTIFACT)


@pytest.mark.parametrize("cc", CCS, ids=lambda cc: f"{cc[0]}.{cc[1]}")
@pytest.mark.parametrize("target", sorted(t for t in RUNS_ON if t.startswith("compute_")))
def test_the_selection_jits_a_ptx_variant_exactly_where_it_runs(target, cc):
    c = select.judge(make_variant(variant="ptx", sass=(), ptx=(target,), ptx_isa="8.4"), cc, 13000)
    assert c.accepted is (cc in RUNS_ON[target]), c.reason
    if c.accepted:
        assert c.tier == select.TIER_PTX


def test_an_arch_specific_variant_is_tried_before_the_plain_one_of_the_same_gpu():
    plain = make_variant(variant="sm90", sass=("sm_90",), size=100)
    specific = make_variant(variant="sm90a", sass=("sm_90a",), size=200)  # larger: still first
    fatbin = make_variant(variant="fatbin", sass=("sm_75", "sm_80", "sm_90"), ptx=("compute_90",), size=50)
    order = [c.variant for c in select.rank([plain, fatbin, specific], (9, 0), 13000) if c.accepted]
    assert order[:2] == ["sm90a", "fatbin"] and order[2] == "sm90"  # then the plain ones, the smaller first
    on_h20_like = [c.variant for c in select.rank([plain, specific], (9, 1), 13000) if c.accepted]
    assert on_h20_like == ["sm90", "cpu"]  # a 9.1 would not take 9.0a's code


def test_a_gpu_newer_than_every_sass_falls_to_ptx_or_names_the_driver():
    fatbin = make_variant(variant="fatbin", sass=("sm_75", "sm_120"), ptx=("compute_120",), ptx_isa="9.0")
    newer = select.judge(fatbin, (13, 0), 13000)
    assert newer.accepted and newer.tier == select.TIER_PTX and "compute_120" in newer.reason
    old_driver = select.judge(fatbin, (13, 0), 12080)
    assert not old_driver.accepted and old_driver.code == reasons.DRIVER_TOO_OLD
    assert "PTX ISA 9.0 needs driver CUDA 13.0, driver is 12.8" in old_driver.reason


@pytest.mark.parametrize(
    ("target", "cuda", "listed", "why"),
    [
        ("sm_90a", 12040, {"90"}, None),
        ("sm_100f", 12040, {"90"}, "sm_XXf targets need CUDA >= 12.9; this toolkit is 12.4"),
        ("sm_100f", 13000, {"100"}, None),
        ("sm_101", 13000, {"100", "110"}, "CUDA 13 renamed sm_101 to sm_110; declare sm_110"),
        ("sm_110", 12040, {"90"}, "calls it sm_101"),
        ("sm_70", 13000, {"75"}, "CUDA 13 compiles for CC >= 7.5 only"),
        ("sm_70", 12040, {"70", "75"}, None),
        ("sm_89", 13000, {"75", "80"}, "arch 89 is not supported by this nvcc"),
    ],
)
def test_what_a_toolkit_can_build_and_the_fix_when_it_cannot(target, cuda, listed, why):
    got = targets.buildable(targets.parse(target), cuda, frozenset(listed))
    assert got is None if why is None else (got is not None and why in got), got


@pytest.mark.parametrize("bad", ["sm_9", "sm_90b", "compute_", "sm90", "gfx_90a", "sm_９0", 90, None])
def test_a_bad_spelling_is_named(bad):
    with pytest.raises(ValueError, match="not a CUDA target"):
        targets.parse(bad)
