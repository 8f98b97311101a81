#!/usr/bin/env bash
# Issue 33 on the GPU machine: the Hopper build (dist-hopper/: sm90a, sm90, fatbin, ptx per CUDA major, with
# dist/'s cuplug wheel) installed into its own site; tests/test_gpu_targets.py on it (the arch-specific variant
# selected and run, the plain one forced, the planted wrong sm90a of build/planted/ rejected by its self-test);
# then what the self-test adds to load() (bench/selftest_cost.py) on that site and on dist/'s default one.
# Carried: dist, dist-hopper, build/planted, build/deps (pyelftools: --no-deps installs leave it out).
# $OUT gets targets-tests.log, selftest-cost-{hopper,default}.json.
#   here:  python3 ci/nox.py -s wheels hopper_wheels; .nox/wheels/bin/python bench/plant_wrong_sm90a.py build/planted
#   run:   bash bench/gpu_targets.sh
set -o pipefail
ROOT=$(pwd)
SITE=/tmp/hopper-site
rm -rf "$SITE" && python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" \
  "$ROOT"/dist/cuplug-*.whl "$ROOT"/dist-hopper/*.whl "$ROOT"/build/deps/*.whl || { echo "gpu_targets: install failed"; exit 1; }
python3 -m compileall -q "$SITE" > /dev/null
export PYTHONUNBUFFERED=1
cd /tmp || exit 1
CUPLUG_HOPPER_SITE="$SITE" CUPLUG_PLANTED_SM90A="$ROOT/build/planted/libcuplug_vector.so" PYTHONPATH="$SITE" \
  timeout 240 python3 -m pytest "$ROOT/tests/test_gpu_targets.py" -p no:cacheprovider --rootdir="$ROOT" \
  -c "$ROOT/pyproject.toml" -q -rfE -o addopts="" 2>&1 | tee "$OUT/targets-tests.log" | tail -15
PYTHONPATH="$SITE" python3 -m cuplug doctor > "$OUT/targets-doctor.txt" 2>&1
PYTHONPATH="$SITE" timeout 120 python3 "$ROOT/bench/selftest_cost.py" 9 > "$OUT/selftest-cost-hopper.json"
PYTHONPATH=/tmp/site timeout 120 python3 "$ROOT/bench/selftest_cost.py" 9 > "$OUT/selftest-cost-default.json"
for f in "$OUT"/selftest-cost-*.json; do echo "== $f"; python3 -c "
import json,sys; d=json.load(open(sys.argv[1])); print(d.get('variant'), {m: (v['load_ms']['median'], v['selftest_ms']['median'], v['load_ms_minus_selftest_0'], v['load_and_first_use_ms_minus_selftest_0']) for m, v in d.get('modes', {}).items()}, d.get('ops_first_second_ms'), d.get('always_ops_ms'), d.get('error', '')[:500])" "$f"; done
