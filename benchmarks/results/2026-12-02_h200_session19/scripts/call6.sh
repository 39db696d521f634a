#!/bin/bash
# Session 19, call 6 (ran as this one-line command): both streamed variants, command buffers off.
cd "$(dirname "$0")/../../../.."
S=benchmarks/results/2026-12-02_h200_session19/scripts; export PYTHONPATH=$PWD:$PWD/$S; F="--xla_gpu_experimental_stream_annotation=true --xla_gpu_enable_command_buffer= --xla_gpu_enable_latency_hiding_scheduler=true"; echo "XLA_FLAGS=$F"; XLA_FLAGS="$F" timeout 150 python3 $S/probe_streams_trace.py one two 2>&1 | grep -v "^WARNING" | tail -12 | tee $OUT/call6_trace.txt
