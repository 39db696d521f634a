#!/usr/bin/env bash
# Device probe, short: gpt-oss's train step at T = 4096 and 16384 (ours bf16, fp8_training, the
# line), then fp8_blocks against the jnp rule and the train step's check at T = 2048.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p $OUT/r
t0=$SECONDS
timeout 110 python3 -m benchmarks.run --out $OUT/r/train --suite train --no-plots --time-limit 70 \
  --tokens 4096,16384 --impls moe_pallas:auto,moe_pallas:auto+fp8_training,cublas_line > $OUT/r/train.log 2>&1
echo "rc=$? == train $((SECONDS-t0)) s"
python3 - <<'P'
import json, os
d = json.load(open(os.environ["OUT"] + "/r/train/results.json"))
for r in d["rows"]:
    print(r["case"], r["impl"], r["status"], r.get("time_ms"), r.get("vs_line"), r.get("peak_mem_gib"), (r.get("message") or "")[:100])
P
t0=$SECONDS
timeout $((200 - SECONDS)) python3 .probe/fp8_blocks_check.py 2>&1 | grep -v "^WARNING\|^I0000" | tee $OUT/r/check.log
echo "== check $((SECONDS-t0)) s"
