"""Compile the plain gmm (tail_m 0 / 16) and the GLU gmm (tail 16) with XLA's dump on: which MMA
instructions each kernel's PTX uses (wgmma vs mma.sync), per kernel."""
import dataclasses, os, sys
import jax, jax.numpy as jnp
from moe_pallas.kernels import config as C
from moe_pallas.kernels.gmm import gmm

variant = sys.argv[1]
e, kd, nd = 8, 2880, 2880
sizes = jnp.full((e,), 136, jnp.int32); m = 136 * e
lhs = jnp.ones((m, kd), jnp.bfloat16)
base = C.pick("gmm", 16384, 128, 2880, 2880)
if variant.startswith("plain"):
    cfg = dataclasses.replace(base, tail_m=int(variant[5:]))
    w = jnp.ones((e, kd, nd), jnp.bfloat16)
    f = jax.jit(lambda: gmm(lhs, w, sizes, bias=jnp.ones((e, nd), jnp.bfloat16), row_scale=jnp.ones((m,), jnp.float32), config=cfg))
else:
    cfg = C.pick("gmm_glu", 16384, 128, 2880, 2880, "gptoss")
    w = jnp.ones((e, kd, 2 * nd), jnp.bfloat16)
    f = jax.jit(lambda: gmm(lhs, w, sizes, lhs_row_index=jnp.arange(m, dtype=jnp.int32), activation="gptoss", config=cfg))
print(variant, cfg)
jax.block_until_ready(f())
