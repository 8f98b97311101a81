"""llmkit's ops against NumPy references, on whatever backend this machine has (the CPU twin without a GPU)."""

from __future__ import annotations

import llmkit
import numpy as np
import pytest

import cuplug
import cuplug.contract.dtypes

RNG = np.random.default_rng(32)


def _layernorm_ref(x, w, b, eps=1e-5):
    m = x.astype(np.float64).mean(-1)
    v = ((x - m[..., None]) ** 2).mean(-1)
    s = 1.0 / np.sqrt(v + eps)
    return ((x - m[..., None]) * s[..., None]) * w + b, m, s


@pytest.mark.parametrize("shape", [(2, 3, 64), (5, 1000), (7,), (1, 1, 1)])
def test_layernorm_gives_b_t_statistics(shape):
    x = RNG.standard_normal(shape).astype(np.float32)
    w, b = RNG.standard_normal(shape[-1]).astype(np.float32), RNG.standard_normal(shape[-1]).astype(np.float32)
    y, mean, rstd = llmkit.layernorm(x, w, b)
    assert y.shape == shape and mean.shape == shape[:-1] and rstd.shape == shape[:-1]
    ry, rm, rs = _layernorm_ref(x, w, b)
    np.testing.assert_allclose(mean, rm, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(rstd, rs, rtol=1e-4)
    np.testing.assert_allclose(y, ry, rtol=1e-4, atol=1e-4)


def test_layernorm_refuses_a_weight_of_another_width():
    with pytest.raises(cuplug.InvalidInputError, match=r"weight has shape \[3\]; it must be \[4\]"):
        llmkit.layernorm(np.ones((2, 4), np.float32), np.ones(3, np.float32), np.ones(4, np.float32))


@pytest.mark.parametrize("bins", [256, 16, 1000])
def test_histogram_counts_bytes_in_uint32(bins):
    data = RNG.integers(0, 256, 100_003, dtype=np.uint8)
    hist = llmkit.histogram(data, bins=bins)
    assert hist.dtype == np.uint32 and hist.shape == (bins,)
    want = np.bincount(data, minlength=max(bins, 256))[:bins]
    np.testing.assert_array_equal(hist, want)


def test_gelu_in_bfloat16():
    """bfloat16 in cuplug's own host memory (NumPy has no bfloat16): values exact in bfloat16 go in, the result is
    within one bfloat16 step of the float64 reference."""
    xs = [i / 8 for i in range(-48, 49)]  # multiples of 1/8 in [-6, 6]: exact in bfloat16
    x = cuplug.HostTensor(cuplug.contract.dtypes.BY_NAME["bfloat16"], (len(xs),))
    x.fill(xs)
    got = llmkit.gelu(x)
    assert isinstance(got, cuplug.HostTensor) and got.shape == x.shape
    v = np.array(xs)
    want = 0.5 * v * (1 + np.tanh(0.7978845608 * (v + 0.044715 * v**3)))
    assert np.max(np.abs(np.array(got.values()) - want)) <= 2**-7 * np.max(np.abs(want))


@pytest.mark.parametrize("shape", [(4, 33), (3, 2, 1024), (1, 5000)])
def test_softmax_over_the_last_dimension(shape):
    x = (RNG.standard_normal(shape) * 4).astype(np.float32)
    got = llmkit.softmax(x)
    e = np.exp(x.astype(np.float64) - x.max(-1, keepdims=True))
    np.testing.assert_allclose(got, e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7)


def test_the_signatures_say_the_shapes():
    ops = llmkit.load().ops
    assert "mean[x[:-1]]" in repr(ops["layernorm"]) and "hist[bins]" in repr(ops["histogram"])
