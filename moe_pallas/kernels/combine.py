"""Deterministic combine: out[t] = sum_{j<k} rows[pair_row[t, j]], Pallas Triton lowering.

Math. `rows[M, H]` holds one (already weighted) expert output per expert-sorted row; `pair_row[T, k]`
names the row of each token's j-th slot (a negative entry adds nothing). Each token's k rows are
added in float32 in the fixed order j = 0, 1, ..., k-1 and rounded once to `out_dtype`. There are
no atomics and no data-dependent order, so the result is bitwise reproducible from run to run. The
same kernel sums dx rows in the backward, and the expert-parallel exchange's rows per token.

Tiling. A 2-D grid over (block_t tokens, block_h columns); each program gathers its tokens' k rows
with vector-indexed loads (`pair_row` is passed transposed, [k, T], so each slot's indices load
contiguously). Blocks are powers of 2 (Triton); block_h shrinks (down to 64) to divide H where
it can, T and any H tail are masked. The kernel is memory-bound: it reads T·k·H and writes T·H
elements once.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from moe_pallas.kernels import _common


def _combine_kernel(pair_row_ref, rows_ref, out_ref, *, num_tokens, hidden, top_k, bt, bh):
    t0 = pl.program_id(0) * bt
    h0 = pl.program_id(1) * bh
    t_ok = t0 + jnp.arange(bt, dtype=jnp.int32) < num_tokens
    cols = h0 + jnp.arange(bh, dtype=jnp.int32)
    # No column mask when bh divides H: a mask along the contiguous axis stops vectorised loads.
    mask = jnp.broadcast_to(
        t_ok[:, None] & (cols < hidden)[None, :] if hidden % bh else t_ok[:, None], (bt, bh)
    )
    acc = jnp.zeros((bt, bh), jnp.float32)
    for j in range(top_k):  # fixed order: the float32 sum is reproducible
        # jnp.int32(j), not j: interpret mode rejects Python ints next to a pl.ds indexer.
        r = plgpu.load(pair_row_ref.at[jnp.int32(j), pl.ds(t0, bt)], mask=t_ok, other=-1)
        # A negative row adds nothing (no load: the expert-parallel exchange marks pairs
        # computed nowhere so).
        r_mask = mask & (r >= 0)[:, None]
        y = plgpu.load(rows_ref.at[jnp.maximum(r, 0)[:, None], cols[None, :]], mask=r_mask, other=0)
        acc += y.astype(jnp.float32)
    plgpu.store(out_ref.at[pl.ds(t0, bt), pl.ds(h0, bh)], acc.astype(out_ref.dtype), mask=mask)


def combine(
    rows: jax.Array,
    pair_row: jax.Array,
    *,
    out_dtype=None,
    block_t: int = 32,
    block_h: int = 256,
    num_warps: int = 4,
) -> jax.Array:
    """`out[T, H] = sum_j rows[pair_row[t, j]]` (float32 sum in slot order), see module docstring.

    rows `[M, H]`; pair_row `[T, k]` int32 with entries in [0, M), or negative for a slot that
    adds nothing; returns `[T, H]` in out_dtype (default rows.dtype).
    """
    if rows.ndim != 2 or pair_row.ndim != 2:
        raise ValueError(
            f"combine needs rows [M, H] and pair_row [T, k]; got {rows.shape}, {pair_row.shape}."
        )
    num_tokens, top_k = pair_row.shape
    hidden = rows.shape[1]
    out_dtype = jnp.dtype(out_dtype or rows.dtype)
    if num_tokens == 0 or hidden == 0 or top_k == 0 or rows.shape[0] == 0:
        return jnp.zeros((num_tokens, hidden), out_dtype)
    bt = _common.pow2_block(block_t, num_tokens)
    bh = _common.dividing_block(_common.pow2_block(block_h, hidden), hidden, 64)
    kernel = functools.partial(
        _combine_kernel, num_tokens=num_tokens, hidden=hidden, top_k=top_k, bt=bt, bh=bh
    )
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((num_tokens, hidden), out_dtype),
        grid=(pl.cdiv(num_tokens, bt), pl.cdiv(hidden, bh)),
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=1),
        interpret=_common.interpret_mode(),
        name="moe_combine",
    )(pair_row.T.astype(jnp.int32), rows)
