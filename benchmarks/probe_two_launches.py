"""Probe: a routed grouped matmul as two launches, the bulk of each group on 128-row ping-pong
tiles and the short remainders (at most 64 rows) on 64-row tiles, against one launch over the
routed rows (gpt-oss down, 65536 rows, TFLOP/s of the routed work, one process).

Group g of n rows, r = n mod 128: r > 64 rounds the bulk up (one whole tile computes the
remainder), r <= 64 leaves r rows to the second launch. Each launch is timed on its own operands
(the rows it computes), so the sum is what two launches writing one output would take.

    python -m benchmarks.probe_two_launches OUT_DIR
"""

import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.bench_gmm import time_op
from moe_pallas import dispatch
from moe_pallas.kernels import gmm_mgpu


def cfg(bm, stages=4):
    return gmm_mgpu.MosaicConfig(bm, 192, 64, stages, consumers=2, split="pingpong", epi_n=64)


def main(out_dir):
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows, experts, top_k, k_dim = 65536, 128, 4, 2880
    k2, k3 = jax.random.split(jax.random.key(1))
    rhs = (jax.random.normal(k3, (experts, k_dim, k_dim), jnp.float32) * k_dim**-0.5).astype(
        jnp.bfloat16
    )
    flops = 2 * rows * k_dim * k_dim
    for seed in (0, 1):
        idx = jax.random.randint(
            jax.random.key(seed), (rows // top_k, top_k), 0, experts, jnp.int32
        )
        sizes = np.asarray(dispatch.dispatch(idx, experts).group_sizes)
        rem = sizes % 128
        bulk = np.where(rem > 64, sizes - rem + 128, sizes - rem).astype(np.int32)
        tail = np.where(rem > 64, 0, rem).astype(np.int32)
        row = {"routing seed": seed, "bulk rows": int(bulk.sum()), "tail rows": int(tail.sum())}
        ops = {
            "one launch 128x192": (rows, sizes, cfg(128)),
            "bulk 128x192": (int(bulk.sum()), bulk, cfg(128)),
            "tails 64x192 s4": (int(tail.sum()), tail, cfg(64)),
            "tails 64x192 s6": (int(tail.sum()), tail, cfg(64, 6)),
        }
        for label, (m, s, c) in ops.items():
            lhs = jax.random.normal(k2, (m, k_dim), jnp.bfloat16)
            fn = lambda x, w, s_, c=c: gmm_mgpu.gmm(x, w, s_, config=c)
            row[label + " ms"] = round(time_op(fn, lhs, rhs, jnp.asarray(s)) * 1e3, 4)
        best_tail = min(row["tails 64x192 s4 ms"], row["tails 64x192 s6 ms"])
        two = row["bulk 128x192 ms"] + best_tail
        row["two launches ms"] = round(two, 4)
        row["one launch TFLOP/s"] = round(flops / row["one launch 128x192 ms"] / 1e9, 1)
        row["two launches TFLOP/s"] = round(flops / two / 1e9, 1)
        print(json.dumps(row), flush=True)
        with (out_dir / "two_launches.jsonl").open("a") as f:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:])
