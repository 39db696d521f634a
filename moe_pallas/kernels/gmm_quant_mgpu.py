"""Probe (history only): fp8 expert weights in Mosaic GPU with swapped operands, the decoded
weight as wgmma's register operand A, in grouped form.

    out[m] = w_t[g] @ x_sorted[m]      for the rows m of group g; w_t [G, N, K] float8_e4m3fn
                                        (N-major, as stored), x_sorted [M, K] bf16

A CTA takes (visit, 64-row tile of N), a visit being one group's chunk of up to 64 rows: a TMA
pipeline streams [64, block_k] fp8 bytes of w_t and [width, block_k] of x into shared memory; the
fp8 tile is loaded into registers in wgmma's A layout, decoded there to bf16 and fed to wgmma with
x's tile transposed from shared memory as B, so the decoded weights never pass through shared
memory (Triton's wgmma path stores them there). Decodes: "cvt" (via f16: e4m3 -> bf16 has no
direct conversion on sm_90) and "bits" (sign-extend to 16 bits, shift, mask, times 2^120, as
gmm_quant's PTX). Per-channel scales, bias, GLU and row scale are left out: this times the core
against the bf16 and fp8 Triton gmms (its predecessor, d773893, padded every group to fixed
8/16/64-row chunks and re-read a group's weights once per chunk).
"""

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from moe_pallas.kernels import _common


def _decode(q, decode):
    if decode == "cvt":  # the hardware path: e4m3 -> f16 (no direct bf16 conversion on sm_90)
        return q.astype(jnp.float16).astype(jnp.bfloat16)
    s = lax.bitcast_convert_type(q, jnp.int8).astype(jnp.int16)  # sign spread over the top byte
    bits = (s << 4) & jnp.int16(-0x7810)  # 0x87F0: sign, then E3..E0 M2..M0 under bf16's fields
    return lax.bitcast_convert_type(bits, jnp.bfloat16) * jnp.bfloat16(2.0**120)


def gmm_fp8_grouped(
    x_sorted,
    w_t,
    group_sizes,
    *,
    widths=(8, 16, 24, 32, 40, 48, 56, 64, 72),
    block_k=128,
    stages=4,
    decode="cvt",
    out_dtype=jnp.bfloat16,
):
    """x_sorted [M, K] bf16 (rows sorted by group), w_t [G, N, K] fp8 -> [M, N] out_dtype,
    out[m] = w_t[group(m)] @ x_sorted[m]; rows past sum(group_sizes) are zero.

    One visit per (group, chunk of up to 64 rows): each group's weights are read once per 64 rows,
    not once per 8 or 16 as in `gmm_fp8_swapped`. A visit reads x's rows straight from x_sorted,
    from its first row rounded down to a multiple of 8 (Mosaic's TMA boxes start on 8-row tiles),
    with the pipeline compiled for the smallest width in `widths` (wgmma's N: multiples of 8, up
    to 64 + 8) covering them; rows outside the chunk multiply into columns nobody reads, and x is
    padded so that no box leaves it. Its [64, width] product goes to
    out_t [N, P] at the visit's own column range (a running sum of the widths, so visits never
    share columns), and out is gathered back from out_tᵀ."""
    num_rows, k_dim = x_sorted.shape
    num_groups, n_dim, _ = w_t.shape
    tile_n, wmax = 64, 64
    if max(widths) < wmax + 8 or any(w % 8 for w in widths):
        raise ValueError(f"widths={widths} must be multiples of 8 up to {wmax + 8} at least.")
    interpret = _common.interpret_mode()
    sizes = jnp.minimum(group_sizes.astype(jnp.int32), num_rows)
    sizes = jnp.minimum(sizes, num_rows - (jnp.cumsum(sizes) - sizes).clip(max=num_rows))
    start = jnp.cumsum(sizes) - sizes
    chunks = (sizes + wmax - 1) // wmax
    num_visits = num_groups + num_rows // wmax  # >= sum(ceil(size / wmax))
    v = jnp.arange(num_visits, dtype=jnp.int32)
    g_of_v = jnp.searchsorted(jnp.cumsum(chunks), v, side="right").astype(jnp.int32)
    valid = g_of_v < num_groups
    g_safe = jnp.minimum(g_of_v, num_groups - 1)
    chunk = v - (jnp.cumsum(chunks) - chunks)[g_safe]
    row0 = jnp.where(valid, start[g_safe] + chunk * wmax, 0)
    rows = jnp.where(valid, jnp.minimum(wmax, sizes[g_safe] - chunk * wmax), 0)
    box0 = row0 - row0 % 8
    table = jnp.asarray(widths, jnp.int32)
    width = jnp.where(valid, table[jnp.searchsorted(table, rows + row0 % 8)], 0)
    col0 = jnp.cumsum(width) - width
    padded_cols = -(-(num_rows + num_visits * 15) // 8) * 8  # >= sum(width): width < rows + 15
    x_pad = jnp.pad(x_sorted, ((0, max(widths) + (-num_rows) % 8), (0, 0)))  # rows in 8s

    def kernel(group_gmem, row_gmem, col_gmem, width_gmem, x_gmem, w_gmem, out_gmem):
        vi, ni = lax.axis_index("v"), lax.axis_index("n")
        g, r0 = group_gmem[vi], pl.multiple_of(row_gmem[vi], 8)
        c0 = pl.multiple_of(col_gmem[vi], 8)
        wid = width_gmem[vi]

        def visit(w_rows):
            def product(acc_ref, w_dec):
                def step(_, x_smem, w_smem):
                    w = _decode(w_smem[...], decode)
                    if interpret:  # interpret mode's wgmma takes shared-memory operands only
                        w_dec[...] = w
                        plgpu.commit_smem()
                        w = w_dec
                    plgpu.wgmma(acc_ref, w, x_smem.T)
                    plgpu.wgmma_wait(0)

                plgpu.emit_pipeline(
                    step,
                    grid=(k_dim // block_k,),
                    in_specs=[
                        plgpu.BlockSpec((w_rows, block_k), lambda kk: (0, kk)),
                        plgpu.BlockSpec((tile_n, block_k), lambda kk: (0, kk)),
                    ],
                    max_concurrent_steps=stages,
                )(x_gmem.at[pl.ds(r0, w_rows)], w_gmem.at[g, pl.ds(ni * tile_n, tile_n)])
                return acc_ref[...]

            def scoped(w_dec=None):
                return pl.run_scoped(
                    lambda acc_ref: product(acc_ref, w_dec), plgpu.ACC((tile_n, w_rows))
                )

            if interpret:
                acc = pl.run_scoped(scoped, plgpu.SMEM((tile_n, block_k), jnp.bfloat16))
            else:
                acc = scoped()

            @functools.partial(pl.run_scoped, o_smem=plgpu.SMEM((tile_n, w_rows), out_dtype))
            def _(o_smem):
                o_smem[...] = acc.astype(out_dtype)
                plgpu.commit_smem()
                plgpu.copy_smem_to_gmem(
                    o_smem, out_gmem.at[pl.ds(ni * tile_n, tile_n), pl.ds(c0, w_rows)]
                )
                plgpu.wait_smem_to_gmem(0)

        for w_rows in widths:
            pl.when((g < num_groups) & (wid == w_rows))(functools.partial(visit, w_rows))

    out_t = plgpu.kernel(
        kernel,
        out_type=jax.ShapeDtypeStruct((n_dim, padded_cols), out_dtype),
        grid=(num_visits, n_dim // tile_n),
        grid_names=("v", "n"),
        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
        interpret=plgpu.InterpretGPUParams() if interpret else None,
        kernel_name=f"gmm_fp8_grouped_{decode}",
    )(jnp.where(valid, g_of_v, num_groups), box0, col0, width, x_pad, w_t)
    m = jnp.arange(num_rows, dtype=jnp.int32)
    ends = jnp.where(valid, row0 + rows, num_rows)  # non-decreasing: visits in row order
    v_of_m = jnp.minimum(jnp.searchsorted(ends, m, side="right"), num_visits - 1)
    in_group = (m < jnp.sum(sizes)) & valid[v_of_m]
    col = jnp.where(in_group, col0[v_of_m] + m - box0[v_of_m], 0)
    out = jnp.take(out_t.T, col, axis=0)
    return jnp.where(in_group[:, None], out, jnp.zeros((), out_dtype))
