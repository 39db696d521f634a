"""The weight gradients (tgmm) of the layer's backward against what their writes allow.

    python -m benchmarks.bench_tgmm [--cases gptoss:gate_up:2048 ...] [--impls auto,mosaic_gpu]
                                    [--configs 64,128,128,8,4,3 ...] [--small] [--out FILE.json]

At T = 2048 an expert gets ~64 rows, so `d w[e] = lhs[rows of e]ᵀ @ d_out[rows of e]` is bound by
writing the [E, K, N] bf16 gradient (4.25 GB for gpt-oss's d w_gate_up, 0.88 ms at 4.8 TB/s). Per
case (workload, weight, T, uniform routing, bf16) this times:
  triton    `kernels.tgmm.tgmm` as the layer calls it (gate_up: x gathered by row_token in the
            kernel), with the tuning table's config and with each --configs entry
            ("block_m,block_n,block_k,group_m,num_warps,num_stages")
  <impl>    `moe_pallas.tgmm(..., implementation=impl)` for each --impls backend, on an
            XLA-gathered copy of x for gate_up (the copy included)
  fill      an XLA fusion writing the same [E, K, N] bf16 array: a store-only reference
  cublas    `einsum("eck,ecn->ekn")` on inputs padded to the largest group (built outside the
            timing): a batched cuBLAS GEMM writing the same output
Each time: median over 5 runs of `reps` back-to-back calls returning the whole output (nothing is
optimised away), seconds per call; TB/s of the output's bytes. Every output is checked against
the first Triton one (relative error).
"""

import argparse
import functools
import json
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import moe_pallas
from benchmarks import provenance
from benchmarks.cases import SMALL_WORKLOADS, WORKLOADS
from moe_pallas import dispatch, tuning
from moe_pallas.kernels.config import BlockConfig
from moe_pallas.kernels.tgmm import tgmm

DEFAULT_CASES = ("gptoss:gate_up:2048", "gptoss:down:2048", "swiglu256:down:2048")
DEFAULT_IMPLS = ("auto", "mosaic_gpu")


def time_calls(fn, *args, reps=20, runs=5):
    """Median seconds per call of the jitted fn over `runs` runs of reps back-to-back calls."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        for _ in range(reps):
            out = fn(*args)
        jax.block_until_ready(out)
        times.append((time.perf_counter() - t0) / reps)
        del out
    return statistics.median(times)


def parse_config(text: str) -> BlockConfig:
    bm, bn, bk, gm, warps, stages = (int(v) for v in text.split(","))
    return BlockConfig(bm, bn, bk, group_m=gm, num_warps=warps, num_stages=stages)


def _label(cfg: dict) -> str:
    keys = ("block_m", "block_n", "block_k", "group_m", "num_warps", "num_stages")
    return ",".join(str(cfg[k]) for k in keys)


def run_case(spec, configs=(), impls=DEFAULT_IMPLS, small=False):
    name, weight, tokens = spec.split(":")
    w = (SMALL_WORKLOADS if small else WORKLOADS)[name]
    timed = functools.partial(time_calls, reps=1, runs=1) if small else time_calls
    tokens = int(tokens)
    keys = iter(jax.random.split(jax.random.key(tokens), 4))
    idx = jax.random.randint(next(keys), (tokens, w.top_k), 0, w.experts, jnp.int32)
    d = dispatch.dispatch(idx, w.experts)
    m = tokens * w.top_k
    if weight == "gate_up":  # x[row_token]ᵀ dh
        lhs = jax.random.normal(next(keys), (tokens, w.hidden), jnp.bfloat16)
        rhs = jax.random.normal(next(keys), (m, 2 * w.inter), jnp.bfloat16)
        row_index = d.row_token
    else:  # aᵀ dy
        lhs = jax.random.normal(next(keys), (m, w.inter), jnp.bfloat16)
        rhs = jax.random.normal(next(keys), (m, w.hidden), jnp.bfloat16)
        row_index = None
    k_dim, n_dim = lhs.shape[1], rhs.shape[1]
    out_bytes = w.experts * k_dim * n_dim * 2
    result = {
        "case": spec,
        "rows": m,
        "experts": w.experts,
        "k": k_dim,
        "n": n_dim,
        "out_GB": out_bytes / 1e9,
    }
    reference = None

    def record(label, fn, *args):
        nonlocal reference
        try:
            out = fn(*args)
            if reference is None:
                reference = out.astype(jnp.float32)
            else:
                diff = jnp.linalg.norm(out.astype(jnp.float32) - reference)
                result.setdefault("rel_err", {})[label] = float(
                    diff / jnp.maximum(jnp.linalg.norm(reference), 1e-30)
                )
            del out
            seconds = timed(fn, *args)
            result[label] = {"ms": seconds * 1e3, "TBps": out_bytes / seconds / 1e12}
            shown = f"{seconds * 1e3:8.3f} ms {out_bytes / seconds / 1e12:6.2f} TB/s"
        except Exception as err:  # noqa: BLE001 - e.g. shared memory exceeded: record, go on
            result[label] = {"error": str(err)[:200]}
            shown = f"failed: {str(err)[:100]}"
        print(f"{spec:22} {label:40} {shown}", flush=True)

    table = tuning.lookup(
        "pallas_triton",
        "tgmm",
        dtype=lhs.dtype,
        k=k_dim,
        n=n_dim,
        rows=tuning.rows_class(m, w.experts),
    )
    table_label = "table" if table is None else f"table {_label(table)}"
    for label, cfg in [(f"triton {table_label}", None)] + [
        (f"triton {c}", parse_config(c)) for c in configs
    ]:
        fn = jax.jit(lambda l, r, s, i, cfg=cfg: tgmm(l, r, s, lhs_row_index=i, config=cfg))
        record(label, fn, lhs, rhs, d.group_sizes, row_index)
    for impl in impls:

        def fn(l, r, s, i, impl=impl):
            return moe_pallas.tgmm(l if i is None else l[i], r, s, implementation=impl)

        record(f"moe_pallas.tgmm {impl}", jax.jit(fn), lhs, rhs, d.group_sizes, row_index)
    del reference

    c = jnp.ones((), jnp.bfloat16)
    fill = jax.jit(lambda c: jnp.full((w.experts, k_dim, n_dim), c))
    seconds = timed(fill, c)
    result["fill"] = {"ms": seconds * 1e3, "TBps": out_bytes / seconds / 1e12}

    sizes = np.asarray(d.group_sizes)
    cap = int(-(-sizes.max() // 16) * 16)
    slot = np.arange(m) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    expert = np.repeat(np.arange(w.experts), sizes)
    lhs_rows = lhs[row_index] if row_index is not None else lhs
    lhs_pad = jnp.zeros((w.experts, cap, k_dim), lhs.dtype).at[expert, slot].set(lhs_rows)
    rhs_pad = jnp.zeros((w.experts, cap, n_dim), rhs.dtype).at[expert, slot].set(rhs)
    result["cublas_capacity"] = cap
    einsum = jax.jit(lambda a, b: jnp.einsum("eck,ecn->ekn", a, b))
    seconds = timed(einsum, lhs_pad, rhs_pad)
    result["cublas"] = {"ms": seconds * 1e3, "TBps": out_bytes / seconds / 1e12}
    for label in ("fill", f"cublas (groups padded to {cap})"):
        col = result[label.split()[0]]
        print(f"{spec:22} {label:40} {col['ms']:8.3f} ms {col['TBps']:6.2f} TB/s", flush=True)
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cases", nargs="+", default=list(DEFAULT_CASES))
    parser.add_argument("--configs", nargs="*", default=[], help="explicit Triton configs")
    parser.add_argument(
        "--impls", default=",".join(DEFAULT_IMPLS), help="moe_pallas.tgmm backends (or '')"
    )
    parser.add_argument("--out", type=Path, help="JSON file to write")
    parser.add_argument("--small", action="store_true", help="tiny workloads (CPU smoke test)")
    args = parser.parse_args(argv)
    impls = [i for i in args.impls.split(",") if i]
    results = [run_case(spec, args.configs, impls, args.small) for spec in args.cases]
    meta = {
        "device": jax.devices()[0].device_kind,
        "jax": jax.__version__,
        "commit": provenance.git_commit(),
        "command": "python -m benchmarks.bench_tgmm "
        + " ".join(sys.argv[1:] if argv is None else argv),
    }
    if args.out:
        args.out.write_text(json.dumps({**meta, "results": results}, indent=1))
    return {**meta, "results": results}


if __name__ == "__main__":
    main()
