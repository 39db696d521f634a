"""Probe (history only): the backward's dx matmul (gmm_t: dh @ w_gate_upᵀ, rhs read transposed)
on Mosaic GPU at several warp-specialised configs against the Triton gmm_t, 65536 routed rows,
both workloads. TFLOP/s on 2·M·K·N, bf16 in and out; outputs compared with Triton's.

    python -m benchmarks.probe_gmm_t_mosaic OUT.json
"""

import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from moe_pallas import backends, dispatch
from moe_pallas.kernels import gmm_mgpu

SHAPES = {"gptoss_dx": (128, 5760, 2880, 4), "swiglu_dx": (256, 4096, 4096, 8)}  # E, K, N, k
MOSAIC = {
    "m64x256": dict(block_m=64, block_n=256, consumers=2, split="m"),
    "m64x192": dict(block_m=64, block_n=192, consumers=2, split="m"),
    "m128x128": dict(block_m=128, block_n=128, consumers=2, split="m"),
    "n128x128": dict(block_m=128, block_n=128, consumers=2, split="n"),
}


def bench(fn, *args, samples=7):
    jax.block_until_ready(fn(*args))
    t = time.perf_counter()
    jax.block_until_ready(fn(*args))
    calls = max(2, min(100, int(0.05 / max(time.perf_counter() - t, 1e-6))))
    times = []
    for _ in range(samples):
        t = time.perf_counter()
        for _ in range(calls):
            r = fn(*args)
        jax.block_until_ready(r)
        times.append((time.perf_counter() - t) / calls)
    return float(np.median(times))


def main(out_path):
    m, rows = 65536, []
    for name, (e, k, n, top_k) in SHAPES.items():
        keys = jax.random.split(jax.random.key(0), 3)
        dh = jax.random.normal(keys[0], (m, k), jnp.bfloat16)
        w_t = (jax.random.normal(keys[1], (e, n, k), jnp.float32) * k**-0.5).astype(jnp.bfloat16)
        ids = jax.random.randint(keys[2], (m // top_k, top_k), 0, e, jnp.int32)
        sizes = dispatch.dispatch(ids, e).group_sizes
        flops = 2.0 * m * k * n
        triton = jax.jit(
            lambda x, w, s: backends.get("pallas_triton").gmm(x, w, s, transpose_rhs=True)
        )
        ref = triton(dh, w_t, sizes)
        fns = {"triton": triton}
        for cname, c in MOSAIC.items():
            cfg = gmm_mgpu.MosaicConfig(**c)
            fns[f"mosaic {cname}"] = jax.jit(
                lambda x, w, s, cfg=cfg: gmm_mgpu.gmm(x, w, s, transpose_rhs=True, config=cfg)
            )
        for _ in range(2):  # two rounds, alternating
            for fname, fn in fns.items():
                try:
                    out = fn(dh, w_t, sizes)
                    diff = float(
                        jnp.max(jnp.abs(out.astype(jnp.float32) - ref.astype(jnp.float32)))
                    )
                    s = bench(fn, dh, w_t, sizes)
                    row = {
                        "matmul": name,
                        "impl": fname,
                        "ms": s * 1e3,
                        "tflops": flops / s / 1e12,
                        "max_abs_diff": diff,
                    }
                except Exception as err:  # noqa: BLE001 (a config that does not compile)
                    row = {"matmul": name, "impl": fname, "error": str(err)[:300]}
                rows.append(row)
                print(json.dumps(row), flush=True)
        del dh, w_t
    json.dump(rows, open(out_path, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
