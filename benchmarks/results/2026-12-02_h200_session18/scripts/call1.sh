#!/bin/bash
# Session 18, call 1: the ping-pong slab matmul probe; the 2^31-element reliability tests; MXFP4 load timing.
cd "$(dirname "$0")/../../../.."
S=benchmarks/results/2026-12-02_h200_session18/scripts
export PYTHONPATH=$PWD:$PWD/$S:$PWD/benchmarks/results/2026-12-01_h200_session13/scripts:$PWD/benchmarks/results/2026-12-01_h200_session11/scripts
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv
timeout 330 python3 $S/probe_pingpong.py 2>&1 | grep -v "^WARNING" | tee $OUT/call1_pingpong.txt | tail -40
timeout 150 python3 -m pytest -m gpu -v -p no:cacheprovider tests/test_reliability.py -k 2_pow_31 2>&1 | tail -8 | tee $OUT/call1_tests.txt
timeout 60 python3 benchmarks/results/2026-12-02_h200_session17/scripts/mxfp4_gpu.py 2>&1 | tail -8 | tee $OUT/call1_mxfp4.txt
