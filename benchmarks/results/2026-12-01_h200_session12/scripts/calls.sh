# Session 12 device calls (one H200), in order; scratch probes ran from _ab/ (PYTHONPATH=.:_ab),
# archived here; probe_common.py is session 11's (../../2026-12-01_h200_session11/scripts/), and the
# A/B's "old" is c85cc4b's tgmm_padded: git show c85cc4b:moe_pallas/kernels/tgmm_padded.py > _ab/old_padded.py
# 1 (c85cc4b): train-step traces; peak memory at the largest cases
OUT=$OUT STEPS="profile memory" PROFILE_S=200 PROFILE_ARGS="--cases gptoss:2048,swiglu256:2048,gptoss:4096 --modes train" MEMORY_S=170 bash benchmarks/device_check.sh
# 2 (795ea41's code before commit): slab kernel A/B in the train step (and its block variants); traces
BLOCKS="512:4,256:8,128:4" OUT=$OUT timeout 330 python3 _ab/probe_slab.py
timeout 120 python3 benchmarks/profile_layer.py --out /tmp --cases gptoss:2048,gptoss:4096 --modes train
# 3 (795ea41 + the slab gpu test): gpu tests; glu_bwd block variants; peak memory
timeout 200 python3 -m pytest -q -m gpu tests/test_slab.py tests/test_tgmm_padded.py -p no:cacheprovider
OUT=$OUT timeout 120 python3 _ab/probe_glu.py
timeout 150 python3 -m benchmarks.bench_memory --out $OUT/memory.json
# 4 (795ea41): cuBLAS batched dW with other slab layouts
OUT=$OUT timeout 200 python3 _ab/probe_layout.py
# 5 (f8845ee, carry .peers): gpu tests (cut by their 260 s limit, see README); the train suite with the peers
timeout 260 python3 -m pytest -q -m gpu tests/test_fused.py tests/test_determinism.py tests/test_slab.py tests/test_tgmm_padded.py -p no:cacheprovider
BENCH_COMMIT=f8845ee timeout 300 bash benchmarks/gpu_run.sh --suite train --impls moe_pallas:auto,tokamax,torch._grouped_mm,jax.lax.ragged_dot --out $OUT/suites --time-limit 280
# 6 (f8845ee): gpu tests of the fused layer and determinism
timeout 300 python3 -m pytest -q -m gpu tests/test_fused.py tests/test_determinism.py -p no:cacheprovider --durations=0
# 7 (f8845ee, carry .peers): forward suites and decode, appended to call 5's results
cp -r benchmarks/results/2026-12-01_h200_session12/suites $OUT/suites
BENCH_COMMIT=f8845ee timeout 400 bash benchmarks/gpu_run.sh --suite gptoss,swiglu256,decode --impls moe_pallas:auto,tokamax,torch._grouped_mm,jax.lax.ragged_dot --out $OUT/suites --append --time-limit 330
