"""Backward of the down projection fused with the GLU derivative, Pallas Triton lowering.

Math. For expert-sorted row m of group (expert) e, with token t = row_token[m], routing weight
w = row_weight[m] and saved pre-activation h[m] = (gate, up) in the layout of `activation`:

    g[m]     = dout[t] @ w_down[e]ᵀ                  ([I], float32 accumulator)
    a[m]     = glu(gate, up)                          (the forward activation, recomputed)
    dw[m]    = Σ_i g[m, i] · a[m, i]                  (= ⟨dout[t], y[m] - b_down[e]⟩, y unweighted)
    dh[m]    = glu_bwd(gate, up, w · g[m])            (written in h's gate/up layout)

so one pass over w_down gives the gate_up gradient rows `dh`, the activation `a` (the lhs of the
w_down weight gradient) and the data term of d topk_weight, without materialising the float32
`[M, I]` product or keeping `y` for the backward. `dw` comes back as per-n-tile partial sums
`[n_tiles, M]` (summed by the caller: no atomics, deterministic). Rows past sum(group_sizes) get
zeros everywhere.

Tiling. As `gmm` with a transposed rhs: a 1-D grid over (visit, n-tile) pairs from
`dispatch.tile_schedule`, swizzled in bands of `group_m` visits; the dout rows are gathered in the
kernel by token; K = H loops in block_k steps, N = I tiles of block_n are masked at the tail.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from moe_pallas import _backend, dispatch
from moe_pallas.activations import glu, glu_bwd
from moe_pallas.kernels import config as _config


def _masked(mask) -> dict:
    return {} if mask is None else {"mask": mask, "other": 0}


def _dlhs_glu_kernel(
    group_ref,
    m_start_ref,
    row_start_ref,
    row_end_ref,
    row_token_ref,
    row_weight_ref,
    dout_ref,
    w_ref,
    h_ref,
    dh_ref,
    a_ref,
    dw_ref,
    *,
    num_groups,
    num_visits,
    k_dim,
    n_out,
    cfg,
    activation,
    compute_dtype,
):
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    n_tiles = pl.cdiv(n_out, bn)
    pid = pl.program_id(0)
    band = cfg.group_m * n_tiles
    first_v = (pid // band) * cfg.group_m
    band_rows = jnp.minimum(num_visits - first_v, cfg.group_m)
    v = first_v + (pid % band) % band_rows
    n_idx = (pid % band) // band_rows
    n0 = n_idx * bn

    g = group_ref[v]
    m0 = m_start_ref[v]
    rows = m0 + jnp.arange(bm, dtype=jnp.int32)
    row_ok = (rows >= row_start_ref[v]) & (rows < row_end_ref[v])
    cols = n0 + jnp.arange(bn, dtype=jnp.int32)
    # Masks only where a tail exists: a mask that varies along the contiguous axis stops Triton
    # from vectorising the load.
    n_ok = (cols < n_out) if n_out % bn else None
    mask = jnp.broadcast_to(
        row_ok[:, None] if n_ok is None else row_ok[:, None] & n_ok[None, :], (bm, bn)
    )
    gate_cols, up_cols = (
        (2 * cols, 2 * cols + 1) if activation == "gptoss" else (cols, cols + n_out)
    )
    used = row_start_ref[v] < row_end_ref[v]

    def store(dgate, dup, act, dw):
        plgpu.store(
            dh_ref.at[rows[:, None], gate_cols[None, :]], dgate.astype(dh_ref.dtype), mask=mask
        )
        plgpu.store(dh_ref.at[rows[:, None], up_cols[None, :]], dup.astype(dh_ref.dtype), mask=mask)
        plgpu.store(a_ref.at[pl.ds(m0, bm), pl.ds(n0, bn)], act.astype(a_ref.dtype), mask=mask)
        plgpu.store(dw_ref.at[n_idx, pl.ds(m0, bm)], dw, mask=row_ok)

    @pl.when(used & (g == num_groups))
    def _tail_rows():
        zeros = jnp.zeros((bm, bn), jnp.float32)
        store(zeros, zeros, zeros, jnp.zeros((bm,), jnp.float32))

    @pl.when(used & (g < num_groups))
    def _grouped_rows():
        src = plgpu.load(row_token_ref.at[pl.ds(m0, bm)], mask=row_ok, other=0)

        def body(i, acc):
            k0 = i * bk
            ks = k0 + jnp.arange(bk, dtype=jnp.int32)
            k_ok = (ks < k_dim)[None, :] if k_dim % bk else None
            # Rows outside the visit are not loaded (as in gmm's gather).
            d_mask = row_ok[:, None] if k_ok is None else row_ok[:, None] & k_ok
            d = plgpu.load(dout_ref.at[src[:, None], ks[None, :]], mask=d_mask, other=0)
            n_col = None if n_ok is None else n_ok[:, None]
            w_mask = n_col if k_ok is None else k_ok if n_col is None else n_col & k_ok
            w = plgpu.load(w_ref.at[g, pl.ds(n0, bn), pl.ds(k0, bk)], **_masked(w_mask))
            return acc + plgpu.dot(d.astype(compute_dtype), w.astype(compute_dtype), trans_b=True)

        acc = jax.lax.fori_loop(0, pl.cdiv(k_dim, bk), body, jnp.zeros((bm, bn), jnp.float32))
        gate = plgpu.load(h_ref.at[rows[:, None], gate_cols[None, :]], mask=mask, other=0)
        up = plgpu.load(h_ref.at[rows[:, None], up_cols[None, :]], mask=mask, other=0)
        gate, up = gate.astype(jnp.float32), up.astype(jnp.float32)
        act = glu(gate, up, activation)
        dw = jnp.sum(jnp.where(mask, acc * act, 0), axis=1)
        weight = plgpu.load(row_weight_ref.at[pl.ds(m0, bm)], mask=row_ok, other=0)
        dgate, dup = glu_bwd(gate, up, acc * weight.astype(jnp.float32)[:, None], activation)
        store(dgate, dup, act, dw)


def dlhs_glu(
    dout: jax.Array,
    w_down: jax.Array,
    h: jax.Array,
    group_sizes: jax.Array,
    *,
    row_token: jax.Array,
    row_weight: jax.Array,
    activation: str,
    config: _config.BlockConfig | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(dh `[M, 2I]`, a `[M, I]`, dw `[M]` float32) of the module docstring.

    dout `[T, H]`; w_down `[E, I, H]`; h `[M, 2I]` (pre-activation, in the `activation` layout);
    group_sizes `[E]`; row_token `[M]` int32; row_weight `[M]`. dh and a have h's dtype.
    """
    num_rows, two_i = h.shape
    num_groups, n_out, k_dim = w_down.shape
    if two_i != 2 * n_out or dout.shape[1] != k_dim:
        raise ValueError(
            f"dlhs_glu: h {h.shape}, w_down {w_down.shape} and dout {dout.shape} disagree "
            "(need h [M, 2I], w_down [E, I, H], dout [T, H])."
        )
    if num_rows == 0 or n_out == 0:
        return (
            jnp.zeros_like(h),
            jnp.zeros((num_rows, n_out), h.dtype),
            jnp.zeros((num_rows,), jnp.float32),
        )
    if config is None:
        # The table's gmm_t tiles, cut to 64 rows and 64 (gpt-oss) or 128 (SwiGLU) columns: the
        # epilogue holds gate, up, the activation and their derivatives beside the accumulator,
        # which at the table's 128 x 128 tiles ran twice as slow (register spills, presumably:
        # not profiled). H200, T = 2048 (bench_layer,
        # 2026-11-30): gpt-oss 1.70 ms at 64 x 64 (4 warps) vs 3.05 at 128 x 128; SwiGLU 2.60 ms
        # at 64 x 128 (8 warps) vs 3.28.
        config = _config.pick("gmm_t", num_rows, num_groups, k_dim, n_out)
        block_n = 64 if activation == "gptoss" else 128
        config = dataclasses.replace(
            config,
            block_m=min(config.block_m, 64),
            block_n=min(config.block_n, block_n),
            num_warps=min(config.num_warps, 4) if block_n == 64 else config.num_warps,
        )
    cfg = config.fit(num_rows, k_dim, n_out)
    sched = dispatch.tile_schedule(group_sizes, num_rows, cfg.block_m)
    num_visits = sched.group.shape[0]
    n_tiles = pl.cdiv(n_out, cfg.block_n)
    kernel = functools.partial(
        _dlhs_glu_kernel,
        num_groups=num_groups,
        num_visits=num_visits,
        k_dim=k_dim,
        n_out=n_out,
        cfg=cfg,
        activation=activation,
        compute_dtype=jnp.promote_types(dout.dtype, w_down.dtype),
    )
    dh, a, dw_partial = pl.pallas_call(
        kernel,
        out_shape=(
            jax.ShapeDtypeStruct(h.shape, h.dtype),
            jax.ShapeDtypeStruct((num_rows, n_out), h.dtype),
            jax.ShapeDtypeStruct((n_tiles, num_rows), jnp.float32),
        ),
        grid=(num_visits * n_tiles,),
        compiler_params=plgpu.CompilerParams(num_warps=cfg.num_warps, num_stages=cfg.num_stages),
        interpret=_backend.interpret_mode(),
        name="dlhs_glu",
    )(
        sched.group,
        sched.m_start,
        sched.row_start,
        sched.row_end,
        row_token.astype(jnp.int32),
        row_weight.astype(jnp.float32),
        dout,
        w_down,
        h,
    )
    return dh, a, jnp.sum(dw_partial, axis=0)
