#!/bin/bash
# Session 19, call 1: the chained-visits Mosaic GPU gmm (MosaicConfig.chain, trailing "c") against
# the same configs unchained, gpt-oss and SwiGLU, small (T = 2048) and large (T = 16384 / 8192) rows.
cd "$(dirname "$0")/../../../.."
export PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv
timeout 290 python3 benchmarks/bench_gmm_mgpu.py --out $OUT/chain_gptoss.json --workloads gptoss \
  --tokens 2048 16384 --tgmm-configs \
  --configs 64,256,64,4,4,2m 64,256,64,3,4,2m 64,256,64,3,4,2mc 64,128,64,3,4,2 64,128,64,3,4,2c \
  2>&1 | grep -v "^WARNING" | tee $OUT/chain_gptoss.txt
timeout 290 python3 benchmarks/bench_gmm_mgpu.py --out $OUT/chain_swiglu.json --workloads swiglu \
  --tokens 2048 8192 --tgmm-configs \
  --configs 64,256,64,4,4,2m 64,256,64,4,4,2mc 64,128,64,4,4,2 64,128,64,4,4,2c \
  2>&1 | grep -v "^WARNING" | tee $OUT/chain_swiglu.txt
