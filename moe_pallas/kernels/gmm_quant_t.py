"""Grouped matmul with a transposed quantised weight, converted on chip: Pallas Triton lowering.

Math. out[m] = lhs[m] @ w[group(m)]ᵀ, w a `moe_pallas.quant.QuantizedWeight` of logical shape
[G, K, N]: lhs [M, N], out [M, K], float32 accumulation, rows past the groups zero. It is the
backward's product of an upstream gradient with the weight (dx = dh @ w_gate_upᵀ, and the GLU's
input gradient through w_down), so its contraction runs over the weight's output columns n and
its own output columns are the weight's K. The stored values [G, N, K] ("fp8", "fp8_block":
N-major, `moe_pallas.quant`) are then a [contraction, output] matrix per group, row-major: the
layout a plain (untransposed) matmul reads, each output column's values K-contiguous across a
row. The values stay e4m3 in memory and convert exactly to float16 on chip; lhs enters as
float16 with a power of two per row (`gmm_quant.rows_as_f16`), restored on the accumulator:
  - "fp8": the scale s[g, n] runs along the contraction, so it multiplies lhs before the
    conversion, once per call in float32: lhs'[m, n] = lhs[m, n] · s[g(m), n] (one float16
    rounding of each product's lhs factor, 2^-11, where the dequantised bf16 weight rounds to
    2^-8), and out[m] = (lhs'[m] / p[m])16 @ q[g(m)] · p[m].
  - "fp8_block" with [G, K/128, N/128] block scales: a K step of at most 128 contraction values
    (n) and a tile of at most 128 output columns (k) lie in one scale block, so each step's
    float16 dot is scaled on the float32 accumulator by that block's one scale, exactly:
    acc += dot(lhs16[:, n0:n0+bn], q[n0:n0+bn, k0:k0+bk]) · s[g, k0 // 128, n0 // 128].
The result equals the float32-accumulated product with the exactly decoded weights up to
float32 summation order and fp8's float16 rounding of lhs' (docs/reliability.md). "mxfp4" and
fp8_block's per-column scales ([G, K/128, N], the loader's form for a gate|up pair off the
128-column blocks) are not taken (`supports`): mxfp4 packs each 32-bit word's codes from two
halves of K (`kernels.mx_words`), so a tile's output columns would not be contiguous, and
per-column scales vary along the contraction inside a step; those calls dequantise per call
(`moe_pallas.backends`).

Tiling. As `kernels.gmm`: a 1-D grid of (visit, column-tile) pairs over `dispatch.tile_schedule`'s
visits (each an m-tile of one group's rows, a group's weights read once per visit), one compiled
path per tile height (`BlockConfig.m_paths`), contraction and column tails masked, the visits
swizzled in bands of `group_m`. The values are read as uint16 byte pairs along K (each pair two
adjacent output columns, decoded and interleaved back into a [block_k, block_n] float16 tile in
registers): one view for every size, whose int32 element offsets stay in range up to 2^32 bytes
(SwiGLU-256's [256, 4096, 4096] gate_up), where bytes would pass 2^31 elements; K must be even.
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
from moe_pallas.kernels.gmm_quant import e4m3_f16, rows_as_f16

FP8_BLOCK = 128  # the edge of "fp8_block"'s scale blocks
LHS_DTYPES = (jnp.bfloat16, jnp.float16)  # lhs exactly in float16 up to a power of two a row


def supports(w, lhs_dtype) -> bool:
    """Whether `gmm_quant_t` takes lhs of `lhs_dtype` against the transposed weight w (module
    docstring: "fp8", and "fp8_block" with block scales, K even)."""
    _, k, n = w.shape
    block_scales = w.fmt == "fp8_block" and w.scales.shape[2] == -(-n // FP8_BLOCK)
    return (
        (w.fmt == "fp8" or block_scales)
        and k % 2 == 0
        and any(jnp.dtype(lhs_dtype) == d for d in LHS_DTYPES)
    )


def _and(a, b):
    return b if a is None else a if b is None else a & b


def _load(ref, mask):
    return plgpu.load(ref, mask=mask) if mask is None else plgpu.load(ref, mask=mask, other=0)


def _pairs_f16(pairs):
    """uint16 [r, c] byte pairs -> float16 [r, 2c]: columns 2j and 2j + 1 the e4m3 values of pair
    j's low and high byte (exact)."""
    lo = e4m3_f16((pairs & 0xFF).astype(jnp.uint8))
    hi = e4m3_f16((pairs >> 8).astype(jnp.uint8))
    r, c = pairs.shape
    return jnp.stack([lo, hi], axis=-1).reshape(r, 2 * c)


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
    block_scales: bool,
):
    scales_ref = refs[0] if block_scales else None
    power_ref, out_ref = refs[-2:]
    bm, bo, bc = cfg.block_m, cfg.block_n, cfg.block_k
    half = bo // 2

    # Swizzle: walk group_m visits down each column tile before moving right (`kernels.gmm`).
    n_tiles = pl.cdiv(o_dim, bo)
    pid = pl.program_id(0)
    band = cfg.group_m * n_tiles
    first_v = _common.div(pid, band) * cfg.group_m
    band_rows = jnp.minimum(num_visits - first_v, cfg.group_m)
    v = first_v + _common.rem(_common.rem(pid, band), band_rows)
    o_tile = _common.div(_common.rem(pid, band), band_rows)
    o0, p0 = o_tile * bo, o_tile * half  # (a product, so Triton proves the pairs' alignment)

    g = group_ref[v]
    m0, row_end = m_start_ref[v], row_end_ref[v]
    used = m0 < row_end
    cols = o0 + jnp.arange(bo, dtype=jnp.int32)
    o_mask = cols < o_dim if o_dim % bo else None
    p_mask = None if o_mask is None else p0 + jnp.arange(half, dtype=jnp.int32) < o_dim // 2

    def store_mask(h):
        row_ok = m0 + jnp.arange(h, dtype=jnp.int32) < row_end
        return row_ok, _and(row_ok[:, None], None if o_mask is None else o_mask[None, :])

    @pl.when(used & (g == num_groups))
    def _tail_rows():
        plgpu.store(
            out_ref.at[pl.ds(m0, bm), pl.ds(o0, bo)],
            jnp.zeros((bm, bo), out_ref.dtype),
            mask=store_mask(bm)[1],
        )

    def grouped_rows(h):
        row_ok, out_mask = store_mask(h)

        def body(i, acc):
            n0 = i * bc
            c_mask = n0 + jnp.arange(bc, dtype=jnp.int32) < c_dim if c_dim % bc else None
            a = _load(
                lhs_ref.at[pl.ds(m0, h), pl.ds(n0, bc)],
                _and(row_ok[:, None], None if c_mask is None else c_mask[None, :]),
            )
            pairs = _load(
                pairs_ref.at[g, pl.ds(n0, bc), pl.ds(p0, half)],
                _and(
                    None if c_mask is None else c_mask[:, None],
                    None if p_mask is None else p_mask[None, :],
                ),
            )
            part = plgpu.dot(a, _pairs_f16(pairs))
            if block_scales:  # (Math: one scale block per step and tile)
                part = part * scales_ref[g, o0 // FP8_BLOCK, n0 // FP8_BLOCK]
            return acc + part

        acc = jax.lax.fori_loop(
            0, jnp.int32(pl.cdiv(c_dim, bc)), body, jnp.zeros((h, bo), jnp.float32)
        )
        power = _load(power_ref.at[pl.ds(m0, h)], row_ok)
        plgpu.store(
            out_ref.at[pl.ds(m0, h), pl.ds(o0, bo)],
            (acc * power[:, None]).astype(out_ref.dtype),
            mask=out_mask,
        )

    # Path p takes the visits whose rows span p/2 < r <= p (`kernels.gmm`): one path per visit.
    paths = cfg.m_paths()
    span = row_end - m0
    for i, p in enumerate(paths):
        run = used & (g < num_groups)
        if i > 0:
            run &= span <= p
        if i < len(paths) - 1:
            run &= span > p // 2
        pl.when(run)(functools.partial(grouped_rows, p))


def gmm_quant_t(
    lhs: jax.Array,
    rhs,
    group_sizes: jax.Array,
    *,
    lhs_row_index: jax.Array | None = None,
    out_dtype=None,
    config: BlockConfig | None = None,
) -> jax.Array:
    """out[m] = lhs[src(m)] @ rhs[group(m)]ᵀ (module docstring): lhs [M_src, N] (bf16 or
    float16); lhs_row_index [M] int32 (src(m) = lhs_row_index[m]), else M = M_src; rhs a
    `QuantizedWeight` of logical shape [G, K, N] that `supports` takes, group_sizes [G] int32.
    The rows are gathered in the float16 conversion's pass, which writes lhs16 [M, N] anyway.
    config's block_n tiles the output's K columns and its block_k the contraction (each at most
    128 for "fp8_block"); tail_m is ignored. Returns [M, K] in out_dtype (default lhs.dtype)."""
    num_groups, k_dim, n_dim = rhs.shape
    if not supports(rhs, lhs.dtype):
        raise ValueError(
            f"gmm_quant_t takes bf16 or float16 lhs against 'fp8' weights, or 'fp8_block' ones "
            f"with [G, K/128, N/128] block scales, K even; got lhs {lhs.dtype}, {rhs.fmt!r} "
            f"scales {rhs.scales.shape}, K={k_dim}. Dequantise the weight for this product."
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
    cfg = config or BlockConfig()
    block_scales = rhs.fmt == "fp8_block"
    if block_scales:
        cfg = dataclasses.replace(
            cfg, block_n=min(cfg.block_n, FP8_BLOCK), block_k=min(cfg.block_k, FP8_BLOCK)
        )
    cfg = dataclasses.replace(cfg.fit(num_rows, n_dim, k_dim), tail_m=0)
    group_ends = _common.clamp_group_ends(group_sizes, num_rows)
    if block_scales:
        lhs16, power = rows_as_f16(lhs)
        operands = [rhs.scales.astype(jnp.float32)]
    else:  # (Math: "fp8") the column scales onto lhs, row m by its group's
        row_group = jnp.searchsorted(group_ends, jnp.arange(num_rows, dtype=jnp.int32), "right")
        scales = jnp.concatenate([rhs.scales, jnp.zeros((1, n_dim), rhs.scales.dtype)])
        lhs16, power = rows_as_f16(lhs.astype(jnp.float32) * scales[row_group].astype(jnp.float32))
        operands = []
    values = jax.lax.bitcast_convert_type(rhs.values, jnp.uint8)
    pairs = jax.lax.bitcast_convert_type(
        values.reshape(num_groups, n_dim, k_dim // 2, 2), jnp.uint16
    )
    sched = dispatch.tile_schedule(group_ends, num_rows, cfg.block_m)
    num_visits = sched.group.shape[0]
    kernel = functools.partial(
        _kernel,
        num_groups=num_groups,
        num_visits=num_visits,
        c_dim=n_dim,
        o_dim=k_dim,
        cfg=cfg,
        block_scales=block_scales,
    )
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((num_rows, k_dim), out_dtype),
        grid=(num_visits * pl.cdiv(k_dim, cfg.block_n),),
        compiler_params=plgpu.CompilerParams(num_warps=cfg.num_warps, num_stages=cfg.num_stages),
        interpret=_common.interpret_mode(),
        name=f"gmm_t_{rhs.fmt}",
    )(sched.group, sched.m_start, sched.row_end, lhs16, pairs, *operands, power)
