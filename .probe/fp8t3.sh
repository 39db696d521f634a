#!/usr/bin/env bash
# Device probe, short: fp8_blocks against the jnp rule (gpt-oss) with the train step's check, then
# the train suite (ours bf16, fp8_training, the line).
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p $OUT/r
t0=$SECONDS
timeout 130 python3 .probe/fp8_blocks_check.py 2>&1 | grep -v "^WARNING\|^I0000" | tee $OUT/r/check.log
echo "== check $((SECONDS-t0)) s"; t0=$SECONDS
timeout $((245 - SECONDS)) python3 -m benchmarks.run --out $OUT/r/train --suite train --no-plots --time-limit 80 \
  --impls moe_pallas:auto,moe_pallas:auto+fp8_training,cublas_line > $OUT/r/train.log 2>&1
echo "rc=$? == train $((SECONDS-t0)) s"
python3 - <<'P'
import json, os
d = json.load(open(os.environ["OUT"] + "/r/train/results.json"))
for r in d["rows"]:
    print(r["case"], r["impl"], r["status"], r.get("time_ms"), r.get("vs_line"), r.get("peak_mem_gib"), (r.get("message") or "")[:100])
P
