#!/bin/bash
# Session 18, call 3: write bandwidth of a store-only kernel at the weight gradients' shapes; the
# demo's burst timing (db33d9f) on the GPU.
cd "$(dirname "$0")/../../../.."
S=benchmarks/results/2026-12-02_h200_session18/scripts
export PYTHONPATH=$PWD:$PWD/$S:$PWD/benchmarks/results/2026-12-01_h200_session13/scripts:$PWD/benchmarks/results/2026-12-01_h200_session11/scripts
timeout 240 python3 $S/probe_store.py 2>&1 | grep -v "^WARNING" | tee $OUT/call3_store.txt | tail -20
python3 $S/make_mxfp4_checkpoint.py /tmp/ck20 > /dev/null
for t in 1 2048; do
  python3 -m moe_pallas demo --checkpoint /tmp/ck20/ --tokens $t 2>&1 | grep -v "^WARNING\|Deprecat\|return rule" | tee -a $OUT/call3_demo.txt
done
python3 -m moe_pallas demo 2>&1 | grep -v "^WARNING\|Deprecat\|return rule" | tee -a $OUT/call3_demo.txt
