#!/usr/bin/env bash
# Issue 18 on the GPU machine (`build/wheels/` and `build/deps/` carried): the real driver and the real
# CUDA artifacts loaded from sealed memfds. doctor/probe/inspect, the gpu tests (JUnit for
# docs/reliability.md), where the loaded library is mapped from, and the verify+dlopen and decision
# benchmarks with the real driver. Everything lands in $OUT.
set -o pipefail
REPO=$(pwd)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/run.log"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$REPO"/build/wheels/*.whl \
  "$REPO"/build/deps/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
cp -r "$REPO/tests" /tmp/t && cd /tmp || exit 1
{ python3 -m cuplug doctor; python3 -m cuplug probe; echo "probe exit $?"; python3 -m cuplug inspect;
  echo "inspect exit $?"; python3 -m cuplug doctor --timeout 0; echo "doctor --timeout 0 exit $?";
  python3 -c "
import cuplug, json
b = cuplug.load()
maps = open('/proc/self/maps').read()
print(json.dumps({'variant': b.variant, 'cuda': b.cuda, 'path': str(b.path),
  'mapped_from_memfd': '/memfd:cuplug:' + b.path.name in maps, 'real_path_mapped': str(b.path) in maps,
  'attempts': [[a.variant, a.code] for a in b.trace.attempts]}))"; } 2>&1 | tee "$OUT/doctor.txt"
python3 -m pytest /tmp/t/test_gpu.py -p no:cacheprovider --rootdir=/tmp/t -q -o addopts="" \
  -o junit_family=xunit1 --junitxml="$OUT/gpu-junit.xml" -rA 2>&1 | tee "$OUT/gpu_tests.log" | tail -15
python3 "$REPO/bench/verify_dlopen_bench.py" "$OUT/verify-dlopen.json" 2>&1 | tail -20
[ "${WITH_DECISION:-0}" = 1 ] && python3 "$REPO/bench/decision_bench.py" "$OUT/decision.json"
