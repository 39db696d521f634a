"""Repeat of the best Mosaic GPU slab-matmul configs (_ab/slab_mgpu.py, v1) against cuBLAS on the
same slabs, in alternating rounds (cuBLAS at the layer's capacity and at the 64-rounded one)."""
import json, math, os
import jax, jax.numpy as jnp
from probe_common import wall_time
from slab_mgpu import Cfg, slabmm_mgpu
from moe_pallas.kernels import slab as _slab
from moe_pallas.kernels.tgmm_padded import capacity

CASES = {  # name: (G, M, K, N, [configs])
    "swiglu_gate_up": (256, 16384, 4096, 4096, ["128,128,3,1,2", "128,128,2,1,2", "128,128,3,1,1"]),
    "swiglu_down": (256, 16384, 2048, 4096, ["128,128,3,1,2", "128,128,2,1,2"]),
    "gptoss_gate_up_4096": (128, 16384, 2880, 5760, ["64,192,3,1,1", "64,192,4,1,1"]),
    "gptoss_down_4096": (128, 16384, 2880, 2880, ["64,192,3,1,1", "64,192,4,1,1"]),
    "gptoss_gate_up": (128, 8192, 2880, 5760, ["64,192,3,1,2"]),
}
dims = (((1,), (1,)), ((0,), (0,)))
cub = lambda a, b: jax.lax.dot_general(a, b, dims, preferred_element_type=jnp.bfloat16)
out = []
for name, (g, m, k, n, configs) in CASES.items():
    cap = capacity(m, g)
    cap64 = -(-cap // 64) * 64
    keys = jax.random.split(jax.random.key(2), 4)
    ids = jax.random.randint(keys[0], (m,), 0, g)
    sizes = jnp.bincount(ids, length=g).astype(jnp.int32)
    offs = jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(sizes).astype(jnp.int32)])
    lr = jax.random.normal(keys[1], (m, k), jnp.bfloat16)
    rr = jax.random.normal(keys[2], (m, n), jnp.bfloat16)
    slabs = {c: (_slab.slab(lr, offs, c), _slab.slab(rr, offs, c)) for c in {cap, cap64}}
    ref = jax.jit(cub)(*slabs[cap])
    variants = {f"cublas C={cap}": (cub, slabs[cap]), f"cublas C={cap64}": (cub, slabs[cap64])}
    for c in configs:
        cfg = Cfg(*map(int, c.split(",")))
        variants[f"mgpu {c} C={cap64}"] = (lambda a, b, cfg=cfg: slabmm_mgpu(a, b, cfg), slabs[cap64])
    for r in range(3):
        for label, (fn, args) in variants.items():
            row = dict(shape=name, impl=label, round=r)
            try:
                if r == 0:
                    row["same"] = bool(jnp.array_equal(jax.jit(fn)(*args), ref))
                ms = wall_time(fn, *args) * 1e3
                row.update(ms=ms, out_tbs=g * k * n * 2 / ms / 1e9)
            except Exception as e:
                row["error"] = str(e)[-200:]
            print(json.dumps(row), flush=True); out.append(row)
    del slabs, ref, lr, rr
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "slabmm3.json"), "w"), indent=1)
