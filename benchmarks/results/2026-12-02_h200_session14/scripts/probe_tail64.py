"""Session 14, call 3: tail_m 0 / 16 / 64 for the GLU gate_up and the transposed dx gmm at
T = 4096 (SwiGLU, gpt-oss): bit for bit against tail_m = 0, three runs, and time."""
import dataclasses, json, os, sys
import jax, jax.numpy as jnp, numpy as np
from probe_common import wall_time
from moe_pallas.dispatch import dispatch
from moe_pallas.kernels import config as C
from moe_pallas.kernels.gmm import gmm

OUT = os.environ.get("OUT", ".")
work = sys.argv[1]
t, k, e, h, inter, act = {"swiglu": (4096, 8, 256, 4096, 2048, "swiglu"),
                          "gptoss": (4096, 4, 128, 2880, 2880, "gptoss"), "tiny": (160, 4, 4, 64, 32, "gptoss")}[work]
rng = np.random.default_rng(11)
d = dispatch(jnp.asarray(rng.integers(0, e, (t, k)), jnp.int32), e)
sizes = np.asarray(d.group_sizes); m = t * k
keys = jax.random.split(jax.random.key(11), 4)
wgu = (jax.random.normal(keys[0], (e, h, 2 * inter), jnp.float32) * h**-0.5).astype(jnp.bfloat16)
x = jax.random.normal(keys[1], (t, h), jnp.bfloat16)
bgu = jax.random.normal(keys[2], (e, 2 * inter), jnp.bfloat16) if act == "gptoss" else None
dh = jax.random.normal(keys[3], (m, 2 * inter), jnp.bfloat16)
ops = {
    "gate_up": ("gmm_glu", h, inter, act, lambda cfg: (lambda x, w, s, i, b: gmm(x, w, s, lhs_row_index=i, bias=b, activation=act, config=cfg)), (x, wgu, d.group_sizes, d.row_token, bgu)),
    "dx": ("gmm_t", 2 * inter, h, None, lambda cfg: (lambda a, w, s: gmm(a, w, s, transpose_rhs=True, config=cfg)), (dh, wgu, d.group_sizes)),
}
rows = []
for op, (table, kd, nd, ac, make, args) in ops.items():
    base = C.pick(table, m, e, kd, nd, ac)
    ref = None
    for tail in (0, 16, 64):
        cfg = dataclasses.replace(base, tail_m=tail)
        row = dict(work=work, T=t, op=op, tail_m=tail, cfg=str(cfg), max_group=int(sizes.max()),
                   groups_over_bm=int((sizes > cfg.block_m).sum()))
        try:
            f = jax.jit(make(cfg))
            runs = [np.asarray(f(*args), np.float32) for _ in range(3)]
            ref = runs[0] if ref is None else ref
            row.update(deterministic=all(np.array_equal(runs[0], r) for r in runs[1:]),
                       same_as_tail0=bool(np.array_equal(runs[0], ref)),
                       rows_differing=int((runs[0] != ref).any(axis=1).sum()),
                       ms=wall_time(make(cfg), *args) * 1e3)
        except Exception as ex:
            row["error"] = repr(ex)[-400:]
        print(json.dumps(row), flush=True); rows.append(row)
        json.dump(rows, open(os.path.join(OUT, f"tail64_{work}.json"), "w"), indent=1)
