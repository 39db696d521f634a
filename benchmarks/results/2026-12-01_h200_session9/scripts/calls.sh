# The device calls of 2026-12-01 session 9 (one H200), run from the repository root with $OUT the
# device tool's output folder and PYTHONPATH=.; the probes are in this folder (copied to _ab/s9/ then).
case $1 in
1)  # code 09b908c
    timeout 90 python3 probe_concurrent.py ;;
2)  # code 09b908c
    timeout 300 python3 probe_multi.py   # (multi.py beside it)
    timeout 100 python3 benchmarks/profile_layer.py --out /tmp --cases gptoss:1,swiglu256:1 --modes fwd ;;
5)  # code 09b908c with tgmm_held_steps.diff applied to moe_pallas/kernels/tgmm.py
    timeout 330 python3 probe_tails.py gptoss:gate_up:2048,gptoss:down:2048 1:-:64:3,1:16:64:3,2:-:64:3,2:16:64:3,2:16:64:2
    timeout 150 python3 probe_tails.py gptoss:gate_up:4096 1:-:64:3,2:16:64:3,3:16:64:3 ;;
6)  # _ab/head = `git archive 09b908c moe_pallas`; the working tree at 1b30c58
    for v in head new; do
      if [ $v = head ]; then export PYTHONPATH=_ab/head:.; else export PYTHONPATH=.; fi
      timeout 100 python3 benchmarks/profile_layer.py --out /tmp --cases gptoss:1,swiglu256:1,gptoss:16 --modes fwd
    done
    PYTHONPATH=. timeout 240 python3 -m pytest -m gpu -q -p no:cacheprovider --timeout 150 tests/test_kernels_gpu.py --durations=5 ;;
7)  # code 1b30c58, .peers carried
    BENCH_COMMIT=1b30c58 bash benchmarks/gpu_run.sh --suite gptoss,swiglu256,decode,train \
      --impls moe_pallas:auto,tokamax,torch._grouped_mm,jax.lax.ragged_dot --out $OUT/suites --time-limit 480 ;;
8)  # code 1b30c58
    for f in "" "--xla_gpu_enable_command_buffer=" "--xla_gpu_graph_min_graph_size=1"; do
      XLA_FLAGS="$f" timeout 130 python3 probe_dispatch.py
    done ;;
9)  # code 1b30c58, a freshly started machine
    timeout 150 python3 probe_host.py ;;
esac
# Calls 3 and 4 compiled the backward's kernels under XLA_FLAGS=--xla_dump_to (and
# --xla_gpu_dump_llvmir) to read their PTX: XLA wrote no .ptx or .ll files; not pursued.
# Call 10 (code 1b30c58): PYTHONPATH=. python3 -m pytest -m gpu -q -p no:cacheprovider --timeout 200 tests/test_fused.py --durations=8
# Call 11 (package as at 1b30c58): for f in "" '--legacy_command_buffer_custom_call_targets=__gpu$xla.gpu.triton'; do
#   XLA_FLAGS="$f" timeout 70 python3 probe_dispatch.py; done
# Call 12: the gpt-oss T = 1 layer compiled under XLA_FLAGS=--xla_dump_to=/tmp/d3; its
#   *thunk_sequence.txt printed (call11_log.txt)
