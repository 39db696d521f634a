# Session 13 device calls (one H200), in order; scratch probes ran from _ab/ (PYTHONPATH=.:_ab) and
# are archived here; probe_common.py is session 11's (../../2026-12-01_h200_session11/scripts/).
# 1 (b6ab151): a Triton batched slab matmul (slabmm.py) against cuBLAS on the same slabs
OUT=$OUT timeout 420 python3 _ab/probe_slabmm.py
# 2-3 (b6ab151): the Mosaic GPU slab matmul (slab_mgpu.py, slabmm_mgpu), C as the layer's, then C rounded to 64
OUT=$OUT timeout 400 python3 _ab/probe_slabmm2.py
CAP64=1 SHAPES_ONLY=gptoss_gate_up,gptoss_down,swiglu_gate_up,swiglu_down OUT=$OUT timeout 400 python3 _ab/probe_slabmm2.py
# 4 (b6ab151): with two accumulators (slabmm_mgpu2)
CAP64=1 CONFIGS="64,192,3,1,2 v2:64,192,3,1,2 v2:64,192,2,1,2 v2:64,128,3,1,2 v2:64,128,4,1,2 v2:64,256,2,1,2" OUT=$OUT timeout 400 python3 _ab/probe_slabmm2.py
# 5 (b6ab151, carry .peers): best Mosaic configs against cuBLAS in three rounds; decode T = 64, 256 appended
OUT=$OUT timeout 200 python3 _ab/probe_slabmm3.py
cp -r benchmarks/results/2026-12-01_h200_session12/suites $OUT/suites
BENCH_COMMIT=b6ab151 timeout 230 bash benchmarks/gpu_run.sh --suite decode --tokens 64,256 --impls moe_pallas:auto,tokamax,torch._grouped_mm,jax.lax.ragged_dot --out $OUT/suites --append --time-limit 200
#   (then here: results.json's meta.commit set to "f8845ee (decode T = 64, 256: b6ab151, same layer code)", summary.md rewritten with benchmarks.run.markdown)
# 6 (b6ab151): gate_up / down gmm at equal group sizes around 128 rows per expert, and random routing
OUT=$OUT timeout 300 python3 _ab/probe_tails2.py
# 7 (tail_m in the working tree): tail_m 0 / 16 / 32 per kernel and shape
TAILS=0,16,32 OUT=$OUT timeout 430 python3 _ab/probe_tailm.py
# 8 (tail_m, table with tail_m = 16 for gmm, gmm_glu and gmm_t "small"): gpu tests; the layer A/B
timeout 240 python3 -m pytest -q -m gpu tests/test_kernels_gpu.py tests/test_fused.py -k "not mosaic" -p no:cacheprovider
OUT=$OUT timeout 300 python3 _ab/probe_tail_layer.py
# 9: the plain gmm's tail path, run to run
OUT=$OUT timeout 200 python3 _ab/probe_tail_bug.py
# 10 (the committed table: tail_m for gmm_glu and gmm_t only): the tail-path gpu tests
timeout 170 python3 -m pytest -q -m gpu tests/test_kernels_gpu.py -k tail_path -p no:cacheprovider
