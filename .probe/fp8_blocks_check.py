"""Device probe: kernels.fp8_blocks against the jnp rule at gpt-oss and SwiGLU-256 sizes: values
that differ (count, largest step), scales, and the time of each (both layouts / one layout) with
the bytes moved per second."""
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from moe_pallas import quant


def timed(f, *args):
    out = f(*args)
    jax.block_until_ready(out)
    times = []
    for _ in range(7):
        t = time.perf_counter()
        for _ in range(5):
            out = f(*args)
        jax.block_until_ready(out)
        times.append((time.perf_counter() - t) / 5)
    return sorted(times)[3], out


key = jax.random.key(0)
for name, shape in (("gptoss gate_up", (128, 2880, 5760)), ("gptoss down", (128, 2880, 2880)),
                    ("swiglu256 gate_up", (256, 4096, 4096))):
    w = (jax.random.normal(key, shape, jnp.float32) * 0.02).astype(jnp.bfloat16)
    res = {}
    for label, both, kernel in (("kernel both", True, True), ("kernel one", False, True),
                                ("jnp both", True, False))[: 3 if "gate_up" in name else 1]:
        f = jax.jit(functools.partial(quant.fp8_training_weights, both=both, kernel=kernel))
        try:
            t, out = timed(f, w)
        except Exception as err:  # noqa: BLE001
            print(name, label, "failed:", str(err).splitlines()[0][:200]); continue
        moved = w.size * 2 + w.size * (2 if both else 1)
        print(f"{name} {shape} {label}: {t*1e3:.3f} ms, {moved / t / 1e12:.2f} TB/s", flush=True)
        res[label] = out
        del out
    if "kernel both" in res and "jnp both" in res:
        for i, layout in enumerate(("w", "w_t")):
            a, b = res["kernel both"][i], res["jnp both"][i]
            same_scales = bool(jnp.array_equal(a.scales, b.scales))
            va = a.values.astype(jnp.float32); vb = b.values.astype(jnp.float32)
            diff = int(jnp.sum(va != vb))
            ratio = float(jnp.max(jnp.where(va != vb, jnp.abs(va - vb) / jnp.maximum(jnp.abs(vb), 1e-30), 0)))
            print(f"  {layout}: shapes {a.values.shape} {b.values.shape} k {a.k} {b.k}; scales equal {same_scales}; "
                  f"values differing {diff} of {va.size} ({diff / va.size:.2e}), largest relative step {ratio:.4f}", flush=True)
    del res, w

# The train step with fp8_training at gpt-oss's size, T = 2048: against the bf16 step and against
# pallas_triton's fp8_training step (the gpu test's comparisons, one size).
from tests.helpers import device_expert_params, device_normal, random_routing  # noqa: E402
from tests.test_fp8_training import _loss_and_grads  # noqa: E402
from tests.test_quant import rel_err  # noqa: E402

rng = np.random.default_rng(7)
params = device_expert_params(rng, 128, 2880, 2880, jnp.bfloat16, (0.1, 0.1))
x = device_normal(rng, (2048, 2880), jnp.bfloat16)
idx, wts = (jnp.asarray(a) for a in random_routing(rng, 2048, 128, 4))
dout = device_normal(rng, (2048, 2880), jnp.float32)
runs = {}
for impl, fp8 in (("auto", True), ("auto", False), ("pallas_triton", True)):
    step = jax.jit(lambda *a, impl=impl, fp8=fp8: _loss_and_grads("gptoss", impl, fp8, *a))
    runs[(impl, fp8)] = jax.tree.leaves(step(x, idx, wts, params, dout))
got = runs[("auto", True)]
for key, leaves in runs.items():
    errs = [float(rel_err(a, b)) for a, b in zip(got, leaves, strict=True)]
    print("step vs", key, "max rel err", f"{max(errs):.3e}", [f"{e:.2e}" for e in errs], flush=True)
