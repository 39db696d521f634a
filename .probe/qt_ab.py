"""The backward's products with wᵀ on the weights as stored (kernels.gmm_quant_t) against
a dense copy per call (gmm_quant_t.supports patched to False while compiling): gradients of x and
the routing weights through the layer, medians of 3 alternating rounds (bursts of 10 calls), ms,
beside the bf16 layer's; and how far the two gradients differ.
Usage: python .probe/qt_ab.py gptoss|swiglu256 OUT.json"""
import json, sys, time
import jax, jax.numpy as jnp, numpy as np
import moe_pallas
from moe_pallas.kernels import gmm_quant_t as qt
from benchmarks import cases as C, run as R

wl, out_path = sys.argv[1], sys.argv[2]
W = (C.SMALL_WORKLOADS if "--small" in sys.argv else C.WORKLOADS)[wl]
params = C.make_params(W)
stored = {f: moe_pallas.quantize_experts(params, f) for f in ("fp8", "fp8_block", "mxfp4")}
TOKENS = (16,) if "--small" in sys.argv else {"gptoss": (2048, 16384), "swiglu256": (2048, 8192)}[wl]


def grads(x, idx, wts, p):
    loss = lambda x, wts: jnp.sum(moe_pallas.moe_experts(
        x, idx, wts, p, activation=W.activation).astype(jnp.float32) ** 2)
    return jax.grad(loss, argnums=(0, 1))(x, wts)


def compiled(args, dense_copy):
    saved = qt.supports
    if dense_copy:
        qt.supports = lambda w, dtype: False
    try:
        return jax.jit(grads).lower(*args).compile()
    finally:
        qt.supports = saved


def burst(fn, args, n=10):
    jax.block_until_ready(fn(*args))
    t0 = time.perf_counter()
    for _ in range(n):
        out = fn(*args)
    jax.block_until_ready(out)
    return (time.perf_counter() - t0) / n * 1e3


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


rows = []
for T in TOKENS:
    case = C.Case("train", W, T, "train")
    inputs = R._inputs(case, params)
    base = (inputs["x"], inputs["topk_idx"], inputs["topk_weight"])
    variants = {"bf16": (compiled((*base, params), False), params)}
    for f, q in stored.items():
        variants[f] = (compiled((*base, q), False), q)
        variants[f + "|dense"] = (compiled((*base, q), True), q)
    outs = {k: fn(*base, p) for k, (fn, p) in variants.items()}
    times = {k: [] for k in variants}
    for _ in range(3):
        for k, (fn, p) in variants.items():
            times[k].append(burst(fn, (*base, p)))
    row = {"workload": wl, "T": T, **{k: round(sorted(v)[1], 4) for k, v in times.items()},
           "dx_vs_dense": {f: rel(outs[f][0], outs[f + "|dense"][0]) for f in stored},
           "dw_vs_dense": {f: rel(outs[f][1], outs[f + "|dense"][1]) for f in stored}}
    print(json.dumps(row), flush=True)
    rows.append(row)
    del variants, outs
json.dump(rows, open(out_path, "w"), indent=1)
