"""Time moe_pallas gmm / tgmm at both workloads' expert shapes against jax.lax.ragged_dot.

Shapes: gpt-oss (H = I = 2880, E = 128, k = 4) and SwiGLU (H = 4096, I = 2048, E = 256, k = 8),
projections gate_up (K = H, N = 2I) and down (K = I, N = H), M = T·k rows for T in 1, 64 (decode)
and 2048, 16384 (prefill), expert ids drawn uniformly at random. bf16 inputs (random normal, never
zeros), f32 accumulation. Each timing runs the kernel `reps` times inside one jitted loop (every
iteration depends on the previous one, so nothing is hoisted or overlapped) after a warm-up; the
median of 5 such loops over reps is reported; a loop iteration costs ~15 us by itself on the H200
(2026-12-01, session 8), which inflates the T = 1 rows (kernels of 20-60 us): kernel times there come from a trace
(benchmarks/profile_layer.py). Bytes: weights of the experts actually hit, plus
lhs in and out (tgmm: lhs and rhs in, the whole [G, K, N] out). tokamax is timed when importable.

    PYTHONPATH=. python3 benchmarks/bench_gmm.py --out results.json
"""

import argparse
import datetime
import json
import statistics
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from moe_pallas import dispatch
from moe_pallas.kernels import gmm, tgmm

WORKLOADS = {
    "gptoss": {"h": 2880, "i": 2880, "e": 128, "k": 4},
    "swiglu": {"h": 4096, "i": 2048, "e": 256, "k": 8},
}
TOKENS = (1, 64, 2048, 16384)
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
    try:
        import tokamax

        return tokamax.ragged_dot
    except Exception:  # noqa: BLE001 - absent or broken install: just skip the column
        return None


def read_bandwidth():
    """Bytes/s of a 2 GiB reduction: the streaming ceiling the weight-bound cases compare to."""
    x = jax.random.normal(jax.random.key(0), (1 << 30,), jnp.bfloat16)
    t = time_op(lambda c, x: jnp.sum(x + c[0], dtype=jnp.float32), jnp.zeros((1,), jnp.float32), x)
    return x.nbytes / t


def cases(workloads, tokens):
    for name in workloads:
        w = WORKLOADS[name]
        for proj, (k_dim, n_dim) in {
            "gate_up": (w["h"], 2 * w["i"]),
            "down": (w["i"], w["h"]),
        }.items():
            for t in tokens:
                yield name, proj, t, w["k"], w["e"], k_dim, n_dim


def run_case(name, proj, t, top_k, e, k_dim, n_dim, *, with_ragged_dot=True, seed=0):
    key = jax.random.key(seed)
    k1, k2, k3, k4 = jax.random.split(key, 4)
    m = t * top_k
    topk_idx = jax.random.randint(k1, (t, top_k), 0, e, jnp.int32)
    sizes = dispatch.dispatch(topk_idx, e).group_sizes
    lhs = jax.random.normal(k2, (m, k_dim), jnp.bfloat16)
    rhs = (jax.random.normal(k3, (e, k_dim, n_dim), jnp.bfloat16) * k_dim**-0.5).astype(
        jnp.bfloat16
    )
    d_out = jax.random.normal(k4, (m, n_dim), jnp.bfloat16)
    hit = int((sizes > 0).sum())
    flops = 2 * m * k_dim * n_dim
    gmm_bytes = 2 * (hit * k_dim * n_dim + m * k_dim + m * n_dim)
    tgmm_bytes = 2 * (m * k_dim + m * n_dim + e * k_dim * n_dim)
    row = {
        "workload": name,
        "proj": proj,
        "T": t,
        "M": m,
        "K": k_dim,
        "N": n_dim,
        "E": e,
        "experts_hit": hit,
    }

    def record(label, fn, carry, *args, nbytes):
        try:
            s = time_op(fn, carry, *args)
            row[label] = {"ms": s * 1e3, "tbps": nbytes / s / 1e12, "tflops": flops / s / 1e12}
        except Exception as err:  # noqa: BLE001 - a failing column is recorded, not fatal
            row[label] = {"error": f"{type(err).__name__}: {str(err)[:300]}"}

    record("gmm", lambda x, w, s: gmm(x, w, s), lhs, rhs, sizes, nbytes=gmm_bytes)
    record("tgmm", lambda x, y, s: tgmm(x, y, s), lhs, d_out, sizes, nbytes=tgmm_bytes)
    if with_ragged_dot and m <= RAGGED_DOT_MAX_ROWS:
        record("lax_ragged_dot", jax.lax.ragged_dot, lhs, rhs, sizes, nbytes=gmm_bytes)
    tokamax_rd = _tokamax_ragged_dot()
    if tokamax_rd is not None:
        record("tokamax", tokamax_rd, lhs, rhs, sizes, nbytes=gmm_bytes)
    del lhs, rhs, d_out
    return row


def _fmt(col):
    if col is None:
        return "-"
    if "error" in col:
        return "ERR"
    return f"{col['ms']:.3f}ms {col['tbps']:.2f}TB/s {col['tflops']:.0f}TF"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="gmm_bench.json")
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS))
    parser.add_argument("--tokens", nargs="+", type=int, default=list(TOKENS))
    parser.add_argument("--no-ragged-dot", action="store_true")
    args = parser.parse_args()
    meta = {
        "date": datetime.date.today().isoformat(),
        "device": str(jax.devices()[0].device_kind),
        "jax": jax.__version__,
        "command": "PYTHONPATH=. python3 benchmarks/bench_gmm.py " + " ".join(sys.argv[1:]),
        "git_commit": subprocess.run(
            ["git", "rev-parse", "HEAD"], check=False, capture_output=True, text=True
        ).stdout.strip(),
        "tokamax": "importable" if _tokamax_ragged_dot() else "not importable",
    }
    meta["read_tbps"] = read_bandwidth() / 1e12
    rows = []
    for case in cases(args.workloads, args.tokens):
        rows.append(run_case(*case, with_ragged_dot=not args.no_ragged_dot))
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
        r = rows[-1]
        print(
            f"{r['workload']:7} {r['proj']:8} T={r['T']:5} M={r['M']:6} hit={r['experts_hit']:3} | "
            f"gmm {_fmt(r.get('gmm'))} | tgmm {_fmt(r.get('tgmm'))} | "
            f"ragged_dot {_fmt(r.get('lax_ragged_dot'))}",
            flush=True,
        )
    print(json.dumps(meta))


if __name__ == "__main__":
    main()
