"""The weight gradients (tgmm) of the layer's backward against what their writes allow.

At T = 2048 an expert gets ~64 rows, so `d w[e] = lhs[rows of e]ᵀ @ d_out[rows of e]` is bound by
writing the [E, K, N] bf16 gradient (4.25 GB for gpt-oss's d w_gate_up, 0.88 ms at 4.8 TB/s). Per
case (workload, weight, T, uniform routing, bf16) this times, as the layer calls them:
  tgmm      `kernels.tgmm` with the table's config and with each --configs entry
            ("block_m,block_n,block_k,group_m,num_warps,num_stages")
  mosaic    `kernels.tgmm_mgpu` with each --mosaic-configs entry ("block_m,block_k,block_n,
            num_stages[,ctas_per_sm[,producer]]"), on an XLA-gathered copy of x for gate_up (as
            the layer runs it), the copy included
  fill      an XLA fusion writing the same [E, K, N] bf16 array (at 1.7 TB/s on the H200: not
            a ceiling; a store-only Triton kernel wrote 4.2-4.5 TB/s, results/..._session7/)
  cublas    `einsum("eck,ecn->ekn")` on inputs padded to the largest group (built outside the
            timing): a batched cuBLAS GEMM writing the same output, the library's reference
Each time: median over 5 runs of `reps` back-to-back calls returning the whole output (so nothing
is optimised away), seconds per call; TB/s of the output's bytes.

    PYTHONPATH=. python3 benchmarks/bench_tgmm.py [--cases gptoss:gate_up:2048 ...] [--configs ...]
                                                  [--mosaic-configs 64,64,256,4 ...]
                                                  [--small] [--out tgmm.json]
"""

import argparse
import functools
import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.cases import SMALL_WORKLOADS, WORKLOADS
from moe_pallas import dispatch
from moe_pallas.kernels import config as _config
from moe_pallas.kernels import tgmm_mgpu
from moe_pallas.kernels.tgmm import tgmm

DEFAULT_CASES = ("gptoss:gate_up:2048", "gptoss:down:2048", "swiglu256:down:2048")


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


def parse_config(text):
    bm, bn, bk, gm, warps, stages = (int(v) for v in text.split(","))
    return _config.BlockConfig(bm, bn, bk, group_m=gm, num_warps=warps, num_stages=stages)


def run_case(spec, configs, mosaic_configs=(), small=False):
    name, weight, tokens = spec.split(":")
    w = (SMALL_WORKLOADS if small else WORKLOADS)[name]
    timed = functools.partial(time_calls, reps=1, runs=1) if small else time_calls
    tokens = int(tokens)
    keys = iter(jax.random.split(jax.random.key(tokens), 4))
    idx = jax.random.randint(next(keys), (tokens, w.top_k), 0, w.experts, jnp.int32)
    d = dispatch.dispatch(idx, w.experts)
    m = tokens * w.top_k
    if weight == "gate_up":  # x[row_token]ᵀ dh, x gathered in the kernel
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

    def record(label, seconds):
        result[label] = {"ms": seconds * 1e3, "TBps": out_bytes / seconds / 1e12}
        print(
            f"{spec:22} {label:34} {seconds * 1e3:8.3f} ms {out_bytes / seconds / 1e12:6.2f} TB/s",
            flush=True,
        )

    table = _config.pick("tgmm", m, w.experts, k_dim, n_dim)
    reference = None
    for label, cfg in [("tgmm table " + _label(table), None)] + [
        ("tgmm " + c, parse_config(c)) for c in configs
    ]:
        fn = jax.jit(lambda l, r, s, i, cfg=cfg: tgmm(l, r, s, lhs_row_index=i, config=cfg))
        try:
            out = fn(lhs, rhs, d.group_sizes, row_index)
            if reference is None:
                reference = out
            elif not bool(jnp.array_equal(out, reference)):
                result.setdefault("mismatch", []).append(label)
            del out
            record(label, timed(fn, lhs, rhs, d.group_sizes, row_index))
        except Exception as err:  # noqa: BLE001 - e.g. shared memory exceeded: record, go on
            result[label] = {"error": str(err)[:200]}
            print(f"{spec:22} {label:34} failed: {str(err)[:100]}", flush=True)
    for c in mosaic_configs:
        label = "mosaic " + c
        cfg = tgmm_mgpu.TgmmMosaicConfig(*(int(v) for v in c.split(",")))

        def fn(l, r, s, i, cfg=cfg):
            return tgmm_mgpu.tgmm(l if i is None else l[i], r, s, config=cfg)

        fn = jax.jit(fn)
        try:
            out = fn(lhs, rhs, d.group_sizes, row_index).astype(jnp.float32)
            want = reference.astype(jnp.float32)
            result.setdefault("mosaic_rel_err", {})[c] = float(
                jnp.linalg.norm(out - want) / jnp.linalg.norm(want)
            )
            del out, want
            record(label, timed(fn, lhs, rhs, d.group_sizes, row_index))
        except Exception as err:  # noqa: BLE001 - e.g. shared memory exceeded: record, go on
            result[label] = {"error": str(err)[:200]}
            print(f"{spec:22} {label:34} failed: {str(err)[:100]}", flush=True)
    del reference

    c = jnp.ones((), jnp.bfloat16)
    record("fill", timed(jax.jit(lambda c: jnp.full((w.experts, k_dim, n_dim), c)), c))

    sizes = np.asarray(d.group_sizes)
    cap = int(-(-sizes.max() // 16) * 16)
    slot = np.arange(m) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    expert = np.repeat(np.arange(w.experts), sizes)
    lhs_rows = lhs[row_index] if row_index is not None else lhs
    lhs_pad = jnp.zeros((w.experts, cap, k_dim), lhs.dtype).at[expert, slot].set(lhs_rows)
    rhs_pad = jnp.zeros((w.experts, cap, n_dim), rhs.dtype).at[expert, slot].set(rhs)
    result["cublas_capacity"] = cap
    einsum = jax.jit(lambda a, b: jnp.einsum("eck,ecn->ekn", a, b))
    record(f"cublas (groups padded to {cap})", timed(einsum, lhs_pad, rhs_pad))
    return result


def _label(cfg):
    return (
        f"{cfg.block_m},{cfg.block_n},{cfg.block_k},{cfg.group_m},{cfg.num_warps},{cfg.num_stages}"
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=list(DEFAULT_CASES))
    parser.add_argument("--configs", nargs="*", default=[])
    parser.add_argument("--mosaic-configs", nargs="*", default=[])
    parser.add_argument("--out", default="tgmm.json")
    parser.add_argument("--small", action="store_true", help="tiny workloads (CPU smoke test)")
    args = parser.parse_args(argv)
    results = [run_case(spec, args.configs, args.mosaic_configs, args.small) for spec in args.cases]
    with open(args.out, "w") as f:
        meta = {"device": jax.devices()[0].device_kind, "jax": jax.__version__}
        json.dump({**meta, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
