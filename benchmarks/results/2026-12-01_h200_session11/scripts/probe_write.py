"""Can a Mosaic GPU kernel write a weight gradient at streaming speed? Dense stand-ins of tgmm at
gpt-oss T = 2048: out [M, N] = a [M, 64] @ b [64, N] with M = 128 * 2880 (every expert's K rows
stacked), N = 5760 (d w_gate_up) and 2880 (d w_down); jax's dense Hopper example (TMA stores from
64x64 epilogue tiles), cuBLAS (jnp.dot), and an XLA fill of the same output. TB/s of the output."""

import json
import os
import time

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.gpu import hopper_matmul_mgpu as hop

from benchmarks.bench_gmm import time_op

out = []


def rec(label, nbytes, fn, *args):
    try:
        t0 = time.perf_counter()
        s = time_op(lambda c, *a: fn(*a), jnp.zeros((1,), jnp.float32), *args)
        row = dict(impl=label, ms=s * 1e3, tbs=nbytes / s / 1e12, wall=time.perf_counter() - t0)
    except Exception as ex:  # noqa: BLE001
        row = dict(impl=label, error=f"{type(ex).__name__}: {str(ex)[:300]}")
    print(json.dumps(row), flush=True)
    out.append(row)


M = 128 * 2880
for n, kd in ((5760, 64), (2880, 64), (5760, 128)):
    k1, k2 = jax.random.split(jax.random.key(n + kd))
    a = jax.random.normal(k1, (M, kd), jnp.bfloat16)
    b = jax.random.normal(k2, (kd, n), jnp.bfloat16)
    nbytes = M * n * 2
    tag = f"N{n}_K{kd}"
    rec(f"fill_{tag}", nbytes, lambda a: jnp.broadcast_to(a[0, 0] + 1, (M, n)), a)
    rec(f"cublas_{tag}", nbytes, lambda a, b: jnp.dot(a, b), a, b)
    for tm, tn, wg, steps, epn in (
        (128, 128, hop.MatmulDimension.N, 2, 64),
        (128, 128, hop.MatmulDimension.M, 2, 64),
        (64, 256, hop.MatmulDimension.M, 2, 64),
        (128, 128, hop.MatmulDimension.N, 2, 128),
        (128, 192, hop.MatmulDimension.M, 2, 64),
    ):
        if n % (tn * (2 if wg == hop.MatmulDimension.N else 1)) or kd % 64:
            continue
        cfg = hop.TuningConfig(tile_m=tm, tile_n=tn, tile_k=64, max_concurrent_steps=steps,
                               epi_tile_n=epn, grid_minor_dim=hop.MatmulDimension.N,
                               grid_tile_width=4, wg_dimension=wg)
        rec(f"hopper_{tag}_{tm}x{tn}_wg{wg}_epi{epn}", nbytes,
            lambda a, b, cfg=cfg: hop.matmul(a, b, None, cfg), a, b)
    del a, b

json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "write.json"), "w"), indent=1)
