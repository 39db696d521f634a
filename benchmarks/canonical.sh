#!/usr/bin/env bash
# The canonical run kept in benchmarks/results/ (docs/benchmarks.md, "The canonical run"), in steps
# that each fit a 10-minute call on an H100 or an H200 with room to spare (a step cut short, or
# lost with its machine, is run again alone), all at one commit (BENCH_COMMIT=<sha> where the tree
# has no .git). Each forward suite takes two steps of eight cases (--tokens, below):
#   benchmarks/canonical.sh 1    # gptoss forward, bf16 and quantised weights, first half (new run)
#   benchmarks/canonical.sh 2    # gptoss forward, second half (appended, as every later step)
#   benchmarks/canonical.sh 3    # swiglu256 forward, first half
#   benchmarks/canonical.sh 4    # swiglu256 forward, second half
#   benchmarks/canonical.sh 5    # decode, with the quantised peers
#   benchmarks/canonical.sh 6    # the gmm micro-benchmarks
#   benchmarks/canonical.sh 7    # train, bf16 and fp8_training
#   benchmarks/canonical.sh 8    # benchmarks.trace of decode, 64-row and compute-bound cases
#   python3 -m benchmarks.readme # README's table and docs/performance.md from the folder
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=benchmarks/results
IMPLS=moe_pallas:auto,cublas_line,tokamax,torch._grouped_mm
OURS_Q=moe_pallas:auto+fp8,moe_pallas:auto+fp8_block,moe_pallas:auto+mxfp4
# FP8 activations pay where the layer is compute-bound, so only the forward suites time them.
OURS_A8=moe_pallas:auto+fp8_a8,moe_pallas:auto+fp8_block_a8
FORWARD="$IMPLS,$OURS_Q,$OURS_A8"
PEERS_Q=tokamax+fp8,tokamax+fp8_block,tokamax+mxfp4
# FP8 training (`fp8_training`): train cases only.
OURS_TRAIN=moe_pallas:auto+fp8_training
# Each forward suite's tokens (benchmarks.cases.SUITE_TOKENS) in two halves of eight cases; the
# largest case, which takes the longest, goes with the smallest ones.
GPTOSS_A=2048,2080,2112,2144,2176,2208,2240,16384
GPTOSS_B=2272,2293,2304,2336,2368,2400,3011,4096
SWIGLU_A=2048,2080,2112,2144,2176,2208,2240,8192
SWIGLU_B=2272,2304,2336,2447,2767,3072,3803,4096
PY=${PYTHON:-python3}
# A case's compile-only implementations compile in COMPILE_WORKERS threads (1: one after another).
run() {
  "$PY" -m benchmarks.run --out "$OUT" --time-limit 540 --compile-workers "${COMPILE_WORKERS:-8}" "$@"
}
case "${1:-}" in
  1) run --suite gptoss --tokens "$GPTOSS_A" --impls "$FORWARD" ;;
  2) run --suite gptoss --tokens "$GPTOSS_B" --impls "$FORWARD" --append ;;
  3) run --suite swiglu256 --tokens "$SWIGLU_A" --impls "$FORWARD" --append ;;
  4) run --suite swiglu256 --tokens "$SWIGLU_B" --impls "$FORWARD" --append ;;
  5) run --suite decode --impls "$IMPLS,$OURS_Q,$PEERS_Q" --append ;;
  6) run --suite gmm --impls "$IMPLS" --append ;;
  7) run --suite train --impls "$IMPLS,$OURS_TRAIN" --append ;;
  8)
    "$PY" -m benchmarks.trace --steps 5 --out "$OUT/trace.md" --case gptoss:fwd:1 \
      gptoss:fwd:2048 gptoss:fwd:4096 gptoss:fwd:16384 gptoss:train:2048 gptoss:train:4096 \
      gptoss:train:16384 swiglu256:fwd:1 swiglu256:fwd:2048 swiglu256:fwd:3803 \
      swiglu256:fwd:4096 swiglu256:fwd:8192 swiglu256:train:2048 swiglu256:train:8192
    ;;
  *) echo "usage: benchmarks/canonical.sh 1|2|3|4|5|6|7|8 (docs/benchmarks.md)" >&2; exit 2 ;;
esac
