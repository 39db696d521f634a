#!/usr/bin/env bash
# Every kernel under compute-sanitizer's memcheck, racecheck and synccheck (tests/sanitize.py has
# the cases), on an NVIDIA GPU: tests/sanitize.sh OUT_DIR [PYTHON]. The three tools (or those
# SANITIZE_TOOLS names) run side by side, each over SANITIZE_SHARDS (default 1) slices of the
# cases at once; one log per tool in OUT_DIR, and OUT_DIR/summary.txt holds each tool's error
# summaries and the cases' own exactness checks. Where the tool itself dies in a case, reports an
# internal error (not a report on a kernel) or a case's result is off its bound, that case runs
# again in a process of its own. Exit status 1 if a tool reports an error on a kernel, or a case
# fails again alone. SANITIZE_SECONDS (default: none) bounds the whole run's wall time: a tool
# still running then is stopped, its log says from which case on nothing was checked, and the run
# fails but still writes the logs and the summary. SANITIZE_CASES=START:STOP (default: all) runs
# only cases START to STOP - 1.
set -u
out=${1:?usage: tests/sanitize.sh OUT_DIR [PYTHON]}
python=${2:-python3}
tools=${SANITIZE_TOOLS:-memcheck racecheck synccheck}
mkdir -p "$out"
# jax must not preallocate: the sanitizer tracks every allocation, and a pool hides overruns.
export XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_PYTHON_CLIENT_ALLOCATOR=platform
# XLA's GEMM autotuner would run every candidate kernel of each dot (the slabs, the references'
# activations) under the tool: racecheck spent minutes there, on kernels that are not ours. And
# XLA would launch runs of kernels as CUDA graphs (command buffers): each kernel is launched on its
# own instead, so the tool tracks every launch (racecheck once printed "Internal Sanitizer Error:
# Detected a failure to track a kernel launch").
export XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_autotune_level=0 --xla_gpu_enable_command_buffer="
shards=${SANITIZE_SHARDS:-1}
count=$("$python" -m tests.sanitize --list | wc -l)
first=0
if [ -n "${SANITIZE_CASES:-}" ]; then
  first=${SANITIZE_CASES%%:*}
  last_case=${SANITIZE_CASES##*:}
  [ "$last_case" -lt "$count" ] && count=$last_case
fi
deadline=$(($(date +%s) + ${SANITIZE_SECONDS:-0}))
# The tool over cases [$1, $2) in one process, its output appended to $log; the time left of
# SANITIZE_SECONDS bounds it. Returns the process's exit status.
sanitize() {
  local limit=()
  if [ "${SANITIZE_SECONDS:-0}" -gt 0 ]; then
    limit=(timeout -k 20 $((deadline - $(date +%s) > 1 ? deadline - $(date +%s) : 1)))
  fi
  "${limit[@]}" compute-sanitizer --tool "$tool" $([ "$tool" = memcheck ] && echo --report-api-errors no) \
    --print-limit 50 --target-processes all "$python" -m tests.sanitize --start "$1" \
    --stop "$2" >> "$log" 2>&1 < /dev/null
}
# Case $1 again in a process of its own, after the tool failed in it ($2 says how).
run_alone() {
  local case=$1 why=$2 seen status
  echo "$why; case $case again, alone:" >> "$log"
  seen=$(wc -l < "$log")
  sanitize "$case" "$((case + 1))"
  status=$?
  echo "exit status $status (case $case alone)" >> "$log"
  if ! tail -n +$((seen + 1)) "$log" | grep -q "cases exact within their bounds"; then
    echo "CRASH in case $case (exit status $status, alone too): $(grep -E "^case $case " "$log" | tail -n 1)" >> "$log"
  fi
}
# One tool over cases [start, stop); where the tool itself dies in a case (a segfault, not a
# report), the log says so, the case runs again in a process of its own, and the next process
# resumes after it, so one crash hides no other case.
run_tool() {
  local tool=$1 start=$2 stop=$3 log=$4 status last seen finished c why
  : > "$log"
  while :; do
    seen=$(wc -l < "$log")  # this segment's lines follow (late writes of XLA may trail them)
    sanitize "$start" "$stop"
    status=$?
    echo "exit status $status (cases $start to $((stop - 1)))" >> "$log"
    segment=$(tail -n +$((seen + 1)) "$log")
    last=$(echo "$segment" | grep -oE '^case [0-9]+' | tail -n 1 | cut -d' ' -f2)
    finished=$(echo "$segment" | grep -c "cases exact within their bounds")
    # An internal error of the tool (racecheck's "failure to track a kernel launch") is counted in
    # its summary but reports nothing on a kernel, and a case off its bound under the tool may be
    # the tool's doing (its instrumented code also died, or raised CUDA_ERROR_INVALID_PC, in long
    # processes): such a case runs again alone, where it must be clean and exact. (case, its first
    # such line) per case:
    while IFS=$'\t' read -r c why; do
      [ "$finished" -eq 0 ] && [ "$c" = "$last" ] && continue  # the crash path below reruns it
      run_alone "$c" "TOOL ERROR or OFF in case $c ($why)"
    done < <(echo "$segment" | awk '/^case [0-9]+/ {c = $2}
      /Internal Sanitizer Error|^FAIL/ && !(c in seen) {seen[c] = 1; print c "\t" substr($0, 1, 120)}')
    [ "$finished" -gt 0 ] && return
    if [ "${SANITIZE_SECONDS:-0}" -gt 0 ] && [ "$(date +%s)" -ge "$deadline" ]; then
      echo "TIMEOUT: SANITIZE_SECONDS spent; cases ${last:-$start} to $((stop - 1)) not checked" >> "$log"
      return
    fi
    if [ -z "$last" ] || [ "$last" -lt "$start" ]; then
      echo "CRASH before the first case from $start (exit status $status); stopping" >> "$log"
      return
    fi
    # The tool has died in a case that it then checked cleanly in a process of its own (it dies
    # in long processes, not in one kernel): the case runs again alone, and only a second death
    # is a crash.
    run_alone "$last" "TOOL DIED in case $last (exit status $status)"
    start=$((last + 1))
    [ "$start" -lt "$stop" ] || return
  done
}
for tool in $tools; do
  for j in $(seq 0 $((shards - 1))); do
    run_tool "$tool" $((first + j * (count - first) / shards)) \
      $((first + (j + 1) * (count - first) / shards)) "$out/$tool.shard$j" &
  done
done
wait
for tool in $tools; do  # one log per tool, its shards in case order
  for j in $(seq 0 $((shards - 1))); do cat "$out/$tool.shard$j"; rm "$out/$tool.shard$j"; done \
    > "$out/$tool.log"
done
status=0
: > "$out/summary.txt"
for tool in $tools; do
  log="$out/$tool.log"
  # A process's reported errors fail the run, less the tool's internal errors in that process,
  # unless the process ran a case alone again (that one must be clean, and exact).
  awk '/again, alone:/ {alone = 1} /Internal Sanitizer Error/ {internal++} /^FAIL/ && alone {bad = 1}
    /ERROR SUMMARY: [0-9]+ error/ {match($0, /SUMMARY: [0-9]+/); n = substr($0, RSTART + 9, RLENGTH - 9)}
    /RACECHECK SUMMARY: [0-9]+ hazard/ {match($0, /SUMMARY: [0-9]+/); n = substr($0, RSTART + 9, RLENGTH - 9)}
    /SUMMARY: [0-9]+ (error|hazard)/ && (n + 0 > (alone ? 0 : internal + 0)) {bad = 1}
    /^exit status/ {alone = 0; internal = 0}
    END {exit bad}' "$log" || status=1
  grep -qE "ERROR SUMMARY|RACECHECK SUMMARY" "$log" || status=1
  grep -qE "^CRASH|^TIMEOUT" "$log" && status=1
  {
    echo "## $tool"
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|cases exact|^FAIL|^CRASH|^TOOL|^TIMEOUT|^exit status" "$log"
  } >> "$out/summary.txt"
done
cat "$out/summary.txt"
exit $status
