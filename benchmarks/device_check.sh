#!/usr/bin/env bash
# GPU-machine checks and timings in one call, each step under its own time limit, in the order
# given by STEPS (default: suites tests ep demo; "a+b" runs steps a and b at once, for steps whose
# timings do not matter; keep "tests" alone: beside the fuzz processes a gpt-oss determinism test
# failed, 2026-12-01, and a test step cut by its limit prints no failure reports). Output under
# $OUT (at most 8 files come back from the device tool: log.txt plus a few JSON/plots). Steps:
#   suites  the two 16-case forward suites of our layer (benchmarks/run.py; SUITES picks others,
#           e.g. gptoss,swiglu256,train)                                      -> $OUT/suites/
#   peers   the same suites for tokamax and torch (carry .peers/)         -> $OUT/peers/
#   tests   every gpu-marked test
#   ep      expert parallelism, 1 vs all GPUs (skipped with fewer than 2; EP_ARGS e.g.
#           "--workload gptoss --exchange ragged")                           -> $OUT/ep_*.json
#   demo    python -m moe_pallas demo at seed shapes
#   gmm     gmm/tgmm kernels at both workloads' shapes                     -> $OUT/gmm.json
#   mgpu    Mosaic GPU gmm next to Triton (MGPU_ARGS: bench_gmm_mgpu options)  -> $OUT/gmm_mgpu.json
#   tgmm    the weight gradients against cuBLAS and fill references (TGMM_ARGS: bench_tgmm options,
#           e.g. "--mosaic-configs 64,64,128,3,2 64,64,256,4,1,1")             -> $OUT/tgmm.json
#   autotune  the gmm/tgmm block table for AUTOTUNE_CLASSES (default small; AUTOTUNE_ARGS e.g.
#           "--kernels gmm --around-table")                                    -> $OUT/config.py;
#           AUTOTUNE_APPLY=1 copies it into moe_pallas/kernels/config.py for the later steps
#   layer   fwd+bwd of the layer, per-kernel breakdown, memory             -> $OUT/layer.json
#   fuzz    the long hypothesis profile, time-capped, FUZZ_PROCS processes per test -> $OUT/fuzz.json
#   memory  peak memory of fwd and fwd+bwd at the largest seed cases      -> $OUT/memory.json
#   train   python -m moe_pallas train --size small
#   profile per-kernel GPU times of the layer from a jax.profiler trace (PROFILE_ARGS, e.g.
#           "--cases gptoss:2048 --modes fwd")
# Usage on the device: OUT=... BENCH_COMMIT=<sha> STEPS="suites tests" bash benchmarks/device_check.sh
# (each step's limit: <STEP>_S seconds, e.g. SUITES_S=150; TESTS=<files> picks the test files in
# that order, SUITES_IMPLS the suites' implementations (e.g. moe_pallas:pallas_triton,moe_pallas:mosaic_gpu),
# TEST_TIMEOUT caps each test (pytest-timeout, on the device image), TRAIN_ARGS the
# train options, LAYER_ARGS bench_layer's).
set -uo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to the output folder}"
export PYTHONPATH=. PYTHONUNBUFFERED=1
step() {
  local limit=$1; shift
  echo "== $(date -u +%T) $* (limit ${limit}s)"
  timeout "$limit" "$@"
  echo "== exit $?"
}
# The long fuzz profile, FUZZ_PROCS processes per test (test:count; compiles and the host side of
# each example run on the CPU, so processes of one test draw different examples in parallel), dealt
# round-robin to the GPUs and sharing them (no preallocation); their reports are merged into
# $OUT/fuzz.json (examples summed per test), their output tails go to the log.
FUZZ_PROCS_DEFAULT="test_ragged_dot:2 test_moe_experts:3 test_gmm_epilogues:3 test_tgmm_matches:2 test_tgmm_padded:2 test_tile_schedule:3"
fuzz_every_test() {
  local limit=$1 gpus i=0 t n j spec
  gpus=$(nvidia-smi -L | wc -l)
  echo "== $(date -u +%T) fuzz: ${FUZZ_PROCS:-$FUZZ_PROCS_DEFAULT} on $gpus GPU(s) (limit ${limit}s)"
  for spec in ${FUZZ_PROCS:-$FUZZ_PROCS_DEFAULT}; do
    t=${spec%%:*} n=${spec##*:}
    for (( j = 0; j < n; j++ )); do
      CUDA_VISIBLE_DEVICES=$(( i % gpus )) XLA_PYTHON_CLIENT_PREALLOCATE=false \
        FUZZ_REPORT="$OUT/fuzz_${t}_$j.json" timeout "$limit" \
        python3 -m pytest tests/test_fuzz.py --long -q -p no:cacheprovider -k "$t" \
        --fuzz-minutes "$(awk "BEGIN {print ($limit - 45) / 60}")" > "$OUT/fuzz_${t}_$j.txt" 2>&1 &
      i=$(( i + 1 ))
    done
  done
  wait
  tail -n 3 "$OUT"/fuzz_*.txt && rm -f "$OUT"/fuzz_*.txt
  python3 benchmarks/merge_fuzz.py "$OUT/fuzz.json" "$OUT"/fuzz_*.json
  echo "== fuzz done"
}
run_step() {
  case "$1" in
    suites) step "${SUITES_S:-150}" bash benchmarks/gpu_run.sh --suite "${SUITES:-gptoss,swiglu256}" \
              --impls "${SUITES_IMPLS:-moe_pallas:pallas_triton}" --out "$OUT/suites" --time-limit "$(( ${SUITES_S:-150} - 20 ))"
            rm -f "$OUT/suites/roofline.png" "$OUT/suites/results.csv" ;;
    peers)  step "${PEERS_S:-240}" bash benchmarks/gpu_run.sh --suite gptoss,swiglu256 \
              --impls tokamax,torch._grouped_mm --out "$OUT/peers" --time-limit "$(( ${PEERS_S:-240} - 20 ))" --no-plots
            rm -f "$OUT/peers/results.csv" ;;
    tests)  step "${TESTS_S:-240}" python3 -m pytest -m gpu -v --durations=0 -p no:cacheprovider \
              --timeout "${TEST_TIMEOUT:-120}" ${TESTS:-tests} ;;
    ep)     if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
              step "${EP_S:-150}" python3 benchmarks/bench_ep.py --out "$OUT" --budget-s "$(( ${EP_S:-150} - 20 ))" ${EP_ARGS:-}
            fi ;;
    demo)   step "${DEMO_S:-45}" python3 -m moe_pallas demo ;;
    gmm)    step "${GMM_S:-150}" python3 benchmarks/bench_gmm.py --out "$OUT/gmm.json" --no-ragged-dot ;;
    mgpu)   step "${MGPU_S:-300}" python3 benchmarks/bench_gmm_mgpu.py --out "$OUT/gmm_mgpu.json" ${MGPU_ARGS:-} ;;
    tgmm)   step "${TGMM_S:-200}" python3 benchmarks/bench_tgmm.py --out "$OUT/tgmm.json" ${TGMM_ARGS:-} ;;
    autotune) cp moe_pallas/kernels/config.py "$OUT/config.py"
            step "${AUTOTUNE_S:-240}" python3 benchmarks/autotune_gmm.py \
              --classes ${AUTOTUNE_CLASSES:-small} --write "$OUT/config.py" --log "$OUT/autotune.json" \
              ${AUTOTUNE_ARGS:-}
            if [ "${AUTOTUNE_APPLY:-0}" = 1 ]; then cp "$OUT/config.py" moe_pallas/kernels/config.py; fi ;;
    layer)  step "${LAYER_S:-180}" python3 benchmarks/bench_layer.py --out "$OUT/layer.json" ${LAYER_ARGS:-} ;;
    fuzz)   fuzz_every_test "${FUZZ_S:-300}" ;;
    memory) step "${MEMORY_S:-180}" python3 -m benchmarks.bench_memory --out "$OUT/memory.json" ;;
    train)  step "${TRAIN_S:-120}" python3 -m moe_pallas train --no-progress ${TRAIN_ARGS:---size small} ;;
    profile) step "${PROFILE_S:-120}" python3 benchmarks/profile_layer.py --out /tmp ${PROFILE_ARGS:-} ;;
    *)      echo "unknown step $1" ;;
  esac
}
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c 'import jax; print("jax", jax.__version__, jax.devices())'
  for s in ${STEPS:-suites tests ep demo}; do
    if [[ $s == *+* ]]; then  # "a+b": steps a and b at the same time, sharing the GPU memory
      for part in ${s//+/ }; do (XLA_PYTHON_CLIENT_PREALLOCATE=false run_step "$part") & done
      wait
    else
      run_step "$s"
    fi
  done
} 2>&1 | tee "$OUT/log.txt"
