#!/usr/bin/env bash
# Device probe: fp8_training on the GPU: its gpu test, the train suite beside bf16 and the line,
# and a trace of two train cases.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
mkdir -p $OUT/r
finish() { tar czf $OUT/r.tgz -C $OUT r; }
trap finish EXIT
t0=$SECONDS
timeout 220 python3 -m pytest -q -m gpu tests/test_fp8_training.py -p no:warnings 2>&1 | tee $OUT/r/tests.log | tail -6
echo "== tests $((SECONDS-t0)) s"; t0=$SECONDS
timeout 230 python3 -m benchmarks.run --out $OUT/r/train --suite train --no-plots --time-limit 170 \
  --impls moe_pallas:auto,cublas_line,torch._grouped_mm,moe_pallas:auto+fp8_training > $OUT/r/train.log 2>&1
echo "rc=$? == train $((SECONDS-t0)) s"; cat $OUT/r/train/summary.md 2>/dev/null | head -20
python3 - <<'P'
import json, os
d = json.load(open(os.environ["OUT"] + "/r/train/results.json"))
for r in d["rows"]:
    print(r["case"], r["impl"], r["status"], r["time_ms"], r["vs_line"], r["rel_err"], r["peak_mem_gib"], (r["message"] or "")[:200])
P
t0=$SECONDS
timeout $((560 - SECONDS)) python3 -m benchmarks.trace --steps 5 --impl moe_pallas:auto+fp8_training \
  --out $OUT/r/trace.md --case gptoss:train:4096 swiglu256:train:2048 > $OUT/r/trace.log 2>&1
echo "rc=$? == trace $((SECONDS-t0)) s"
