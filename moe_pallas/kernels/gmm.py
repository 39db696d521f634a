"""Grouped matmul: out[m] = epilogue(lhs[src(m)] @ rhs[group(m)]), Pallas Triton lowering.

Math. Rows m in [0, M) are split into G contiguous groups by `group_sizes`; row m of the product
reads `lhs[lhs_row_index[m]]` (or `lhs[m]`) and multiplies it by `rhs[g]` (`[K, N]`, or `[N, K]`
with `transpose_rhs`) of its group g, accumulating in float32. The epilogue then adds `bias[g]`,
applies the GLU `activation` (rhs has 2·N_out columns: two accumulators per tile, gate and up,
in the layout of the activation, see `moe_pallas.activations`), and multiplies by
`row_scale[m]`. Rows past sum(group_sizes) are written as zeros.

Tiling. A 1-D grid over (visit, n-tile) pairs, where the visits come from `dispatch.tile_schedule`:
each visit is an m-tile of at most block_m rows of one group, tiles starting at the group's first
row (a group of <= block_m rows is one visit: its expert's weights are read once), so no row is
padded and no `lhs[perm]` copy is made: the row gather happens in the kernel. Each program loops
over K in block_k steps with a [p, block_n] float32 accumulator (two for a GLU), where p is the
smallest of the config's tile heights ("paths", `BlockConfig.m_paths`: block_m, block_m/2, ...,
min_block_m, each compiled into the kernel) that covers the visit's r rows, p/2 < r <= p: a group's
short last visit (or a group of few rows) then does not pay a full block_m-row matmul. Programs are
swizzled in bands of `group_m` visits so that consecutive programs reuse one expert's weight slab
from L2 (compute-bound case); with few rows per expert, a narrow block_n spreads each hit expert's
weights over all SMs (bandwidth-bound case). Triton needs power-of-2 blocks: K and N tails are
masked.

Tails (`BlockConfig.tail_m`). At ~128 rows per expert about half the groups have a few rows past
block_m, and a second visit for them streams the expert's whole weight slab again for a few-row
dot. With tail_m the schedule gives such a group's last visit up to block_m + tail_m rows, and the
program multiplies the extra rows by a second [tail_m, block_k] dot on the rhs blocks it already
loaded; outputs are bit for bit those without the tail path. `BlockConfig` refuses tails under 32
rows, and under 64 at 8 warps: Triton miscompiles two dots of different heights that share a loaded
block in a pipelined loop at 8 warps (every row of the main product wrong; reduced to a two-dot
kernel in tests/test_kernels_gpu.py, docs/reliability.md).
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from moe_pallas import dispatch
from moe_pallas.activations import glu
from moe_pallas.kernels import _common
from moe_pallas.kernels.config import BlockConfig

_ACTIVATIONS = (None, "swiglu", "gptoss")


def _gmm_kernel(
    *refs,
    num_groups: int,
    num_visits: int,
    k_dim: int,
    n_out: int,
    cfg: BlockConfig,
    gather: bool,
    transpose_rhs: bool,
    has_bias: bool,
    activation: str | None,
    has_row_scale: bool,
    compute_dtype,
):
    it = iter(refs)
    group_ref, m_start_ref, row_end_ref = (next(it) for _ in range(3))
    row_index_ref = next(it) if gather else None
    lhs_ref, rhs_ref = next(it), next(it)
    bias_ref = next(it) if has_bias else None
    row_scale_ref = next(it) if has_row_scale else None
    out_ref = next(it)
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k

    v, n_tile = _common.swizzled_tile(num_visits, pl.cdiv(n_out, bn), cfg.group_m)
    n0 = n_tile * bn

    g = group_ref[v]
    m0 = m_start_ref[v]
    row_start, row_end = m0, row_end_ref[v]  # a Triton visit stores from its tile's first row
    cols = n0 + jnp.arange(bn, dtype=jnp.int32)
    n_mask = cols < n_out if n_out % bn else None
    used = row_start < row_end
    # Column blocks of rhs (and bias) behind the bn outputs: contiguous loads only. gpt-oss
    # interleaves gate/up, so one [bk, 2·bn] block holds both and is split after the dot;
    # SwiGLU reads the gate and the up half as two blocks.
    if activation == "gptoss":
        pair_cols = 2 * n0 + jnp.arange(2 * bn, dtype=jnp.int32)
        blocks = ((2 * n0, 2 * bn, None if n_mask is None else pair_cols < 2 * n_out),)
    elif activation == "swiglu":
        blocks = ((n0, bn, n_mask), (n_out + n0, bn, n_mask))
    else:
        blocks = ((n0, bn, n_mask),)

    def masks(bm, off=0):  # rows of the visit in a tile of bm rows from m0 + off, store mask
        rows = m0 + off + jnp.arange(bm, dtype=jnp.int32)
        row_ok = (rows >= row_start) & (rows < row_end)
        return row_ok, _common.and_masks(
            row_ok[:, None], None if n_mask is None else n_mask[None, :]
        )

    @pl.when(used & (g == num_groups))
    def _tail_rows():
        plgpu.store(
            out_ref.at[pl.ds(m0, bm), pl.ds(n0, bn)],
            jnp.zeros((bm, bn), out_ref.dtype),
            mask=masks(bm)[1],
        )

    def grouped_rows(bm, tail=0):
        """The visit's rows in a tile of bm rows (one of cfg.m_paths()), and with tail the
        [tail, ...] segment after it: both segments' dots use each loaded rhs block."""
        segments = ((0, bm),) + (((bm, tail),) if tail else ())
        row_masks = [masks(h, off) for off, h in segments]
        if gather:
            srcs = [
                _common.masked_load(row_index_ref.at[pl.ds(m0 + off, h)], row_ok)
                for (off, h), (row_ok, _) in zip(segments, row_masks)
            ]

        def body(i, accs):
            k0 = i * bk
            ks = k0 + jnp.arange(bk, dtype=jnp.int32)
            k_mask = ks < k_dim if k_dim % bk else None
            lhs_tiles = []
            for j, ((off, h), (row_ok, _)) in enumerate(zip(segments, row_masks)):
                # Rows outside the visit are not loaded: 64 rows fill half a 128-row tile.
                a_mask = _common.and_masks(
                    row_ok[:, None], None if k_mask is None else k_mask[None, :]
                )
                if gather:
                    a = _common.masked_load(lhs_ref.at[srcs[j][:, None], ks[None, :]], a_mask)
                else:
                    a = _common.masked_load(lhs_ref.at[pl.ds(m0 + off, h), pl.ds(k0, bk)], a_mask)
                lhs_tiles.append(a.astype(compute_dtype))
            new = [list(seg) for seg in accs]
            for c, (c0, width, c_mask) in enumerate(blocks):
                kn_mask = _common.and_masks(
                    None if k_mask is None else k_mask[:, None],
                    None if c_mask is None else c_mask[None, :],
                )
                if transpose_rhs:
                    b = _common.masked_load(
                        rhs_ref.at[g, pl.ds(c0, width), pl.ds(k0, bk)],
                        None if kn_mask is None else kn_mask.T,
                    ).astype(compute_dtype)
                else:
                    b = _common.masked_load(rhs_ref.at[g, pl.ds(k0, bk), pl.ds(c0, width)], kn_mask)
                    b = b.astype(compute_dtype)
                for j, a in enumerate(lhs_tiles):
                    new[j][c] = new[j][c] + plgpu.dot(a, b, trans_b=transpose_rhs)
            return tuple(tuple(seg) for seg in new)

        accs = tuple(
            tuple(jnp.zeros((h, width), jnp.float32) for _, width, _ in blocks) for _, h in segments
        )
        accs = jax.lax.fori_loop(0, jnp.int32(pl.cdiv(k_dim, bk)), body, accs)
        for (off, h), (row_ok, out_mask), seg in zip(segments, row_masks, accs):
            if has_bias:
                seg = tuple(
                    acc
                    + _common.masked_load(bias_ref.at[g, pl.ds(c0, width)], c_mask).astype(
                        jnp.float32
                    )[None, :]
                    for acc, (c0, width, c_mask) in zip(seg, blocks)
                )
            if activation == "gptoss":
                seg = jnp.unstack(seg[0].reshape(h, bn, 2), axis=-1)  # (gate, up)
            out = glu(seg[0], seg[1], activation) if activation else seg[0]
            if has_row_scale:
                scale = _common.masked_load(row_scale_ref.at[pl.ds(m0 + off, h)], row_ok)
                out = out * scale.astype(jnp.float32)[:, None]
            plgpu.store(
                out_ref.at[pl.ds(m0 + off, h), pl.ds(n0, bn)],
                out.astype(out_ref.dtype),
                mask=out_mask,
            )

    # One path per used visit (`_common.run_paths`). With tail_m, a visit spanning more than
    # block_m rows (a group's last, at most block_m + tail_m) runs the tail path instead.
    span = row_end - m0
    run_grouped = used & (g < num_groups)
    _common.run_paths(cfg.m_paths(), span, run_grouped, grouped_rows, tail=bool(cfg.tail_m))
    if cfg.tail_m:
        pl.when(run_grouped & (span > bm))(functools.partial(grouped_rows, bm, cfg.tail_m))


def gmm(
    lhs: jax.Array,
    rhs: jax.Array,
    group_sizes: jax.Array,
    *,
    lhs_row_index: jax.Array | None = None,
    transpose_rhs: bool = False,
    bias: jax.Array | None = None,
    activation: str | None = None,
    row_scale: jax.Array | None = None,
    out_dtype=None,
    config: BlockConfig | None = None,
) -> jax.Array:
    """Grouped matmul with in-kernel row gather and a fused epilogue (see the module docstring).

    lhs `[M_src, K]`; lhs_row_index `[M]` int32 (row m reads lhs[lhs_row_index[m]]), else M = M_src;
    rhs `[G, K, N]` (`[G, N, K]` if transpose_rhs); group_sizes `[G]` int32; bias `[G, N]` in rhs's column layout;
    activation None | "swiglu" | "gptoss" (then N = 2·N_out); row_scale `[M]`; config: the
    block sizes (default `BlockConfig()`; the backends pass the tuning table's, see
    `moe_pallas.tuning`), fitted to the problem. Returns `[M, N_out]` in out_dtype (default
    lhs.dtype).
    """
    if activation not in _ACTIVATIONS:
        raise ValueError(f"activation={activation!r} must be one of {_ACTIVATIONS}.")
    if lhs.ndim != 2 or rhs.ndim != 3:
        raise ValueError(f"gmm needs lhs [M, K] and rhs [G, K, N]; got {lhs.shape}, {rhs.shape}.")
    num_groups, k_dim, n_dim = _common.grouped_dims(lhs, rhs, group_sizes, transpose_rhs)
    if activation is not None and (transpose_rhs or n_dim % 2):
        raise ValueError("a GLU activation needs a non-transposed rhs with an even column count.")
    gather = lhs_row_index is not None
    num_rows = lhs_row_index.shape[0] if gather else lhs.shape[0]
    _common.check_epilogue(num_groups, n_dim, num_rows, bias, row_scale)
    _common.check_int32_sizes(
        "gmm", lhs=lhs.shape, rhs=rhs.shape, out=(num_rows, n_dim // 2 if activation else n_dim)
    )
    n_out = n_dim // 2 if activation else n_dim
    out_dtype = jnp.dtype(out_dtype or lhs.dtype)
    if num_rows == 0 or n_out == 0:
        return jnp.zeros((num_rows, n_out), out_dtype)
    if k_dim == 0:
        return gmm(
            jnp.zeros((1, 16), lhs.dtype),
            jnp.zeros((num_groups, 16, n_dim), rhs.dtype),
            group_sizes,
            lhs_row_index=jnp.zeros((num_rows,), jnp.int32),
            bias=bias,
            activation=activation,
            row_scale=row_scale,
            out_dtype=out_dtype,
            config=config,
        )

    cfg = (config or BlockConfig()).fit(num_rows, k_dim, n_out)
    sched = dispatch.tile_schedule(
        _common.clamp_group_ends(group_sizes, num_rows), num_rows, cfg.block_m, tail=cfg.tail_m
    )
    num_visits = sched.group.shape[0]
    operands = [sched.group, sched.m_start, sched.row_end]
    if gather:
        operands.append(lhs_row_index.astype(jnp.int32))
    operands += [lhs, rhs]
    if bias is not None:
        operands.append(bias)
    if row_scale is not None:
        operands.append(row_scale)
    kernel = functools.partial(
        _gmm_kernel,
        num_groups=num_groups,
        num_visits=num_visits,
        k_dim=k_dim,
        n_out=n_out,
        cfg=cfg,
        gather=gather,
        transpose_rhs=transpose_rhs,
        has_bias=bias is not None,
        activation=activation,
        has_row_scale=row_scale is not None,
        compute_dtype=jnp.promote_types(lhs.dtype, rhs.dtype),
    )
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((num_rows, n_out), out_dtype),
        grid=(num_visits * pl.cdiv(n_out, cfg.block_n),),
        compiler_params=plgpu.CompilerParams(num_warps=cfg.num_warps, num_stages=cfg.num_stages),
        interpret=_common.interpret_mode(),
        name="gmm_t" if transpose_rhs else "gmm",
    )(*operands)
