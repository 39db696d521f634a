#!/usr/bin/env bash
# Every kernel under compute-sanitizer's memcheck, racecheck and synccheck (tests/sanitize.py has
# the cases), on an NVIDIA GPU: tests/sanitize.sh OUT_DIR [PYTHON]. The three tools run side by
# side, one log each in OUT_DIR, and OUT_DIR/summary.txt holds each tool's error summary and the
# cases' own exactness check. Exit status 1 if a tool reports an error or a case is off.
set -u
out=${1:?usage: tests/sanitize.sh OUT_DIR [PYTHON]}
python=${2:-python3}
mkdir -p "$out"
# jax must not preallocate: the sanitizer tracks every allocation, and a pool hides overruns.
export XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_PYTHON_CLIENT_ALLOCATOR=platform
for tool in memcheck racecheck synccheck; do
  (compute-sanitizer --tool "$tool" $([ "$tool" = memcheck ] && echo --report-api-errors no) --print-limit 50 --target-processes all \
    "$python" -m tests.sanitize > "$out/$tool.log" 2>&1; echo "exit status $?" >> "$out/$tool.log") &
done
wait
status=0
: > "$out/summary.txt"
for tool in memcheck racecheck synccheck; do
  grep -qE "ERROR SUMMARY: 0 errors|RACECHECK SUMMARY: 0 hazards" "$out/$tool.log" || status=1
  grep -q "^FAIL" "$out/$tool.log" && status=1
  grep -q "^exit status 0" "$out/$tool.log" || status=1
  {
    echo "## $tool"
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|cases exact|^FAIL|^exit status" "$out/$tool.log"
  } >> "$out/summary.txt"
done
cat "$out/summary.txt"
exit $status
