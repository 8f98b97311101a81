"""Cold start of one fresh process, step by step: where the time to a first verified result goes.

    python bench/cold_start.py            # prints one JSON object (ms per step) for this process

CUPLUG_BACKEND picks the variant as usual. The steps follow the loader's own path
(loading.load), called one at a time so each can be timed:

  import        `import cuplug` (the interpreter's own start is not included)
  cuinit        dlopen("libcuda.so.1") + cuInit: the driver's own initialisation
  probe         cuplug's ctypes reads of the driver facts (driver already initialised)
  select        manifests read + ranking (the probe result reused)
  verify        size + sha256 + ELF header of the chosen file
  dlopen        dlopen of the backend .so + ABI symbol and version check
  context       cuplug_backend_create: cudaSetDevice + cudaFree(0), the CUDA context
  first_launch  cuplug_backend_ping: module load (JIT for PTX) + the smoke kernel
  first_add     Backend.run("add") on 1M elements, host to host, checked
"""

from __future__ import annotations

import ctypes
import json
import time

T0 = time.perf_counter()
import cuplug  # noqa: E402
from cuplug.contract import abi  # noqa: E402
from cuplug.runtime import driver, loading, verify  # noqa: E402

marks: dict[str, float] = {"import": time.perf_counter() - T0}


def timed(name: str, fn, *args):
    t = time.perf_counter()
    out = fn(*args)
    marks[name] = time.perf_counter() - t
    return out


def main() -> None:
    lib = timed("cuinit", lambda: ctypes.CDLL("libcuda.so.1").cuInit(0))
    assert lib == 0, f"cuInit returned {lib}"
    facts = timed("probe", driver.probe)
    real_probe, loading.driver.probe = loading.driver.probe, lambda: facts
    trace = timed("select", loading.decide)
    loading.driver.probe = real_probe
    chosen = next(c for c in trace.candidates if c.accepted and c.artifact is not None)
    path = timed("verify", verify.verify, chosen.artifact)
    backend_lib = timed("dlopen", abi.BackendLibrary, path)
    handle = timed("context", backend_lib.create, "0")
    rc, info = timed("first_launch", backend_lib.ping, handle)
    assert rc == 0, info
    b = cuplug.Backend(backend_lib, handle, json.loads(info), cuda=chosen.cuda, trace=trace)
    x = (ctypes.c_float * (1 << 20))(*([1.0] * (1 << 20)))
    out = timed("first_add", b.run, "add", memoryview(x).cast("B").cast("f"), memoryview(x).cast("B").cast("f"))
    assert out[5] == 2.0 and out[-1] == 2.0
    b.close()
    result = {k: round(v * 1e3, 3) for k, v in marks.items()}
    result["variant"] = f"{chosen.cuda}:{chosen.variant}"
    print(json.dumps(result))


if __name__ == "__main__":
    main()
