#!/bin/bash
# Session 19, call 4: traces of the gpt-oss T = 2048 train step, committed backward against the
# weight gradients on stream 1 (probe_streams_trace.py).
cd "$(dirname "$0")/../../../.."
S=benchmarks/results/2026-12-02_h200_session19/scripts
export PYTHONPATH=$PWD:$PWD/$S
timeout 240 python3 $S/probe_streams_trace.py none one 2>&1 | grep -v "^WARNING" | tee $OUT/call4_trace.txt | tail -30
