"""quantkit's own tests: they run against the installed package (GPU or the CPU twin).

Every result is compared bit for bit with the NumPy reference (reference.py), which
computes the formulas of the README op by op in float32.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import quantkit
import reference
from bf16 import BF16

import cuplug

BLOCKSIZES = [64, 128, 256, 1024, 4096]
SHAPES = [(1,), (63,), (64,), (65,), (1000,), (3, 257), (4096,), (2, 3, 1001), (100_003,)]
BAD_BLOCKSIZES = [32, 100, 96, 8192, 1 << 40]


def _np(result: object, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """A host result as NumPy: its bytes (NumPy, array.array and cuplug.HostTensor all give tobytes())."""
    return np.frombuffer(result.tobytes(), dtype=dtype).reshape(shape)


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def _values(shape: tuple[int, ...], seed: int, kind: str = "normal") -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    if kind == "normal":
        x = rng.standard_normal(n) * np.exp(rng.uniform(-4, 4, n))
    elif kind == "special":  # zeros of both signs, infinities, NaN, subnormals, huge values
        x = rng.standard_normal(n) * np.exp(rng.uniform(-30, 30, n))
        pick = rng.integers(0, 64, n)
        for k, v in enumerate([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -3e-39, 3e38]):
            x[pick == k] = v
    else:  # ties: blocks whose absmax is 127, so x * scale = x exactly, and x = k + 0.5
        x = rng.integers(-127, 127, n) + 0.5
        x[::64] = 127.0
    return x.astype(np.float32).reshape(shape)


def _inputs(dtype: str, xf: np.ndarray) -> tuple[object, np.ndarray]:
    """(what quantkit gets, its exact float32 values)."""
    if dtype == "float32":
        return xf, xf
    if dtype == "float16":
        with np.errstate(over="ignore"):
            h = xf.astype(np.float16)
        return h, h.astype(np.float32)
    bits = reference.f32_to_bf16_bits(xf)
    return BF16(bits), reference.bf16_bits_to_f32(bits).reshape(xf.shape)


def _check_quantize(x: object, xf: np.ndarray, blocksize: int) -> tuple[np.ndarray, np.ndarray]:
    q, absmax = quantkit.quantize(x, blocksize=blocksize)
    nb = -(-xf.size // blocksize)
    q, absmax = _np(q, "int8", xf.shape), _np(absmax, "float32", (nb,))
    want_q, want_a = reference.quantize(xf, blocksize)
    np.testing.assert_array_equal(_bits(absmax), _bits(want_a))
    np.testing.assert_array_equal(q, want_q)
    return q, absmax


def test_the_backend_says_what_it_is():
    with quantkit.load() as b:
        assert set(b.ops) == {"quantize_blockwise", "dequantize_blockwise"}
        assert b.info()["backend"] == "quant"
        assert b.trace.decision_reason


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_quantize_matches_the_reference_bit_for_bit(dtype, shape):
    for i, blocksize in enumerate(BLOCKSIZES):
        x, xf = _inputs(dtype, _values(shape, seed=i))
        _check_quantize(x, xf, blocksize)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("kind", ["special", "ties"])
def test_special_values_and_ties_match_the_reference(dtype, kind):
    for blocksize in (64, 256, 4096):
        x, xf = _inputs(dtype, _values((3 * blocksize + 5,), seed=blocksize, kind=kind))
        _, absmax = _check_quantize(x, xf, blocksize)
        if kind == "special":
            nan_blocks = np.isnan(absmax)
            assert nan_blocks.any() and _bits(absmax[nan_blocks]).tolist() == [0x7FC00000] * int(nan_blocks.sum())


def test_the_documented_cases():
    x = np.zeros(4 * 64, np.float32)
    x[64:128] = np.linspace(-2, 2, 64)  # block 1: absmax 2
    x[128] = np.nan  # block 2: NaN -> absmax NaN, q all 0
    x[129] = 5.0
    x[192] = np.inf  # block 3: inf -> scale 0, q all 0
    x[193] = 1.0
    q, absmax = quantkit.quantize(x, blocksize=64)
    assert absmax[0] == 0 and (q[:64] == 0).all()  # block 0: all zero -> q 0
    assert absmax[1] == 2 and q[64] == -127 and q[127] == 127
    assert np.isnan(absmax[2]) and (q[128:192] == 0).all()
    assert absmax[3] == np.inf and (q[192:] == 0).all()
    y = quantkit.dequantize(q, absmax, blocksize=64)
    assert (y[:64] == 0).all() and y[64] == -2 and np.isnan(y[128:]).all()


def test_default_blocksize_is_256():
    x = _values((1000,), seed=3)
    q, absmax = quantkit.quantize(x)
    assert absmax.shape == (4,)
    np.testing.assert_array_equal(quantkit.dequantize(q, absmax), reference.dequantize(q, absmax, 256))


@pytest.mark.parametrize("shape", [(1,), (65,), (3, 257), (100_003,)], ids=str)
@pytest.mark.parametrize("blocksize", [64, 256, 4096])
def test_dequantize_matches_the_reference_bit_for_bit(shape, blocksize):
    rng = np.random.default_rng(blocksize)
    q = rng.integers(-127, 128, shape).astype(np.int8)
    absmax = np.abs(rng.standard_normal(-(-q.size // blocksize))).astype(np.float32) * 10
    absmax[0] = 0.0
    y = quantkit.dequantize(q, absmax, blocksize=blocksize)
    assert y.dtype == np.float32 and y.shape == q.shape
    np.testing.assert_array_equal(_bits(y), _bits(reference.dequantize(q, absmax, blocksize)))


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("blocksize", [64, 256, 4096])
def test_round_trip_error_is_within_half_a_step(dtype, blocksize):
    x, xf = _inputs(dtype, _values((5 * blocksize + 17,), seed=7))
    q, absmax = quantkit.quantize(x, blocksize=blocksize)
    nb = -(-xf.size // blocksize)
    q, absmax = _np(q, "int8", xf.shape), _np(absmax, "float32", (nb,))
    y = quantkit.dequantize(q, absmax, blocksize=blocksize)
    step = np.repeat(absmax.astype(np.float64) / 127, blocksize)[: xf.size]
    err = np.abs(y.astype(np.float64) - xf.astype(np.float64))
    # half a step from rounding, plus the three float32 roundings (scale, product, dequant scale)
    assert (err <= step * (0.5 + 1e-4) + 1e-45).all(), float((err / step).max())


@pytest.mark.parametrize("blocksize", BAD_BLOCKSIZES)
def test_a_bad_blocksize_is_refused_with_the_ops_message(blocksize):
    x = np.ones(300, np.float32)
    want = f"blocksize must be a power of two in \\[64, 4096\\], got {blocksize}"
    with pytest.raises(cuplug.InvalidInputError, match=want) as exc:
        quantkit.quantize(x, blocksize=blocksize)
    assert "quantize_blockwise" in str(exc.value)
    q = np.zeros(300, np.int8)
    with pytest.raises(cuplug.InvalidInputError, match=want):
        quantkit.dequantize(q, np.ones(-(-300 // blocksize), np.float32), blocksize=blocksize)


@pytest.mark.parametrize("blocksize", [0, -256])
def test_a_blocksize_that_is_not_positive_is_refused(blocksize):
    with pytest.raises(cuplug.InvalidInputError, match="blocksize"):
        quantkit.quantize(np.ones(300, np.float32), blocksize=blocksize)


def test_dequantize_checks_the_length_of_absmax():
    """The signature gives absmax its shape (one scale per block of q): refused before the call."""
    q = np.zeros(300, np.int8)
    with pytest.raises(
        cuplug.InvalidInputError, match=r"dequantize_blockwise: absmax has shape \[1\]; it must be \[2\]"
    ):
        quantkit.dequantize(q, np.ones(1, np.float32))
    with pytest.raises(cuplug.InvalidInputError, match=r"absmax has shape \[3\]; it must be \[2\]"):
        quantkit.dequantize(q, np.ones(3, np.float32))
    with pytest.raises(cuplug.InvalidInputError, match=r"absmax has shape \[3\]; it must be \[5\]"):
        quantkit.dequantize(q, np.ones(3, np.float32), blocksize=64)


def test_the_signature_refuses_other_dtypes():
    with pytest.raises(cuplug.InvalidInputError, match="float64"):
        quantkit.quantize(np.ones(300, np.float64))
    with pytest.raises(cuplug.InvalidInputError, match="int32"):
        quantkit.dequantize(np.zeros(300, np.int32), np.ones(2, np.float32))


def test_out_writes_into_the_callers_arrays():
    x = _values((2, 700), seed=11)
    q, absmax = np.empty((2, 700), np.int8), np.empty(6, np.float32)
    got = quantkit.quantize(x, blocksize=256, out=(q, absmax))
    assert got[0] is q and got[1] is absmax
    want_q, want_a = reference.quantize(x, 256)
    np.testing.assert_array_equal(q, want_q)
    np.testing.assert_array_equal(_bits(absmax), _bits(want_a))


def test_unknown_op_names_the_ones_it_has():
    with quantkit.load() as b, pytest.raises(cuplug.UnknownOpError, match="quantize_blockwise"):
        b.run("prefix_sum", np.ones(4, np.float32))


def test_doctor_knows_the_backend(tmp_path):
    # Run outside the project: `python -m` puts the working directory first on sys.path.
    proc = subprocess.run(
        [sys.executable, "-m", "cuplug", "doctor", "--json", "--backend", "quant"],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    )
    doc = json.loads(proc.stdout)
    assert doc["decision"]["backend"] == "quant" and doc["loaded"]["ok"], doc
