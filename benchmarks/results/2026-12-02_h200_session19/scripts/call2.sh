#!/bin/bash
# Session 19, call 2: the SwiGLU-256 suite's last 8 cases under auto / pallas_triton / mosaic_gpu,
# appended to session 18's side-by-side (whose 470 s limit stopped after the first 8 cases).
cd "$(dirname "$0")/../../../.."
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv
cp -r benchmarks/results/2026-12-02_h200_session18/suites $OUT/suites
BENCH_COMMIT=${BENCH_COMMIT:-142fdb2} timeout 560 bash benchmarks/gpu_run.sh --suite swiglu256 \
  --tokens 2304,2336,2447,2767,3072,3803,4096,8192 \
  --impls moe_pallas:auto,moe_pallas:pallas_triton,moe_pallas:mosaic_gpu \
  --out $OUT/suites --time-limit 500 --budget 0.15 --append 2>&1 | grep -v "^WARNING" | tee $OUT/call2_log.txt | tail -40
