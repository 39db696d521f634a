# Session 16, call 2: the row-gather probes and the gpu tests of the gathering Mosaic GPU gmm.
set -x
S=benchmarks/results/2026-12-02_h200_session16/scripts
export PYTHONPATH=$PWD:$PWD/$S:$PWD/benchmarks/results/2026-12-01_h200_session11/scripts
git log --oneline -1; git status --short | head
timeout 120 python3 $S/probe_row_gather.py 2>&1 | grep -v "^W0\|^I0" | tee $OUT/call2_row_gather.txt
timeout 200 python3 $S/probe_gather_gmm.py 2>&1 | grep -v "^W0\|^I0" | tee $OUT/call2_gather_gmm.txt
timeout 200 python3 -m pytest -m gpu -q tests/test_kernels_gpu.py tests/test_fused.py -k "row_gather or mosaic_gpu_full" 2>&1 | tail -15 | tee $OUT/call2_tests.txt
