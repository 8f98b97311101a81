"""Every op of a backend as a PyTorch op: opcheck, the same results as run(), torch.compile(fullgraph=True).

Used by tests/test_torch_ops.py (cuplug's `vector`) and by the example projects' tests (`scan`, `quant`), in
a subprocess whose sys.path sees that backend: ``python -c "import torch_opcheck; torch_opcheck.main('quant')"``
prints one JSON object per op.
"""

from __future__ import annotations

import json

import torch
from torch.library import opcheck

import cuplug
import cuplug.torch
from cuplug.runtime.samples import sample_inputs

# What check() reports for an op that passes everything.
PASSED = {
    "same_as_run": True,
    "out_variant": True,
    "opcheck": ["SUCCESS"],
    "opcheck_out": ["SUCCESS"],
    "compiled_fullgraph": True,
}


def samples(sig) -> tuple[list[torch.Tensor], dict]:
    """The op's declared sample (what `cuplug probe` runs) as PyTorch CPU tensors of their own memory."""
    inputs, attrs = sample_inputs(sig)
    return [torch.from_dlpack(b).clone() for b in inputs], attrs


def check(backend, namespace: str) -> dict[str, dict]:
    ops = cuplug.torch.register(backend, namespace)
    report = {}
    for name, sig in backend.ops.items():
        xs, attrs = samples(sig)
        op = getattr(ops, name)
        got = op(*xs, **attrs)
        got = list(got) if isinstance(got, tuple) else [got]
        want = backend.run(name, *xs, **attrs)
        want = list(want) if isinstance(want, tuple) else [want]
        same = all(torch.equal(g, torch.as_tensor(w).reshape(g.shape)) for g, w in zip(got, want, strict=True))
        outs = {n: torch.empty_like(g) for n, g in zip(cuplug.torch.output_names(sig), got, strict=True)}
        op.out(*xs, **attrs, **outs)
        same_out = all(torch.equal(o, g) for o, g in zip(outs.values(), got, strict=True))
        checks = opcheck(op.default, tuple(xs), attrs)
        checks_out = opcheck(op.out, tuple(xs), {**attrs, **{n: torch.empty_like(g) for n, g in outs.items()}})
        compiled = torch.compile(lambda *a, op=op, attrs=attrs: op(*a, **attrs), fullgraph=True, backend="aot_eager")(
            *xs
        )
        compiled = list(compiled) if isinstance(compiled, tuple) else [compiled]
        same_compiled = all(torch.equal(c, g) for c, g in zip(compiled, got, strict=True))
        report[name] = {
            "same_as_run": same,
            "out_variant": same_out,
            "opcheck": sorted(set(checks.values())),
            "opcheck_out": sorted(set(checks_out.values())),
            "compiled_fullgraph": same_compiled,
        }
    return report


def main(backend: str = "vector") -> None:
    print(json.dumps(check(cuplug.load(backend), f"cuplug_{backend}_check")))


def check_project(dist: str, distribution: str, backend: str, tmp: str) -> dict[str, dict]:
    """An example project's plain wheel (its CPU twin) from ``dist`` installed into ``tmp``, then ``check`` of
    its backend in a subprocess of this interpreter (PyTorch from this environment): the report."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    wheel = next(Path(dist).glob(f"{distribution}-*.whl"))
    site = os.path.join(tmp, "site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", site, str(wheel)],
        check=True,
    )
    here = os.path.dirname(os.path.abspath(__file__))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUPLUG_", "FAKE_CUDA_", "LD_LIBRARY_PATH"))}
    env.update(PYTHONPATH=os.pathsep.join([site, here]), CUPLUG_BACKEND="cpu")
    code = f"import torch_opcheck; torch_opcheck.main({backend!r})"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
