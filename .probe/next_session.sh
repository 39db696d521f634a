#!/usr/bin/env bash
# usage (device, carry [".probe"]): bash .probe/next_session.sh 1|2
#   1: the quantised GPU tests (the new PTX: byte pairs on decode tiles, one scale multiply;
#      weights_first's layer; fp8 activations) then the gpt-oss A/Bs (.probe/ab_all.py);  2: SwiGLU-256's A/Bs.
set -o pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader
if [ "$1" = 1 ]; then
  timeout 240 python3 -m pytest -q -m gpu tests/test_quant.py tests/test_weights.py \
    tests/test_fp8_activations.py \
    -p no:cacheprovider 2>&1 | tail -8 | tee $OUT/gputests.txt
  timeout 330 python3 .probe/ab_all.py gptoss $OUT/ab_gptoss.json 2>&1 | tail -8
else
  timeout 570 python3 .probe/ab_all.py swiglu256 $OUT/ab_swiglu256.json 2>&1 | tail -8
fi
