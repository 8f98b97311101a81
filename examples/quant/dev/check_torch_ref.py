"""The PyTorch reference of tests/test_quantkit_gpu.py against the NumPy one (tests/reference.py) on
the GPU, before quantkit itself can be installed: python dev/check_torch_ref.py."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import numpy as np

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path.insert(0, str(TESTS))
for name in ("quantkit", "cuplug"):  # the test module imports them; only its reference is used here
    sys.modules.setdefault(name, types.ModuleType(name))
import reference  # noqa: E402
import test_quantkit_gpu as g  # noqa: E402

bad = 0
for dtype in g.DTYPES:
    for special in (False, True):
        for n in (1, 65, 4099, (1 << 20) + 3):
            x = g._values((n,), dtype, seed=n, special=special)
            xf = x.float().cpu().numpy()
            for bs in (64, 256, 4096):
                q, a = g.torch_quantize(x, bs)
                rq, ra = reference.quantize(xf, bs)
                y = g.torch_dequantize(q, a, bs)
                ry = reference.dequantize(rq, ra, bs)
                ok = (
                    np.array_equal(q.cpu().numpy(), rq)
                    and np.array_equal(a.cpu().numpy().view(np.uint32), ra.view(np.uint32))
                    and np.array_equal(y.cpu().numpy().view(np.uint32), ry.view(np.uint32))
                )
                if not ok:
                    bad += 1
                    print("MISMATCH", dtype, special, n, bs)
print("bad:", bad)
sys.exit(1 if bad else 0)
