"""cuda.core's StridedMemoryView against cuplug's own DLPack reader: import cost and per-operand cost.

    python bench/dlpack_reader_bench.py OUT.json

Import: median of 15 fresh interpreters each (`import cuda.core` with StridedMemoryView vs `import
cuplug.runtime.dlpack`), beside a bare interpreter. Per operand: median of 20 rounds of 2,000 reads of a NumPy
array's DLPack capsule (both read the same capsule protocol; the GPU run adds CUDA tensors).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time


def fresh(code: str, n: int = 15) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def per_read(fn, rounds: int = 20, n: int = 2000) -> tuple[float, float, float]:
    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        samples.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(samples), min(samples), max(samples)


def main() -> None:
    import numpy as np

    bare = fresh("pass")
    ours = fresh("import cuplug")  # the whole package: dlpack.py comes with the API anyway
    theirs = fresh("from cuda.core.utils import StridedMemoryView")
    x = np.ones(1024, dtype=np.float32)
    from cuda.core.utils import StridedMemoryView

    from cuplug.runtime import dlpack

    def read_ours():
        t = dlpack.Imported(x.__dlpack__()).tensor
        return t.data, t.ndim

    def read_theirs():
        v = StridedMemoryView.from_dlpack(x, stream_ptr=-1)
        return v.ptr, v.shape

    out = {
        "machine": os.uname().nodename,
        "python": sys.version.split()[0],
        "import_ms": {
            "bare": round(bare, 2),
            "cuplug (whole package)": round(ours - bare, 2),
            "cuda.core": round(theirs - bare, 2),
        },
        "per_operand_us": {
            "cuplug.runtime.dlpack": [round(v, 3) for v in per_read(read_ours)],
            "cuda.core StridedMemoryView": [round(v, 3) for v in per_read(read_theirs)],
        },
        "note": "import: median of 15 fresh processes minus a bare interpreter; per operand: [median, min, max] of 20 rounds",
    }
    print(json.dumps(out, indent=2))
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
