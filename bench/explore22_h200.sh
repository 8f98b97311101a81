#!/usr/bin/env bash
# Issue 22, first GPU call (2026-12-03): the perf branch's build against main's (8be360f), side by side,
# to find where the time goes and to pick the host path's defaults. Run from the repository root of the
# checkout that `run` sends, with .perfcarry/ carried:
#   .perfcarry/new/*.whl   cuplug, cuplug-cuda12, cuplug-cuda13 built from perf (python3 ci/nox.py -s wheels)
#   .perfcarry/old/*.whl   the same three built from main 8be360f
#   .perfcarry/sm90/*.whl  perf's cuplug-cuda13 sm90 variant wheel (nox -s variant_wheels)
#   .perfcarry/bench/      perf22.py, cold_start.py, plot22.py
# Everything lands in $OUT (8 files at most come back).
set -o pipefail
C=$(pwd)/.perfcarry
export PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,pstate,clocks.sm,clocks.mem --format=csv,noheader; nproc; uname -r
  python3 -c "import torch, cupy, numpy; print(torch.__version__, cupy.__version__, numpy.__version__)"; } 2>&1 | tee "$OUT/log.txt"
pip() { python3 -m pip install -q --no-index --no-deps --no-compile --target "$1" "${@:2}"; }
pip /tmp/site_new "$C"/new/*.whl || exit 1
pip /tmp/site_old "$C"/old/*.whl || exit 1
pip /tmp/site_sm90 "$C"/new/cuplug-0*.whl "$C"/sm90/*.whl || exit 1
export PYTHONPATH=/tmp/site_new
cd /tmp || exit 1
B="$C/bench/perf22.py"
S="--site old=/tmp/site_old --site sm90=/tmp/site_sm90"
step() { echo "== $*" | tee -a "$OUT/log.txt"; timeout "$1" "${@:2}" 2>&1 | tee -a "$OUT/log.txt" | tail -25; }
step 120 python3 "$B" cold "$OUT/cold.json" --rounds 6 $S \
  --cases python,floor,breakdown,cuplug_array,cuplug_array@old,cuplug_array@sm90,breakdown@sm90,breakdown@old,cuplug_numpy,cuplug_load,overlap_array,overlap_ctx_array
{ echo "== import profile (perf's cuplug)"; python3 -X importtime -c "import cuplug" 2>&1 | sort -t'|' -k2 -n | tail -25; } >> "$OUT/log.txt"
step 90 python3 "$B" sum "$OUT/sum.json" --repeats 7
step 60 env PYTHONPATH=/tmp/site_old python3 "$B" sum "$OUT/sum_old.json" --repeats 7 --dtypes float32 --det-runs 5
step 120 python3 "$B" ncu "$OUT/ncu.json"
step 120 python3 "$B" host "$OUT/host_sweep.json" --calls 10 --fresh-calls 3 \
  --configs "default;threads=4;threads=6;threads=12;threads=16;chunk_kb=1024;chunk_kb=4096;chunk_kb=8192;copy=memcpy;schedule=static;copy=memcpy,schedule=static"
step 60 env PYTHONPATH=/tmp/site_old python3 "$B" host "$OUT/host_old.json" --calls 10 --fresh-calls 2
step 120 python3 "$B" hostprocs "$OUT/host.json" --procs 3 --calls 10 --fresh-calls 0 --configs "default;threads=12"
mkdir -p /tmp/t && cp "$C"/tests/test_gpu_perf.py /tmp/t/
step 120 python3 -m pytest /tmp/t/test_gpu_perf.py -q -p no:cacheprovider -o addopts="" -W ignore::pytest.PytestUnknownMarkWarning
