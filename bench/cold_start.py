"""One fresh process's cold start, step by step: where the time to a first verified result goes.

    CUPLUG_BENCH_T0=<time.monotonic() of the parent just before it started this process> \\
        python bench/cold_start.py [array|numpy]      # prints one JSON object (ms per step)

The steps run in the loader's own order, through the real ``cuplug.load()``: each loader step is
timed by wrapping the function that does it (found by name in whichever cuplug module defines it,
so the script survives modules moving), and the backend reports its own C-side steps in the ping
JSON (``startup_us``, CUDA backends built from 2026-12-03 on). ``CUPLUG_BACKEND`` picks the
variant as usual.

  interpreter     the parent's spawn to this script's first line (CLOCK_MONOTONIC is system-wide):
                  exec, the interpreter, site (every .pth of the image), nothing of ours
  import_cuplug   ``import cuplug``
  cuinit          (--cuinit-first only) dlopen("libcuda.so.1") + cuInit(0) through ctypes before load():
                  the driver's own start timed apart; the loader's probe then finds it done
  discover        the installed backend packages: entry points, RECORDs, manifests
  probe           cuInit and the driver facts (cuDriverGetVersion, devices, capability, ...); from
                  2026-12-03 on a thread of the loader's own, beside discover (see "spans")
  verify          the chosen file: sealed copy, size, sha256, ELF header
  dlopen          dlopen of the backend + ABI symbols (the static CUDA runtime's constructors run
                  here: its registration of every cubin of the fatbin)
  c_runtime_init  create(): cudaGetDeviceCount, the static runtime's own initialisation
  c_context       create(): cudaSetDevice + cudaFree(0), the primary context
  c_create_rest   create(): attributes, the instance stream, driver entry points
  c_smoke_launch  first ping(): module load of the smoke kernel, launch, sync
  c_device_facts  first ping(): versions, memory, name
  c_nvml          first ping(): NVML's temperature (0: from 2026-12-03 the first ping leaves it to
                  later pings); c_nvml_init: how long NVML's initialisation took, where it ran
  load_other      the rest of load(): policy, select, the ping's JSON, parsing it, the Backend
  first_op        run("add") of two 2^20-element host arrays, checked (first-use costs included:
                  pinned staging, the add kernel's module load)
  second_op       the same again: first_op - second_op is what the first use cost
  total           this script's first line to its end (exit not included; the parent adds it)
  spans           [start, end] of each step in ms after the first line: the driver thread's probe
                  runs beside discover and the rest
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time

T_FIRST = time.monotonic()
_T0 = os.environ.get("CUPLUG_BENCH_T0")
MARKS: dict[str, float] = {}
if _T0:
    MARKS["interpreter"] = (T_FIRST - float(_T0)) * 1e3

_t = time.monotonic()
import cuplug  # noqa: E402

MARKS["import_cuplug"] = (time.monotonic() - _t) * 1e3


def _import_loader_modules() -> None:
    """The loader's modules, where a release imports them lazily (timed as import_lazy)."""
    for name in ("driver", "discovery", "select", "manifest", "verify", "library", "api", "loading"):
        for prefix in ("cuplug.", "cuplug.runtime.", "cuplug.contract."):
            if prefix + name in sys.modules:
                break
            try:
                importlib.import_module(prefix + name)
                break
            except ImportError:
                continue


def _module_with(*names: str):
    """The cuplug module that defines all of ``names`` (the loader's modules may move between releases)."""
    for name, mod in sorted(sys.modules.items()):
        if name.startswith("cuplug") and mod is not None and all(hasattr(mod, n) for n in names):
            return mod
    return None


SPANS: dict[str, list[float]] = {}  # step -> [start, end] in ms after this script's first line (first call)


def _wrap(mod, attr: str, step: str) -> None:
    """Time every call of mod.attr into MARKS[step] (summed) and SPANS[step] (first start, last end)."""
    if mod is None or not hasattr(mod, attr):
        return
    real = getattr(mod, attr)

    def timed(*args, **kwargs):
        t = time.monotonic()
        try:
            return real(*args, **kwargs)
        finally:
            end = time.monotonic()
            MARKS[step] = MARKS.get(step, 0.0) + (end - t) * 1e3
            span = SPANS.setdefault(step, [(t - T_FIRST) * 1e3, 0.0])
            span[1] = (end - T_FIRST) * 1e3

    setattr(mod, attr, timed)


def main() -> None:
    kind = sys.argv[1] if len(sys.argv) > 1 else "array"
    if "--cuinit-first" in sys.argv:  # the driver's own start timed apart (then the probe finds it done)
        import ctypes

        t = time.monotonic()
        rc = ctypes.CDLL("libcuda.so.1").cuInit(0)
        MARKS["cuinit"] = (time.monotonic() - t) * 1e3
        assert rc == 0, f"cuInit returned {rc}"
    t = time.monotonic()
    _import_loader_modules()
    MARKS["import_lazy"] = (time.monotonic() - t) * 1e3

    _wrap(_module_with("probe", "ProbeResult"), "probe", "probe")
    _wrap(_module_with("discover", "Discovery"), "discover", "discover")
    _wrap(_module_with("verified", "Verified"), "verified", "verify")
    lib_cls = getattr(_module_with("BackendLibrary"), "BackendLibrary", None)
    if lib_cls is not None:
        for attr, step in (("__init__", "dlopen"), ("create", "create"), ("ping", "ping")):
            _wrap(lib_cls, attr, step)

    t = time.monotonic()
    SPANS["load"] = [(t - T_FIRST) * 1e3, 0.0]
    b = cuplug.load()
    load_ms = (time.monotonic() - t) * 1e3
    SPANS["load"][1] = (time.monotonic() - T_FIRST) * 1e3
    assert b.cuda, f"fell back to the CPU: {b.trace.decision_code}: {b.trace.decision_reason}"
    info = b._info if hasattr(b, "_info") else {}
    startup = {f"c_{k}": v / 1e3 for k, v in (info.get("startup_us") or {}).items()}
    MARKS.update(startup)

    n = 1 << 20
    if kind == "numpy":
        t = time.monotonic()
        import numpy as np

        MARKS["import_numpy"] = (time.monotonic() - t) * 1e3
        x = np.ones(n, dtype=np.float32)
    else:
        import array

        x = array.array("f", [1.0]) * n
    for step in ("first_op", "second_op"):
        t = time.monotonic()
        out = b.run("add", x, x)
        assert out[5] == 2.0 and out[n - 1] == 2.0
        MARKS[step] = (time.monotonic() - t) * 1e3
    t_end = time.monotonic()
    MARKS["total"] = (t_end - T_FIRST) * 1e3
    # load() minus what was timed inside it: policy, select, the ping's JSON, the Backend.
    # load() minus the main thread's timed steps; the probe counts only as far as load() waited for it
    # (it may run on the loader's driver thread, beside discover).
    inside = sum(MARKS.get(k, 0.0) for k in ("discover", "verify", "dlopen", "create", "ping"))
    if "probe" in SPANS and "discover" in SPANS:
        inside += max(0.0, SPANS["probe"][1] - max(SPANS["discover"][1], SPANS["probe"][0]))
    else:
        inside += MARKS.get("probe", 0.0)
    MARKS["load_other"] = load_ms - inside
    MARKS["load"] = load_ms
    c_create = sum(startup.get(k, 0.0) for k in ("c_runtime_init", "c_context", "c_create_rest"))
    c_ping = sum(startup.get(k, 0.0) for k in ("c_smoke_launch", "c_device_facts", "c_nvml"))
    if startup:  # the wrappers' create/ping time not explained by the C side's own steps
        MARKS["create_other"] = MARKS.get("create", 0.0) - c_create
        MARKS["ping_other"] = MARKS.get("ping", 0.0) - c_ping
    # Steps that ran beside the main thread (the loader's driver thread) overlap others: their spans show it.
    result = {k: round(v, 3) for k, v in MARKS.items()}
    result["spans"] = {k: [round(a, 2), round(b_, 2)] for k, (a, b_) in SPANS.items()}
    result["variant"] = f"{b.cuda}:{b.variant}"
    result["staging"] = info.get("staging")
    result["t_end"] = t_end
    print(json.dumps(result))


if __name__ == "__main__":
    main()
