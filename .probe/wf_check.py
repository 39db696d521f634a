"""Triton gmm_quant's quantised product at 64 rows per expert (uniform groups) against an XLA
float32 einsum on the same quantised operands: as the table configures it (weights_first) and
with weights_first forced off, three calls each (a race shows as varying errors).
Usage: python .probe/wf_check.py OUT.json"""
import json, sys
import jax, jax.numpy as jnp, numpy as np
import moe_pallas
from moe_pallas import quant, tuning

_lookup = tuning.lookup
MODE = {"wf": None}


def patched(*a, **kw):
    cfg = _lookup(*a, **kw)
    if cfg is not None and MODE["wf"] is not None and "weights_first" in cfg:
        cfg = {**cfg, "weights_first": MODE["wf"]}
    return cfg


tuning.lookup = patched


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


res = []
for fmt in ("fp8", "mxfp4", "fp8_block"):
    for e_dim, k_dim, n_dim, m in [(64, 4096, 4096, 64), (128, 2880, 5760, 64), (128, 2880, 2880, 64),
                                   (128, 2880, 2880, 100)]:
        k1, k2 = jax.random.split(jax.random.key(e_dim * 7 + n_dim + m))
        w_bf = (jax.random.normal(k1, (e_dim, k_dim, n_dim), jnp.float32) * 0.05).astype(jnp.bfloat16)
        xb = jax.random.normal(k2, (e_dim * m, k_dim), jnp.float32).astype(jnp.bfloat16)
        q = quant.quantize_weight(w_bf, fmt)
        if fmt != "mxfp4":
            q = quant.with_row_pitch(q)
        del w_bf
        gs = jnp.full((e_dim,), m, jnp.int32)
        wd = q.dequantize(jnp.float32)
        ref = np.asarray(jax.jit(lambda x_, w_: jnp.einsum("emk,ekn->emn", x_.astype(jnp.float32).reshape(e_dim, m, k_dim), w_))(xb, wd), np.float64).reshape(e_dim * m, n_dim)
        del wd
        row = {"fmt": fmt, "case": [e_dim, k_dim, n_dim, m]}
        for wf in (None, False):
            MODE["wf"] = wf
            f = jax.jit(lambda a, b: moe_pallas.ragged_dot(a, b, gs, implementation="pallas_triton"))
            errs = []
            for _ in range(3):
                out = np.asarray(f(xb, q), np.float32)
                errs.append([rel(out, ref), int(np.isnan(out).sum())])
            row["table" if wf is None else "wf_off"] = errs
        print(json.dumps(row), flush=True)
        res.append(row)
        json.dump(res, open(sys.argv[1], "w"), indent=1)
