#!/usr/bin/env bash
# On a machine with a CUDA GPU: the engine against transformers in bf16 with and without CUDA graphs and
# the numba-cuda kernels (scripts/gpu_check.py), the kernel and bfloat16 tests on the GPU, the bench's
# roofline lines and chapter 09's fixed cost per step against model size on the GPU. Run from the repository
# root after `make venv`: bash scripts/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
status=0
$BIN/python scripts/gpu_check.py || status=$?
if [ "$status" = 2 ]; then exit 2; fi                       # no GPU: said why already
$BIN/pytest -q tests/test_kernels.py tests/test_bfloat16.py tests/test_profiler.py || status=1
$BIN/python -m minibatch bench --quick --device cuda --no-online --systems minibatch-continuous || status=1
$BIN/python -m minibatch overhead --device cuda || status=1   # chapter 09's fixed cost per step, measured on the GPU
echo "gpu_check: $([ $status = 0 ] && echo 'all passed' || echo FAILED)"
exit $status
