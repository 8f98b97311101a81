#!/usr/bin/env bash
# The restructured loader on the H200 (issues 17 and 20), one device call; issue 22's numbers are the
# next call (bench/bench_h200.sh). Carried: dist (nox -s variant_wheels: dist/*.whl, dist/variants/),
# build/deps (pyelftools), .whl (uv-0.13.8-*.whl). Everything lands in $OUT/check.tar.gz and log.txt:
#
#   doctor.txt, probe.json       cuplug doctor / probe --json from the installed wheels (real driver)
#   decision-h200.json           bench/decision_bench.py with the real driver: import, explain, load to
#                                the CPU over a bare interpreter, beside ctypes cuInit alone
#   gpu-junit.xml, gpu-tests.log the gpu tests (tests/test_gpu*.py, -m gpu) on the installed wheels
#   variant-gpu.log, doctor-*.json  bench/variant_wheels_gpu.sh: uv picks the variant by itself, probe runs it
set -o pipefail
REPO=$(pwd)
: "${OUT:?OUT must be set (the device machine sets it)}"
A="$OUT/check"
mkdir -p "$A"
export PYTHONUNBUFFERED=1
exec > >(tee "$OUT/log.txt") 2>&1
step() { echo "== $(date +%T) $*"; timeout "$1" "${@:2}"; echo "== rc $?"; }
nvidia-smi --query-gpu=name,compute_cap,driver_version,pstate,temperature.gpu --format=csv,noheader
nvidia-smi --query-compute-apps=pid,process_name --format=csv,noheader
echo "PYTHONDONTWRITEBYTECODE=${PYTHONDONTWRITEBYTECODE-unset}"
python3 -m pip install -q --no-index --no-deps --target /tmp/site "$REPO"/dist/cuplug*.whl "$REPO"/build/deps/*.whl \
  2>&1 | grep -v "as the 'root' user"
export PYTHONPATH=/tmp/site
cd /tmp || exit 1
step 60 python3 -m cuplug doctor > "$A/doctor.txt"
step 60 python3 -m cuplug probe --json > "$A/probe.json"
tail -3 "$A/doctor.txt"; grep -E '"(ok|variant|cuda|code|add_ms|total_ms|exit_code)"' "$A/probe.json"
CUPLUG_BENCH_RUNS=15 step 120 python3 "$REPO/bench/decision_bench.py" "$A/decision-h200.json"
step 240 python3 -m pytest "$REPO"/tests/test_gpu.py "$REPO"/tests/test_gpu_v2.py "$REPO"/tests/test_gpu_perf.py -m gpu \
  --rootdir="$REPO/tests" -q -p no:cacheprovider -o addopts="" -rfE -o junit_family=xunit1 \
  --junitxml="$A/gpu-junit.xml" > "$A/gpu-tests.log" 2>&1
tail -5 "$A/gpu-tests.log"
cd "$REPO" || exit 1
OUT="$A" step 150 bash bench/variant_wheels_gpu.sh > /dev/null
tail -4 "$A/variant-gpu.log"
tar -czf "$OUT/check.tar.gz" -C "$OUT" check && rm -rf "$A"
echo "h200_check: done"
