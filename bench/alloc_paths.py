"""Runs bench/alloc_paths.c (its header says how to build it): ns per PyTorch output made from C, median of 7
loops of 200,000, for a 1-element and a 4096-element float32 tensor. One JSON line."""

import json
import statistics

import _alloc_paths as alloc_paths  # the extension bench/alloc_paths.c builds
import torch

API = torch.Tensor.__dlpack_c_exchange_api__
rows = {}
for label, x in {"1 element": torch.ones(1), "4096 elements": torch.ones(1024, 4)}.items():
    loops = [alloc_paths.bench(x, torch.empty_like, API, 200_000) for _ in range(7)]
    rows[label] = {
        name: round(statistics.median(loop[k] for loop in loops), 1)
        for k, name in enumerate(
            ("torch.empty_like via the C API", "exchange allocator + to_py_object", "dltensor_from_py")
        )
    }
print(json.dumps({"command": "PYTHONPATH=/tmp python bench/alloc_paths.py", "torch": torch.__version__, "ns": rows}))
