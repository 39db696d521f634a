# Device calls of session 10 (one H200 each; PYTHONPATH=. on the device; probes travelled as the
# untracked _ab/ folder, archived here under scripts/).
# 1 (863623d): Mosaic gmm tails vs the dense Hopper example, gate_up both workloads
timeout 540 python3 _ab/probe_tails.py
# 2 (863623d): fused dx + weight gradient on equal 64/128-row groups; Mosaic down configs
timeout 300 python3 _ab/probe_fused_bwd.py
SHAPES=gptoss_down,swiglu_down DISTS=uniform DENSE=0 EPI=1 timeout 250 python3 _ab/probe_tails.py "128,256,64,3,4 64,256,64,4,4,2m 64,256,64,3,4,2m 128,128,64,3,4,2m"
# 3 (863623d + gmm_mgpu_skip_consumer.diff; _ab/gmm_mgpu_old.py = git show 863623d:moe_pallas/kernels/gmm_mgpu.py)
SHAPES=gptoss_gate_up,swiglu_gate_up DISTS=uniform DENSE=0 OLD=1 timeout 280 python3 _ab/probe_tails.py "64,256,64,4,4,2m 64,256,64,3,4,2m 128,128,64,3,4,2m"
OUT=$OUT/b SHAPES=gptoss_down,swiglu_down DISTS=uniform DENSE=0 EPI=1 timeout 250 python3 _ab/probe_tails.py "64,256,64,4,4,2m 64,256,64,3,4,2m"
# 4 (863623d + AUTO_TABLE change): Triton configs at T = 4096; forward traces at T = 4096
timeout 400 python3 _ab/probe_medium.py 4096 gmm_glu,gmm gptoss,swiglu256
timeout 130 python3 benchmarks/profile_layer.py --out /tmp --cases gptoss:4096,swiglu256:4096 --modes fwd
# 5 (same): fused backward on ragged groups; the layer at T = 16384 with the new and old AUTO_TABLE
timeout 240 python3 _ab/probe_fused_bwd2.py
timeout 200 python3 _ab/probe_auto16384.py
# 6 (same): persistent flat-loop Triton gmm
timeout 400 python3 _ab/probe_persist.py
# 7 (25520e2): all four suites with the peers (carry .peers)
BENCH_COMMIT=25520e2 bash benchmarks/gpu_run.sh --suite gptoss,swiglu256,decode,train --impls moe_pallas:auto,tokamax,torch._grouped_mm,jax.lax.ragged_dot --out $OUT/suites --time-limit 480
# 8 (815fde2): the GPU tests of the kernels, with the new AUTO_TABLE test
timeout 280 python3 -m pytest -q -m gpu tests/test_kernels_gpu.py -p no:cacheprovider
# 9 (d313427): the AUTO_TABLE test after the float32 fix
timeout 200 python3 -m pytest -q -m gpu tests/test_kernels_gpu.py -k auto_table -p no:cacheprovider
