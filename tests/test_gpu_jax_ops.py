"""On a real GPU (issue 30, part 4): cuplug ops as JAX FFI targets on the CUDA platform. jax.jit of a function of
them runs as XLA custom calls on XLA's buffers and stream, gives what jax.numpy gives, and leaves its results on
the device. Skips without a GPU or without jax's CUDA plugin (the CPU half is tests/test_jax_ops.py)."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = jax.numpy
try:
    GPUS = jax.devices("gpu")
except RuntimeError:
    GPUS = []
if not GPUS:
    pytest.skip("no CUDA device for JAX", allow_module_level=True)

import cuplug  # noqa: E402
import cuplug.jax  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def b():
    with cuplug.load() as backend:
        assert backend.device_type == 2, backend.trace
        yield backend


@pytest.fixture(scope="module")
def ops(b):
    return cuplug.jax.register(b)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "int8", "uint8", "int32"])
def test_jitted_ops_run_on_the_gpu_and_give_what_jax_numpy_gives(ops, dtype):
    with jax.default_device(GPUS[0]):
        x = (jnp.arange(3 * 1024) % 7).astype(dtype).reshape(3, 1024)
        y = (jnp.arange(3 * 1024) % 5).astype(dtype).reshape(3, 1024)
        f = jax.jit(lambda a, c: (ops.add(a, c), ops.scale_add(a, alpha=2.0, beta=1.0), ops.sum(a)))
        added, scaled, total = f(x, y)
    assert added.devices() == {GPUS[0]} and scaled.devices() == {GPUS[0]}  # results stay on the device
    np.testing.assert_array_equal(np.asarray(added), np.asarray(x + y))
    np.testing.assert_array_equal(np.asarray(scaled), np.asarray(x * 2 + 1))
    # the sum of small integers is exact in float64; the result is rounded once to the output's dtype (9213 is
    # 9216 in float16 and bfloat16), as jnp.sum's would be
    assert float(total) == float(np.asarray(np.asarray(x, dtype=np.float64).sum(), dtype=total.dtype))
    hlo = f.lower(x, y).as_text()
    assert "cuplug_call_cuda" in hlo  # an XLA custom call, not a host callback


def test_a_chain_of_jitted_calls_is_ordered_on_xlas_stream(ops):
    with jax.default_device(GPUS[0]):
        x = jnp.arange(1 << 22, dtype=jnp.float32)

        @jax.jit
        def chain(a):
            for _ in range(8):
                a = ops.scale_add(ops.add(a, a), alpha=0.5, beta=1.0)
            return a

        got = chain(x)
        want = x
        for _ in range(8):
            want = (want + want) * 0.5 + 1.0
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
