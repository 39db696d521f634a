# Session 16, call 3: the gathering gmm_mgpu at layer shapes; cp.async with deeper rings; gpu tests.
set -x
S=benchmarks/results/2026-12-02_h200_session16/scripts
export PYTHONPATH=$PWD:$PWD/$S:$PWD/benchmarks/results/2026-12-01_h200_session11/scripts
git log --oneline -1; git status --short | head
timeout 170 python3 $S/probe_gather_gmm.py 2>&1 | grep -v "^W0\|^I0" | tee $OUT/call3_gather_gmm.txt
for v in 64,8 128,5; do
  PROBE_BN_STAGES=$v PROBE_VARIANTS=box,cpasync timeout 60 python3 $S/probe_row_gather.py 2>&1 | grep -v "^W0\|^I0" | tee -a $OUT/call3_row_gather.txt
done
timeout 200 python3 -m pytest -m gpu -q tests/test_kernels_gpu.py tests/test_fused.py -k "(row_gather and not 256) or (mosaic_gpu_full and (gptoss-1- or swiglu-128))" 2>&1 | tail -15 | tee $OUT/call3_tests.txt
