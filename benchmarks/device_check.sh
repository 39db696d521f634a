#!/usr/bin/env bash
# One GPU-machine call that checks and times everything, in priority order, each step under its own
# time limit: the layer suites (ours), the gpu-marked tests, expert parallelism (when 2+ GPUs) and
# the demo at seed shapes. Output under $OUT (log.txt, suites/, ep_*.json).
# Usage on the device: OUT=... BENCH_COMMIT=<sha> bash benchmarks/device_check.sh
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
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c 'import jax; print("jax", jax.__version__, jax.devices())'
  step "${SUITES_S:-150}" bash benchmarks/gpu_run.sh --suite gptoss,swiglu256 \
    --impls moe_pallas:pallas_triton --out "$OUT/suites" --time-limit "${SUITES_LIMIT_S:-130}"
  rm -f "$OUT/suites/roofline.png" "$OUT/suites/results.csv"
  step "${TESTS_S:-170}" python3 -m pytest -m gpu -v -p no:cacheprovider tests
  if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
    step "${EP_S:-100}" python3 benchmarks/bench_ep.py --out "$OUT" --tokens 2048 --budget-s 80
  fi
  step "${DEMO_S:-45}" python3 -m moe_pallas demo
} 2>&1 | tee "$OUT/log.txt"
