#!/usr/bin/env bash
# The whole GPU session in one call (device machine, wheels carried in dist/):
# install the wheels, run doctor/probe, the gpu tests and the benchmarks.
# Results land in $OUT (gpu_tests.log, bench.json, doctor.txt).
REPO=$(pwd)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$REPO"/dist/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
cp -r "$REPO/tests" /tmp/t && cd /tmp || exit 1
python3 -m cuplug doctor 2>&1 | tee "$OUT/doctor.txt"
python3 -m cuplug probe; echo "probe exit $?"
python3 -m pytest /tmp/t/test_gpu.py -p no:cacheprovider --rootdir=/tmp/t -q -o addopts="" 2>&1 | tee "$OUT/gpu_tests.log" | tail -40
python3 "$REPO/bench/gpu_bench.py" "$OUT/bench.json" 2>&1 | tail -30
