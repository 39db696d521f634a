"""Probe (history only): the no-gradient forward's gate_up at the large class, GLU in the gmm's
epilogue (one kernel, a only) against h from the plain gmm plus the GLU in XLA, one process,
both workloads' large cases, "auto" policy, bf16; outputs compared.

    python -m benchmarks.probe_glu_split OUT.json
"""

import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from moe_pallas import backends, dispatch
from moe_pallas.activations import glu, split_gate_up


def bench(fn, *args, samples=7):
    jax.block_until_ready(fn(*args))
    t = time.perf_counter()
    jax.block_until_ready(fn(*args))
    calls = max(2, min(100, int(0.05 / max(time.perf_counter() - t, 1e-6))))
    times = []
    for _ in range(samples):
        t = time.perf_counter()
        for _ in range(calls):
            r = fn(*args)
        jax.block_until_ready(r)
        times.append((time.perf_counter() - t) / calls)
    return float(np.median(times))


CASES = {"gptoss": (16384, 2880, 2880, 128, 4), "swiglu": (8192, 4096, 2048, 256, 8)}


def main(out_path):
    rows = []
    for act, (t, h, i, e, k) in CASES.items():
        keys = jax.random.split(jax.random.key(0), 3)
        x = jax.random.normal(keys[0], (t, h), jnp.bfloat16)
        w = (jax.random.normal(keys[1], (e, h, 2 * i), jnp.float32) * h**-0.5).astype(jnp.bfloat16)
        d = dispatch.dispatch(jax.random.randint(keys[2], (t, k), 0, e, jnp.int32), e)

        def fused(x, w, sizes, rows, act=act):
            return backends.gmm("auto", x, w, sizes, lhs_row_index=rows, activation=act)

        def split(x, w, sizes, rows, act=act):
            hh = backends.gmm("auto", x, w, sizes, lhs_row_index=rows)
            return glu(*split_gate_up(hh.astype(jnp.float32), act), act).astype(x.dtype)

        fns = {"epilogue": jax.jit(fused), "h + xla glu": jax.jit(split)}
        args = (x, w, d.group_sizes, d.row_token)
        outs = {n: f(*args) for n, f in fns.items()}
        diff = float(jnp.max(jnp.abs(outs["epilogue"].astype(jnp.float32) - outs["h + xla glu"])))
        for _ in range(3):
            for name, fn in fns.items():
                row = {"case": act, "impl": name, "ms": bench(fn, *args) * 1e3, "max_diff": diff}
                rows.append(row)
                print(json.dumps(row), flush=True)
        del x, w, outs
    with open(out_path, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
