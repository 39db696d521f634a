"""Grouped matmul with a transposed quantised weight, converted on chip: Pallas Triton lowering.

Math. out[m] = lhs[m] @ w[group(m)]ᵀ, w a `moe_pallas.quant.QuantizedWeight` of logical shape [G, K,
N]: lhs [M, N], out [M, K], float32 accumulation, rows past the groups zero. It is the backward's
product of an upstream gradient with the weight (dx = dh @ w_gate_upᵀ, and the GLU's input gradient
through w_down), so its contraction runs over the weight's output columns n and its own output
columns are the weight's K. The stored values ([G, N, P] fp8, rows padded past K to
`quant.row_pitch` and read up to K; [G, N, K/2] mxfp4: N-major, `moe_pallas.quant`) are then a
[contraction, output] matrix per group, row-major: the layout a plain (untransposed) matmul reads.
Each format's scale goes where it stays exact or costs least:
  - "fp8": e4m3 converts exactly to float16; the scale s[g, n] runs along the contraction, so it
    multiplies lhs before the kernel, once per call in float32: lhs'[m, n] = lhs[m, n] ·
    s[g(m), n], then lhs' enters as float16 times a power of two per row
    (`gmm_quant.rows_as_f16`), restored on the accumulator: one float16 rounding of each
    product's lhs factor (2^-11, where the dequantised bf16 weight rounds to 2^-8).
  - "fp8_block" with [G, K/128, N/128] block scales: lhs enters as float16 times a power of two
    per row (exact for bf16), and since a K step of at most 128 contraction values (n) and a
    tile of at most 128 output columns (k) lie in one scale block, each step's float16 dot is
    scaled on the float32 accumulator by that block's one scale, exactly:
    acc += dot(lhs16[:, n0:n0+bn], q[n0:n0+bn, k0:k0+bk]) · s[g, k0 // 128, n0 // 128].
  - "mxfp4": each 32-bit word of a row holds the codes of k = r..r+3 (low half) and K/2 + r..r+3
    (high half) (`kernels.mx_words`), so a tile of b bytes a row serves b output columns of each
    half. The words decode by bit placement in four quarters of 2 values, each already times its
    e8m0 scale, exactly in bf16 (`gmm_quant.e2m1`, the forward's decode, here with a scale per
    element: s[g, k // 32, n] varies along both the contraction and the output), and each
    quarter is a dot of its own against the bf16 lhs; after the K loop each half's two
    quarters interleave back into column order (word i's k = 4i + 2q + d).
So the result equals the float32-accumulated product with the exactly decoded weights up to
float32 summation order (fp8: and the float16 rounding of lhs') (docs/reliability.md).
fp8_block's per-column scales ([G, K/128, N], the loader's form for a gate|up pair off the
128-column blocks) vary along the contraction inside a step and are not taken (`supports`):
those calls, like any with float32 lhs, dequantise per call (`moe_pallas.backends`).

Tiling. As `kernels.gmm`: a 1-D grid of (visit, column-tile) pairs over `dispatch.tile_schedule`'s
visits (each an m-tile of one group's rows, a group's weights read once per visit), one compiled
path per tile height (`BlockConfig.m_paths`), contraction and column tails masked, the visits
swizzled in bands of `group_m`; block_k steps the contraction and block_n counts a tile's output
columns (mxfp4: block_n/2 bytes a row, as many columns of each half, at least one 32-value scale
block). The values are read as uint16 byte pairs along K, one view for every size, whose int32
element offsets stay in range up to 2^32 bytes (SwiGLU-256's [256, 4096, 4096] fp8 gate_up),
where bytes would pass 2^31 elements; fp8 needs K even. fp8's low and high bytes (output columns
2j and 2j + 1) are two dots of their own, interleaved once after the K loop, not every step
(offline SASS of the K loop, instructions a thread, split / interleaved each step: 16 x 128 x
128 447 / 691, 64 x 128 x 64 294 / 305, 128 x 128 x 64 at 8 warps 203 / 197; registers 56 / 123
at 16 rows).
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from moe_pallas import dispatch
from moe_pallas.kernels import _common
from moe_pallas.kernels.config import BlockConfig
from moe_pallas.kernels.gmm_quant import (
    FP8_BLOCK,
    MX_BLOCK,
    MX_QUARTERS,
    byte_pairs,
    e2m1,
    e4m3_f16,
    e8m0_factors,
    rows_as_f16,
)

LHS_DTYPES = (jnp.bfloat16, jnp.float16)  # lhs exactly in float16 up to a power of two a row


def supports(w, lhs_dtype) -> bool:
    """Whether `gmm_quant_t` takes lhs of `lhs_dtype` against the transposed weight w (module
    docstring: "fp8" and "fp8_block" with block scales, K even, bf16 or float16 lhs; "mxfp4",
    bf16 lhs)."""
    _, k, n = w.shape
    if w.fmt == "mxfp4":
        return jnp.dtype(lhs_dtype) == jnp.bfloat16
    block_scales = w.fmt == "fp8_block" and w.scales.shape[2] == -(-n // FP8_BLOCK)
    return (
        (w.fmt == "fp8" or block_scales)
        and k % 2 == 0
        and any(jnp.dtype(lhs_dtype) == d for d in LHS_DTYPES)
    )


def _pair_bytes_f16(pairs):
    """uint16 [r, c] byte pairs -> the e4m3 values of their low and of their high bytes, each
    float16 [r, c] (exact)."""
    return [e4m3_f16(b.astype(jnp.uint8)) for b in (pairs & 0xFF, pairs >> 8)]


def _mx_factors(scales_ref, g, rows, n0, depth, c_mask, small_scales):
    """The e8m0 scale factors (`gmm_quant.e8m0_factors`, each bf16 [depth, pairs]) of a pairs
    tile at contraction rows n0..n0 + depth whose K blocks (32 values: 16 pairs each) are `rows`
    (a pl.ds over scales' second axis, and its mask): the [blocks, depth] codes, transposed and
    repeated along each block's pairs."""
    blocks_ds, kb_mask = rows
    codes = _common.masked_load(
        scales_ref.at[g, blocks_ds, pl.ds(n0, depth)],
        _common.and_masks(
            None if kb_mask is None else kb_mask[:, None],
            None if c_mask is None else c_mask[None, :],
        ),
    )
    blocks = codes.shape[0]
    codes = jnp.broadcast_to(codes.T[:, :, None], (depth, blocks, MX_BLOCK // 2))
    return e8m0_factors(codes.reshape(depth, blocks * MX_BLOCK // 2), small_scales)


def _interleave_quarters(acc_01, acc_23):
    """Two quarters' [h, 2w] accumulators (column 2i + d: word i's code pair 0 or 1, resp. 2 or 3,
    d-th code) -> [h, 4w] in the words' column order, column 4i + 2q + d."""
    h, n = acc_01.shape
    pair = jnp.stack([acc_01.reshape(h, n // 2, 2), acc_23.reshape(h, n // 2, 2)], axis=-1)
    return pair.transpose(0, 1, 3, 2).reshape(h, 2 * n)


def _kernel(
    group_ref,
    m_start_ref,
    row_end_ref,
    lhs_ref,
    pairs_ref,
    *refs,
    num_groups: int,
    num_visits: int,
    c_dim: int,
    o_dim: int,
    cfg: BlockConfig,
    fmt: str,
    small_scales: bool,
):
    mx = fmt == "mxfp4"
    scales_ref = refs[0] if fmt != "fp8" else None
    power_ref = refs[-2] if not mx else None
    out_ref = refs[-1]
    bm, bo, bc = cfg.block_m, cfg.block_n, cfg.block_k
    # Output columns a tile: fp8's bo; mxfp4's bo/2 bytes of each row, bo/2 columns of each half.
    width = bo // 2 if mx else bo
    span_dim = o_dim // 2 if mx else o_dim  # the columns the tiles span
    half = bo // 2 if not mx else bo // 4  # uint16 pairs a tile row

    v, o_tile = _common.swizzled_tile(num_visits, pl.cdiv(span_dim, width), cfg.group_m)
    o0, p0 = o_tile * width, o_tile * half  # (products, so Triton proves the pairs' alignment)

    g = group_ref[v]
    m0, row_end = m_start_ref[v], row_end_ref[v]
    used = m0 < row_end
    cols = o0 + jnp.arange(width, dtype=jnp.int32)
    o_mask = cols < span_dim if span_dim % width else None
    p_mask = None if o_mask is None else p0 + jnp.arange(half, dtype=jnp.int32) < span_dim // 2
    out_starts = (o0, span_dim + o0) if mx else (o0,)  # mxfp4: the low and the high half

    def store_mask(h):
        row_ok = m0 + jnp.arange(h, dtype=jnp.int32) < row_end
        return row_ok, _common.and_masks(
            row_ok[:, None], None if o_mask is None else o_mask[None, :]
        )

    @pl.when(used & (g == num_groups))
    def _tail_rows():
        for start in out_starts:
            plgpu.store(
                out_ref.at[pl.ds(m0, bm), pl.ds(start, width)],
                jnp.zeros((bm, width), out_ref.dtype),
                mask=store_mask(bm)[1],
            )

    def grouped_rows(h):
        row_ok, out_mask = store_mask(h)

        def body(i, accs):
            n0 = i * bc
            c_mask = n0 + jnp.arange(bc, dtype=jnp.int32) < c_dim if c_dim % bc else None
            a = _common.masked_load(
                lhs_ref.at[pl.ds(m0, h), pl.ds(n0, bc)],
                _common.and_masks(row_ok[:, None], None if c_mask is None else c_mask[None, :]),
            )
            pairs = _common.masked_load(
                pairs_ref.at[g, pl.ds(n0, bc), pl.ds(p0, half)],
                _common.and_masks(
                    None if c_mask is None else c_mask[:, None],
                    None if p_mask is None else p_mask[None, :],
                ),
            )
            if mx:  # (Math: "mxfp4") a dot per quarter of the words, scales in the decode
                factors = [
                    _mx_factors(scales_ref, g, rows, n0, bc, c_mask, small_scales)
                    for rows in mx_rows
                ]
                return tuple(
                    acc + plgpu.dot(a, e2m1(pairs, q, factors[q.startswith("hi")]))
                    for acc, q in zip(accs, MX_QUARTERS)
                )
            parts = [plgpu.dot(a, w) for w in _pair_bytes_f16(pairs)]
            if fmt == "fp8_block":  # (Math: one scale block per step and tile)
                scale = scales_ref[g, o0 // FP8_BLOCK, n0 // FP8_BLOCK]
                parts = [part * scale for part in parts]
            return tuple(acc + part for acc, part in zip(accs, parts))

        if mx:  # the tile's scale rows (blocks of 32 of K), low half then high
            blocks = width // MX_BLOCK
            kb0 = o_tile * blocks
            kb_mask = None if o_mask is None else kb0 + jnp.arange(blocks) < span_dim // MX_BLOCK
            mx_rows = [
                (pl.ds(start, blocks), kb_mask) for start in (kb0, span_dim // MX_BLOCK + kb0)
            ]
        accs = jax.lax.fori_loop(
            0,
            jnp.int32(pl.cdiv(c_dim, bc)),
            body,
            tuple(jnp.zeros((h, half), jnp.float32) for _ in range(4 if mx else 2)),
        )
        if mx:  # each half's two quarters back into column order: word i's k = 4i + 2q + d
            outs = [_interleave_quarters(*accs[:2]), _interleave_quarters(*accs[2:])]
        else:  # the low and high bytes' columns back into order: pair j's k = 2j + b
            power = _common.masked_load(power_ref.at[pl.ds(m0, h)], row_ok)
            out = jnp.stack(accs, axis=-1).reshape(h, width)
            outs = [out * power[:, None]]
        for start, out in zip(out_starts, outs):
            plgpu.store(
                out_ref.at[pl.ds(m0, h), pl.ds(start, width)],
                out.astype(out_ref.dtype),
                mask=out_mask,
            )

    _common.run_paths(cfg.m_paths(), row_end - m0, used & (g < num_groups), grouped_rows)


def gmm_quant_t(
    lhs: jax.Array,
    rhs,
    group_sizes: jax.Array,
    *,
    lhs_row_index: jax.Array | None = None,
    out_dtype=None,
    config: BlockConfig | None = None,
) -> jax.Array:
    """out[m] = lhs[src(m)] @ rhs[group(m)]ᵀ (module docstring): lhs [M_src, N];
    lhs_row_index [M] int32 (src(m) = lhs_row_index[m]), else M = M_src; rhs a `QuantizedWeight`
    of logical shape [G, K, N] that `supports` takes with lhs's dtype; group_sizes [G] int32. The
    rows are gathered before the kernel (for fp8 in the float16 conversion's pass, which writes
    [M, N] anyway). config's block_n counts a tile's output columns and its block_k the
    contraction's step (fp8_block: each at most 128; mxfp4: block_n at least 64); tail_m is
    ignored. Returns [M, K] in out_dtype (default lhs.dtype)."""
    num_groups, k_dim, n_dim = rhs.shape
    if not supports(rhs, lhs.dtype):
        raise ValueError(
            f"gmm_quant_t takes bf16 or float16 lhs against 'fp8' weights or 'fp8_block' ones "
            f"with [G, K/128, N/128] block scales (K even), and bf16 lhs against 'mxfp4' ones; "
            f"got lhs {lhs.dtype}, {rhs.fmt!r} scales {rhs.scales.shape}, K={k_dim}. Dequantise "
            "the weight for this product."
        )
    if lhs.ndim != 2 or lhs.shape[1] != n_dim:
        raise ValueError(f"lhs must be [M, N={n_dim}], got {lhs.shape}.")
    if group_sizes.shape != (num_groups,):
        raise ValueError(f"group_sizes must be [{num_groups}], got {group_sizes.shape}.")
    out_dtype = jnp.dtype(out_dtype or lhs.dtype)
    if lhs_row_index is not None:
        lhs = lhs[lhs_row_index]
    num_rows = lhs.shape[0]
    _common.check_int32_sizes("gmm_quant_t", lhs=lhs.shape, out=(num_rows, k_dim))
    if num_rows == 0 or k_dim == 0:
        return jnp.zeros((num_rows, k_dim), out_dtype)
    fmt = rhs.fmt
    cfg = config or BlockConfig()
    if fmt == "fp8_block":  # (Math: one scale block a step and tile)
        cfg = dataclasses.replace(
            cfg, block_n=min(cfg.block_n, FP8_BLOCK), block_k=min(cfg.block_k, FP8_BLOCK)
        )
    if fmt == "mxfp4":  # (Math: whole scale blocks of each half a tile)
        cfg = dataclasses.replace(cfg, block_n=max(cfg.block_n, 2 * MX_BLOCK))
    cfg = dataclasses.replace(cfg.fit(num_rows, n_dim, k_dim), tail_m=0)
    group_ends = _common.clamp_group_ends(group_sizes, num_rows)
    pairs = byte_pairs(jax.lax.bitcast_convert_type(rhs.values, jnp.uint8))
    if fmt == "mxfp4":
        operands = [lhs, pairs, rhs.scales]
    elif fmt == "fp8_block":
        lhs16, power = rows_as_f16(lhs)
        operands = [lhs16, pairs, rhs.scales.astype(jnp.float32), power]
    else:  # (Math: "fp8") the column scales onto lhs, row m by its group's
        row_group = dispatch.searchsorted(
            group_ends, jnp.arange(num_rows, dtype=jnp.int32), "right"
        )
        scales = jnp.concatenate([rhs.scales, jnp.zeros((1, n_dim), rhs.scales.dtype)])
        lhs16, power = rows_as_f16(lhs.astype(jnp.float32) * scales[row_group].astype(jnp.float32))
        operands = [lhs16, pairs, power]
    sched = dispatch.tile_schedule(group_ends, num_rows, cfg.block_m)
    num_visits = sched.group.shape[0]
    kernel = functools.partial(
        _kernel,
        num_groups=num_groups,
        num_visits=num_visits,
        c_dim=n_dim,
        o_dim=k_dim,
        cfg=cfg,
        fmt=fmt,
        small_scales=rhs.small_scales,
    )
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((num_rows, k_dim), out_dtype),
        grid=(num_visits * pl.cdiv(k_dim, cfg.block_n),),
        compiler_params=plgpu.CompilerParams(num_warps=cfg.num_warps, num_stages=cfg.num_stages),
        interpret=_common.interpret_mode(),
        name=f"gmm_t_{rhs.fmt}",
    )(sched.group, sched.m_start, sched.row_end, *operands)
