# Session 16, call 6: a producer warpgroup issuing the cp.async rows (probe variant wscp).
set -x
S=benchmarks/results/2026-12-02_h200_session16/scripts
export PYTHONPATH=$PWD:$PWD/$S:$PWD/benchmarks/results/2026-12-01_h200_session11/scripts
export PROBE_SHORT=1 PROBE_VARIANTS=box,cpasync,wscp
for v in 128,4 128,5; do
  PROBE_BN_STAGES=$v timeout 70 python3 $S/probe_row_gather.py 2>&1 | grep -v "^W0\|^I0" | tail -4 | tee -a $OUT/call6_wscp.txt
done
