# Session 16, call 5: where the cp.async gather's time goes (diagnostic variants of the probe).
set -x
S=benchmarks/results/2026-12-02_h200_session16/scripts
export PYTHONPATH=$PWD:$PWD/$S:$PWD/benchmarks/results/2026-12-01_h200_session11/scripts
export PROBE_SHORT=1 PROBE_VARIANTS=box,cpasync
for env in "X=1" "PROBE_ROWS=sequential" "PROBE_NO_FENCE=1" "PROBE_ROWS=sequential PROBE_NO_FENCE=1"; do
  echo "== $env" | tee -a $OUT/call5_diag.txt
  env $env timeout 60 python3 $S/probe_row_gather.py 2>&1 | grep -v "^W0\|^I0" | tee -a $OUT/call5_diag.txt
done
