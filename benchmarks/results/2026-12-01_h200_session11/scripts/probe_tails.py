"""Is Mosaic GPU gmm's gap to the dense example tail waste? Time, at compute-bound shapes:
the dense hopper example on [M, K] x [K, N]; our Mosaic gmm with several configs on random
(uniform routing) and on equal group sizes; Triton's gmm on both. TFLOP/s of useful flops."""

import functools
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas.ops.gpu import hopper_matmul_mgpu as hop

from benchmarks.bench_gmm import time_op
from moe_pallas import dispatch
from moe_pallas.kernels import gmm_mgpu
import importlib
sys.path.insert(0, os.path.dirname(__file__))
import importlib as _il; gmm_mgpu_old = _il.import_module(os.environ.get("OLDMOD", "gmm_mgpu_old"))

tr = importlib.import_module("moe_pallas.kernels.gmm")

ALL_SHAPES = {
    "gptoss_gate_up": (16384, 4, 128, 2880, 5760),
    "swiglu_gate_up": (8192, 8, 256, 4096, 4096),
    "gptoss_down": (16384, 4, 128, 2880, 2880),
    "swiglu_down": (8192, 8, 256, 2048, 4096),
}
SHAPES = {k: ALL_SHAPES[k] for k in os.environ.get("SHAPES", "gptoss_gate_up,swiglu_gate_up").split(",")}
DISTS = os.environ.get("DISTS", "uniform,equal").split(",")
DENSE = os.environ.get("DENSE", "1") == "1"
EPI = os.environ.get("EPI", "0") == "1"
CONFIGS = sys.argv[1].split() if len(sys.argv) > 1 else [
    "128,128,64,3,4,2m",
    "64,256,64,4,4,2m",
    "64,256,64,3,4,2m",
    "64,128,64,6,4,2m",
    "128,256,64,3,4",
]


def parse(text):
    *ints, last = text.split(",")
    split = "m" if last.endswith("m") else "n"
    return gmm_mgpu.MosaicConfig(*map(int, [*ints, last.rstrip("m")]), split=split)


out = []
for name, (t, k, e, kd, nd) in SHAPES.items():
    m = t * k
    key = jax.random.key(0)
    k1, k2, k3 = jax.random.split(key, 3)
    idx = jnp.argsort(jax.random.uniform(k1, (t, e)), axis=1)[:, :k].astype(jnp.int32)
    sizes = {
        "uniform": dispatch.dispatch(idx, e).group_sizes,
        "equal": jnp.full((e,), m // e, jnp.int32),
    }
    lhs = jax.random.normal(k2, (m, kd), jnp.bfloat16)
    rhs = (jax.random.normal(k3, (e, kd, nd), jnp.bfloat16) * kd**-0.5).astype(jnp.bfloat16)
    flops = 2 * m * kd * nd

    def rec(label, fn, *args):
        try:
            t0 = time.perf_counter()
            s = time_op(lambda c, *a: fn(*a), jnp.zeros((1,), jnp.float32), *args)
            row = dict(shape=name, impl=label, ms=s * 1e3, tflops=flops / s / 1e12,
                       wall=time.perf_counter() - t0)
        except Exception as ex:  # noqa: BLE001
            row = dict(shape=name, impl=label, error=f"{type(ex).__name__}: {str(ex)[:200]}")
        print(json.dumps(row), flush=True)
        out.append(row)

    for tn, gw in ((128, 4), (192, 4), (128, 8)):
        if nd % tn or not DENSE:
            continue
        cfg = hop.TuningConfig(tile_m=128, tile_n=tn, tile_k=64, max_concurrent_steps=4,
                               grid_minor_dim=hop.MatmulDimension.N, grid_tile_width=gw,
                               wg_dimension=hop.MatmulDimension.M)
        rec(f"dense_hopper_128x{tn}_wgM_w{gw}", lambda a, b, cfg=cfg: hop.matmul(a, b, None, cfg),
            lhs, rhs[0])
    bias = jax.random.normal(k1, (e, nd), jnp.float32)
    scale = jax.random.uniform(k2, (m,), jnp.float32)
    for dist, gs in sizes.items():
        if dist not in DISTS:
            continue
        rec(f"triton_{dist}", lambda a, b, g: tr.gmm(a, b, g), lhs, rhs, gs)
        if EPI:
            rec(f"triton_epi_{dist}", lambda a, b, g, bb, rs: tr.gmm(a, b, g, bias=bb, row_scale=rs), lhs, rhs, gs, bias, scale)
        ref = tr.gmm(lhs, rhs, gs)
        for c in CONFIGS:
            cfg = parse(c)
            rec(f"mgpu_{c}_{dist}", functools.partial(gmm_mgpu.gmm, config=cfg), lhs, rhs, gs)
            if os.environ.get("OLD") == "1":
                rec(f"mgpu_old_{c}_{dist}", functools.partial(gmm_mgpu_old.gmm, config=gmm_mgpu_old.MosaicConfig(**vars(cfg))), lhs, rhs, gs)
            if EPI:
                rec(f"mgpu_epi_{c}_{dist}", lambda a, b, g, bb, rs, cfg=cfg: gmm_mgpu.gmm(a, b, g, bias=bb, row_scale=rs, config=cfg), lhs, rhs, gs, bias, scale)
            if dist == "uniform":
                try:
                    o = gmm_mgpu.gmm(lhs, rhs, gs, config=cfg)
                    err = float(jnp.max(jnp.abs(o.astype(jnp.float32) - ref.astype(jnp.float32))))
                    print(json.dumps(dict(shape=name, impl=c, maxabs_vs_triton=err)), flush=True)
                except Exception as ex:  # noqa: BLE001
                    print("err", c, type(ex).__name__, str(ex)[:200], flush=True)

json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "tails.json"), "w"), indent=1)
