"""A backend's ops as JAX FFI targets (issue 30, part 4): cuplug.jax.register on the CPU twin with jaxlib CPU.

jax.jit of a function of cuplug ops compiles to XLA custom calls into the twin (no host round trip of
Python), with the results NumPy gives; a bad call fails at trace time naming the op; the handler is
built once per jaxlib and source. The CUDA half needs a GPU (tests/test_gpu_torch_ops.py's machine).
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = jax.numpy

import cuplug  # noqa: E402
import cuplug.jax  # noqa: E402
from conftest import clean_env, run_py  # noqa: E402
from cuplug.contract.errors import ConfigError, InvalidInputError  # noqa: E402


@pytest.fixture(scope="module")
def b():
    os.environ["CUPLUG_BACKEND"] = "cpu"
    try:
        with cuplug.load() as backend:
            yield backend
    finally:
        os.environ.pop("CUPLUG_BACKEND", None)


@pytest.fixture(scope="module")
def ops(b):
    return cuplug.jax.register(b)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64", "int8", "uint8", "int32"])
def test_jitted_ops_give_what_numpy_gives(ops, dtype):
    if dtype == "float64":
        jax.config.update("jax_enable_x64", True)
    try:
        x = (jnp.arange(24) % 7).astype(dtype).reshape(2, 3, 4)
        y = (jnp.arange(24) % 5).astype(dtype).reshape(2, 3, 4)
        f = jax.jit(lambda a, c: (ops.add(a, c), ops.scale_add(a, alpha=2.0, beta=1.0), ops.sum(a)))
        added, scaled, total = f(x, y)
        assert added.dtype == x.dtype and added.shape == (2, 3, 4)
        np.testing.assert_array_equal(np.asarray(added), np.asarray(x + y))
        np.testing.assert_array_equal(np.asarray(scaled), np.asarray(x * 2 + 1))
        assert float(total) == float(np.asarray(x, dtype=np.float64).sum())
    finally:
        jax.config.update("jax_enable_x64", False)


def test_a_bad_call_fails_while_tracing_naming_the_op(ops):
    with pytest.raises(InvalidInputError, match=r"^add: y must match x in dtype and shape \(lengths differ\)"):
        jax.jit(ops.add)(jnp.ones(4), jnp.ones(5))
    with pytest.raises(InvalidInputError, match=r"^scale_add: unknown attribute\(s\) gamma"):
        ops.scale_add(jnp.ones(4), gamma=1.0)


def test_the_handler_is_built_once_per_jaxlib_and_source(ops):
    lib = cuplug.jax.handler_library(jax)
    assert lib.is_file() and lib.parent.name == "xla-ffi"
    mtime = lib.stat().st_mtime_ns
    assert cuplug.jax.handler_library(jax) == lib and lib.stat().st_mtime_ns == mtime


def test_without_a_compiler_the_build_says_so(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    with pytest.raises(ConfigError, match=r"needs a C\+\+ compiler"):
        cuplug.jax.handler_library(jax)


def test_out_a_jax_array_is_refused_naming_the_fix(b):
    with pytest.raises(InvalidInputError, match=r"JAX arrays are immutable, so out= cannot write one"):
        b.run("add", np.ones(3, np.float32), np.ones(3, np.float32), out=jnp.zeros(3, jnp.float32))


def test_importing_cuplug_jax_imports_no_jax():
    proc = run_py("import sys, json, cuplug.jax; print(json.dumps('jax' in sys.modules))", clean_env())
    assert proc.returncode == 0 and json.loads(proc.stdout) is False, proc.stderr
