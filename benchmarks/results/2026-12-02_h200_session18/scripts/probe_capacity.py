"""How much of the slab matmuls' time is the padded contraction? The weight-gradient slab matmuls of
the T = 2048 train steps at capacity 64 (each group's first 64 rows, about the mean: the others
dropped, for timing only) against the layer's capacity (96) and 128: cuBLAS, session 13's one-
warpgroup kernel (v1) and the ping-pong kernel. Run by call4.sh (its PYTHONPATH has this folder,
session 13's slab_mgpu.py and session 11's probe_common.py)."""
import json
import os

import jax
import jax.numpy as jnp

from probe_common import wall_time
from slab_mgpu import Cfg, slabmm_mgpu
from slab_pingpong import PPCfg, slabmm_pingpong
from moe_pallas.kernels import slab as _slab

CASES = {  # name: (G, M, K, N, v1 config, ping-pong config)
    "gptoss_gate_up_2048": (128, 8192, 2880, 5760, "64,192,3,1,2", "64,128,4,2,2"),
    "gptoss_down_2048": (128, 8192, 2880, 2880, "64,192,3,1,2", "64,192,4,2,1"),
    "swiglu_gate_up_2048": (256, 16384, 4096, 4096, "128,128,3,1,2", "64,128,4,2,2"),
    "swiglu_down_2048": (256, 16384, 2048, 4096, "128,128,3,1,2", "64,128,4,2,2"),
}
dims = (((1,), (1,)), ((0,), (0,)))
cublas = lambda a, b: jax.lax.dot_general(a, b, dims, preferred_element_type=jnp.bfloat16)
rows = []
for name, (g, m, k, n, v1c, ppc) in CASES.items():
    keys = jax.random.split(jax.random.key(7), 3)
    ids = jax.random.randint(keys[0], (m,), 0, g)
    sizes = jnp.bincount(ids, length=g).astype(jnp.int32)
    offs = jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(sizes).astype(jnp.int32)])
    lr = jax.random.normal(keys[1], (m, k), jnp.bfloat16)
    rr = jax.random.normal(keys[2], (m, n), jnp.bfloat16)
    slabs = {c: (_slab.slab(lr, offs, c), _slab.slab(rr, offs, c)) for c in (64, 96, 128)}
    v1cfg, ppcfg = Cfg(*map(int, v1c.split(","))), PPCfg(*map(int, ppc.split(",")))
    variants = {}
    for c in (64, 96, 128):
        variants[f"cublas C={c}"] = (cublas, slabs[c])
    for c in (64, 128):
        variants[f"v1 {v1c} C={c}"] = (lambda a, b: slabmm_mgpu(a, b, v1cfg), slabs[c])
        variants[f"pp {ppc} C={c}"] = (lambda a, b: slabmm_pingpong(a, b, ppcfg), slabs[c])
    for r in range(3):
        for label, (fn, args) in variants.items():
            row = dict(shape=name, impl=label, round=r)
            try:
                if r == 0:
                    ref = cublas(*args).astype(jnp.float32)
                    out = jax.jit(fn)(*args).astype(jnp.float32)
                    row["same_as_cublas"] = bool(jnp.array_equal(out, ref))
                    del out, ref
                ms = wall_time(fn, *args) * 1e3
                row.update(ms=round(ms, 4), out_tbs=round(g * k * n * 2 / ms / 1e9, 3))
            except Exception as e:  # noqa: BLE001
                row["error"] = f"{type(e).__name__}: {str(e)[-300:]}"
            print(json.dumps(row), flush=True)
            rows.append(row)
    del slabs, lr, rr
json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "capacity.json"), "w"), indent=1)
print("\n| shape | impl | median ms | TB/s |")
print("|---|---|---|---|")
for name in CASES:
    for label in dict.fromkeys(r["impl"] for r in rows if r["shape"] == name):
        ms = sorted(r["ms"] for r in rows if r["shape"] == name and r["impl"] == label and "ms" in r)
        if ms:
            g, m, k, n = CASES[name][:4]
            med = ms[len(ms) // 2]
            print(f"| {name} | {label} | {med:.3f} | {g * k * n * 2 / med / 1e9:.2f} |")
