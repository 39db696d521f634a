#!/usr/bin/env bash
# Device probe, short: fp8_blocks past 2^31 elements, fp8_blocks by num_warps, fp8_training's
# backward FP8 products on Triton against Mosaic GPU.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
t0=$SECONDS
timeout 120 python3 .probe/big_check.py 2>&1 | grep -v "^WARNING\|^I0000" | tee $OUT/big.log
echo "== big_check $((SECONDS-t0)) s"
t0=$SECONDS
timeout 80 python3 .probe/warps.py 2>&1 | grep -v "^WARNING\|^I0000" | tee $OUT/warps.log
echo "== warps $((SECONDS-t0)) s"
t0=$SECONDS
timeout $((390 - SECONDS)) python3 .probe/train_ab.py --compile-workers 1 --out $OUT/train --suite train --no-plots \
  --time-limit $((360 - SECONDS)) --tokens 4096,16384 \
  --impls moe_pallas:auto+fp8_training,moe_pallas:auto+fp8_training_mgpu,moe_pallas:auto > $OUT/train.log 2>&1
echo "== train rc=$? $((SECONDS-t0)) s"
python3 - <<'P'
import json, os
d = json.load(open(os.environ["OUT"] + "/train/results.json"))
for r in d["rows"]:
    print(r["case"], r["impl"], r["status"], r.get("time_ms"), r.get("peak_mem_gib"), (r.get("message") or "")[:150])
P
