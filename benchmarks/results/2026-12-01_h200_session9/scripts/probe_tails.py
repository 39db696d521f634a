"""tgmm variants as the layer calls them (rhs_sums, gather for gate_up), T from argv:
HELD_STEPS (groups of that many row steps hold their lhs) x min_block_m (bucketed last step)."""
import importlib, sys, os
sys.path.insert(0, ".")
import jax, jax.numpy as jnp
from benchmarks.bench_tgmm import time_calls
from moe_pallas import dispatch
from moe_pallas.kernels import config as C
T = importlib.import_module("moe_pallas.kernels.tgmm")
W = {"gptoss": (128, 2880, 2880, 4), "swiglu": (256, 4096, 2048, 8)}
cases = sys.argv[1].split(",")
variants = [v.split(":") for v in sys.argv[2].split(",")]  # held:lo:bm:stages
for case in cases:
    name, weight, tok = case.split(":")
    E, H, I, K = W[name]; tok = int(tok); M = tok * K
    keys = jax.random.split(jax.random.key(tok), 4)
    idx = jax.random.randint(keys[0], (tok, K), 0, E, jnp.int32)
    d = dispatch.dispatch(idx, E)
    if weight == "gate_up":
        lhs = jax.random.normal(keys[1], (tok, H), jnp.bfloat16); rhs = jax.random.normal(keys[2], (M, 2 * I), jnp.bfloat16); ri = d.row_token
    else:
        lhs = jax.random.normal(keys[1], (M, I), jnp.bfloat16); rhs = jax.random.normal(keys[2], (M, H), jnp.bfloat16); ri = None
    table = C.pick("tgmm", M, E, lhs.shape[1], rhs.shape[1])
    ref = None
    for held, lo, bm, st in variants:
        T.HELD_STEPS = int(held)
        cfg = C.BlockConfig(int(bm), table.block_n, table.block_k, group_m=table.group_m, num_warps=table.num_warps,
                            num_stages=int(st), min_block_m=None if lo == "-" else int(lo))
        fn = jax.jit(lambda l, r, i, cfg=cfg: T.tgmm(l, r, d.group_sizes, lhs_row_index=i, config=cfg, rhs_sums=True))
        try:
            out = fn(lhs, rhs, ri)
            if ref is None:
                ref = out; diff = 0.0
            else:
                diff = max(float(jnp.max(jnp.abs(o.astype(jnp.float32) - r.astype(jnp.float32)))) for o, r in zip(out, ref))
            del out
            t = time_calls(fn, lhs, rhs, ri)
            print(f"{case:20} held={held} lo={lo:>2} bm={bm} st={st}: {t*1e3:.3f} ms  maxdiff {diff:.3g}", flush=True)
        except Exception as e:
            print(f"{case:20} held={held} lo={lo} bm={bm} st={st}: failed {str(e)[:200]}", flush=True)
    del ref
