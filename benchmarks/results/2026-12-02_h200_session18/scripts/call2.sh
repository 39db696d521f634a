#!/bin/bash
# Session 18, call 2: the CLI demo on the GPU (seed shapes; a gpt-oss-20b-shaped MXFP4 checkpoint in
# two shards); the gpu tests of the slab and padded-tgmm kernels.
cd "$(dirname "$0")/../../../.."
S=benchmarks/results/2026-12-02_h200_session18/scripts
export PYTHONPATH=$PWD
python3 -m moe_pallas demo 2>&1 | grep -v "^WARNING\|Deprecat\|return rule" | tee $OUT/call2_demo.txt
python3 $S/make_mxfp4_checkpoint.py /tmp/ck20 | tee -a $OUT/call2_demo.txt
for t in 2048 1; do
  /usr/bin/time -f "demo --checkpoint --tokens $t: %e s wall" python3 -m moe_pallas demo --checkpoint /tmp/ck20/ --tokens $t 2>&1 \
    | grep -v "^WARNING\|Deprecat\|return rule" | tee -a $OUT/call2_demo.txt
done
timeout 240 python3 -m pytest -m gpu -v -p no:cacheprovider tests/test_slab.py tests/test_tgmm_padded.py 2>&1 | grep -E "PASS|FAIL|ERROR|passed|failed" | tee $OUT/call2_tests.txt
