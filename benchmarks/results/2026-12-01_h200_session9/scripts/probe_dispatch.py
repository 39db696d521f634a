"""Decode T = 1: is the layer's call host-bound or GPU-bound? Per call: the wall clock of
back-to-back calls, the host's enqueue time alone, and the GPU time of 100 chained calls in one jit."""
import os, statistics, sys, time
sys.path.insert(0, ".")
import jax, jax.numpy as jnp
import moe_pallas

def params_for(name, key):
    E, H, I = (128, 2880, 2880) if name == "gptoss" else (256, 4096, 2048)
    k = jax.random.split(key, 4)
    p = {"w_gate_up": jax.random.normal(k[0], (E, H, 2 * I), jnp.bfloat16) * 0.02,
         "w_down": jax.random.normal(k[1], (E, I, H), jnp.bfloat16) * 0.02}
    if name == "gptoss":
        p["b_gate_up"] = jax.random.normal(k[2], (E, 2 * I), jnp.bfloat16) * 0.02
        p["b_down"] = jax.random.normal(k[3], (E, H), jnp.bfloat16) * 0.02
    return p, E, H, (4 if name == "gptoss" else 8)

for name in ("gptoss", "swiglu"):
    params, E, H, K = params_for(name, jax.random.key(0))
    act = "gptoss" if name == "gptoss" else "swiglu"
    x = jax.random.normal(jax.random.key(1), (1, H), jnp.bfloat16)
    idx = jax.random.permutation(jax.random.key(2), E)[:K][None].astype(jnp.int32)
    w = jax.nn.softmax(jax.random.normal(jax.random.key(3), (1, K)), -1)
    layer = jax.jit(lambda x, i, w, p: moe_pallas.moe_experts(x, i, w, p, activation=act, implementation="auto"))
    jax.block_until_ready(layer(x, idx, w, params))
    walls, enq = [], []
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(200):
            out = layer(x, idx, w, params)
        t1 = time.perf_counter()
        jax.block_until_ready(out)
        t2 = time.perf_counter()
        enq.append((t1 - t0) / 200); walls.append((t2 - t0) / 200)

    @jax.jit
    def chained(x, i, w, p):
        def body(_, x):
            ii = jnp.where(x[0, 0] > 1e30, (i + 1) % E, i)  # data-dependent: the routing stays in the loop
            return (x.astype(jnp.float32) + 1e-3 * moe_pallas.moe_experts(x, ii, w, p, activation=act, implementation="auto").astype(jnp.float32)).astype(x.dtype)
        return jax.lax.fori_loop(0, 100, body, x)
    jax.block_until_ready(chained(x, idx, w, params))
    loops = []
    for _ in range(5):
        t0 = time.perf_counter(); jax.block_until_ready(chained(x, idx, w, params)); loops.append((time.perf_counter() - t0) / 100)
    print(f"{name} T=1 [{os.environ.get('XLA_FLAGS', 'default flags')}]: wall {statistics.median(walls)*1e3:.4f} ms/call, "
          f"host enqueue {statistics.median(enq)*1e3:.4f} ms/call, in-jit loop {statistics.median(loops)*1e3:.4f} ms/call", flush=True)
    del params
