"""Device probe: kernels.fp8_blocks at SwiGLU-256's gate_up size ([256, 4096, 4096]: 2^32 values, past
int32 element offsets) against the jnp rule on the first and last experts, both layouts."""
import time

import jax
import jax.numpy as jnp

from moe_pallas import quant

import os

shape = tuple(int(s) for s in os.environ.get("SHAPE", "256,4096,4096").split(","))
w = jax.random.normal(jax.random.key(3), shape, jnp.bfloat16) * jnp.bfloat16(0.02)
f = jax.jit(lambda w: quant.fp8_training_weights(w, both=True, kernel=True))
qw, qwt = f(w)
jax.block_until_ready((qw, qwt))
t = time.perf_counter()
for _ in range(5):
    out = f(w)
jax.block_until_ready(out)
print(f"swiglu256 gate_up both layouts: {(time.perf_counter() - t) / 5 * 1e3:.3f} ms", flush=True)
del out
print("values", qw.values.shape, qw.values.dtype, "t", qwt.values.shape, flush=True)
E = shape[0]
for sl in (slice(0, 4), slice(E // 2 - 4, E // 2 + 4), slice(E - 8, E)):
    for name, got, transposed in (("w", qw, False), ("w_t", qwt, True)):
        ref = quant.fp8_training_weight(w[sl], transposed=transposed)
        a = got.values[sl][..., : ref.values.shape[2]].astype(jnp.float32)
        b = ref.values.astype(jnp.float32)
        pad = got.values[sl][..., ref.values.shape[2]:].astype(jnp.float32)
        print(f"experts {sl.start}-{sl.stop} {name}: values differing {int(jnp.sum(a != b))} of {a.size}, "
              f"scales equal {bool(jnp.array_equal(got.scales[sl], ref.scales))}, "
              f"pad nonzero {int(jnp.sum(pad != 0))}", flush=True)
