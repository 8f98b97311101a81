"""A backend's ops as PyTorch ops (issue 30, part 3): cuplug.torch.register, on the CPU twin with PyTorch CPU.

The schemas come from the op table; the kernels call run() with outputs from torch.empty; the fake
kernels follow the shape rules, so opcheck (schema, fake tensors, AOT dispatch with dynamic shapes) and
torch.compile(fullgraph=True) pass. The GPU half (CUDA kernels, graph capture, inductor) is in
tests/test_gpu_torch_ops.py; scan's and quant's ops are checked in their example tests.
"""

from __future__ import annotations

import json
import sys

import pytest

torch = pytest.importorskip("torch")

import cuplug  # noqa: E402
import cuplug.torch  # noqa: E402
from conftest import HERE, clean_env, run_py  # noqa: E402
from cuplug.contract.errors import ConfigError, InvalidInputError  # noqa: E402


@pytest.fixture(scope="module")
def b():
    import os

    os.environ["CUPLUG_BACKEND"] = "cpu"
    try:
        with cuplug.load() as backend:
            yield backend
    finally:
        os.environ.pop("CUPLUG_BACKEND", None)


@pytest.fixture(scope="module")
def ops(b):
    return cuplug.torch.register(b, "cuplug_test_ops")


def test_the_schemas_come_from_the_op_table(b):
    assert [cuplug.torch.schemas(s) for s in b.ops.values()] == [
        ("add(Tensor x, Tensor y) -> Tensor", "add.out(Tensor x, Tensor y, *, Tensor(a!) out) -> ()"),
        (
            "scale_add(Tensor x, float alpha=1.0, float beta=0.0) -> Tensor",
            "scale_add.out(Tensor x, float alpha=1.0, float beta=0.0, *, Tensor(a!) out) -> ()",
        ),
        ("sum(Tensor x) -> Tensor", "sum.out(Tensor x, *, Tensor(a!) out) -> ()"),
    ]


def test_several_outputs_and_int_attributes_have_their_schema():
    from cuplug.runtime.signature import OpSignature

    sig = OpSignature(
        "quantize",
        {
            "inputs": [{"name": "x", "dtypes": ["float32"]}],
            "outputs": [
                {"name": "q", "dtype": {"fixed": "int8"}},
                {"name": "absmax", "dtype": {"fixed": "float32"}, "shape": {"blocks_of": 0, "attr": "blocksize"}},
            ],
            "attrs": [{"name": "blocksize", "kind": "int64", "default": 256}],
        },
    )
    assert cuplug.torch.schemas(sig) == (
        "quantize(Tensor x, int blocksize=256) -> (Tensor, Tensor)",
        "quantize.out(Tensor x, int blocksize=256, *, Tensor(a!) out_q, Tensor(b!) out_absmax) -> ()",
    )


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64", "int8", "uint8", "int32", "int64"])
def test_the_ops_give_what_pytorch_gives(ops, dtype):
    dt = getattr(torch, dtype)
    x = (torch.arange(12) % 7).to(dt).reshape(3, 4)
    y = (torch.arange(12) % 5).to(dt).reshape(3, 4)
    assert torch.equal(ops.add(x, y), x + y)
    assert torch.equal(ops.scale_add(x, alpha=2.0, beta=1.0), x * 2 + 1)
    want = torch.sum(x.to(torch.float64 if dt.is_floating_point else torch.int64)).to(
        dt if dt.is_floating_point else torch.int64
    )
    assert torch.equal(ops.sum(x), want)
    out = torch.empty_like(x)
    assert ops.add.out(x, y, out=out) is None and torch.equal(out, x + y)


def test_opcheck_and_compile_pass_for_every_op(b):
    """opcheck (schema, fake tensors, autograd registration, AOT dispatch with dynamic shapes) of the
    functional and the out= op, and torch.compile(fullgraph=True) giving run()'s results, for each op."""
    sys.path.insert(0, str(HERE))
    import torch_opcheck

    report = torch_opcheck.check(b, "cuplug_test_opcheck")
    assert set(report) == set(b.ops)
    for name, r in report.items():
        assert r == torch_opcheck.PASSED, name


def test_compiled_with_dynamic_shapes_follows_the_shape_rules(ops):
    f = torch.compile(
        lambda a, c: ops.sum(ops.scale_add(ops.add(a, c), alpha=3.0)), fullgraph=True, dynamic=True, backend="aot_eager"
    )
    for n in (5, 17, 1000):
        a, c = torch.ones(n), torch.full((n,), 2.0)
        assert f(a, c).item() == 9.0 * n


def test_fake_tensors_get_the_shapes_of_the_rules_without_running(ops, b, monkeypatch):
    from torch._subclasses.fake_tensor import FakeTensorMode

    ran = []
    monkeypatch.setattr(b, "run", lambda *a, **k: ran.append(a))
    with FakeTensorMode():
        x = torch.empty(6, 7, dtype=torch.float16)
        assert ops.add(x, x).shape == (6, 7) and ops.add(x, x).dtype == torch.float16
        assert ops.sum(x).shape == () and ops.sum(x.to(torch.int8)).dtype == torch.int64
        with pytest.raises(InvalidInputError, match=r"^add: y must match x in dtype and shape"):
            ops.add(x, torch.empty(3))
    assert ran == []


def test_a_bad_call_raises_cuplugs_error_through_the_op(ops):
    with pytest.raises(InvalidInputError, match=r"^add: y must match x in dtype and shape \(lengths differ\)"):
        ops.add(torch.ones(4), torch.ones(5))
    with pytest.raises(InvalidInputError, match=r"^add: out has 3 elements"):
        ops.add.out(torch.ones(4), torch.ones(4), out=torch.empty(3))
    with pytest.raises(InvalidInputError, match=r"is not C-contiguous"):
        ops.add(torch.ones(4, 4).t(), torch.ones(4, 4))
    with pytest.raises(InvalidInputError, match=r"an out= tensor that requires grad"):
        ops.add.out(torch.ones(4), torch.ones(4), out=torch.ones(4, requires_grad=True))


def test_one_device_one_backend_per_namespace(b):
    cuplug.torch.register(b, "cuplug_test_twice")
    with pytest.raises(ConfigError, match=r"already has a CPU kernel"):
        cuplug.torch.register(b, "cuplug_test_twice")
    with pytest.raises(ConfigError, match=r"namespace 'no-dash' is not an identifier"):
        cuplug.torch.register(b, "no-dash")


def test_importing_cuplug_torch_imports_no_pytorch():
    code = "import sys, json, cuplug, cuplug.torch; print(json.dumps('torch' in sys.modules))"
    proc = run_py(code, clean_env())
    assert proc.returncode == 0 and json.loads(proc.stdout) is False, proc.stderr
