"""Does cuBLAS write the batched weight gradient faster with other slab layouts?
out [G, K, N] (bf16) = Σ_c lhs[g, c, k] rhs[g, c, n], slabs prepared (materialised) beforehand in
[G, C, D] (what kernels.slab writes) or [G, D, C]; the dot alone timed, output materialised."""

import json
import os

import jax
import jax.numpy as jnp

from probe_common import wall_time

SHAPES = {"gptoss_gate_up": (128, 96, 2880, 5760), "gptoss_down": (128, 96, 2880, 2880),
          "swiglu_gate_up": (256, 96, 4096, 4096), "swiglu_down": (256, 96, 2048, 4096),
          "gptoss_gate_up_4096": (128, 192, 2880, 5760)}
out = []
for name, (g, c, k, n) in SHAPES.items():
    key = jax.random.split(jax.random.key(1), 2)
    lhs = jax.random.normal(key[0], (g, c, k), jnp.bfloat16)
    rhs = jax.random.normal(key[1], (g, c, n), jnp.bfloat16)
    lhs_t, rhs_t = (jnp.swapaxes(a, 1, 2).copy() for a in (lhs, rhs))
    jax.block_until_ready((lhs_t, rhs_t))
    dims = lambda lc, rc: (((lc,), (rc,)), ((0,), (0,)))
    bf = jnp.bfloat16
    variants = {
        "CK_CN (now)": (lambda a, b: jax.lax.dot_general(a, b, dims(1, 1), preferred_element_type=bf), lhs, rhs),
        "KC_CN": (lambda a, b: jax.lax.dot_general(a, b, dims(2, 1), preferred_element_type=bf), lhs_t, rhs),
        "KC_NC": (lambda a, b: jax.lax.dot_general(a, b, dims(2, 2), preferred_element_type=bf), lhs_t, rhs_t),
        "CK_NC": (lambda a, b: jax.lax.dot_general(a, b, dims(1, 2), preferred_element_type=bf), lhs, rhs_t),
    }
    ref = None
    for label, (fn, a, b) in variants.items():
        res = jax.jit(fn)(a, b)
        same = None if ref is None else bool(jnp.array_equal(res, ref))
        ref = res if ref is None else ref
        ms = wall_time(fn, a, b, calls=20) * 1e3
        row = dict(shape=name, layout=label, ms=ms, out_tbs=g * k * n * 2 / ms / 1e9, same=same)
        print(json.dumps(row), flush=True)
        out.append(row)
    del lhs, rhs, lhs_t, rhs_t, ref
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "layout.json"), "w"), indent=1)
