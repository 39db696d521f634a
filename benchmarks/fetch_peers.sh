#!/usr/bin/env bash
# Download the peer libraries the benchmarks compare against (tokamax and its pure-Python needs)
# as Python 3.12 x86-64 wheels into the git-ignored .peers/, for carrying to a GPU machine that
# has no network. Also writes the xprof stub tokamax imports at import time.
# Usage: benchmarks/fetch_peers.sh [PYTHON]   (then on the GPU: benchmarks/gpu_run.sh ...)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-python3}
DEST=.peers/wheels
mkdir -p "$DEST" .peers/stub/xprof/cli
get() {
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any -d "$DEST" "$@"
}
get tokamax==0.0.17 einshape qwix immutabledict tensorboardx annotated-types typing-inspection \
  'typing-extensions>=4.16' pydantic
# pydantic pins the exact pydantic-core it was built against.
core=$(unzip -p "$DEST"/pydantic-2*.whl '*/METADATA' | sed -n 's/^Requires-Dist: pydantic-core==\([0-9.]*\).*/\1/p')
get "pydantic-core==$core"
touch .peers/stub/xprof/__init__.py .peers/stub/xprof/cli/__init__.py
cat > .peers/stub/xprof/cli/tools.py <<'PY'
"""Stub: tokamax imports this at import time; profiling through xprof is not available here."""


def get_kernel_stats_tool(*args, **kwargs):
    raise NotImplementedError("xprof is not installed; this is the benchmarks' import stub.")
PY
ls "$DEST"
