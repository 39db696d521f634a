#!/usr/bin/env bash
# Every variant of benchmarks/probe_case18.py plain (3 runs) and under memcheck, initcheck,
# synccheck and racecheck (1 run each), one process each; OUT_DIR/probe_case18.log.
out=${1:?usage: benchmarks/probe_case18.sh OUT_DIR}; mkdir -p "$out"; log=$out/probe_case18.log
export XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_PYTHON_CLIENT_ALLOCATOR=platform
export XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_autotune_level=0 --xla_gpu_enable_command_buffer="
for v in case18 stages3 one_path bn64 fp8 plain_gmm; do
  echo "== $v plain" >> "$log"; timeout 120 python3 -m benchmarks.probe_case18 $v 3 >> "$log" 2>&1
  for tool in memcheck initcheck synccheck racecheck; do
    echo "== $v $tool" >> "$log"
    timeout 120 compute-sanitizer --tool $tool --print-limit 20 python3 -m benchmarks.probe_case18 $v 1 \
      2>&1 | grep -E "relative error|OFF|ok \(|SUMMARY|Error|error" | head -12 >> "$log"
  done
done
grep -E "^==|OFF|ok \(|SUMMARY" "$log"
