# The seven device calls of this session, as run from the repository root on the H200 (OUT set by
# the device tool). Calls 1 and 2 ran with scratch copies of moe_pallas under _ab/ (described in
# ../README.md); those copies are not kept.
s() { local l=$1; shift; echo "== $(date -u +%T) $* (limit $l)"; timeout "$l" "$@"; echo "== exit $?"; }
export PYTHONUNBUFFERED=1
case "$1" in
1)  # code 6c77a73 (main f3735fd + the glu-bwd commit); _ab/glu = moe_pallas of the glu-bwd branch
    export PYTHONPATH=.
    s 110 python3 benchmarks/bench_tgmm.py --out $OUT/tgmm.json --configs 128,128,128,8,8,3 64,128,128,16,4,3 64,256,128,8,8,3 128,128,64,8,4,3 64,128,128,8,4,2 64,64,128,8,4,3 32,128,128,8,4,4 64,128,128,4,8,3
    s 120 python3 benchmarks/profile_layer.py --cases gptoss:2048,swiglu256:2048 --modes train   # main f3735fd
    PYTHONPATH=_ab/glu:. s 120 python3 benchmarks/profile_layer.py --cases gptoss:2048,swiglu256:2048 --modes train
    s 140 python3 benchmarks/bench_gmm_mgpu.py --out $OUT/gmm_mgpu.json --workloads gptoss swiglu --tokens 16384 8192 --cases gptoss:gate_up:16384 gptoss:down:16384 swiglu:gate_up:8192 swiglu:down:8192 --configs 128,128,64,3,4,2m 128,192,64,3,4,2m 128,64,64,3,4,2m --tgmm-configs
    s 90 bash benchmarks/gpu_run.sh --suite decode --tokens 1,16 --impls moe_pallas:pallas_triton,moe_pallas:mosaic_gpu --out $OUT/decode --time-limit 80 --no-plots ;;
2)  # _ab/evict1: tgmm's store with eviction_policy="evict_first"; _ab/evict2: also its loads "evict_last"
    for v in main evict1 evict2; do
      pp=.; [ $v != main ] && pp=_ab/$v:.
      PYTHONPATH=$pp s 90 python3 benchmarks/bench_tgmm.py --out $OUT/tgmm_$v.json --cases gptoss:gate_up:2048 gptoss:down:2048 swiglu256:down:2048 swiglu256:gate_up:2048 --configs 32,128,128,8,4,4 64,128,128,8,8,3
    done
    PYTHONPATH=. s 200 python3 probe_decode.py 0,0,0,0 64,64,64,8 64,32,64,8 64,16,64,8 64,64,64,4 128,64,64,4 128,128,64,4 ;;
3)  # code 724a810
    export PYTHONPATH=.
    s 100 python3 probe_store.py
    s 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_fused.py -k "mosaic_gpu_full or full_shapes" --durations=5
    s 150 bash benchmarks/gpu_run.sh --suite decode --impls moe_pallas:pallas_triton,moe_pallas:mosaic_gpu --out $OUT/decode --time-limit 140 --no-plots ;;
4)  # _ab/tA: tgmm accumulating acc + dot and zeroing acc after the store (instead of where(i == 0, 0, acc) + dot)
    for v in main tA; do
      pp=.; [ $v != main ] && pp=_ab/$v:.
      PYTHONPATH=$pp s 100 python3 benchmarks/bench_tgmm.py --out $OUT/tgmm_$v.json --cases gptoss:gate_up:2048 gptoss:down:2048 --configs 64,128,128,8,4,4 64,128,64,8,4,4 32,128,128,8,4,4 64,128,128,16,4,4
    done ;;
5)  # code 3373ff3 (new tgmm_mgpu)
    PYTHONPATH=. timeout 280 python3 benchmarks/bench_tgmm.py --out $OUT/tgmm.json --cases gptoss:gate_up:2048 gptoss:down:2048 swiglu256:down:2048 swiglu256:gate_up:2048 gptoss:gate_up:16384 --mosaic-configs 64,64,256,4 64,64,128,6 64,64,256,3 128,64,128,3 ;;
6|7)  # 6: code b81f930 (ones column set in the kernel); 7: code decb80b (ones column copied in XLA)
    export PYTHONPATH=.
    [ "$1" = 6 ] && s 200 python3 -m pytest -m gpu -q -p no:cacheprovider --timeout 120 tests/test_fused.py tests/test_determinism.py tests/test_kernels_gpu.py --durations=5
    s 70 python3 benchmarks/profile_layer.py --cases gptoss:2048 --modes train
    s 150 bash benchmarks/gpu_run.sh --suite train --impls moe_pallas:auto --out $OUT/train --time-limit 140 --no-plots
    [ "$1" = 7 ] && s 140 python3 -m pytest -m gpu -q -p no:cacheprovider --timeout 100 tests/test_fused.py -k "full_shapes" --durations=3 ;;
esac
