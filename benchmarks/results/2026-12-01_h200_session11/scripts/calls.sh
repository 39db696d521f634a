# Device calls of session 11 (one H200 each; the probes travelled as the untracked _ab/ folder,
# archived here; PYTHONPATH=.:_ab on the device). _ab/gmm_mgpu_defer.py = moe_pallas/kernels/gmm_mgpu.py
# at 0067c5b with session 10's scripts/gmm_mgpu_deferred_store_wait.diff applied.
# 1 (0067c5b): write-bound stand-ins of tgmm; the deferred store wait; forward traces at T = 16384 / 8192
# (_ab/probe_tails.py = session 10's scripts/probe_tails.py with `import gmm_mgpu_old` replaced by
#  `gmm_mgpu_old = importlib.import_module(os.environ.get("OLDMOD", "gmm_mgpu_old"))`)
timeout 200 python3 _ab/probe_write.py
OLDMOD=gmm_mgpu_defer SHAPES=gptoss_gate_up,gptoss_down DISTS=uniform DENSE=0 EPI=1 OLD=1 timeout 200 python3 _ab/probe_tails.py "64,256,64,4,4,2m"
timeout 150 python3 benchmarks/profile_layer.py --out /tmp --cases gptoss:16384,swiglu256:8192 --modes fwd
# 2 (0067c5b): clocks and power under sustained load; Mosaic GPU configs at T = 2048 / 4096
DURATION=8 timeout 100 python3 _ab/probe_clock.py
timeout 400 python3 _ab/probe_mid.py
# 3 (0067c5b): Triton block_k 32 / 128 rings at T = 2048 (autotune_gmm.tune)
timeout 500 python3 _ab/probe_k32.py gmm,gmm_glu,gmm_t
# 4 (0067c5b): the weight gradients as cuBLAS batched matmuls over capacity slabs vs our tgmm
timeout 400 python3 _ab/probe_cublas.py
# 5 (0067c5b): the train step with that (monkeypatched) vs Triton, alternating
timeout 500 python3 _ab/probe_train_ab.py
# 6 (729ca9a's code; a first run failed to lower, see call6_log.txt): A/B of the committed path; gpu tests
timeout 250 python3 _ab/probe_train_ab2.py
timeout 300 python3 -m pytest -q -m gpu tests/test_tgmm_padded.py tests/test_fused.py -p no:cacheprovider -x
# 7 (729ca9a): SwiGLU A/B; the train suite with the peers (carry .peers)
CASES=swiglu256:2048 DIFFS=0 ROUNDS=3 timeout 120 python3 _ab/probe_train_ab2.py
BENCH_COMMIT=729ca9a timeout 300 bash benchmarks/gpu_run.sh --suite train --impls moe_pallas:auto,tokamax,torch._grouped_mm,jax.lax.ragged_dot --out $OUT/train --time-limit 280
# 8 (729ca9a): would cuBLAS stream the forward's weights faster?
timeout 180 python3 _ab/probe_fwd_cublas.py
# 9 (68cd0fa): gpu tests of the kernels and ops; the gmm suite, auto vs pallas_triton
timeout 150 python3 -m pytest -q -m gpu tests/test_kernels_gpu.py tests/test_kernels_ops.py -p no:cacheprovider
PYTHONPATH=. timeout 150 python3 -m benchmarks.run --suite gmm --impls moe_pallas:auto,moe_pallas:pallas_triton --out $OUT/gmm --no-plots --time-limit 130
# 10 (ee502cc + probe): padded weight gradients at 256-512 rows per expert, train A/B
OUT=$OUT timeout 190 python3 _ab/probe_large.py
# The archived probes were refactored after the session to share probe_common.py (wall_time,
# alternate): the same timing code as what ran, moved.
