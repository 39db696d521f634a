import importlib, itertools, sys
import jax, jax.numpy as jnp, numpy as np
T = importlib.import_module("moe_pallas.kernels.tgmm")
from moe_pallas.kernels.config import BlockConfig
rng = np.random.default_rng(0)
for held, lo, sizes in itertools.product((1, 2, 3), (None, 16), ([0, 5, 17, 33, 64, 70, 100, 130, 0, 200], [1], [0, 0, 3])):
    T.HELD_STEPS = held
    M = sum(sizes) + 3
    K, N = 40, 48
    lhs = jnp.asarray(rng.normal(size=(M + 5, K)), jnp.float32)
    rhs = jnp.asarray(rng.normal(size=(M, N)), jnp.float32)
    rhs = rhs.at[-1].set(jnp.nan)  # rows past the groups must not reach them
    idx = jnp.asarray(rng.integers(0, M + 5, size=M), jnp.int32)
    gs = jnp.asarray(sizes, jnp.int32)
    cfg = BlockConfig(32, 16, 16, group_m=2, min_block_m=lo)
    out, sums = T.tgmm(lhs, rhs, gs, lhs_row_index=idx, config=cfg, rhs_sums=True)
    offs = np.concatenate([[0], np.cumsum(sizes)])
    L, R = np.asarray(lhs)[np.asarray(idx)], np.asarray(rhs)
    want = np.stack([L[a:b].T @ R[a:b] for a, b in zip(offs[:-1], offs[1:])])
    ws = np.stack([R[a:b].sum(0) for a, b in zip(offs[:-1], offs[1:])])
    e1 = np.max(np.abs(np.asarray(out) - want)); e2 = np.max(np.abs(np.asarray(sums) - ws))
    print(held, lo, sizes[:3], f"{e1:.2e} {e2:.2e}", "OK" if e1 < 1e-3 and e2 < 1e-3 else "FAIL")
