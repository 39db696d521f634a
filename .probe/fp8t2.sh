#!/usr/bin/env bash
# Device probe: fp8_blocks check and timing, the fp8_training gpu test, the train suite (ours and
# the line only: torch's allocator would share the card), a trace.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
mkdir -p $OUT/r
finish() { tar czf $OUT/r.tgz -C $OUT r; }
trap finish EXIT
t0=$SECONDS
timeout 200 python3 .probe/fp8_blocks_check.py 2>&1 | grep -v "^WARNING\|^I0000" | tee $OUT/r/check.log
echo "== check $((SECONDS-t0)) s"; t0=$SECONDS
timeout 170 python3 -m benchmarks.run --out $OUT/r/train --suite train --no-plots --time-limit 130 \
  --impls moe_pallas:auto,cublas_line,moe_pallas:auto+fp8_training > $OUT/r/train.log 2>&1
echo "rc=$? == train $((SECONDS-t0)) s"
python3 - <<'P'
import json, os
d = json.load(open(os.environ["OUT"] + "/r/train/results.json"))
for r in d["rows"]:
    print(r["case"], r["impl"], r["status"], r.get("time_ms"), r.get("vs_line"), r.get("peak_mem_gib"), (r.get("message") or "")[:150])
P
t0=$SECONDS
timeout 90 python3 -m benchmarks.trace --steps 5 --impl moe_pallas:auto+fp8_training \
  --out $OUT/r/trace.md --case gptoss:train:4096 > $OUT/r/trace.log 2>&1
echo "rc=$? == trace $((SECONDS-t0)) s"; t0=$SECONDS
