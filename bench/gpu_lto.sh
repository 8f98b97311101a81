#!/usr/bin/env bash
# Issue 33 on the GPU machine, in one call: the Hopper build's checks (bench/gpu_targets.sh: sm90a/sm90 selected and
# run, the planted wrong sm90a rejected, the self-test's cost) with the LTO variant's GPU tests; then the LTO
# variant against SASS and PTX (bench/lto_cost.py); then the host's launch costs (bench/cuda_call_costs.cu).
# Carried: dist's wheels, dist-hopper, build/planted, build/deps (pyelftools: --no-deps installs leave it out),
# build/nvjitlink (the pinned nvidia-nvjitlink wheel(s) of toolchains/nvjitlink.txt, `pip download --no-deps -d
# build/nvjitlink -r toolchains/nvjitlink.txt`, or, to fit the 64 MiB a call carries, its `pip install --target`
# directory as an .tar.xz: 28 MB for 13.0.88's 40 MB wheel).
# $OUT gets: run.log, targets-tests.log, targets-doctor.txt, selftest-cost-{hopper,default}.json, lto-cost.json,
# dispatch-cupy.json, cuda-call-costs.json (8 files: the most a call returns; the CuPy tests go to run.log).
# Usage (device machine, repo root): bash bench/gpu_lto.sh
set -o pipefail
ROOT=$(pwd)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/run.log"
rm -rf /tmp/site /tmp/nvjl
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$ROOT"/dist/*.whl "$ROOT"/build/deps/*.whl \
  || exit 1
# compiled as pip compiles an install: the device runs with PYTHONDONTWRITEBYTECODE=1, and an uncompiled site
# made every fresh process compile cuplug's lazily imported modules (the self-test's among them) from source
python3 -m compileall -q /tmp/site > /dev/null
mkdir -p /tmp/nvjl
for f in "$ROOT"/build/nvjitlink/*.whl; do
  [ -e "$f" ] && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/nvjl "$f"
done
for f in "$ROOT"/build/nvjitlink/*.tar.xz; do [ -e "$f" ] && tar -C /tmp/nvjl -xJf "$f"; done
export CUPLUG_NVJITLINK_SITE=/tmp/nvjl PYTHONUNBUFFERED=1
PYTHONPATH=/tmp/site python3 -c "
import sys; sys.path[:0] = ['/tmp/nvjl']
from cuplug.runtime import jitlink
for m in (12, 13): print('nvJitLink', m, jitlink.find(m))" | tee -a "$OUT/run.log"
bash "$ROOT/bench/gpu_targets.sh" 2>&1 | tee -a "$OUT/run.log" | tail -30
cd /tmp || exit 1
PYTHONPATH="/tmp/hopper-site:/tmp/nvjl" timeout 300 python3 "$ROOT/bench/lto_cost.py" 7 > "$OUT/lto-cost.json"
python3 -c "
import json, sys; d = json.load(open(sys.argv[1]))
print(d.get('error', '')[-2000:])
for m, v in d.get('load', {}).items(): print(m, v['variant'], 'load', v['load_ms'], 'link', v['link_ms'])
for k, v in d.get('speed_ms_per_call', {}).items(): print(k, {r: x['ms'] if isinstance(x, dict) else x for r, x in v.items()})
" "$OUT/lto-cost.json" | tee -a "$OUT/run.log"
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
"$NVCC" -O2 -o /tmp/costs "$ROOT/bench/cuda_call_costs.cu" -lcuda -ldl \
  && /tmp/costs 20000 /tmp/site/cuplug_cuda13/fatbin/libcuplug_vector.so | tee "$OUT/cuda-call-costs.json"
# issue 30: the CuPy fast path's GPU tests, and every per-call CUDA row beside its anchor
cd /tmp || exit 1
[ -f "$ROOT/tests/test_gpu_cupy_fast.py" ] && PYTHONPATH=/tmp/site timeout 120 python3 -m pytest \
  "$ROOT/tests/test_gpu_cupy_fast.py" -p no:cacheprovider --rootdir="$ROOT" -c "$ROOT/pyproject.toml" -q -rfE \
  -o addopts="" 2>&1 | tee -a "$OUT/run.log" | tail -8
PYTHONPATH=/tmp/site timeout 60 python3 "$ROOT/bench/diag_cupy_empty.py" 2>&1 | tee -a "$OUT/run.log" | tail -12
PYTHONPATH=/tmp/site timeout 150 python3 -m pytest "$ROOT/bench/bench_dispatch.py" -p no:cacheprovider --rootdir="$ROOT" \
  -q -o addopts="" -k "per_call_cuda" --benchmark-json="$OUT/dispatch-cupy.json" \
  --benchmark-columns=median,iqr,min,rounds 2>&1 | tail -25 | tee -a "$OUT/run.log"
