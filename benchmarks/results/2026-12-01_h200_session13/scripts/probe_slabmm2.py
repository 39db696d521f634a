"""The Mosaic GPU slab matmul (_ab/slab_mgpu.py) against cuBLAS's batched dot_general on the same
slabs: the train step's weight gradients at T = 2048 (and gpt-oss 4096)."""
import json, os
import jax, jax.numpy as jnp
from probe_common import wall_time
from slab_mgpu import Cfg, slabmm_mgpu, slabmm_mgpu2
from moe_pallas.kernels import slab as _slab
from moe_pallas.kernels.tgmm_padded import capacity

SHAPES = {"gptoss_gate_up": (128, 8192, 2880, 5760), "gptoss_down": (128, 8192, 2880, 2880),
          "swiglu_gate_up": (256, 16384, 4096, 4096), "swiglu_down": (256, 16384, 2048, 4096),
          "gptoss_gate_up_4096": (128, 16384, 2880, 5760)}
CONFIGS = os.environ.get("CONFIGS", "64,192,3,1,2 64,192,4,1,2 64,192,2,2,1 64,128,3,2,1 64,128,2,2,2 64,256,3,1,2 64,256,4,1,1 128,128,3,1,2 128,192,3,1,1 64,192,3,1,1").split()
only = os.environ.get("SHAPES_ONLY")
out = []
for name, (g, m, k, n) in SHAPES.items():
    if only and name not in only.split(","):
        continue
    cap = capacity(m, g)
    cap = -(-cap // 64) * 64 if os.environ.get('CAP64') else cap
    keys = jax.random.split(jax.random.key(1), 4)
    ids = jax.random.randint(keys[0], (m,), 0, g)
    sizes = jnp.bincount(ids, length=g).astype(jnp.int32)
    offs = jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(sizes).astype(jnp.int32)])
    lhs = _slab.slab(jax.random.normal(keys[1], (m, k), jnp.bfloat16), offs, cap)
    rhs = _slab.slab(jax.random.normal(keys[2], (m, n), jnp.bfloat16), offs, cap)
    jax.block_until_ready((lhs, rhs))
    dims = (((1,), (1,)), ((0,), (0,)))
    cub = lambda a, b: jax.lax.dot_general(a, b, dims, preferred_element_type=jnp.bfloat16)
    ref = jax.jit(cub)(lhs, rhs)
    ms = wall_time(cub, lhs, rhs) * 1e3
    row = dict(shape=name, impl="cublas", cap=cap, ms=ms, out_tbs=g * k * n * 2 / ms / 1e9)
    print(json.dumps(row), flush=True); out.append(row)
    for c in CONFIGS:
        v2 = c.startswith("v2:")
        bk, bn, st, ctas, nb = map(int, c.removeprefix("v2:").split(","))
        if k % bk or n % bn:
            continue
        cfg = Cfg(bk, bn, st, ctas, nb)
        fn = (lambda a, b: slabmm_mgpu2(a, b, cfg)) if v2 else (lambda a, b: slabmm_mgpu(a, b, cfg))
        try:
            res = jax.jit(fn)(lhs, rhs)
            same = bool(jnp.array_equal(res, ref))
            err = float(jnp.max(jnp.abs(res.astype(jnp.float32) - ref.astype(jnp.float32))) / jnp.max(jnp.abs(ref.astype(jnp.float32))))
            ms = wall_time(fn, lhs, rhs) * 1e3
            row = dict(shape=name, impl=f"mgpu {c}", cap=cap, ms=ms,
                       out_tbs=g * k * n * 2 / ms / 1e9, rel_err=err, same=same)
        except Exception as e:
            row = dict(shape=name, impl=f"mgpu {c}", error=str(e)[-300:])
        print(json.dumps(row), flush=True); out.append(row)
    del lhs, rhs, ref
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "slabmm2.json"), "w"), indent=1)
