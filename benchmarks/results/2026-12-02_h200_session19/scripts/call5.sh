#!/bin/bash
# Session 19, call 5 (ran as this one-line command): the streamed backward's trace under XLA flags.
cd "$(dirname "$0")/../../../.."
S=benchmarks/results/2026-12-02_h200_session19/scripts; export PYTHONPATH=$PWD:$PWD/$S; for F in "--xla_gpu_experimental_stream_annotation=true" "--xla_gpu_experimental_stream_annotation=true --xla_gpu_enable_command_buffer=" ; do echo "XLA_FLAGS=$F"; XLA_FLAGS="$F" timeout 100 python3 $S/probe_streams_trace.py one 2>&1 | grep -v "^WARNING" | tail -6; done | tee $OUT/call5_trace.txt
