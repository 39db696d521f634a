"""Triton batched slab matmul (and ragged direct variant) against cuBLAS's batched dot_general
on the same slabs: the weight gradients of the train step at T = 2048 (and gpt-oss 4096)."""
import json, os, sys
import jax, jax.numpy as jnp
import numpy as np
from probe_common import wall_time
from slabmm import slabmm, raggedmm
from moe_pallas.kernels import slab as _slab
from moe_pallas.kernels.tgmm_padded import capacity

SHAPES = {"gptoss_gate_up": (128, 8192, 2880, 5760), "gptoss_down": (128, 8192, 2880, 2880),
          "swiglu_gate_up": (256, 16384, 4096, 4096), "swiglu_down": (256, 16384, 2048, 4096),
          "gptoss_gate_up_4096": (128, 16384, 2880, 5760)}
CONFIGS = [c.split(",") for c in os.environ.get("CONFIGS", "128,128,32,4,2 128,128,32,8,2 64,128,32,4,2 128,256,32,8,2 64,256,32,4,2 128,128,32,4,3 256,128,32,8,2").split()]
only = os.environ.get("SHAPES_ONLY")
out = []
for name, (g, m, k, n) in SHAPES.items():
    if only and name not in only.split(","):
        continue
    cap = capacity(m, g)
    keys = jax.random.split(jax.random.key(1), 4)
    ids = jax.random.randint(keys[0], (m,), 0, g)
    sizes = jnp.bincount(ids, length=g).astype(jnp.int32)
    offs = jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(sizes).astype(jnp.int32)])
    lhs_rows = jax.random.normal(keys[1], (m, k), jnp.bfloat16)
    rhs_rows = jax.random.normal(keys[2], (m, n), jnp.bfloat16)
    lhs = _slab.slab(lhs_rows, offs, cap)
    rhs = _slab.slab(rhs_rows, offs, cap)
    jax.block_until_ready((lhs, rhs))
    dims = (((1,), (1,)), ((0,), (0,)))
    cub = lambda a, b: jax.lax.dot_general(a, b, dims, preferred_element_type=jnp.bfloat16)
    ref = jax.jit(cub)(lhs, rhs).astype(jnp.float32)
    scale = float(jnp.max(jnp.abs(ref)))
    ms = wall_time(cub, lhs, rhs) * 1e3
    row = dict(shape=name, impl="cublas", cap=cap, ms=ms, out_tbs=g * k * n * 2 / ms / 1e9)
    print(json.dumps(row), flush=True); out.append(row)
    for c in CONFIGS:
        bm, bn, bc, w, s = map(int, c)
        for kind in ("slab", "ragged"):
            if kind == "ragged" and os.environ.get("NO_RAGGED"):
                continue
            try:
                if kind == "slab":
                    fn = lambda a, b: slabmm(a, b, bm=bm, bn=bn, bc=bc, warps=w, stages=s)
                    args = (lhs, rhs)
                else:
                    fn = lambda a, b, o: raggedmm(a, b, o, cap, bm=bm, bn=bn, bc=bc, warps=w, stages=s)
                    args = (lhs_rows, rhs_rows, offs)
                res = jax.jit(fn)(*args).astype(jnp.float32)
                err = float(jnp.max(jnp.abs(res - ref))) / scale
                ms = wall_time(fn, *args) * 1e3
                row = dict(shape=name, impl=f"{kind} {c}", cap=cap, ms=ms,
                           out_tbs=g * k * n * 2 / ms / 1e9, rel_err=err)
            except Exception as e:  # a config that does not compile
                row = dict(shape=name, impl=f"{kind} {c}", error=str(e)[:200])
            print(json.dumps(row), flush=True); out.append(row)
    del lhs, rhs, lhs_rows, rhs_rows, ref
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "slabmm.json"), "w"), indent=1)
