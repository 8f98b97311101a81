#!/usr/bin/env bash
# Issue 22, second GPU call (2026-12-03): the perf branch's defaults after the first call's study, once
# through the final benchmark (bench/perf22.py all, one run) with main's build and a --no-compile install
# beside it, the host path's thread/chunk choice again, and the GPU tests of what changed. Carried:
#   .perfcarry/new/*.whl  perf's three wheels   .perfcarry/old/*.whl  main 8be360f's three wheels
#   .perfcarry/bench/     perf22.py, cold_start.py, plot22.py   .perfcarry/tests/  the test suite
set -o pipefail
C=$(pwd)/.perfcarry
export PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,pstate,temperature.gpu --format=csv,noheader; nproc
  echo "PYTHONDONTWRITEBYTECODE=${PYTHONDONTWRITEBYTECODE-unset}"; } 2>&1 | tee "$OUT/log.txt"
pip() { python3 -m pip install -q --no-index --no-deps --target "$@" 2>&1 | grep -v "as the 'root' user"; }
pip /tmp/site_new "$C"/new/*.whl
pip /tmp/site_old "$C"/old/*.whl
pip /tmp/site_newnc --no-compile "$C"/new/*.whl
ls /tmp/site_new/cuplug/__pycache__ | head -3 >> "$OUT/log.txt"
export PYTHONPATH=/tmp/site_new
cd /tmp || exit 1
B="$C/bench/perf22.py"
step() { echo "== $*" | tee -a "$OUT/log.txt"; timeout "$1" "${@:2}" 2>&1 | tee -a "$OUT/log.txt" | tail -30; }
step 330 python3 "$B" all "$OUT" --runs 1 --no-ncu --site old=/tmp/site_old --site newnc=/tmp/site_newnc \
  --cases python,floor,cuplug_array,cuplug_load,cuplug_numpy,numpy,cupy,torch,breakdown,overlap_array,overlap_ctx_array,cuplug_array@old,breakdown@old,cuplug_array@newnc
K="test_gpu_perf or test_gpu_v2 or staging or auto_selection or wrong_sass or largest or variants_correct"
K="$K or create_destroy or threads_by_instances or fork or cli_on_the_gpu or resident"
step 240 python3 -m pytest "$C/tests/test_gpu_perf.py" "$C/tests/test_gpu_v2.py" "$C/tests/test_gpu.py" -k "$K" \
  --rootdir="$C/tests" -q -p no:cacheprovider -o addopts="" -rfE -o junit_family=xunit1 --junitxml="$OUT/gpu-junit.xml"
step 90 python3 "$B" host "$OUT/host_sweep2.json" --calls 10 --fresh-calls 2 \
  --configs "default;threads=16,chunk_kb=1024;threads=16,chunk_kb=512;threads=12;threads=16,copy=memcpy;threads=16,schedule=static"
