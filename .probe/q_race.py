"""Quantised products repeated against references after weights_first was turned off for fp8:
(B) the layer forward ("auto") with fp8 / fp8_block / mxfp4 weights against our bf16 layer on the
dequantised weights, 4 calls each; (A) ragged_dot at 64 and 256 rows per expert against an XLA
float32 einsum, 4 calls each. Usage: python .probe/q_race.py OUT.json"""
import json, sys, time
import jax, jax.numpy as jnp, numpy as np
import moe_pallas
from moe_pallas import quant
from benchmarks import cases as C, impls, run as R


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


res = []
t0 = time.time()
for wl, tokens in (("gptoss", (2048, 8192)), ("swiglu256", (2048, 4096))):
    W = C.WORKLOADS[wl]
    params = C.make_params(W)
    for fmt in ("fp8", "fp8_block", "mxfp4"):
        qp = moe_pallas.quantize_experts(params, fmt)
        dq = moe_pallas.dequantize_experts(qp, jnp.bfloat16)
        for T in tokens:
            case = C.Case("decode", W, T, "fwd")
            inputs = R._inputs(case, params)
            ref = impls._ours("auto")(case, {**inputs, "params": dq})
            r = np.asarray(ref.wait(ref.call()), np.float32)
            p = impls._ours("auto")(case, {**inputs, "params": qp})
            errs = [rel(np.asarray(p.wait(p.call()), np.float32), r) for _ in range(4)]
            row = {"layer": wl, "fmt": fmt, "T": T, "errs": errs,
                   "ms_bf16_ours": R.measure(ref, 0.15)[0] * 1e3, "ms": R.measure(p, 0.15)[0] * 1e3,
                   "s": round(time.time() - t0)}
            print(json.dumps(row), flush=True)
            res.append(row)
            json.dump(res, open(sys.argv[1], "w"), indent=1)
            del ref, p
        del qp, dq
    del params
for fmt in ("fp8", "fp8_block", "mxfp4"):
    for e_dim, k_dim, n_dim, m in [(64, 4096, 4096, 64), (128, 2880, 5760, 64),
                                   (64, 4096, 4096, 256), (128, 2880, 5760, 256)]:
        k1, k2 = jax.random.split(jax.random.key(e_dim * 7 + n_dim + m))
        w_bf = (jax.random.normal(k1, (e_dim, k_dim, n_dim), jnp.float32) * 0.05).astype(jnp.bfloat16)
        xb = jax.random.normal(k2, (e_dim * m, k_dim), jnp.float32).astype(jnp.bfloat16)
        q = quant.quantize_weight(w_bf, fmt)
        q = quant.with_row_pitch(q) if fmt != "mxfp4" else q
        del w_bf
        gs = jnp.full((e_dim,), m, jnp.int32)
        wd = q.dequantize(jnp.float32)
        ref = np.asarray(jax.jit(lambda x_, w_: jnp.einsum("emk,ekn->emn", x_.astype(jnp.float32).reshape(e_dim, m, k_dim), w_))(xb, wd), np.float64).reshape(e_dim * m, n_dim)
        del wd
        f = jax.jit(lambda a, b: moe_pallas.ragged_dot(a, b, gs))
        errs = [rel(np.asarray(f(xb, q), np.float32), ref) for _ in range(4)]
        row = {"fmt": fmt, "case": [e_dim, k_dim, n_dim, m], "errs": errs, "s": round(time.time() - t0)}
        print(json.dumps(row), flush=True)
        res.append(row)
        json.dump(res, open(sys.argv[1], "w"), indent=1)
