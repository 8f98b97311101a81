"""The build report (issue 32, part 4): per variant its size and compile seconds, read from Ninja's own log, and a
warning with the usual remedies for a heavy variant; written to build-report.json beside the manifest."""

from __future__ import annotations

import json

import pytest

from cuplug.kit import artifacts

LOG = """# ninja log v5
2\t3574\t1796478130119890742\tCMakeFiles/cuplug_vector_ptx.dir/cuda/vector.cu.o\t51f11b6116aaeabf
3574\t3626\t1796478130175890743\tptx/libcuplug_vector.so\t2c88b58f2698fdf5
3626\t7512\t1796478134059890845\tCMakeFiles/cuplug_vector_sm75.dir/cuda/vector.cu.o\t102f0db48c8209eb
7512\t7567\t1796478134115890846\tsm75/libcuplug_vector.so\t7d135db1a5af1011
2\t18192\t1796478144727891124\tCMakeFiles/cuplug_vector_fatbin.dir/cuda/vector.cu.o\tdc849b6b3f4ef276
2\t9000\t1796478144727891124\tCMakeFiles/cuplug_vector_fatbin.dir/cuda/kernels.cu.o\tdc849b6b3f4ef277
18192\t18244\t1796478144791891125\tfatbin/libcuplug_vector.so\t57f20cb66cdc1a6b
"""


def test_seconds_per_variant_come_from_ninjas_log(tmp_path):
    (tmp_path / ".ninja_log").write_text(LOG)
    got = artifacts.ninja_times(tmp_path, 0, ["fatbin", "ptx", "sm75", "sm80"])
    want = {"fatbin": 18.190 + 8.998 + 0.052, "ptx": 3.572 + 0.052, "sm75": 3.886 + 0.055, "sm80": 0.0}
    assert got == pytest.approx(want)  # two objects and a link for the fatbin; nothing built for sm80


def test_only_this_builds_lines_count_even_after_ninja_recompacted_its_log(tmp_path):
    log = tmp_path / ".ninja_log"
    built_at = 1796478144727891124  # the fatbin's outputs' mtime (ns): this build started just before them
    log.write_text(LOG)
    assert artifacts.ninja_times(tmp_path, built_at, ["fatbin", "ptx", "sm80"]) == pytest.approx(
        {"fatbin": 18.190 + 8.998 + 0.052, "ptx": 0.0, "sm80": 0.0}
    )
    # a recompacted log (Ninja rewrites it once it has grown): only the last entry of each output, in any order
    log.write_text("# ninja log v5\n" + "\n".join(reversed(LOG.splitlines()[1:])) + "\n")
    assert artifacts.ninja_times(tmp_path, built_at, ["fatbin"]) == pytest.approx({"fatbin": 18.190 + 8.998 + 0.052})
    with log.open("a") as fh:
        fh.write(f"100\t2100\t{built_at + 10**9}\tCMakeFiles/cuplug_vector_sm80.dir/cuda/vector.cu.o\tff\n")
    assert artifacts.ninja_times(tmp_path, built_at + 10**9, ["fatbin", "sm80"]) == {"fatbin": 0.0, "sm80": 2.0}
    assert artifacts.ninja_times(tmp_path / "nowhere", 0, ["sm80"]) == {"sm80": 0.0}


def test_a_heavy_variant_is_warned_with_the_remedies():
    assert artifacts.heavy("cuda13/sm80", 10.0, 1 << 20) is None
    slow = artifacts.heavy("cuda12/fatbin", 477.0, 54 << 20)
    assert slow.startswith("warning: cuda12/fatbin is heavy: 477 s of compiling (over 180) and 56.6 MB (over 34)")
    for remedy in ("fewer architectures", "sm_XXf", "--threads", "cuplug_dispatch<Mask>", "-Xptxas -O1"):
        assert remedy in slow


def test_the_reference_build_wrote_its_report(tmp_path):
    """The wheels of this run were built with the report: each variant's bytes as the manifest says."""
    import os
    from pathlib import Path

    root = Path(os.environ.get("CUPLUG_TEST_BUILD_DIR", Path(__file__).resolve().parents[1] / "build" / "backends"))
    reports = sorted(root.glob("cuda*/build-report.json"))
    if not reports:
        pytest.skip("no backends built in this checkout (nox -s build_backends)")
    for report in reports:
        doc = json.loads(report.read_text())
        manifest = json.loads((report.parent / "manifest.json").read_text())
        sizes = {a["variant"]: a["size"] for a in manifest["artifacts"]}
        assert {v: r["bytes"] for v, r in doc["variants"].items()} == sizes
        assert all(r["seconds"] >= 0 for r in doc["variants"].values())
