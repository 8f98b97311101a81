#!/usr/bin/env bash
# One device call for everything a GPU answers (dist/ carried): bench/gpu_dispatch.sh (the GPU tests, the dispatch
# benchmark twice, the whole path, where the time goes), then the suite's GPU scenarios (bench/gpu_suite.sh) under
# BUDGET seconds (default 300). Both write into folders of one archive, since the device machine returns at most
# 8 files: $OUT/all.tar.gz (dispatch/..., suite/...), $OUT/gpu_tests.log, $OUT/log.txt.
#   run: bash bench/gpu_all.sh      (timeout_s 600)
set -o pipefail
ROOT=$(pwd)
FINAL=$OUT
WORK=/tmp/gpu-all
rm -rf "$WORK" && mkdir -p "$WORK/dispatch" "$WORK/suite"
OUT="$WORK/dispatch" bash "$ROOT/bench/gpu_dispatch.sh" 2>&1 | tee "$FINAL/log.txt"
cp "$WORK/dispatch/gpu_tests.log" "$FINAL/" 2>/dev/null
OUT="$WORK/suite" BUDGET=${BUDGET:-300} bash "$ROOT/bench/gpu_suite.sh" 2>&1 | tail -40 | tee -a "$FINAL/log.txt"
tar -czf "$FINAL/all.tar.gz" -C "$WORK" .
