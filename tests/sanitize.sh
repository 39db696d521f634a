#!/usr/bin/env bash
# Every kernel under compute-sanitizer's memcheck, racecheck and synccheck (tests/sanitize.py has
# the cases), on an NVIDIA GPU: tests/sanitize.sh OUT_DIR [PYTHON]. One log per tool in OUT_DIR,
# and OUT_DIR/summary.txt with each tool's error summary and the cases' own exactness check.
set -u
out=${1:?usage: tests/sanitize.sh OUT_DIR [PYTHON]}
python=${2:-python3}
mkdir -p "$out"
# jax must not preallocate: the sanitizer tracks every allocation, and a pool hides overruns.
export XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_PYTHON_CLIENT_ALLOCATOR=platform
status=0
: > "$out/summary.txt"
for tool in memcheck racecheck synccheck; do
  extra=()
  [ "$tool" = memcheck ] && extra=(--leak-check no --report-api-errors no)
  compute-sanitizer --tool "$tool" "${extra[@]}" --print-limit 50 --target-processes all \
    "$python" -m tests.sanitize > "$out/$tool.log" 2>&1
  rc=$?
  [ $rc -ne 0 ] && status=1
  {
    echo "## $tool (exit $rc)"
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|cases exact|^FAIL" "$out/$tool.log"
  } >> "$out/summary.txt"
done
cat "$out/summary.txt"
exit $status
