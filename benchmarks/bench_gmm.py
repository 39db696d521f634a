"""Time the grouped matmuls alone, per backend, at both workloads' expert shapes.

    python -m benchmarks.bench_gmm [--impls pallas_triton,mosaic_gpu] [--workloads gptoss ...]
                                   [--tokens 1 64 2048 16384] [--no-ragged-dot] [--out FILE.json]

Shapes (`benchmarks.cases.WORKLOADS`): gpt-oss (H = I = 2880, E = 128, k = 4) and SwiGLU-256
(H = 4096, I = 2048, E = 256, k = 8), projections gate_up (K = H, N = 2I) and down (K = I, N = H),
M = T·k rows for T in 1, 64 (decode) and 2048, 16384 (prefill), expert ids drawn uniformly at
random; bf16 operands (random normal), bf16 outputs, float32 accumulation. Columns, per backend of
--impls: `moe_pallas.ragged_dot` (gmm) and `moe_pallas.tgmm` (the weight gradient lhsᵀ @ d_out per
expert); then `jax.lax.ragged_dot` (a dense fallback on GPU: up to 8192 rows) and tokamax's
`ragged_dot` where importable (benchmarks/fetch_peers.sh).

Timing (`time_op`): the call runs `reps` times inside one jitted loop, every iteration depending on
the previous one (nothing is hoisted or overlapped), after a warm-up; the median of 5 such loops
over reps. A loop iteration has a fixed cost of its own (~15 us on an H200), which inflates calls
of a few tens of microseconds (T = 1): the suites (`benchmarks.run --suite decode`) time those in
bursts of calls instead. Bytes: the weights of the experts hit, lhs in and out (tgmm: lhs and d_out
in, the whole [E, K, N] out).
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

import moe_pallas
from benchmarks import cases as _cases
from benchmarks import provenance
from moe_pallas import dispatch

TOKENS = (1, 64, 2048, 16384)
SMALL_TOKENS = (1, 16)
BACKENDS = ("pallas_triton", "mosaic_gpu")
RAGGED_DOT_MAX_ROWS = 8192  # jax.lax.ragged_dot is a dense fallback on GPU: slow, memory-hungry


def time_op(op, carry, *args, target_s=0.05):
    """Median seconds per call of `op(carry, *args)`; op's output feeds the next call's carry."""

    def chain(carry, *args):
        out = op(carry, *args)
        return carry.at[(0,) * carry.ndim].set(out.reshape(-1)[0].astype(carry.dtype))

    step = jax.jit(chain)
    jax.block_until_ready(step(carry, *args))
    t0 = time.perf_counter()
    jax.block_until_ready(step(carry, *args))
    reps = int(np.clip(target_s / max(time.perf_counter() - t0, 1e-6), 3, 200))

    @jax.jit
    def loop(carry, *args):
        return jax.lax.fori_loop(0, reps, lambda _, c: chain(c, *args), carry)

    jax.block_until_ready(loop(carry, *args))
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        jax.block_until_ready(loop(carry, *args))
        times.append((time.perf_counter() - t0) / reps)
    return statistics.median(times)


def _tokamax_ragged_dot():
    from benchmarks import impls

    impls._peer_path()
    try:
        import tokamax

        return tokamax.ragged_dot
    except Exception:  # noqa: BLE001 - absent or broken install: just skip the column
        return None


def cases(workloads, tokens, small=False):
    """(workload name, projection, T) of every case."""
    wl = _cases.SMALL_WORKLOADS if small else _cases.WORKLOADS
    for name in workloads:
        for proj in ("gate_up", "down"):
            for t in tokens:
                yield _cases.Case("gmm", wl[name], t, "gmm", proj)


def run_case(case, backends, *, with_ragged_dot=True, tokamax=None, seed=0, target_s=0.05):
    w = case.workload
    m, k_dim, n_dim = case.gmm_shape()
    k1, k2, k3, k4 = jax.random.split(jax.random.key(seed), 4)
    topk_idx = jax.random.randint(k1, (case.tokens, w.top_k), 0, w.experts, jnp.int32)
    sizes = dispatch.dispatch(topk_idx, w.experts).group_sizes
    lhs = jax.random.normal(k2, (m, k_dim), jnp.bfloat16)
    rhs = (jax.random.normal(k3, (w.experts, k_dim, n_dim), jnp.float32) * k_dim**-0.5).astype(
        jnp.bfloat16
    )
    d_out = jax.random.normal(k4, (m, n_dim), jnp.bfloat16)
    hit = int((sizes > 0).sum())
    flops = 2 * m * k_dim * n_dim
    gmm_bytes = 2 * (hit * k_dim * n_dim + m * k_dim + m * n_dim)
    tgmm_bytes = 2 * (m * k_dim + m * n_dim + w.experts * k_dim * n_dim)
    row = {
        "workload": w.name,
        "proj": case.projection,
        "T": case.tokens,
        "M": m,
        "K": k_dim,
        "N": n_dim,
        "E": w.experts,
        "experts_hit": hit,
    }

    def record(label, fn, carry, *args, nbytes):
        try:
            s = time_op(fn, carry, *args, target_s=target_s)
            row[label] = {"ms": s * 1e3, "tbps": nbytes / s / 1e12, "tflops": flops / s / 1e12}
        except Exception as err:  # noqa: BLE001 - a failing column is recorded, not fatal
            row[label] = {"error": f"{type(err).__name__}: {str(err)[:300]}"}

    for b in backends:
        gmm = lambda x, w_, s, b=b: moe_pallas.ragged_dot(x, w_, s, implementation=b)
        tgmm = lambda x, y, s, b=b: moe_pallas.tgmm(x, y, s, implementation=b)
        record(f"{b} gmm", gmm, lhs, rhs, sizes, nbytes=gmm_bytes)
        record(f"{b} tgmm", tgmm, lhs, d_out, sizes, nbytes=tgmm_bytes)
    if with_ragged_dot and m <= RAGGED_DOT_MAX_ROWS:
        record("jax.lax.ragged_dot", jax.lax.ragged_dot, lhs, rhs, sizes, nbytes=gmm_bytes)
    if tokamax is not None:
        record("tokamax", tokamax, lhs, rhs, sizes, nbytes=gmm_bytes)
    return row


def _fmt(col):
    if "error" in col:
        return "ERR " + col["error"][:60]
    return f"{col['ms']:.3f} ms {col['tbps']:.2f} TB/s {col['tflops']:.0f} TFLOP/s"


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--impls", default=",".join(BACKENDS), help="moe_pallas backends")
    parser.add_argument("--workloads", nargs="+", default=list(_cases.WORKLOADS))
    parser.add_argument("--tokens", nargs="+", type=int)
    parser.add_argument("--no-ragged-dot", action="store_true")
    parser.add_argument("--small", action="store_true", help="tiny shapes (CPU smoke test)")
    parser.add_argument("--out", type=Path, help="JSON file, rewritten after every case")
    args = parser.parse_args(argv)
    backends = [b for b in args.impls.split(",") if b]
    tokamax = _tokamax_ragged_dot()
    meta = {
        "device": jax.devices()[0].device_kind,
        "jax": jax.__version__,
        "commit": provenance.git_commit(),
        "command": "python -m benchmarks.bench_gmm "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "tokamax": "importable" if tokamax else "not importable",
    }
    tokens = args.tokens or (SMALL_TOKENS if args.small else TOKENS)
    case_list = list(cases(args.workloads, tokens, args.small))
    rows = []
    for case in tqdm(case_list, desc="gmm", unit="case", file=sys.stderr):
        rows.append(
            run_case(
                case,
                backends,
                with_ragged_dot=not args.no_ragged_dot,
                tokamax=tokamax,
                target_s=1e-3 if args.small else 0.05,
            )
        )
        if args.out:
            args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
        r = rows[-1]
        tqdm.write(f"{r['workload']} {r['proj']} T={r['T']} M={r['M']} hit={r['experts_hit']}")
        for label, col in r.items():
            if isinstance(col, dict):
                tqdm.write(f"    {label:26} {_fmt(col)}")
    return {"meta": meta, "rows": rows}


if __name__ == "__main__":
    main()
