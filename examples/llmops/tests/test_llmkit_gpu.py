"""llmkit on PyTorch CUDA tensors, against PyTorch (needs a GPU and llmkit's CUDA extra; skipped otherwise)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("no CUDA device for PyTorch", allow_module_level=True)

import llmkit  # noqa: E402


def test_the_four_kernels_match_pytorch_on_the_gpu():
    b = llmkit.load()
    assert b.device_type == 2, b.trace.text()
    x = torch.randn(4, 64, 768, device="cuda")
    w, bias = torch.randn(768, device="cuda"), torch.randn(768, device="cuda")
    y, mean, _rstd = b.run("layernorm", x, w, bias)
    ref = torch.nn.functional.layer_norm(x, (768,), w, bias, eps=1e-5)
    assert mean.shape == (4, 64) and torch.allclose(y, ref, rtol=1e-4, atol=1e-4)
    data = torch.randint(0, 256, (1 << 20,), dtype=torch.uint8, device="cuda")
    hist = b.run("histogram", data)
    assert hist.dtype == torch.uint32 and torch.equal(hist.to(torch.int64), torch.bincount(data.long(), minlength=256))
    h = torch.randn(1 << 16, device="cuda").bfloat16()
    g = b.run("gelu", h)
    want = torch.nn.functional.gelu(h.float(), approximate="tanh").bfloat16()
    assert (g.float() - want.float()).abs().max() <= 2**-7 * want.float().abs().max()
    s = torch.randn(8, 5000, device="cuda")
    assert torch.allclose(b.run("softmax", s), torch.softmax(s, -1), rtol=1e-5, atol=1e-7)
