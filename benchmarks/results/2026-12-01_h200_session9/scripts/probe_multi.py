"""gpt-oss backward at T = 2048 (bf16): the kernels after glu_bwd, solo vs interleaved in one
pallas_call (multi.py): tgmm d w_gate_up = x[row_token]^T dh (+ bias sums), gmm_t dx_rows =
dh @ w_gate_up^T, and optionally tgmm d w_down = a^T dy (+ sums)."""
import functools, sys, os
import jax, jax.numpy as jnp
sys.path.insert(0, os.path.dirname(__file__)); sys.path.insert(0, ".")
from multi import multi_call
from benchmarks.bench_tgmm import time_calls
from moe_pallas import dispatch, _backend
import importlib
G = importlib.import_module("moe_pallas.kernels.gmm"); T = importlib.import_module("moe_pallas.kernels.tgmm")
from moe_pallas.kernels import config as C
from moe_pallas.kernels.gmm import clamp_group_ends

SMALL = os.environ.get("SMALL") == "1"
E, H, I, TOK, K = (8, 128, 128, 64, 4) if SMALL else (128, 2880, 2880, int(os.environ.get("TOK", 2048)), 4)
M = TOK * K
keys = jax.random.split(jax.random.key(0), 8)
idx = jax.random.randint(keys[0], (TOK, K), 0, E, jnp.int32)
d = dispatch.dispatch(idx, E)
bf = jnp.bfloat16
x = jax.random.normal(keys[1], (TOK, H), bf)
dh = jax.random.normal(keys[2], (M, 2 * I), bf)
w_gu = (jax.random.normal(keys[3], (E, H, 2 * I), jnp.float32) * 0.02).astype(bf)
a = jax.random.normal(keys[4], (M, I), bf)
dy = jax.random.normal(keys[5], (M, H), bf)
interp = _backend.interpret_mode()


def tgmm_part(lhs, rhs, row_index, cfg, rhs_sums=True):
    k_dim, n_dim = lhs.shape[1], rhs.shape[1]
    cfg = cfg.fit(M, k_dim + rhs_sums, n_dim)
    if rhs_sums:
        extra = jnp.zeros((lhs.shape[0], 8), lhs.dtype).at[:, 0].set(1)
        lhs = jnp.concatenate([lhs, extra], axis=1)
    ends = clamp_group_ends(d.group_sizes, M)
    offs = jnp.concatenate([jnp.zeros((1,), jnp.int32), ends])
    ops = [offs] + ([row_index] if row_index is not None else []) + [lhs, rhs]
    fn = functools.partial(T._tgmm_kernel, k_dim=k_dim, n_dim=n_dim, cfg=cfg,
                           gather=row_index is not None, rhs_sums=rhs_sums, compute_dtype=bf)
    outs = [jax.ShapeDtypeStruct((E, k_dim, n_dim), bf)]
    if rhs_sums:
        outs.append(jax.ShapeDtypeStruct((E, n_dim), jnp.float32))
    grid = (-(-(-(-n_dim // cfg.block_n)) // cfg.group_m), -(-(k_dim + rhs_sums) // cfg.block_k), E)
    return (T, fn, ops, outs, grid)


def gmm_t_part(lhs, rhs, cfg):
    k_dim, n_out = rhs.shape[2], rhs.shape[1]
    cfg = cfg.fit(M, k_dim, n_out)
    s = dispatch.schedule_from_ends(clamp_group_ends(d.group_sizes, M), M, cfg.block_m)
    nv = s.group.shape[0]
    ops = [s.group, s.m_start, s.row_start, s.row_end, lhs, rhs]
    fn = functools.partial(G._gmm_kernel, num_groups=E, num_visits=nv, k_dim=k_dim, n_out=n_out,
                           cfg=cfg, gather=False, transpose_rhs=True, has_bias=False,
                           activation=None, has_row_scale=False, compute_dtype=bf)
    return (G, fn, ops, [jax.ShapeDtypeStruct((M, n_out), bf)], (nv * -(-n_out // cfg.block_n),))


def cfg(bm, bn, bk, gm, w, s, lo=None):
    return C.BlockConfig(bm, bn, bk, group_m=gm, num_warps=w, num_stages=s, min_block_m=lo)


TGMM_TABLE = C.pick("tgmm", M, E, H, 2 * I)
GMMT_TABLE = C.pick("gmm_t", M, E, 2 * I, H)
print("table tgmm", TGMM_TABLE, "\ntable gmm_t", GMMT_TABLE, flush=True)

solo_tg = jax.jit(lambda x, dh: T.tgmm(x, dh, d.group_sizes, lhs_row_index=d.row_token, out_dtype=bf, rhs_sums=True))
solo_gt = jax.jit(lambda dh, w: G.gmm(dh, w, d.group_sizes, transpose_rhs=True))
solo_td = jax.jit(lambda a, dy: T.tgmm(a, dy, d.group_sizes, out_dtype=bf, rhs_sums=True))
timed = (lambda f, *a: (jax.block_until_ready(f(*a)), 0.0)[1]) if SMALL else time_calls
ref_tg, ref_gt, ref_td = solo_tg(x, dh), solo_gt(dh, w_gu), solo_td(a, dy)
t_tg, t_gt, t_td = timed(solo_tg, x, dh), timed(solo_gt, dh, w_gu), timed(solo_td, a, dy)
print(f"solo tgmm gu {t_tg*1e3:.3f}  gmm_t gu {t_gt*1e3:.3f}  tgmm down {t_td*1e3:.3f}  sum2 {(t_tg+t_gt)*1e3:.3f} sum3 {(t_tg+t_gt+t_td)*1e3:.3f} ms", flush=True)


def check(name, got, want):
    err = float(jnp.max(jnp.abs(got.astype(jnp.float32) - want.astype(jnp.float32))))
    return f"{name} maxdiff {err:.3g}"


variants = [
    # (name, warps, stages, tgmm cfg, gmm_t cfg, with down)
    ("w4s3 gt64x128", 4, 3, cfg(64, 128, 128, 8, 4, 3), cfg(64, 128, 64, 8, 4, 3), False),
    ("w8s3 gt128x256", 8, 3, cfg(64, 128, 128, 8, 8, 3), cfg(128, 256, 64, 8, 8, 3), False),
    ("w8s4 gt128x256", 8, 4, cfg(64, 128, 128, 8, 8, 4), cfg(128, 256, 64, 8, 8, 4), False),
    ("w4s3 gt64x128 +down", 4, 3, cfg(64, 128, 128, 8, 4, 3), cfg(64, 128, 64, 8, 4, 3), True),
    ("w8s3 gt128x256 +down", 8, 3, cfg(64, 128, 128, 8, 8, 3), cfg(128, 256, 64, 8, 8, 3), True),
]
if SMALL:
    variants = variants[:1] + variants[3:4]
for name, w, s, tc, gc, down in variants:
    parts = [tgmm_part(x, dh, d.row_token, tc), gmm_t_part(dh, w_gu, gc)]
    if down:
        parts.append(tgmm_part(a, dy, None, tc))
    try:
        # the solo kernels at the combined config, to separate config from co-scheduling
        f = jax.jit(lambda *ops: multi_call(parts, num_warps=w, num_stages=s, interpret=interp))
        ops = [o for p in parts for o in p[2]]
        outs = f(*ops)
        msg = [check("tg", outs[0], ref_tg[0]), check("tgsum", outs[1], ref_tg[1]), check("gt", outs[2], ref_gt)]
        if down:
            msg.append(check("td", outs[3], ref_td[0]))
        t = timed(f, *ops)
        solo_parts = []
        for p in parts:
            g1 = jax.jit(lambda *o, p=p: multi_call([p], num_warps=w, num_stages=s, interpret=interp))
            solo_parts.append(timed(g1, *p[2]))
        del outs
        print(f"{name:24}: multi {t*1e3:.3f} ms; parts solo at this config " + " ".join(f"{v*1e3:.3f}" for v in solo_parts)
              + f" (sum {sum(solo_parts)*1e3:.3f}); " + ", ".join(msg), flush=True)
    except Exception as e:
        print(f"{name}: failed {type(e).__name__}: {str(e)[:400]}", flush=True)
