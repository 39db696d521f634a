# The device calls of 2026-12-01 session 8 (one H200), run from the repository root with
# $OUT the device tool's output folder; the probes are in this folder (copied to _ab/s8/ then).
s() { local l=$1; shift; echo "== $(date -u +%T) $* (limit $l)"; timeout $l "$@"; echo "== exit $?"; }
export PYTHONPATH=. PYTHONUNBUFFERED=1
case $1 in
1)  # code 48ba97c
    s 100 python3 probe_measure.py
    s 90 python3 benchmarks/profile_layer.py --out /tmp --cases gptoss:1,swiglu256:1 --modes fwd
    s 60 python3 benchmarks/profile_layer.py --out /tmp --cases gptoss:2048 --modes train
    s 120 python3 probe_tgmm.py
    s 150 python3 benchmarks/bench_tgmm.py --out $OUT/tgmm.json --cases gptoss:gate_up:2048 gptoss:down:2048 --mosaic-configs 64,64,256,4 64,64,256,4,1,1 64,64,128,3,2 64,64,128,3,2,1 ;;
2)  # code 48ba97c; probe_tgmm2.py with its first variant list: full, ca, and hoist at
    # (64,128,128,8,4,3) (128,128,128,8,4,3) (64,128,128,16,4,3) (64,128,128,8,4,4) (64,256,128,8,8,3)
    # (64,128,256,8,8,3) (128,128,256,8,8,3) (128,256,128,8,8,3) (64,64,128,8,4,3) (64,128,64,16,4,4);
    # the decode probe of this call failed at once (a module name clash)
    s 150 python3 probe_tgmm2.py ;;
3)  # code 48ba97c; probe_tgmm2.py as saved here (hoist2 added); probe_cumsum.py; a first decode
    # probe that closed over the weights (4.25 GB of constants per compile) ran out its 300 s
    s 60 python3 probe_cumsum.py
    s 120 python3 probe_tgmm2.py ;;
4)  # code 48ba97c; probe_decode.py as saved here
    s 200 python3 probe_decode.py 1; s 150 python3 probe_decode.py 16 ;;
5)  # code f7b753c (tgmm one-row-step path, decode block_n floor); .peers carried
    s 230 python3 -m pytest -m gpu -q -p no:cacheprovider --timeout 120 tests/test_kernels_gpu.py tests/test_fused.py tests/test_determinism.py --durations=5
    s 60 python3 benchmarks/bench_tgmm.py --out $OUT/tgmm.json --cases gptoss:gate_up:2048 gptoss:down:2048 swiglu256:down:2048
    s 70 python3 benchmarks/profile_layer.py --out /tmp --cases gptoss:2048,gptoss:1,swiglu256:1 --modes train,fwd
    s 200 bash benchmarks/gpu_run.sh --suite decode,train --impls moe_pallas:auto,tokamax,torch._grouped_mm,jax.lax.ragged_dot --out $OUT/suites --time-limit 190 --no-plots ;;
6)  # code 433a30a; _ab/old = the same package with kernels/tgmm.py of 48ba97c
    s 100 python3 -m pytest -m gpu -q -p no:cacheprovider --timeout 100 tests/test_determinism.py -k "gptoss or tgmm_bitwise"
    s 120 python3 -m pytest -q -p no:cacheprovider -x --timeout 60 tests/test_kernels_gmm.py -k "tgmm or decode_tiles"
    for v in new old; do
      pp=.; [ $v = old ] && pp=_ab/old:.
      PYTHONPATH=$pp s 45 python3 benchmarks/bench_tgmm.py --out /tmp/t.json --cases gptoss:gate_up:4096 gptoss:down:4096
      PYTHONPATH=$pp s 40 python3 benchmarks/profile_layer.py --out /tmp --cases gptoss:4096 --modes train
    done ;;
7)  # code 433a30a
    timeout 195 python3 -m pytest -m gpu -v -p no:cacheprovider --durations=3 tests/test_determinism.py -k "gptoss or tgmm_bitwise" ;;
esac
