"""How much do a group's tail visits cost the forward gate_up gmm (GLU epilogue, row gather, bias)
at ~128 rows per expert? gpt-oss shapes, equal group sizes r (every group r rows) against the
layer's random routing at T = 4096, the "small" table config pinned, and the auto pick."""
import json, os
import jax, jax.numpy as jnp
from probe_common import wall_time
from moe_pallas.kernels import config as C
from moe_pallas.kernels.gmm import gmm

G, H, I = 128, 2880, 2880
keys = jax.random.split(jax.random.key(3), 6)
w = (jax.random.normal(keys[0], (G, H, 2 * I), jnp.float32) * 0.02).astype(jnp.bfloat16)
b = jax.random.normal(keys[1], (G, 2 * I), jnp.float32).astype(jnp.bfloat16)
wd = (jax.random.normal(keys[4], (G, I, H), jnp.float32) * 0.02).astype(jnp.bfloat16)
small = C._TABLE[("gmm_glu", "small")]
small_d = C._TABLE[("gmm", "small")]
out = []
cases = [("equal", r) for r in (64, 96, 112, 120, 128, 136, 144, 160, 192, 256)] + [("random", 128), ("random", 64)]
for kind, r in cases:
    m = G * r
    t = m // 4
    x = jax.random.normal(keys[2], (t, H), jnp.bfloat16)
    row_token = jax.random.randint(keys[3], (m,), 0, t)
    if kind == "equal":
        sizes = jnp.full((G,), r, jnp.int32)
    else:
        ids = jax.random.randint(keys[5], (m,), 0, G)
        sizes = jnp.bincount(ids, length=G).astype(jnp.int32)
    a = jax.random.normal(keys[2], (m, I), jnp.bfloat16)
    for label, cfg in (("small", small), ("auto", None)):
        f = lambda x, w, s, i, b, cfg=cfg: gmm(x, w, s, lhs_row_index=i, bias=b, activation="gptoss", config=cfg)
        ms = wall_time(f, x, w, sizes, row_token, b) * 1e3
        fd = lambda a, w, s, cfg=cfg: gmm(a, w, s, config=None if cfg is None else small_d)
        msd = wall_time(fd, a, wd, sizes) * 1e3
        row = dict(kind=kind, rows_per_group=r, cfg=label, gate_up_ms=ms,
                   gate_up_tflops=2 * m * H * 2 * I / ms / 1e9, gate_up_wtbs=w.size * 2 / ms / 1e9,
                   down_ms=msd, down_tflops=2 * m * I * H / msd / 1e9, max_group=int(sizes.max()))
        print(json.dumps(row), flush=True); out.append(row)
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "tails2.json"), "w"), indent=1)
