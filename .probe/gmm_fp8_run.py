"""GPU: the grouped Mosaic GPU FP8 probe (`gmm_fp8_mgpu.py`, block_n 128) on SwiGLU-256's down call
(K = 2048, N = 4096, bias, routing-weight row scale), checked against float64 on a small case and
timed against Triton's FP8-activation gmm_quant (the table's config) and bf16 ("auto"), ms,
medians of 3 rounds of 10 calls. Usage: python .probe/gmm_fp8_run.py OUT.json"""
import json, sys, time
sys.path.insert(0, ".probe")
import jax, jax.numpy as jnp, numpy as np
import gmm_fp8_mgpu as G
from moe_pallas import backends, dispatch, quant
from moe_pallas.backends import pallas_triton as pt
from moe_pallas.kernels.gmm_quant import gmm_quant

res = {"check_fp8": G.check("fp8", 512, 256, [300, 0, 17, 200], bn=128, bk=128),
       "check_fp8_block": G.check("fp8_block", 512, 256, [300, 0, 17, 200], bn=128, bk=128)}
print(res, flush=True)


def timed(f, *args):
    f(*args).block_until_ready()
    ts = []
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(10):
            o = f(*args)
        o.block_until_ready()
        ts.append((time.perf_counter() - t0) / 10 * 1e3)
    return round(sorted(ts)[1], 4)


e, k, n, top_k = 256, 2048, 4096, 8
key = jax.random.key(0)
w16 = jax.random.normal(key, (e, k, n), jnp.bfloat16) * 0.02
for T in (2048, 8192):
    m = T * top_k
    d = dispatch.dispatch(jax.random.randint(jax.random.fold_in(key, T), (T, top_k), 0, e, jnp.int32), e)
    a = jax.random.normal(jax.random.fold_in(key, 1), (m, k), jnp.bfloat16)
    bias = jnp.zeros((e, n), jnp.float32)
    rs = jnp.ones((m,), jnp.float32)
    row = {"T": T}
    for fmt in ("fp8", "fp8_block"):
        w = quant.quantize_weight(w16, fmt)
        cfg = pt.config("gmm", jnp.float8_e4m3fn, m, e, k, n, fp8_activations=True)

        def tri(a, w, s, r, cfg=cfg):
            q, sc = quant.quantize_rows(a)
            return gmm_quant(q, w, s, bias=bias, row_scale=r, out_dtype=jnp.bfloat16, lhs_scales=sc, config=cfg)

        def mg(a, w, s, r):
            q, sc = quant.quantize_rows(a)
            return G.gmm_fp8(q, sc, w, s, bias, r, bn=128, bk=128)

        o1 = jax.jit(tri)(a, w, d.group_sizes, rs)
        o2 = jax.jit(mg)(a, w, d.group_sizes, rs)
        o1, o2 = np.asarray(o1, np.float64), np.asarray(o2, np.float64)
        row[f"{fmt} rel_vs_triton"] = float(np.linalg.norm(o1 - o2) / np.linalg.norm(o1))
        row[f"{fmt} triton"] = timed(jax.jit(tri), a, w, d.group_sizes, rs)
        row[f"{fmt} mgpu"] = timed(jax.jit(mg), a, w, d.group_sizes, rs)
    bf = jax.jit(lambda a, w, s, r: backends.gmm("auto", a, w, s, bias=bias.astype(jnp.bfloat16), row_scale=r))
    row["bf16 auto"] = timed(bf, a, w16, d.group_sizes, rs)
    print(json.dumps(row), flush=True)
    res[f"T={T}"] = row
    json.dump(res, open(sys.argv[1], "w"), indent=1)
