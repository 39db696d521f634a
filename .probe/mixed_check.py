"""Which output is wrong at 64 rows per expert: the probe's Mosaic kernel, or the Triton gmm_quant
("auto")? Both against an XLA float32 einsum on the same quantised operands.
Usage: python .probe/mixed_check.py OUT.json"""
import json, sys
import jax, jax.numpy as jnp, numpy as np
sys.path.insert(0, ".probe")
import mixed_probe as mp
import moe_pallas
from moe_pallas import quant

res = []
for e_dim, k_dim, n_dim, m in [(64, 4096, 4096, 64), (128, 2880, 5760, 64), (128, 2880, 2880, 64),
                               (64, 4096, 4096, 32), (64, 4096, 4096, 16)]:
    k1, k2 = jax.random.split(jax.random.key(e_dim * 7 + n_dim + m))
    w_bf = (jax.random.normal(k1, (e_dim, k_dim, n_dim), jnp.float32) * 0.05).astype(jnp.bfloat16)
    xb = jax.random.normal(k2, (e_dim * m, k_dim), jnp.float32).astype(jnp.bfloat16)
    q = quant.with_row_pitch(quant.quantize_weight(w_bf, "fp8"))
    del w_bf
    gs = jnp.full((e_dim,), m, jnp.int32)
    tri = np.asarray(jax.jit(lambda a, b: moe_pallas.ragged_dot(a, b, gs))(xb, q), np.float32)
    tri = tri.reshape(e_dim, m, n_dim).transpose(0, 2, 1)
    w8 = jax.lax.bitcast_convert_type(q.unpadded_values, jnp.float8_e4m3fn)
    cs = q.scales.reshape(e_dim, -1)[:, :n_dim]
    x16 = xb.astype(jnp.float16).reshape(e_dim, m, k_dim)
    ref = jax.jit(lambda w_, x_, s_: jnp.einsum("enk,emk->enm", w_.astype(jnp.float32),
                  x_.astype(jnp.float32)) * s_[:, :, None])(w8, x16, cs)
    ref = np.asarray(ref, np.float64)
    row = {"case": [e_dim, k_dim, n_dim, m], "triton_nan": int(np.isnan(tri).sum()),
           "triton_err": mp.rel(tri, ref)}
    for v in [dict(tile_k=128, stages=4), dict(tile_k=256, stages=3)]:
        out = np.asarray(jax.jit(lambda w_, x_: mp.mixed_gmm(w_, x_, **v))(w8, x16), np.float32)
        out = out * np.asarray(cs)[:, :, None]
        bad = ~np.isclose(out, ref, rtol=2e-2, atol=1e-2 * np.abs(ref).max())
        idx = np.argwhere(bad)
        row[f"mgpu {v}"] = {"nan": int(np.isnan(out).sum()), "err": mp.rel(out, ref),
                            "bad": int(bad.sum()), "first_bad": idx[:5].tolist(),
                            "bad_experts": np.unique(idx[:, 0])[:20].tolist(),
                            "bad_n_mod128": np.unique(idx[:, 1] % 128)[:20].tolist(),
                            "bad_m": np.unique(idx[:, 2])[:70].tolist()}
    print(json.dumps(row), flush=True)
    res.append(row)
    json.dump(res, open(sys.argv[1], "w"), indent=1)
