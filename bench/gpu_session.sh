#!/usr/bin/env bash
# Both open GPU issues in one device call, for a machine lent rarely: bench/gpu_lto.sh (issue 33: the Hopper build's
# checks, the self-test's cost, the LTO variant against SASS and PTX, the launch costs; issue 30's CuPy tests and
# per-call rows), then bench/gpu_dispatch.sh (issue 30: the GPU tests, the dispatch benchmark RUNS times: per call,
# 1 GiB allocating, captured and replayed). Carried: as bench/gpu_lto.sh says.
# $OUT gets log.txt, gpu_tests.log and all.tar.gz (lto/..., dispatch/...: the machine returns at most 8 files).
#   run: bash bench/gpu_session.sh      (timeout_s 600)
set -o pipefail
ROOT=$(pwd)
FINAL=$OUT
WORK=/tmp/gpu-session
rm -rf "$WORK" && mkdir -p "$WORK/lto" "$WORK/dispatch"
# whatever happens below (a part timing out, a failure), what was made comes back: the archive is made on exit,
# and each part's limit keeps the whole under the device's 600 s
trap 'cp "$WORK/dispatch/gpu_tests.log" "$FINAL/" 2>/dev/null; tar -czf "$FINAL/all.tar.gz" -C "$WORK" .' EXIT
OUT="$WORK/lto" timeout 240 bash "$ROOT/bench/gpu_lto.sh" 2>&1 | tee "$FINAL/log.txt" | tail -45
echo "gpu_lto.sh: exit ${PIPESTATUS[0]}" | tee -a "$FINAL/log.txt"
OUT="$WORK/dispatch" RUNS=${RUNS:-1 2} WHOLE=0 PARTS=0 COSTS= TEST_TIMEOUT=${TEST_TIMEOUT:-180} \
  timeout 300 bash "$ROOT/bench/gpu_dispatch.sh" 2>&1 | tee -a "$FINAL/log.txt" | tail -30
echo "gpu_dispatch.sh: exit ${PIPESTATUS[0]}" | tee -a "$FINAL/log.txt"
