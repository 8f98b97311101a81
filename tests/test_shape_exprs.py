"""Shape expressions and the newer dtypes (issue 32, parts 1 and 2), on a CPU backend of the kernels the four
public ports needed, written here: a LayerNorm forward with three outputs ((B, T, C) -> y, and mean and rstd
of shape "x[:-1]" = (B, T); its weight and bias "x[-1]"), a uint8 -> uint32 histogram of "bins" bins, a
bfloat16 GeLU, a row softmax, and a count of a bool tensor.

C (cuplug_shape_expr) and Python (contract/shapeexpr.py) read one grammar: both accept the same calls, both
refuse the same ones, naming the op, the operand and the expression; b.ops shows the expressions.
"""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest

import cuplug
from conftest import ROOT, build_shared_library
from cuplug.contract import shapeexpr
from cuplug.runtime import api, library

LLM_BACKEND = textwrap.dedent(
    r"""
    #include <math.h>
    #include <stdint.h>
    #include <string.h>
    #include "cuplug_ops.h"
    static float bf(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }
    static uint16_t to_bf(float f) { uint32_t u; memcpy(&u, &f, 4); u += 0x7fffu + ((u >> 16) & 1u); return (uint16_t)(u >> 16); }
    static int layernorm(const cuplug_call* c) {
        const float *x = c->in[0].data, *w = c->in[1].data, *b = c->in[2].data;
        float *y = c->out[0].data, *mean = c->out[1].data, *rstd = c->out[2].data;
        const long long C = c->in[0].shape[c->in[0].ndim - 1], rows = C ? c->n / C : 0;
        const double eps = cuplug_attr_float(c, "eps");
        for (long long r = 0; r < rows; ++r) {
            const float* xr = x + r * C;
            double m = 0, v = 0;
            for (long long i = 0; i < C; ++i) m += xr[i];
            m /= C;
            for (long long i = 0; i < C; ++i) v += (xr[i] - m) * (xr[i] - m);
            const float s = (float)(1.0 / sqrt(v / C + eps));
            for (long long i = 0; i < C; ++i) y[r * C + i] = (float)((xr[i] - m) * s) * w[i] + b[i];
            mean[r] = (float)m, rstd[r] = s;
        }
        return CUPLUG_OK;
    }
    static int histogram(const cuplug_call* c) {
        const uint8_t* x = c->in[0].data;
        uint32_t* h = c->out[0].data;
        const long long bins = c->out[0].shape[0];
        memset(h, 0, sizeof(uint32_t) * (size_t)bins);
        for (long long i = 0; i < c->n; ++i) if (x[i] < bins) ++h[x[i]];
        return CUPLUG_OK;
    }
    static int gelu(const cuplug_call* c) {  /* llm.c's tanh approximation, in float32 */
        const uint16_t* x = c->in[0].data;
        uint16_t* o = c->out[0].data;
        for (long long i = 0; i < c->n; ++i) {
            float v = bf(x[i]);
            o[i] = to_bf(0.5f * v * (1.0f + tanhf(0.7978845608f * (v + 0.044715f * v * v * v))));
        }
        return CUPLUG_OK;
    }
    static int softmax(const cuplug_call* c) {
        const float* x = c->in[0].data;
        float* o = c->out[0].data;
        const long long C = c->in[0].ndim ? c->in[0].shape[c->in[0].ndim - 1] : 1, rows = C ? c->n / C : 0;
        for (long long r = 0; r < rows; ++r) {
            float m = -INFINITY;
            double s = 0;
            for (long long i = 0; i < C; ++i) m = fmaxf(m, x[r * C + i]);
            for (long long i = 0; i < C; ++i) s += expf(x[r * C + i] - m);
            for (long long i = 0; i < C; ++i) o[r * C + i] = (float)(expf(x[r * C + i] - m) / s);
        }
        return CUPLUG_OK;
    }
    static int count(const cuplug_call* c) {
        const uint8_t* x = c->in[0].data;
        long long n = 0;
        for (long long i = 0; i < c->n; ++i) n += x[i] != 0;
        memcpy(c->out[0].data, &n, sizeof n);
        return CUPLUG_OK;
    }
    static const cuplug_op cuplug_ops[] = {
        {"layernorm", layernorm, 0,
         {CUPLUG_IN("x", CUPLUG_F32), CUPLUG_IN_EXPR("weight", CUPLUG_F32, "x[-1]"),
          CUPLUG_IN_EXPR("bias", CUPLUG_F32, "x[-1]")},
         {CUPLUG_OUT_LIKE("y", 0), CUPLUG_OUT_EXPR("mean", CUPLUG_DT_LIKE, 0, "x[:-1]"),
          CUPLUG_OUT_EXPR("rstd", CUPLUG_DT_LIKE, 0, "x[:-1]")},
         {CUPLUG_ATTR_FLOAT("eps", 1e-5)}},
        {"histogram", histogram, 0, {CUPLUG_IN("x", CUPLUG_U8)},
         {CUPLUG_OUT_EXPR("hist", CUPLUG_DT_FIXED, CUPLUG_U32, "bins")}, {CUPLUG_ATTR_INT("bins", 256)}},
        {"gelu", gelu, CUPLUG_ELEMENTWISE, {CUPLUG_IN("x", CUPLUG_BF16)}, {CUPLUG_OUT_LIKE("out", 0)}},
        {"softmax", softmax, 0, {CUPLUG_IN("x", CUPLUG_F32)}, {CUPLUG_OUT_LIKE("out", 0)}},
        {"count", count, 0, {CUPLUG_IN("x", CUPLUG_BOOL)},
         {CUPLUG_OUT("n", CUPLUG_DT_ACCUM, 0, CUPLUG_SHAPE_SCALAR, 0, NULL)}},
    };
    #include "cuplug_cpu_backend.h"
    """
)


@pytest.fixture(scope="module")
def llm_path(tmp_path_factory):
    out = tmp_path_factory.mktemp("llm")
    src = out / "llm.c"
    src.write_text(LLM_BACKEND)
    lib = out / "libllm.so"
    build_shared_library(
        src,
        lib,
        "-std=c11",
        "-ffp-contract=off",
        "-fvisibility=hidden",
        "-Wno-missing-field-initializers",
        '-DCUPLUG_BACKEND_NAME="llm"',
        f"-I{ROOT / 'backends' / 'include'}",
        f"-I{ROOT / 'backends' / 'common'}",
        f"-Wl,--version-script={ROOT / 'backends' / 'cmake' / 'cuplug_exports.map'}",
        "-lpthread",
        "-lm",
    )
    return lib


@pytest.fixture
def b(llm_path, monkeypatch):
    monkeypatch.setenv("CUPLUG_BACKEND", "cpu")
    lib = library.BackendLibrary(str(llm_path))
    handle = lib.create(None)
    rc, text = lib.ping(handle)
    assert rc >= 0, text
    backend = api.Backend(lib, handle, json.loads(text))
    yield backend
    backend.close()


def test_the_ping_and_b_ops_show_the_expressions(b):
    ops = b._info["ops"]
    assert ops["layernorm"]["outputs"][1]["shape"] == {"expr": "x[:-1]"}
    assert ops["layernorm"]["inputs"][1]["shape"] == {"expr": "x[-1]"}
    assert ops["histogram"]["outputs"][0] == {"name": "hist", "dtype": {"fixed": "uint32"}, "shape": {"expr": "bins"}}
    assert repr(b.ops["layernorm"]) == (
        "layernorm(x: float32, weight[x[-1]]: float32, bias[x[-1]]: float32, eps=1e-05) -> (y, mean[x[:-1]], rstd[x[:-1]])"
    )
    assert b.ops["histogram"].shape_attrs == {"bins"}  # its value keys a prepared call


def _layernorm_ref(x, w, bias, eps=1e-5):
    m = x.astype(np.float64).mean(-1)
    v = ((x - m[..., None]) ** 2).mean(-1)
    s = (1.0 / np.sqrt(v + eps)).astype(np.float32)
    return ((x - m[..., None]) * s[..., None]).astype(np.float32) * w + bias, m.astype(np.float32), s


@pytest.mark.parametrize("shape", [(2, 3, 8), (5, 16), (7,), (2, 1, 3, 4)])
def test_a_three_output_row_reduction_gives_leading_dims(b, shape):
    rng = np.random.default_rng(3)
    x = rng.standard_normal(shape).astype(np.float32)
    w, bias = rng.standard_normal(shape[-1]).astype(np.float32), rng.standard_normal(shape[-1]).astype(np.float32)
    y, mean, rstd = b.run("layernorm", x, w, bias)
    assert y.shape == shape and mean.shape == shape[:-1] and rstd.shape == shape[:-1]
    ry, rm, rs = _layernorm_ref(x, w, bias)
    np.testing.assert_allclose(mean, rm, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(rstd, rs, rtol=1e-5)
    np.testing.assert_allclose(y, ry, rtol=1e-4, atol=1e-5)
    outs = (np.empty(shape, np.float32), np.empty(shape[:-1], np.float32), np.empty(shape[:-1], np.float32))
    assert b.run("layernorm", x, w, bias, out=outs) == outs  # out= of the shapes the expressions give


def test_python_and_c_refuse_the_same_calls(b):
    x = np.ones((2, 3, 8), np.float32)
    w = np.ones(8, np.float32)
    with pytest.raises(cuplug.InvalidInputError, match=r"^layernorm: weight has shape \[7\]; it must be \[8\]$"):
        b.run("layernorm", x, np.ones(7, np.float32), w)
    with pytest.raises(cuplug.InvalidInputError, match=r"mean must be float32\[2, 3\]"):
        b.run("layernorm", x, w, w, out=(np.empty_like(x), np.empty(6, np.float32), np.empty((2, 3), np.float32)))
    with pytest.raises(
        cuplug.InvalidInputError, match=r"shape 'x\[-1\]': x has 0 dimension\(s\), so it has no dimension -1"
    ):
        b.run("layernorm", np.ones((), np.float32), w, w)
    # C says the same, called directly (a C caller skips Python's checks)
    lib, h = b._core.lib, b._core.handle
    from test_cpu_abi_v2 import Dtype, Lib, attr, tensor

    direct = Lib(b._path)
    hh = direct.create()
    try:
        rc = direct.call(
            hh,
            "layernorm",
            [tensor(x), tensor(np.ones(7, np.float32)), tensor(w)],
            [tensor(np.empty_like(x)), tensor(np.empty((2, 3), np.float32)), tensor(np.empty((2, 3), np.float32))],
        )
        assert rc == -1 and "layernorm: weight has shape (7,); it must be (8,)" in direct.error(hh)
        rc = direct.call(
            hh,
            "layernorm",
            [tensor(x), tensor(w), tensor(w)],
            [tensor(np.empty_like(x)), tensor(np.empty(6, np.float32)), tensor(np.empty((2, 3), np.float32))],
        )
        assert rc == -1 and "mean" in direct.error(hh) and "(2, 3)" in direct.error(hh)
        one = np.ones((), np.float32)
        rc = direct.call(
            hh,
            "layernorm",
            [tensor(one), tensor(w), tensor(w)],
            [tensor(np.empty((), np.float32)), tensor(np.empty((), np.float32)), tensor(np.empty((), np.float32))],
        )
        assert rc == -1 and "shape 'x[-1]': x has 0 dimension(s), so it has no dimension -1" in direct.error(hh)
        hist = np.zeros(4, np.uint32)
        out = tensor(hist.view(np.int32), "int32")
        out.dtype = Dtype(1, 32, 1)  # kDLUInt 32
        assert (
            direct.call(
                hh, "histogram", [tensor(np.array([0, 1, 1, 3, 9], np.uint8), "uint8")], [out], [attr("bins", 4)]
            )
            == 0
        ), direct.error(hh)
        assert hist.tolist() == [1, 2, 0, 1]
    finally:
        direct.destroy(hh)
    assert lib is not None and h


def test_a_histogram_sized_by_an_attribute_in_uint32(b):
    x = np.random.default_rng(1).integers(0, 256, 10_000, dtype=np.uint8)
    hist = b.run("histogram", x)
    assert hist.dtype == np.uint32 and hist.shape == (256,)
    np.testing.assert_array_equal(hist, np.bincount(x, minlength=256).astype(np.uint32))
    small = b.run("histogram", x, bins=16)  # another value of a sizing attribute: another shape
    assert small.shape == (16,) and small.tolist() == np.bincount(x[x < 16], minlength=16).tolist()
    assert b.run("histogram", x, bins=0).shape == (0,)
    with pytest.raises(
        cuplug.InvalidInputError,
        match=r"histogram: shape 'bins': attribute bins sizes a shape, so it must be >= 0, got -1",
    ):
        b.run("histogram", x, bins=-1)
    torch = pytest.importorskip("torch")
    t = b.run("histogram", torch.from_numpy(x))
    assert t.dtype == torch.uint32 and t.shape == (256,) and t.to(torch.int64).sum() == 10_000


def test_bfloat16_gelu_softmax_and_a_count_of_bools(b):
    torch = pytest.importorskip("torch")
    x = torch.linspace(-4, 4, 1000, dtype=torch.bfloat16)
    got = b.run("gelu", x)
    want = torch.nn.functional.gelu(x.float(), approximate="tanh").bfloat16()
    assert (got.float() - want.float()).abs().max() <= 2**-7 * want.float().abs().max()
    s = np.random.default_rng(2).standard_normal((4, 33)).astype(np.float32)
    sm = b.run("softmax", s)
    ref = np.exp(s - s.max(-1, keepdims=True))
    np.testing.assert_allclose(sm, ref / ref.sum(-1, keepdims=True), rtol=1e-6, atol=1e-7)
    flags = np.array([True, False, True, True])
    assert b.run("count", flags) == 3 and type(b.run("count", flags)) is int  # bool accumulates to int64
    assert b.run("count", torch.tensor([True, True, False])) == 2


@pytest.mark.parametrize(
    ("expr", "inputs", "attrs", "why"),
    [
        ("y[0]", ["x"], [], "names no input"),
        ("x", ["x"], [], "needs a dimension"),
        ("n", ["x"], [], "neither an input before it nor an attribute"),
        ("x[0", ["x"], [], r"not NAME\[i\] or NAME\[a:b\]"),
        ("x[a]", ["x"], [], "not an integer"),
        ("x[0],,4", ["x"], [], "an empty term"),
        ("-3", ["x"], [], "negative"),
        ("4.5", ["x"], [], "neither a name nor an integer"),
    ],
)
def test_a_malformed_expression_is_named(expr, inputs, attrs, why):
    with pytest.raises(ValueError, match=why):
        shapeexpr.parse(expr, inputs, attrs)


def test_an_op_table_with_a_bad_expression_is_refused_at_load():
    from cuplug.runtime import signature

    with pytest.raises(ValueError, match=r"op 'f': malformed signature \(output y's shape: shape expression 'z\[0\]'"):
        signature.parse(
            {
                "f": {
                    "inputs": [{"name": "x", "dtypes": ["float32"]}],
                    "outputs": [{"name": "y", "shape": {"expr": "z[0]"}}],
                }
            }
        )
    with pytest.raises(ValueError, match="names no input before it"):  # an input's shape reads earlier inputs only
        signature.parse(
            {
                "f": {
                    "inputs": [
                        {"name": "a", "dtypes": ["float32"], "shape": {"expr": "b[0]"}},
                        {"name": "b", "dtypes": ["float32"]},
                    ]
                }
            }
        )


@pytest.mark.parametrize(
    ("expr", "shapes", "values", "want"),
    [
        ("x[:-1]", [(2, 3, 4)], {}, (2, 3)),
        ("x[-1]", [(2, 3, 4)], {}, (4,)),
        ("x[1:]", [(2, 3, 4)], {}, (3, 4)),
        ("x[5:]", [(2, 3, 4)], {}, ()),
        ("(x[0], n, 7)", [(2, 3)], {"n": 5}, (2, 5, 7)),
        ("()", [(2,)], {}, ()),
        ("(n,)", [(2,)], {"n": 3}, (3,)),
        ("x[1], x[0]", [(2, 9)], {}, (9, 2)),
    ],
)
def test_expressions_evaluate_as_python_slices(expr, shapes, values, want):
    terms = shapeexpr.parse(expr, ["x"], ["n"])
    assert shapeexpr.evaluate(terms, shapes, values, ["x"]) == want


def test_host_results_keep_their_shape_and_dtype_whoever_made_the_inputs(b):
    """Issue 32, part 6: a producer of DLPack alone (here a NumPy array behind a wrapper) gets its result's shape
    back, and a resident tensor's download keeps shape and dtype for every dtype, bfloat16 included."""

    class DLPackOnly:
        def __init__(self, a):
            self.a = a

        def __dlpack__(self, **kw):
            return self.a.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self.a.__dlpack_device__()

    x = np.arange(600, dtype=np.float32).reshape(6, 100)
    w = np.ones(100, np.float32)
    y, mean, _ = b.run("layernorm", DLPackOnly(x), DLPackOnly(w), DLPackOnly(w))
    assert isinstance(y, cuplug.HostTensor) and y.shape == (6, 100) and mean.shape == (6,)
    np.testing.assert_allclose(np.asarray(y), np.from_dlpack(y))
    np.testing.assert_allclose(np.asarray(mean), x.mean(-1), rtol=1e-6)
    for name in ("float32", "float16", "bfloat16", "int64", "uint32", "bool"):
        t = b.empty((2, 3), name)
        host = t.to_host()
        assert isinstance(host, cuplug.HostTensor) and host.shape == (2, 3) and host.dtype.name == name
        assert np.from_dlpack(host).shape == (2, 3) if name != "bfloat16" else len(host.tolist()) == 2
