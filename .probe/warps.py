"""Device probe: kernels.fp8_blocks at gpt-oss's w_gate_up, both layouts, by num_warps (ms, TB/s moved)."""
import time

import jax
import jax.numpy as jnp

from moe_pallas import quant
from moe_pallas.kernels.fp8_blocks import fp8_blocks

for shape in ((128, 2880, 5760), (128, 2880, 2880)):
    w = jax.random.normal(jax.random.key(1), shape, jnp.bfloat16) * jnp.bfloat16(0.02)
    e, k, n = shape
    p, p_t = quant._activation_pitch(e, n, k), quant._activation_pitch(e, k, n)
    ref = None
    for warps in (4, 8, 2, 16):
        f = jax.jit(lambda w, warps=warps: fp8_blocks(w, p, p_t, num_warps=warps))
        try:
            out = f(w)
            jax.block_until_ready(out)
        except Exception as err:  # noqa: BLE001
            print(shape, warps, "failed", str(err)[:200], flush=True)
            continue
        same = ref is None or all(bool(jnp.array_equal(a, b)) for a, b in zip(out, ref))
        ref = ref or out
        ts = []
        for _ in range(5):
            t = time.perf_counter()
            for _ in range(10):
                o = f(w)
            jax.block_until_ready(o)
            ts.append((time.perf_counter() - t) / 10)
        t = sorted(ts)[2]
        print(f"{shape} warps {warps}: {t * 1e3:.3f} ms, {w.size * 4 / t / 1e12:.2f} TB/s, same {same}", flush=True)
