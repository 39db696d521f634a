#!/bin/bash
# Session 18, call 4: the slab matmuls at capacity 64 / 96 / 128 (how much the padded contraction costs).
cd "$(dirname "$0")/../../../.."
S=benchmarks/results/2026-12-02_h200_session18/scripts
export PYTHONPATH=$PWD:$PWD/$S:$PWD/benchmarks/results/2026-12-01_h200_session13/scripts:$PWD/benchmarks/results/2026-12-01_h200_session11/scripts
timeout 300 python3 $S/probe_capacity.py 2>&1 | grep -v "^WARNING" | tee $OUT/call4_capacity.txt | tail -32
