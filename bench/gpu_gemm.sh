#!/usr/bin/env bash
# Issue 32 part 5 on the GPU machine: examples/gemm (cublasSgemm behind one op) installed where PyTorch's CUDA 13
# wheels put NVIDIA's libcublas.so.13 (the interpreter's own site-packages: the artifact's RUNPATH is
# $ORIGIN/../../nvidia/cu13/lib), its tests run against its CPU twin on the GPU. Carried: examples/gemm/dist
# (GEMMKIT_MAJORS=cuda13 nox -f examples/gemm/noxfile.py -s wheels), dist/ (cuplug, installed in /tmp/site).
ROOT=$(pwd)
python3 -m pip install -q --no-index --no-deps --force-reinstall "$ROOT"/examples/gemm/dist/*.whl || exit 1
so=$(python3 -c "import gemmkit_cuda13, pathlib; print(next(pathlib.Path(gemmkit_cuda13.__file__).parent.glob('*/libcuplug_*.so')))")
echo "== $so"; ldd "$so" | grep -E "cublas|not found"
cd /tmp && PYTHONPATH=/tmp/site python3 -m pytest "$ROOT/examples/gemm/tests" -q -p no:cacheprovider -rfEs -o addopts="" 2>&1 | tail -8
PYTHONPATH=/tmp/site python3 -c "import cuplug; b = cuplug.load('gemm'); print('gemm served by', b.cuda, b.variant)" 2>&1 | tail -2
