"""Mid-T (64-128 rows per expert, weight-bandwidth bound) layer matmuls: Triton (the layer's call)
against Mosaic GPU configs. Down: bias (gpt-oss) and row scale, no gather. SwiGLU gate_up: Triton
gathers rows in-kernel with the GLU epilogue; Mosaic reads an XLA-gathered copy (timed with it).
Routing: uniform random top-k. Prints TB/s of the weights read."""

import json
import os
import time

import jax
import jax.numpy as jnp

from benchmarks.bench_gmm import time_op
from moe_pallas import dispatch
from moe_pallas.kernels import gmm_mgpu
import importlib

tr = importlib.import_module("moe_pallas.kernels.gmm")
TOKENS = [int(t) for t in os.environ.get("TOKENS", "2048,4096").split(",")]
WHICH = os.environ.get("WHICH", "gptoss_down,swiglu_down,swiglu_gate_up").split(",")
CONFIGS = {
    "down": os.environ.get("DOWN_CFGS", "64,256,64,4,4,2m 128,256,64,4 128,256,64,3").split(),
    "gate_up": os.environ.get("GLU_CFGS", "64,128,64,4,4,2m 64,128,64,3,4,2m").split(),
}
SPECS = {  # k, experts, K, N (weight columns), activation, bias
    "gptoss_down": (4, 128, 2880, 2880, None, True),
    "swiglu_down": (8, 256, 2048, 4096, None, False),
    "swiglu_gate_up": (8, 256, 4096, 4096, "swiglu", False),
    "gptoss_gate_up": (4, 128, 2880, 5760, "gptoss", True),
}


def parse(text):
    *ints, last = text.split(",")
    split = "m" if last.endswith("m") else "n"
    return gmm_mgpu.MosaicConfig(*map(int, [*ints, last.rstrip("m")]), split=split)


out = []
for name in WHICH:
    k, e, kd, nd, act, has_bias = SPECS[name]
    for t in TOKENS:
        m = t * k
        k1, k2, k3, k4 = jax.random.split(jax.random.key(t), 4)
        idx = jnp.argsort(jax.random.uniform(k1, (t, e)), axis=1)[:, :k].astype(jnp.int32)
        d = dispatch.dispatch(idx, e)
        gs = d.group_sizes
        rhs = (jax.random.normal(k3, (e, kd, nd), jnp.bfloat16) * kd**-0.5).astype(jnp.bfloat16)
        bias = jax.random.normal(k4, (e, nd), jnp.float32) if has_bias else None
        wbytes = e * kd * nd * 2
        if act:
            x = jax.random.normal(k2, (t, kd), jnp.bfloat16)
            rows = d.row_token
            scale = None
        else:
            x = jax.random.normal(k2, (m, kd), jnp.bfloat16)
            rows = None
            scale = jax.random.uniform(k4, (m,), jnp.float32)

        def rec(label, fn, *args):
            try:
                t0 = time.perf_counter()
                s = time_op(lambda c, *a: fn(*a), jnp.zeros((1,), jnp.float32), *args)
                row = dict(shape=name, tokens=t, impl=label, ms=s * 1e3, tbs=wbytes / s / 1e12,
                           wall=time.perf_counter() - t0)
            except Exception as ex:  # noqa: BLE001
                row = dict(shape=name, tokens=t, impl=label, error=f"{type(ex).__name__}: {str(ex)[:300]}")
            print(json.dumps(row), flush=True)
            out.append(row)

        kw = dict(bias=bias, activation=act, row_scale=scale)
        rec("triton", lambda x, w, g, ri: tr.gmm(x, w, g, lhs_row_index=ri, **kw), x, rhs, gs, rows)
        ref = tr.gmm(x, rhs, gs, lhs_row_index=rows, **kw).astype(jnp.float32)
        for c in CONFIGS["gate_up" if act else "down"]:
            cfg = parse(c)

            def mg(x, w, g, ri, cfg=cfg):
                lhs = x if ri is None else x[ri]
                return gmm_mgpu.gmm(lhs, w, g, config=cfg, **kw)

            rec(f"mgpu_{c}", mg, x, rhs, gs, rows)
            try:
                o = mg(x, rhs, gs, rows).astype(jnp.float32)
                err = float(jnp.max(jnp.abs(o - ref)) / jnp.max(jnp.abs(ref)))
                print(json.dumps(dict(shape=name, tokens=t, impl=c, rel_vs_triton=err)), flush=True)
            except Exception as ex:  # noqa: BLE001
                print("err", c, type(ex).__name__, str(ex)[:200], flush=True)
        del x, rhs

json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "mid.json"), "w"), indent=1)
