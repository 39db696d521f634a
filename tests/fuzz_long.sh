#!/usr/bin/env bash
# The long fuzz profile on one GPU machine: tests/fuzz_long.sh OUT_DIR [PROCESSES] [MINUTES] [PYTHON]
# runs PROCESSES (default 13) pytest processes of tests/test_fuzz.py --long side by side, each
# drawing its own examples for MINUTES (default 7), and merges their FUZZ_REPORTs into
# OUT_DIR/fuzz.json: examples checked per test, in all, and every failure with its drawn inputs.
# Run it alone on the GPU (a sanitizer or another test beside it slows the draws and competes for
# memory). Exit status 1 if any example failed.
set -u
out=${1:?usage: tests/fuzz_long.sh OUT_DIR [PROCESSES] [MINUTES] [PYTHON]}
procs=${2:-13}
minutes=${3:-7}
python=${4:-python3}
mkdir -p "$out"
# One process would take 75% of the GPU's memory by default; the others would fail at once.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
# Each example draws from a pool of shapes, so after the first compiles the examples reuse them;
# one on-disk cache shared by the processes compiles each (shape, dtype, path) about once for
# all of them instead of once per process, which otherwise takes most of a short run.
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-$out/jax_cache}
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=0
for i in $(seq 1 "$procs"); do
  FUZZ_REPORT="$out/fuzz_$i.json" "$python" -m pytest -q -p no:cacheprovider tests/test_fuzz.py \
    --long --fuzz-minutes "$minutes" > "$out/fuzz_$i.log" 2>&1 &
done
wait
"$python" - "$out" <<'PY'
import glob, json, os, sys

out = sys.argv[1]
reports = [json.load(open(p)) for p in sorted(glob.glob(os.path.join(out, "fuzz_*.json")))]
per_test, failures = {}, []
for i, report in enumerate(reports, 1):
    for name, entry in report["tests"].items():
        per_test[name] = per_test.get(name, 0) + entry["examples"]
        if entry["failure"]:
            failures.append({"process": i, "test": name, **entry["failure"]})
summary = {
    "device": reports[0]["device"] if reports else None,
    "processes": len(reports),
    "examples_checked": sum(per_test.values()),
    "per_test": per_test,
    "failures": failures,
}
with open(os.path.join(out, "fuzz.json"), "w") as f:
    json.dump(summary, f, indent=1)
print(json.dumps({k: v for k, v in summary.items() if k != "failures"}, indent=1))
for failure in failures:
    print(f"FAIL {failure['test']}: {failure['drawn']}\n  {failure['error'][:500]}")
sys.exit(1 if failures or not reports else 0)
PY
