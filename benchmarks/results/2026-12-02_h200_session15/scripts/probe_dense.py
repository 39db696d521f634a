"""Session 15, call 6: the dense bf16 matmul ceiling at the suites' compute-bound shapes, as the
H200 sustains it at its power cap: XLA's dot (cuBLAS) and torch.matmul, TFLOP/s of each second of
a 6-second loop of back-to-back calls (random normal inputs, float32 accumulation, bf16 out)."""
import json
import os
import time

import jax
import jax.numpy as jnp
import torch

SHAPES = {  # (M, K, N): T·k rows of the layer's two projections at its compute-bound cases
    "gptoss gate_up T=16384": (65536, 2880, 5760),
    "gptoss down T=16384": (65536, 2880, 2880),
    "swiglu gate_up T=8192": (65536, 4096, 4096),
}
rows = []
for name, (m, k, n) in SHAPES.items():
    flops = 2.0 * m * k * n
    a = jax.random.normal(jax.random.key(0), (m, k), jnp.bfloat16)
    b = jax.random.normal(jax.random.key(1), (k, n), jnp.bfloat16) * k**-0.5
    f = jax.jit(jnp.dot)
    ta = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    tb = torch.randn(k, n, device="cuda", dtype=torch.bfloat16) * k**-0.5
    for lib, call, sync in (
        ("xla", lambda: f(a, b), lambda o: o.block_until_ready()),
        ("torch", lambda: ta @ tb, lambda o: torch.cuda.synchronize()),
    ):
        sync(call())
        per_second, t_end = [], time.perf_counter() + 6
        while time.perf_counter() < t_end:
            t0, calls = time.perf_counter(), 0
            while time.perf_counter() - t0 < 1:
                for _ in range(10):
                    o = call()
                sync(o)
                calls += 10
            per_second.append(flops * calls / (time.perf_counter() - t0) / 1e12)
        row = {"shape": name, "lib": lib, "tflops_per_second": [round(x, 1) for x in per_second]}
        print(json.dumps(row), flush=True)
        rows.append(row)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "dense.json"), "w"), indent=1)
