"""Probe: SwiGLU's gate_up GLU gmm as one [block_k, 2·block_n] dot over the gate and up column
runs (`kernels.gmm._SWIGLU_ONE_DOT`) against two dots of block_n, on the H200: the layer's call
(row gather, bias) at 65536 and 32768 routed rows, TFLOP/s, and the SwiGLU-256 forward at
T = 8192 / 4096 / 2048, alternating, outputs compared.

    python -m benchmarks.probe_swiglu_one_dot OUT_DIR
"""

import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import cases as C
from benchmarks import impls
from benchmarks import run as R
from benchmarks.bench_gmm import time_op
from moe_pallas import backends, dispatch
from moe_pallas.kernels import gmm as gmm_kernels


def main(out_dir):
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    def log(row):
        print(json.dumps(row), flush=True)
        with (out_dir / "one_dot.jsonl").open("a") as f:
            f.write(json.dumps(row) + "\n")

    experts, top_k, hidden, inter = 256, 8, 4096, 2048
    k2, k3 = jax.random.split(jax.random.key(1))
    w = (jax.random.normal(k3, (experts, hidden, 2 * inter), jnp.float32) * hidden**-0.5).astype(
        jnp.bfloat16
    )
    b = (jax.random.normal(k2, (experts, 2 * inter), jnp.float32) * 0.1).astype(jnp.bfloat16)
    for rows in (65536, 32768, 16384):
        tokens = rows // top_k
        x = jax.random.normal(k2, (tokens, hidden), jnp.bfloat16)
        idx = jax.random.randint(jax.random.key(3), (tokens, top_k), 0, experts, jnp.int32)
        d = dispatch.dispatch(idx, experts)
        flops = 2 * rows * hidden * 2 * inter
        row = {"what": "SwiGLU-256 gate_up + GLU, auto", "rows": rows}
        outs = {}
        for rnd in range(2):
            for one in (False, True):
                gmm_kernels._SWIGLU_ONE_DOT = one
                label = "one dot" if one else "two dots"

                def fn(x, w, s, one=one):  # a new function per variant: traced with its flag
                    return backends.gmm(
                        "auto", x, w, s, lhs_row_index=d.row_token, bias=b, activation="swiglu"
                    )

                outs[label] = jax.jit(fn)(x, w, d.group_sizes)
                row.setdefault(label, []).append(
                    round(flops / time_op(fn, x, w, d.group_sizes) / 1e12, 1)
                )
        row["bitwise equal"] = bool(jnp.array_equal(outs["one dot"], outs["two dots"]))
        a, c = (outs[k].astype(jnp.float32) for k in ("one dot", "two dots"))
        row["rel diff"] = float(jnp.linalg.norm(a - c) / jnp.linalg.norm(c))
        log(row)
    for tokens in (8192, 4096, 2048):
        case = C.Case("swiglu256", C.WORKLOADS["swiglu256"], tokens)
        params = C.make_params(case.workload)
        inputs = R._inputs(case, params)
        preps = {}
        for one in (False, True):
            gmm_kernels._SWIGLU_ONE_DOT = one
            preps["one dot" if one else "two dots"] = impls._ours("auto")(case, inputs)
        row = {"case": f"swiglu256 fwd T={tokens}"}
        for _ in range(3):
            for label, prep in preps.items():
                s, _, _ = R.measure(prep, 1.0)
                row.setdefault(label, []).append(round(s * 1e3, 4))
        for label in preps:
            row[label + " median"] = float(np.median(row[label]))
        log(row)
        del preps, inputs, params


if __name__ == "__main__":
    main(*sys.argv[1:])
