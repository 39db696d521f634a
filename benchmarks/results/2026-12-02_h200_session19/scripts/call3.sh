#!/bin/bash
# Session 19, call 3: the train suite with the backward's weight gradients on a second (third)
# CUDA stream beside dx's gmm (probe_streams.py), against the committed backward, same machine.
cd "$(dirname "$0")/../../../.."
S=benchmarks/results/2026-12-02_h200_session19/scripts
export PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_PYTHON_CLIENT_MEM_FRACTION=0.9
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv
for v in none one two none2; do
  BENCH_COMMIT=142fdb2+probe_streams:$v timeout 200 python3 $S/probe_streams.py --streams ${v%2} -- \
    --suite train --impls moe_pallas:auto --out /tmp/streams_$v --no-plots --budget 0.3 --time-limit 150 \
    2>&1 | grep -v "^WARNING" | tr '\r' '\n' | grep -v "bench:" | tee -a $OUT/call3_log.txt | tail -4
  cp /tmp/streams_$v/results.csv $OUT/streams_$v.csv
done
