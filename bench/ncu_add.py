"""One resident cuplug add and one torch.add on the same 1 GiB arrays, for ncu:

    ncu --clock-control none --kernel-name regex:'add_kernel|elementwise' \
        --metrics gpu__time_duration.sum,dram__bytes.sum,... python bench/ncu_add.py

Each kernel runs twice; ncu reports every launch.
"""

import numpy as np
import torch

import cuplug

n = 1 << 28
x = np.ones(n, dtype=np.float32)
with cuplug.load() as b:
    bx, by, bo = b.buffer(x), b.buffer(x), b.empty(n)
    for _ in range(2):
        b._lib.run_resident(b._handle, b"add", bx.id, by.id, bo.id, 1.0, 0.0, n)
    b.sync()
    for buf in (bx, by, bo):
        buf.free()
tx, ty = torch.ones(n, device="cuda"), torch.ones(n, device="cuda")
out = torch.empty_like(tx)
for _ in range(2):
    torch.add(tx, ty, out=out)
torch.cuda.synchronize()
print("ok")
