#!/usr/bin/env bash
# Run the benchmarks on a GPU machine without network: install the wheels fetched by
# benchmarks/fetch_peers.sh (carried in .peers/) into .peers/site, then `python -m benchmarks.run`.
# Usage: benchmarks/gpu_run.sh --suite all --out DIR [more benchmarks.run flags]
set -euo pipefail
cd "$(dirname "$0")/.."
if compgen -G ".peers/wheels/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target .peers/site .peers/wheels/*.whl
fi
# jax grows its pool on demand up to 65% of the card; the torch peers use the rest.
export XLA_PYTHON_CLIENT_PREALLOCATE=${XLA_PYTHON_CLIENT_PREALLOCATE:-false}
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.65}
# benchmarks/impls.py puts .peers/site and .peers/stub (the xprof stub) on sys.path for tokamax.
PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 exec python3 -m benchmarks.run "$@"
