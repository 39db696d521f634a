"""Probe (history only): fp8 expert weights in Mosaic GPU with swapped operands, the decoded
weight as wgmma's register operand A.

    out_t[e] = w_t[e] @ x[e]ᵀ      w_t [E, N, K] float8_e4m3fn (N-major, as stored), x [E, R, K] bf16

per expert e a [N, R] product (R rows of the expert, a multiple of 8: wgmma's N). A CTA takes
(e, 64-row tile of N): a TMA pipeline streams [64, block_k] fp8 bytes of w_t and [R, block_k] of x
into shared memory; the fp8 tile is loaded into registers in wgmma's A layout, decoded there to
bf16 and fed to wgmma with x's tile transposed from shared memory as B. No staging of the decoded
weights in shared memory (Triton's wgmma path stores them there). Decodes: "cvt" (via f16) and
"bits" (sign-extend to 16 bits, shift, mask, times 2^120, as gmm_quant's PTX). Scales, ragged
groups and epilogues are left out: this times the core against the bf16 gmm.
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


def bmm_fp8_swapped(x, w_t, *, block_k=128, stages=4, decode="bits"):
    """[E, R, K] bf16 x [E, N, K] fp8 -> [E, N, R] float32 (module docstring)."""
    e_dim, r_dim, k_dim = x.shape
    _, n_dim, _ = w_t.shape
    tile_n = 64
    interpret = _common.interpret_mode()

    def kernel(x_gmem, w_gmem, out_gmem):
        e, ni = lax.axis_index("e"), lax.axis_index("n")

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
                    plgpu.BlockSpec((r_dim, block_k), lambda kk: (0, kk)),
                    plgpu.BlockSpec((tile_n, block_k), lambda kk: (0, kk)),
                ],
                max_concurrent_steps=stages,
            )(x_gmem.at[e], w_gmem.at[e, pl.ds(ni * tile_n, tile_n)])
            return acc_ref[...]

        def scoped(w_dec=None):
            return pl.run_scoped(
                lambda acc_ref: product(acc_ref, w_dec), plgpu.ACC((tile_n, r_dim))
            )

        if interpret:
            acc = pl.run_scoped(scoped, plgpu.SMEM((tile_n, block_k), jnp.bfloat16))
        else:
            acc = scoped()

        @functools.partial(pl.run_scoped, o_smem=plgpu.SMEM((tile_n, r_dim), jnp.float32))
        def _(o_smem):
            o_smem[...] = acc
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(o_smem, out_gmem.at[e, pl.ds(ni * tile_n, tile_n)])
            plgpu.wait_smem_to_gmem(0)

    return plgpu.kernel(
        kernel,
        out_type=jax.ShapeDtypeStruct((e_dim, n_dim, r_dim), jnp.float32),
        grid=(e_dim, n_dim // tile_n),
        grid_names=("e", "n"),
        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
        interpret=plgpu.InterpretGPUParams() if _common.interpret_mode() else None,
        kernel_name=f"bmm_fp8_swapped_{decode}",
    )(x, w_t)


def gmm_fp8_swapped(x_sorted, w_t, group_sizes, *, rows=8, block_k=128, stages=4, decode="bits"):
    """The grouped form: x_sorted [M, K] bf16 (rows sorted by group), w_t [G, N, K] fp8 ->
    [M, N] float32, out[m] = w_t[group(m)] @ x_sorted[m]; rows past sum(group_sizes) are zero.

    Each group's rows are laid out padded to a multiple of `rows` (wgmma's N: 8 to 256) in a copy
    of x (an XLA scatter); a visit is one `rows`-row chunk of one group, a CTA one (visit, 64-row
    tile of N), whose [64, rows] product is stored into out_t [N, P] at the chunk's columns (TMA
    boxes of `rows` float32 columns: 32-byte aligned); out is gathered back from out_tᵀ."""
    num_rows, k_dim = x_sorted.shape
    num_groups, n_dim, _ = w_t.shape
    tile_n = 64
    interpret = _common.interpret_mode()
    sizes = jnp.minimum(group_sizes.astype(jnp.int32), num_rows)
    sizes = jnp.minimum(sizes, num_rows - (jnp.cumsum(sizes) - sizes).clip(max=num_rows))
    chunks = (sizes + rows - 1) // rows
    pad_start = (jnp.cumsum(chunks) - chunks) * rows
    start = jnp.cumsum(sizes) - sizes
    padded_rows = -(-(num_rows + num_groups * (rows - 1)) // rows) * rows
    num_visits = padded_rows // rows
    m = jnp.arange(num_rows, dtype=jnp.int32)
    g_of_m = jnp.searchsorted(jnp.cumsum(sizes), m, side="right").astype(jnp.int32)
    in_group = g_of_m < num_groups
    g_safe = jnp.minimum(g_of_m, num_groups - 1)
    dest = jnp.where(in_group, pad_start[g_safe] + m - start[g_safe], padded_rows)
    x_pad = jnp.zeros((padded_rows, k_dim), x_sorted.dtype).at[dest].set(x_sorted, mode="drop")
    v = jnp.arange(num_visits, dtype=jnp.int32)
    g_of_v = jnp.searchsorted(jnp.cumsum(chunks), v, side="right").astype(jnp.int32)
    gv_safe = jnp.minimum(g_of_v, num_groups - 1)
    chunk_start = jnp.cumsum(chunks) - chunks
    visit_row = jnp.where(
        g_of_v < num_groups, pad_start[gv_safe] + (v - chunk_start[gv_safe]) * rows, 0
    )

    def kernel(group_gmem, row_gmem, x_gmem, w_gmem, out_gmem):
        vi, ni = lax.axis_index("v"), lax.axis_index("n")
        g = group_gmem[vi]
        row0 = pl.multiple_of(row_gmem[vi], 8)

        @pl.when(g < num_groups)
        def _visit():
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
                        plgpu.BlockSpec((rows, block_k), lambda kk: (0, kk)),
                        plgpu.BlockSpec((tile_n, block_k), lambda kk: (0, kk)),
                    ],
                    max_concurrent_steps=stages,
                )(x_gmem.at[pl.ds(row0, rows)], w_gmem.at[g, pl.ds(ni * tile_n, tile_n)])
                return acc_ref[...]

            def scoped(w_dec=None):
                return pl.run_scoped(
                    lambda acc_ref: product(acc_ref, w_dec), plgpu.ACC((tile_n, rows))
                )

            if interpret:
                acc = pl.run_scoped(scoped, plgpu.SMEM((tile_n, block_k), jnp.bfloat16))
            else:
                acc = scoped()

            @functools.partial(pl.run_scoped, o_smem=plgpu.SMEM((tile_n, rows), jnp.float32))
            def _(o_smem):
                o_smem[...] = acc
                plgpu.commit_smem()
                plgpu.copy_smem_to_gmem(
                    o_smem, out_gmem.at[pl.ds(ni * tile_n, tile_n), pl.ds(row0, rows)]
                )
                plgpu.wait_smem_to_gmem(0)

    out_t = plgpu.kernel(
        kernel,
        out_type=jax.ShapeDtypeStruct((n_dim, padded_rows), jnp.float32),
        grid=(num_visits, n_dim // tile_n),
        grid_names=("v", "n"),
        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
        interpret=plgpu.InterpretGPUParams() if interpret else None,
        kernel_name=f"gmm_fp8_swapped_{decode}",
    )(jnp.where(g_of_v < num_groups, g_of_v, num_groups), visit_row, x_pad, w_t)
    out = jnp.take(out_t.T, jnp.minimum(dest, padded_rows - 1), axis=0)
    return jnp.where(in_group[:, None], out, 0.0)
