"""mxfp4: the e8m0 scale folded into the decode's bf16x2 multiply (two multiplies, exact for
every code) on tiles of >= MX_FOLD_MIN rows, against the partial dots scaled in float32."""
import json, sys, time
import jax, jax.numpy as jnp, numpy as np
import moe_pallas
from moe_pallas import quant
from moe_pallas.kernels import gmm_quant as gq
from moe_pallas.kernels.config import BlockConfig
from benchmarks import cases as C, impls, run as R

OFF = 2**30
def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))

res = {"exact": [], "ab": []}
# Exactness with scale codes across 0..254 (incl. > 128: the second multiply), every tile height.
key = jax.random.split(jax.random.key(1), 4)
e, k, n = 4, 512, 256
vals = jax.random.bits(key[0], (e, n, k // 2), jnp.uint8)
for lo, hi in ((100, 140), (0, 40), (120, 200), (200, 250)):
    sc = jax.random.randint(key[1], (e, k // 32, n), lo, hi).astype(jnp.uint8)
    w = quant.QuantizedWeight(vals, sc, "mxfp4", jnp.bfloat16)
    wd = np.asarray(w.dequantize(jnp.float32), np.float64)
    sizes = np.array([3, 70, 0, 40])
    x = jax.random.normal(key[2], (int(sizes.sum()), k), jnp.bfloat16) * (2.0 ** -((lo + hi) // 2 - 127))
    bounds = np.cumsum([0, *sizes])
    want = np.concatenate([np.asarray(x[bounds[g]:bounds[g+1]], np.float64) @ wd[g] for g in range(e)])
    for bm in (16, 32, 64):
        for fold in (OFF, 16):
            gq.MX_FOLD_MIN = fold
            cfg = BlockConfig(block_m=bm, block_n=64, block_k=64, num_warps=4, num_stages=3)
            out = np.asarray(gq.gmm_quant(x, w, jnp.asarray(sizes, jnp.int32), out_dtype=jnp.float32, config=cfg))
            r = {"codes": [lo, hi], "bm": bm, "fold": fold != OFF, "rel": rel(out, want),
                 "finite": bool(np.isfinite(out).all()) == bool(np.isfinite(want).all())}
            print(json.dumps(r), flush=True); res["exact"].append(r)
gq.MX_FOLD_MIN = OFF

VARIANTS = {"off": OFF, "f64": 64, "f32": 32, "f16": 16}
for wl in ("swiglu256", "gptoss"):
    params = C.make_params(C.WORKLOADS[wl])
    qp = jax.jit(lambda p: moe_pallas.quantize_experts(p, "mxfp4"))(params)
    for T in (16, 256, 2048):
        case = C.Case("decode", C.WORKLOADS[wl], T, "fwd")
        inputs = R._inputs(case, params)
        t0 = time.time()
        preps = {"bf16": impls._ours("auto")(case, inputs)}
        for v, m in VARIANTS.items():
            gq.MX_FOLD_MIN = m
            preps[v] = impls._ours("auto")(case, {**inputs, "params": qp})
        gq.MX_FOLD_MIN = OFF
        outs = {kk: np.asarray(p.wait(p.call()), np.float32) for kk, p in preps.items()}
        times = {kk: [] for kk in preps}
        for _ in range(3):
            for kk, p in preps.items():
                times[kk].append(R.measure(p, 0.2)[0] * 1e3)
        row = {"case": case.name, **{kk: round(sorted(v)[1], 4) for kk, v in times.items()},
               "rel_vs_off": {kk: rel(outs[kk], outs["off"]) for kk in VARIANTS},
               "s": round(time.time() - t0, 1)}
        print(json.dumps(row), flush=True); res["ab"].append(row)
        del preps, outs
    del params, qp
json.dump(res, open(sys.argv[1], "w"), indent=1)
