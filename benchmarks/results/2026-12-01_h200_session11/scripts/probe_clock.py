"""Does sustained load slow the H200? The gpt-oss T = 16384 gate_up (Triton, plain) in jitted
loops of 10 calls, back to back for DURATION seconds, each loop's wall time recorded; nvidia-smi samples
clocks, power and throttle reasons every 100 ms in the background (smi.csv)."""

import json
import os
import subprocess
import time

import jax
import jax.numpy as jnp
import importlib

from moe_pallas import dispatch

tr = importlib.import_module("moe_pallas.kernels.gmm")
OUT = os.environ.get("OUT", ".")
t, k, e, kd, nd = 16384, 4, 128, 2880, 5760
k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
idx = jnp.argsort(jax.random.uniform(k1, (t, e)), axis=1)[:, :k].astype(jnp.int32)
gs = dispatch.dispatch(idx, e).group_sizes
lhs = jax.random.normal(k2, (t * k, kd), jnp.bfloat16)
rhs = (jax.random.normal(k3, (e, kd, nd), jnp.bfloat16) * kd**-0.5).astype(jnp.bfloat16)


@jax.jit
def loop(c, lhs, rhs, gs):
    def body(_, c):
        o = tr.gmm(lhs, rhs, gs)
        return c.at[0].set(o[0, 0].astype(c.dtype))
    return jax.lax.fori_loop(0, 10, body, c)


c = jnp.zeros((1,), jnp.float32)
jax.block_until_ready(loop(c, lhs, rhs, gs))
time.sleep(3.0)  # let the GPU cool to idle before the sustained run
smi = subprocess.Popen(
    ["nvidia-smi", "--query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,"
     "clocks_throttle_reasons.active", "--format=csv,noheader", "-lms", "100"],
    stdout=open(os.path.join(OUT, "smi.csv"), "w"))
time.sleep(0.5)
rows, t_start = [], time.perf_counter()
while time.perf_counter() - t_start < float(os.environ.get("DURATION", "8")):
    t0 = time.perf_counter()
    c = jax.block_until_ready(loop(c, lhs, rhs, gs))
    rows.append((t0 - t_start, (time.perf_counter() - t0) / 10 * 1e3))
smi.terminate()
for i in (0, 1, 2, 3, 5, 10, 20, 40, 80, 120, 160, len(rows) - 1):
    if i < len(rows):
        print(f"loop {i:4d} at {rows[i][0]:6.3f} s: {rows[i][1]:.3f} ms per gmm", flush=True)
json.dump(rows, open(os.path.join(OUT, "clock.json"), "w"))
print(open(os.path.join(OUT, "smi.csv")).read()[:4000])
