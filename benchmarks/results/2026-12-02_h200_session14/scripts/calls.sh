# Session 14 device calls (one H200; jax 0.11.2). Run from the repo root with _ab/ = scripts/ of this folder.
# every call first: export PYTHONPATH=$PWD:$PWD/_ab
# 1 (9aee9be): the plain gmm's tail variants with a bias; GLU/gmm_t at other routings (cut by the timeout: see README); PTX dumps (none written)
set -x
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
export PYTHONPATH=$PWD:$PWD/_ab
timeout 420 python3 _ab/probe_tail_race.py plain glu plain2 2>&1 | grep -v -i "warning" | tee $OUT/log.txt
for v in plain0 plain16 glu; do
  XLA_FLAGS="--xla_dump_to=/tmp/dump_$v" timeout 60 python3 _ab/probe_dump.py $v > /dev/null 2>&1
  echo "== $v"; ls /tmp/dump_$v | grep -i ptx | head
  for f in /tmp/dump_$v/*.ptx; do
    echo "$f: entries $(grep -c '^.visible .entry\|^.entry' $f) wgmma $(grep -c 'wgmma.mma_async' $f) mma.sync $(grep -c 'mma.sync' $f) ldmatrix $(grep -c ldmatrix $f) bar.sync $(grep -c 'bar.sync' $f) local $(grep -c 'ld.local\|st.local' $f)"
  done
  mkdir -p $OUT/ptx_$v; cp /tmp/dump_$v/*.ptx $OUT/ptx_$v/ 2>/dev/null
done 2>&1 | tee -a $OUT/log.txt
# 2 (9aee9be): the plain gmm without a bias (session 13's failing mode), gpt-oss and SwiGLU down
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
timeout 400 python3 _ab/probe_tail_race.py nobias glu 2>&1 | grep -v -i "warning" | tee $OUT/log.txt
# 3 (9aee9be): GLU / gmm_t tail_m 0/16/64 -- nothing came back (the probe's jitted closures held the weights as constants)
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv
(timeout 250 python3 _ab/probe_tail64.py swiglu; timeout 200 python3 _ab/probe_tail64.py gptoss) 2>&1 | grep -v -i "warning" | tee $OUT/log.txt
# 4 (working tree: table with tail_m = 64 for the plain gmm "small", gmm_glu and gmm_t "small" still 16): tail-path gpu tests, then the fixed probe
timeout 110 python3 -m pytest -q -m gpu tests/test_kernels_gpu.py -k tail_path -p no:cacheprovider 2>&1 | tail -15 | tee $OUT/log.txt
(timeout 75 python3 _ab/probe_tail64.py swiglu; timeout 65 python3 _ab/probe_tail64.py gptoss) 2>&1 | grep --line-buffered -v -i "warning" | tee -a $OUT/log.txt
