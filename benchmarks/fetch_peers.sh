#!/usr/bin/env bash
# Fetch the peer library the benchmarks compare against (tokamax and its pure-Python needs) for a
# GPU machine without network: Python 3.12 x86-64 wheels into the git-ignored .peers/wheels/,
# unpacked into .peers/site/, plus the xprof stub tokamax imports at import time (.peers/stub/).
# Carry .peers/ to the GPU machine; benchmarks/impls.py puts .peers/site and .peers/stub on
# sys.path, so `python -m benchmarks.run` times tokamax with nothing to install there.
# torch is not fetched: it is used where the GPU image has it.
# Usage: benchmarks/fetch_peers.sh [PYTHON]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-python3}
DEST=.peers/wheels
TAGS=(--only-binary=:all: --python-version 3.12 --implementation cp
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any)
mkdir -p "$DEST" .peers/stub/xprof/cli
get() {
  "$PY" -m pip download -q --no-deps "${TAGS[@]}" -d "$DEST" "$@"
}
get tokamax==0.0.17 einshape qwix immutabledict tensorboardx jaxtyping wadler-lindig annotated-types \
  typing-inspection 'typing-extensions>=4.16' pydantic
# pydantic pins the exact pydantic-core it was built against.
core=$(unzip -p "$DEST"/pydantic-2*.whl '*/METADATA' | sed -n 's/^Requires-Dist: pydantic-core==\([0-9.]*\).*/\1/p')
get "pydantic-core==$core"
"$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade "${TAGS[@]}" \
  --target .peers/site "$DEST"/*.whl
touch .peers/stub/xprof/__init__.py .peers/stub/xprof/cli/__init__.py
cat > .peers/stub/xprof/cli/tools.py <<'PY'
"""Stub: tokamax imports this at import time; profiling through xprof is not available here."""


def get_kernel_stats_tool(*args, **kwargs):
    raise NotImplementedError("xprof is not installed; this is the benchmarks' import stub.")
PY
du -sh .peers
ls "$DEST"
