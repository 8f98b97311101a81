"""The Python API with PyTorch CPU tensors (ABI v2 interop, in process): bfloat16 and every dtype in and out
through DLPack, results of the caller's kind, attributes given as tensors, the strides PyTorch calls contiguous,
and the frameworks' current streams ordered after a call. Apart from tests/test_api_v2.py so that the tests
without PyTorch never pay its import (3 s a process: the mutation runs' first stage)."""
# ruff: noqa: F811

from __future__ import annotations

import sys

import numpy as np
import pytest

import cuplug
from cuplug.runtime import signature

# test_api_v2's fixtures, imported so pytest finds them here (a test's parameter then "redefines" them: F811)
from test_api_v2 import _CudaArray, _CupyArray, _TorchCudaTensor, b, cpu_only, gpu, spy  # noqa: F401

torch = pytest.importorskip("torch")


def _bf16_round(x32: torch.Tensor) -> torch.Tensor:
    return x32.to(torch.bfloat16)


def test_bfloat16_via_pytorch_cpu_tensors(b):
    """bfloat16 has no buffer-protocol format: PyTorch CPU tensors come in through DLPack and results are
    PyTorch tensors, bit-exact against PyTorch's own float32-then-round arithmetic."""
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(4097, generator=g) * 8).to(torch.bfloat16)
    y = (torch.randn(4097, generator=g) * 8).to(torch.bfloat16)
    got = b.run("add", x, y)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.bfloat16
    assert torch.equal(got, x + y)
    ref = _bf16_round(_bf16_round(x.float() * 1.5).float() + 0.25)
    assert torch.equal(b.run("scale_add", x, alpha=1.5, beta=0.25), ref)
    assert b.run("sum", x) == pytest.approx(float(x.double().sum()), rel=1e-2)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64, torch.int8, torch.int32])
def test_pytorch_cpu_tensors_match_pytorch(b, dtype):
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(2, 300, generator=g) * 50).to(dtype)
    y = (torch.randn(2, 300, generator=g) * 50).to(dtype)
    assert torch.equal(b.run("add", x, y), x + y)


def test_non_contiguous_pytorch_tensor_names_the_fix(b):
    x = torch.ones(4, 4).t()
    with pytest.raises(cuplug.InvalidInputError, match=r"contiguous\(\)"):
        b.run("sum", x)


def test_empty_tensors_are_contiguous_whatever_their_strides(b):
    x = torch.empty(3, 0).t()  # shape (0, 3), strides (1, 1): PyTorch calls it contiguous
    assert b.run("sum", x) == 0.0


def test_a_call_on_a_producers_tensors_runs_on_its_current_stream(gpu, spy, monkeypatch):
    """CuPy's and PyTorch's current stream run the call (stream=None), so the caller's next kernel sees the
    result without a synchronize or a cross-stream wait; a backend-owned result written there is then waited
    for by the instance stream, which owns its lifetime."""
    spy.answers["call"] = 0
    current = {"cupy": 4242, "torch": 77}
    cupy = type(sys)("cupy")
    cupy.cuda = type(sys)("cupy.cuda")
    cupy.cuda.get_current_stream = lambda: type("S", (), {"ptr": current["cupy"]})()
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    asked = []

    def current_stream(device):
        asked.append(device)
        return type("S", (), {"cuda_stream": current["torch"]})()

    monkeypatch.setattr(torch.cuda, "current_stream", current_stream)
    x, y = _CupyArray(), _CupyArray()
    gpu.run("add", x, y)
    assert spy.waits_around_the_call()[1:] == (4242, [(0, 4242)])
    spy.log.clear()
    gpu.run("add", _TorchCudaTensor(), _TorchCudaTensor())
    assert spy.waits_around_the_call()[1:] == (77, [(0, 77)]) and asked == [0]
    current["cupy"] = 0  # CuPy's default stream is the legacy one: 1 to C, never the instance's 0
    spy.log.clear()
    gpu.run("sum", x)
    assert spy.waits_around_the_call()[1:] == (1, [(0, 1)])
    spy.log.clear()
    gpu.run("sum", x, stream=5)  # a given stream: no framework is asked
    assert spy.waits_around_the_call()[1:] == (5, [(0, 5)])
    spy.log.clear()
    gpu.run("sum", _CudaArray())  # no framework behind it: the instance stream, nothing to wait for
    assert spy.waits_around_the_call()[1:] == (0, [])

    def broken():
        raise RuntimeError("no current stream")

    cupy.cuda.get_current_stream = broken  # a framework that cannot say: the instance stream
    spy.log.clear()
    assert isinstance(gpu.run("sum", x), cuplug.Tensor) and spy.waits_around_the_call()[1:] == (0, [])


def test_a_resident_tensor_exports_to_pytorch_without_a_copy(b):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    r = b.run("add", b.buffer(x), b.buffer(x))
    pt = torch.from_dlpack(r)
    assert pt.data_ptr() == r.data_ptr and tuple(pt.shape) == (3, 4)
    pt += 1  # the same memory, seen by every consumer
    np.testing.assert_array_equal(r.to_host(), x + x + 1)


def test_a_pytorch_bool_is_not_a_number(b):
    with pytest.raises(cuplug.InvalidInputError, match=r"attribute alpha must be a number"):
        b.run("scale_add", np.ones(3, np.float32), alpha=torch.tensor(True))


def test_integer_attributes_take_integral_pytorch_tensors():
    sig = signature.OpSignature("q", {"inputs": [], "attrs": [{"name": "blocksize", "kind": "int64", "default": 1}]})
    assert sig.attr_values({"blocksize": torch.tensor(64.0)}) == [("blocksize", "int64", 64)]
    with pytest.raises(cuplug.InvalidInputError, match="blocksize is an integer"):
        sig.attr_values({"blocksize": torch.tensor(2.5)})


def test_a_resident_result_of_a_pytorch_source_comes_back_as_pytorch(b):
    got = b.buffer(torch.ones(2)).to_host()
    assert isinstance(got, torch.Tensor) and torch.equal(got, torch.ones(2))
