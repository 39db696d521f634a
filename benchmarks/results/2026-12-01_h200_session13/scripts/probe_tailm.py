"""gmm with tail_m (a group's last visit takes up to block_m + tail_m rows, one weight pass)
against the table's configs (tail_m = 0): forward gate_up (GLU, gather, bias), down (bias, row
scale), and the backward's gmm_t (dx: dh @ w_gate_upᵀ), random routing and equal 136-row groups."""
import dataclasses, json, os
import jax, jax.numpy as jnp
from probe_common import wall_time
from moe_pallas.kernels import config as C
from moe_pallas.kernels.gmm import gmm

TAILS = [int(t) for t in os.environ.get("TAILS", "0,16,32,64").split(",")]
WORK = {"gptoss": (128, 2880, 2880, 4, "gptoss"), "swiglu": (256, 4096, 2048, 8, "swiglu")}
CASES = [("gptoss", 4096, "random"), ("gptoss", 4096, "equal136"), ("gptoss", 2048, "random"),
         ("swiglu", 4096, "random"), ("swiglu", 3803, "random"), ("gptoss", 16384, "random"),
         ("swiglu", 8192, "random")]
out = []
for wname, t, kind in CASES:
    G, H, I, k, act = WORK[wname]
    m = t * k
    keys = jax.random.split(jax.random.key(t), 8)
    if kind == "equal136":
        sizes = jnp.full((G,), 136, jnp.int32); m = 136 * G; t = m // k
    else:
        ids = jax.random.randint(keys[0], (m,), 0, G)
        sizes = jnp.bincount(ids, length=G).astype(jnp.int32)
    x = jax.random.normal(keys[1], (t, H), jnp.bfloat16)
    row_token = jax.random.randint(keys[2], (m,), 0, t)
    wgu = (jax.random.normal(keys[3], (G, H, 2 * I), jnp.float32) * 0.02).astype(jnp.bfloat16)
    bgu = jax.random.normal(keys[4], (G, 2 * I), jnp.bfloat16)
    wd = (jax.random.normal(keys[5], (G, I, H), jnp.float32) * 0.02).astype(jnp.bfloat16)
    bd = jax.random.normal(keys[6], (G, H), jnp.bfloat16)
    a = jax.random.normal(keys[7], (m, I), jnp.bfloat16)
    dh = jax.random.normal(keys[7], (m, 2 * I), jnp.bfloat16)
    rs = jax.random.uniform(keys[0], (m,), jnp.float32)
    ops = {
        "gate_up": ("gmm_glu", H, I, act, lambda cfg: (lambda x, w, s, i, b: gmm(x, w, s, lhs_row_index=i, bias=b, activation=act, config=cfg)), (x, wgu, sizes, row_token, bgu)),
        "down": ("gmm", I, H, None, lambda cfg: (lambda a, w, s, b, r: gmm(a, w, s, bias=b, row_scale=r, config=cfg)), (a, wd, sizes, bd, rs)),
        "dx": ("gmm_t", 2 * I, H, None, lambda cfg: (lambda d, w, s: gmm(d, w, s, transpose_rhs=True, config=cfg)), (dh, wgu, sizes)),
    }
    for op, (table, kk, n, ac, make, args) in ops.items():
        base = C.pick(table, m, G, kk, n, ac)
        ref = None
        for tail in TAILS:
            if tail > base.block_m:
                continue
            cfg = dataclasses.replace(base, tail_m=tail)
            fn = make(cfg)
            row = dict(work=wname, T=t, kind=kind, op=op, tail_m=tail, block_m=base.block_m,
                       max_group=int(sizes.max()), mean_group=m / G)
            try:
                res = jax.jit(fn)(*args)
                ref = res if ref is None else ref
                row["same"] = bool(jnp.array_equal(res, ref))
                row["ms"] = wall_time(fn, *args) * 1e3
            except Exception as e:
                row["error"] = str(e)[-300:]
            print(json.dumps(row), flush=True); out.append(row)
    del x, wgu, wd, a, dh
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "tailm.json"), "w"), indent=1)
