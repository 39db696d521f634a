"""Would cuBLAS stream the forward's weights faster? At T = 2048 (64 rows per expert): a batched
matmul over capacity slabs [G, C, K] x [G, K, N] (C = 96, slabs prepared, the best case: no
gather, no GLU) against the layer's Triton calls (gate_up: in-kernel gather + GLU epilogue; down:
bias + row scale). TB/s of the weights; wall time of back-to-back calls, outputs materialised."""

import importlib
import json
import os

import jax
import jax.numpy as jnp

from moe_pallas import dispatch
from probe_common import wall_time

tr = importlib.import_module("moe_pallas.kernels.gmm")
out = []


SPECS = [  # name, T, k, E, K, N, activation, bias
    ("gptoss_gate_up", 2048, 4, 128, 2880, 5760, "gptoss", True),
    ("gptoss_down", 2048, 4, 128, 2880, 2880, None, True),
    ("swiglu_gate_up", 2048, 8, 256, 4096, 4096, "swiglu", False),
    ("swiglu_down", 2048, 8, 256, 2048, 4096, None, False),
]
for name, t, k, e, kd, nd, act, has_bias in SPECS:
    m = t * k
    k1, k2, k3, k4 = jax.random.split(jax.random.key(t + nd + kd), 4)
    idx = jnp.argsort(jax.random.uniform(k1, (t, e)), axis=1)[:, :k].astype(jnp.int32)
    d = dispatch.dispatch(idx, e)
    rhs = (jax.random.normal(k3, (e, kd, nd), jnp.bfloat16) * kd**-0.5).astype(jnp.bfloat16)
    bias = jax.random.normal(k4, (e, nd), jnp.float32) if has_bias else None
    wbytes = e * kd * nd * 2
    if act:
        x = jax.random.normal(k2, (t, kd), jnp.bfloat16)
        kw = dict(lhs_row_index=d.row_token, bias=bias, activation=act)
    else:
        x = jax.random.normal(k2, (m, kd), jnp.bfloat16)
        kw = dict(bias=bias, row_scale=jax.random.uniform(k4, (m,), jnp.float32))
    s = wall_time(lambda x, w: tr.gmm(x, w, d.group_sizes, **kw), x, rhs)
    row = dict(shape=name, impl="triton_layer_call", ms=s * 1e3, tbs=wbytes / s / 1e12)
    print(json.dumps(row), flush=True)
    out.append(row)
    for cap in (64, 96, 128):
        slab = jax.random.normal(k2, (e, cap, kd), jnp.bfloat16)
        s = wall_time(
            lambda a, w: jax.lax.dot_general(
                a, w, (((2,), (1,)), ((0,), (0,))), preferred_element_type=jnp.bfloat16
            ),
            slab,
            rhs,
        )
        row = dict(shape=name, impl=f"cublas_slab{cap}", ms=s * 1e3, tbs=wbytes / s / 1e12)
        print(json.dumps(row), flush=True)
        out.append(row)
        del slab
    del x, rhs

json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "fwd_cublas.json"), "w"), indent=1)
