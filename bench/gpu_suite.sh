#!/usr/bin/env bash
# The benchmark suite's GPU scenarios (bench/run.py gpu) on a GPU machine without nox, in one call.
#
#   python3 ci/nox.py -s wheels                  # here: dist/ with cuplug, cuplug-cuda12, cuplug-cuda13
#   run: bash bench/gpu_suite.sh                 # device call, carry ["dist"], timeout_s 600 (scenarios: 480 s)
#
# It installs the wheels as bench/gpu_dispatch.sh does, byte-compiles them (that image sets
# PYTHONDONTWRITEBYTECODE=1: without .pyc files every fresh process of the cold start compiles cuplug's
# sources again, +70 ms, docs/performance.md), then runs every GPU scenario into a scratch folder and packs
# it (the device machine brings back 8 files at most). $OUT gets suite.tar.gz (run<N>/<scenario>.json,
# run<N>/targets.png), targets-run<N>.png and log.txt; the records' table is printed last. Unpack into
# bench/results/<date>-<host>/ to keep the records: tar -xzf suite.tar.gz -C bench/results/<date>-<host>
#
# RUNS=n  how many runs (default 1)   BUDGET=s  seconds for the scenarios (default 480)   SCENARIOS  (default gpu)
set -o pipefail
ROOT=$(pwd)
: "${OUT:?OUT must be set (the device machine sets it)}"
WORK=/tmp/cuplug-suite
rm -rf /tmp/site "$WORK"
export PYTHONUNBUFFERED=1
exec > >(tee "$OUT/log.txt") 2>&1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || echo "gpu_suite: no GPU answers here"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$ROOT"/dist/*.whl || {
  echo "gpu_suite: installing dist/*.whl failed: run python3 ci/nox.py -s wheels here and carry dist"; exit 1; }
python3 -m compileall -q /tmp/site > /dev/null || { echo "gpu_suite: byte-compiling /tmp/site failed"; exit 1; }
export PYTHONPATH=/tmp/site
cd /tmp || exit 1
# shellcheck disable=SC2086  # SCENARIOS is a list of names
python3 "$ROOT/bench/run.py" ${SCENARIOS:-gpu} --out "$WORK" --runs "${RUNS:-1}" --budget "${BUDGET:-480}"
status=$?
tar -czf "$OUT/suite.tar.gz" -C "$WORK" .
for png in "$WORK"/run*/targets.png; do [ -e "$png" ] && cp "$png" "$OUT/targets-$(basename "$(dirname "$png")").png"; done
echo "== the records' table (python3 bench/run.py --table DIR)"
python3 "$ROOT/bench/run.py" --table "$WORK"
echo "gpu_suite: run.py exit $status; $OUT: $(cd "$OUT" && ls | tr '\n' ' ')"
exit $status
