"""gemmkit's own tests: they run against the installed package (CPU twin, or cuBLAS on a GPU)."""

from __future__ import annotations

import array
import os
import shutil

import gemmkit
import pytest

import cuplug


def _reference(a: array.array, b: array.array, side: int) -> list[float]:
    return [sum(a[i * side + k] * b[k * side + j] for k in range(side)) for i in range(side) for j in range(side)]


def _operands(side: int) -> tuple[array.array, array.array]:
    a = array.array("f", [float((i * 7) % 11 - 5) for i in range(side * side)])
    b = array.array("f", [float((i * 5) % 13 - 6) / 4 for i in range(side * side)])
    return a, b


@pytest.mark.parametrize("side", [1, 3, 64, 65])
def test_gemm_matches_a_reference(side):
    a, b = _operands(side)
    got = gemmkit.gemm(a, b, side)
    assert list(got) == _reference(a, b, side)  # small integers and quarters: exact in float32 either way


def test_a_wrong_side_is_the_ops_own_message():
    a, b = _operands(4)
    with pytest.raises(cuplug.CuplugError, match="side\\*side elements"):
        gemmkit.gemm(a, b, 5)


def test_the_backend_says_what_it_is():
    with gemmkit.load() as b:
        assert set(b.ops) == {"gemm"} and b.info()["backend"] == "gemm"


@pytest.mark.skipif(
    not (shutil.which("nvidia-smi") and os.path.exists("/dev/nvidiactl")), reason="needs a real NVIDIA GPU"
)
def test_cublas_serves_on_a_gpu_and_agrees_with_the_twin():
    side = 128
    a, b = _operands(side)
    with gemmkit.load() as gpu:
        assert gpu.variant != "cpu", gpu.trace.text()
        got = list(gpu.run("gemm", a, b, side=side))
    os.environ["CUPLUG_BACKEND"] = "cpu"
    try:
        with gemmkit.load() as twin:
            want = list(twin.run("gemm", a, b, side=side))
    finally:
        del os.environ["CUPLUG_BACKEND"]
    assert got == want
