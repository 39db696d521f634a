#!/bin/bash
# A/B: the train step's traces at HEAD (a63761c, XLA GLU pass in the gradient's forward) and with
# the gate_up kernel keeping h (working tree); then the gpu tests touching the new epilogue.
git log --oneline -1; git status --short | head
for side in old new; do
  if [ $side = old ]; then PP=$PWD/_ab/old:$PWD; else PP=$PWD; fi
  echo "### $side"
  PYTHONPATH=$PP timeout 150 python3 benchmarks/profile_layer.py --cases gptoss:2048,gptoss:16384,swiglu256:2048,swiglu256:8192 --modes train --out /tmp 2>&1 | grep -v -i warn
done
PYTHONPATH=$PWD timeout 330 python3 -m pytest -m gpu -v -p no:cacheprovider tests/test_fused.py tests/test_kernels_gpu.py tests/test_determinism.py -k "(full_shapes_gpu and not mosaic) or gate_up_epilogue or swiglu_gate_up or reproducible_gpu" 2>&1 | grep -E "PASS|FAIL|ERROR|passed|failed|Error" 
