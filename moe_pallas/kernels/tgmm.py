"""Transposed grouped matmul: out[g] = lhs[rows of g]ᵀ @ rhs[rows of g], Pallas Triton lowering.

Math. Rows m in [0, M) are split into contiguous groups by `group_sizes`; for each group g,
`out[g] = Σ_{m in g} lhs[src(m)]ᵀ ⊗ r(m)` (`[K, N]`, float32 accumulation), where
src(m) = lhs_row_index[m] if given (gathered in the kernel) else m, and r(m) = rhs[m], or
rhs_row_scale[m] · rhs[rhs_row_index[m]] rounded to rhs's dtype when those are given (the train
step's dy = row_weight ⊙ dout[row_token], never stored). This is the weight gradient of `gmm`.
Empty groups give exact zeros; rows past sum(group_sizes) contribute nothing. With
rhs_sums, also `sums[g] = Σ_{m in g} r(m)` (`[N]`, float32; a bias gradient): lhs is copied
with a column of ones at index K (padded to K + 8 columns, so rows stay 16-byte aligned), so the
sums are row K of the product, computed by the same dots (in the K tail of the last k-tile, which
is masked anyway when block_k does not divide K, else one more k-tile), and the programs of that
k-tile store that row; no second pass over rhs. The ones are a copied column rather than set in
the kernel: a select on every loaded lhs tile sends the dot operand through registers, which is
slower (docs/decisions.md).

Tiling. A 3-D grid (n-chunk, k-tile, group), n fastest so that the programs of one group run
together and share its rows from L2. Each program owns `group_m` consecutive [block_k, block_n]
output tiles of one k-tile. A group of at most block_m rows (one row step; at T = 2048 about half
of them) loads its lhs tile once and loops over the tiles loading only rhs. Larger groups walk the
tiles in one loop over (tile, row step) pairs, the group's rows in block_m steps (a dynamic trip
count; the last step is masked, the group start need not be aligned): with a few dozen rows per
group a program per tile would be a two-step loop, all latency and no pipelining, so the chunk
keeps loads in flight across tiles. K and N tails are masked. On the H200 this kernel's loads
and stores barely overlap, so fewer loads pay: a one-step group loads its lhs tile once.

Overflow mode (`row_skip`, `accumulate`): each group's first row_skip rows are left out and the
products (and sums) are added to given arrays, aliased to the outputs; a group with no rows left
is not touched, so a call costs only the groups that have rows past row_skip. This is how
the cublas_slab backend (`moe_pallas.backends.cublas_slab`) adds the rows of a group beyond its
capacity.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from moe_pallas.kernels import _common
from moe_pallas.kernels.config import BlockConfig


def _tgmm_kernel(
    *refs,
    k_dim: int,
    n_dim: int,
    cfg: BlockConfig,
    gather: bool,
    rhs_gather: bool,
    rhs_scale: bool,
    rhs_sums: bool,
    compute_dtype,
    row_skip: int,
    accumulate: bool,
):
    it = iter(refs)
    group_offsets_ref = next(it)
    row_index_ref = next(it) if gather else None
    rhs_index_ref = next(it) if rhs_gather else None
    rhs_scale_ref = next(it) if rhs_scale else None
    lhs_ref, rhs_ref = next(it), next(it)
    # The arrays added to (aliased to the outputs: read here, written through out_ref/sums_ref).
    out_init_ref = next(it) if accumulate else None
    sums_init_ref = next(it) if accumulate and rhs_sums else None
    out_ref = next(it)
    sums_ref = next(it) if rhs_sums else None
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    n_tiles = pl.cdiv(n_dim, bn)
    first_tile = pl.program_id(0) * cfg.group_m
    num_tiles = jnp.minimum(cfg.group_m, n_tiles - first_tile)
    k0 = pl.program_id(1) * bk
    g = pl.program_id(2)
    end = group_offsets_ref[g + 1]
    start = jnp.minimum(group_offsets_ref[g] + row_skip, end)
    steps = pl.cdiv(end - start, jnp.int32(bm))  # int32 operands: x64 would make bm int64
    ks = k0 + jnp.arange(bk, dtype=jnp.int32)
    lhs_cols = lhs_ref.shape[1]  # K, or more with the ones column
    k_tail = bool(k_dim % bk) or rhs_sums
    k_mask = (ks < lhs_cols)[None, :] if lhs_cols % bk else None
    sums_tile = pl.program_id(1) == k_dim // bk  # the k-tile holding the ones column

    def load_init(ref, mask):  # the array added to; Triton takes `other` only with a mask
        return plgpu.load(ref, mask=mask, **({} if mask is None else {"other": 0}))

    def store(tile, acc):
        ns = tile * bn + jnp.arange(bn, dtype=jnp.int32)
        mask = None
        if k_tail or n_dim % bn:
            mask = (ks < k_dim)[:, None] & (ns < n_dim)[None, :]
        window = (g, pl.ds(k0, bk), pl.ds(tile * bn, bn))
        out = acc
        if accumulate:
            out = out + load_init(out_init_ref.at[window], mask).astype(out.dtype)
        plgpu.store(out_ref.at[window], out.astype(out_ref.dtype), mask=mask)
        if rhs_sums:

            @pl.when(sums_tile)
            def _sums():
                row = jnp.sum(jnp.where((ks == k_dim)[:, None], acc, 0.0), axis=0)
                sums_window = (g, pl.ds(tile * bn, bn))
                sums_mask = None if n_dim % bn == 0 else ns < n_dim
                if accumulate:
                    row = row + load_init(sums_init_ref.at[sums_window], sums_mask)
                plgpu.store(sums_ref.at[sums_window], row, mask=sums_mask)

    def in_group(r0):  # [bm, 1]: which of the block_m rows from r0 belong to the group
        return (r0 + jnp.arange(bm, dtype=jnp.int32) < end)[:, None]

    def load_a(r0):  # [bm, bk] rows r0.. of lhs (gathered), zero outside the group
        row_ok = in_group(r0)
        a_mask = row_ok if k_mask is None else row_ok & k_mask
        if gather:
            src = plgpu.load(row_index_ref.at[pl.ds(r0, bm)], mask=row_ok[:, 0], other=0)
            a = plgpu.load(lhs_ref.at[src[:, None], ks[None, :]], mask=a_mask, other=0)
        else:
            a = plgpu.load(lhs_ref.at[pl.ds(r0, bm), pl.ds(k0, bk)], mask=a_mask, other=0)
        return a.astype(compute_dtype)

    def load_b(r0, tile):  # [bm, bn] rows r0.. of r at n-tile `tile`, zero outside the group
        row_ok = in_group(r0)
        ns = tile * bn + jnp.arange(bn, dtype=jnp.int32)
        b_mask = row_ok if n_dim % bn == 0 else row_ok & (ns < n_dim)[None, :]
        if rhs_gather:
            src = plgpu.load(rhs_index_ref.at[pl.ds(r0, bm)], mask=row_ok[:, 0], other=0)
            b = plgpu.load(rhs_ref.at[src[:, None], ns[None, :]], mask=b_mask, other=0)
        else:
            b = plgpu.load(rhs_ref.at[pl.ds(r0, bm), pl.ds(tile * bn, bn)], mask=b_mask, other=0)
        if rhs_scale:
            w = plgpu.load(rhs_scale_ref.at[pl.ds(r0, bm)], mask=row_ok[:, 0], other=0)
            b = _common.scale_rows(b, w)
        return b.astype(compute_dtype)

    # A group of at most block_m rows (empty ones too: all loads masked, exact zeros; skipped when
    # accumulating) is one row step: its lhs tile is loaded once and each n-tile loads only rhs,
    # halving the loads.
    @pl.when((steps == 1) if accumulate else (steps <= 1))
    def _one_row_step():
        a = load_a(start)

        @pl.loop(0, num_tiles)
        def _tile(j):
            store(first_tile + j, plgpu.dot(a, load_b(start, first_tile + j), trans_a=True))

    # Larger groups: one loop over (tile j, row step i) pairs, i fastest, so the loads of the next
    # pair are in flight while this one multiplies, also across tiles. The accumulator restarts
    # at i == 0.
    @pl.when(steps > 1)
    def _row_steps():
        def body(it, acc):
            j = jax.lax.div(it, steps)
            i = it - j * steps
            r0 = start + i * bm
            tile = first_tile + j
            acc = jnp.where(i == 0, 0.0, acc) + plgpu.dot(
                load_a(r0), load_b(r0, tile), trans_a=True
            )

            @pl.when(i == steps - 1)
            def _last_step():
                store(tile, acc)

            return acc

        jax.lax.fori_loop(0, steps * num_tiles, body, jnp.zeros((bk, bn), jnp.float32))


def tgmm(
    lhs: jax.Array,
    rhs: jax.Array,
    group_sizes: jax.Array,
    *,
    lhs_row_index: jax.Array | None = None,
    rhs_row_index: jax.Array | None = None,
    rhs_row_scale: jax.Array | None = None,
    out_dtype=None,
    config: BlockConfig | None = None,
    rhs_sums: bool = False,
    row_skip: int = 0,
    accumulate: tuple[jax.Array, jax.Array | None] | None = None,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """`[G, K, N]` per-group products `lhs[rows of g]ᵀ @ rhs[rows of g]` (module docstring), and
    with rhs_sums also the `[G, N]` float32 per-group sums of rhs's rows (returns a pair).

    lhs `[M_src, K]` (row m read as lhs[lhs_row_index[m]] when lhs_row_index `[M]` is given, else
    M_src = M); rhs `[M, N]`, or `[M_rhs, N]` read as rhs[rhs_row_index[m]] when rhs_row_index
    `[M]` is given, times rhs_row_scale[m] (`[M]` float32) when that is given; group_sizes `[G]`
    int32.
    Overflow mode (module docstring): row_skip leaves each group's first rows out; accumulate =
    (out `[G, K, N]` in out_dtype, sums `[G, N]` float32 or None without rhs_sums) are the arrays
    the results are added to (donate them: they are aliased to the outputs).
    """
    if lhs.ndim != 2 or rhs.ndim != 2:
        raise ValueError(f"tgmm needs lhs [M, K] and rhs [M, N]; got {lhs.shape}, {rhs.shape}.")
    gather, rhs_gather = lhs_row_index is not None, rhs_row_index is not None
    num_rows = rhs_row_index.shape[0] if rhs_gather else rhs.shape[0]
    if (lhs_row_index.shape[0] if gather else lhs.shape[0]) != num_rows or (
        rhs_row_scale is not None and rhs_row_scale.shape != (num_rows,)
    ):
        raise ValueError(
            f"tgmm contracts over rows: lhs{' row index' if gather else ''}, "
            f"rhs{' row index' if rhs_gather else ''} ({num_rows} rows) and rhs_row_scale "
            "must have the same number of rows."
        )
    num_groups = group_sizes.shape[0]
    k_dim, n_dim = lhs.shape[1], rhs.shape[1]
    out_dtype = jnp.dtype(out_dtype or jnp.promote_types(lhs.dtype, rhs.dtype))
    _common.check_int32_sizes("tgmm", lhs=lhs.shape, rhs=rhs.shape, out=(num_groups, k_dim, n_dim))
    if accumulate is not None:
        want = [((num_groups, k_dim, n_dim), out_dtype)]
        want += [((num_groups, n_dim), jnp.dtype(jnp.float32))] if rhs_sums else [None]
        got = [None if a is None else (a.shape, a.dtype) for a in accumulate]
        if len(accumulate) != 2 or got != want:
            raise ValueError(
                f"tgmm: accumulate must be (out, sums) of shapes and dtypes {want}, got {got}."
            )
    if num_groups == 0 or k_dim == 0 or n_dim == 0 or num_rows == 0:
        if accumulate is not None:
            return accumulate if rhs_sums else accumulate[0]
        out = jnp.zeros((num_groups, k_dim, n_dim), out_dtype)
        return (out, jnp.zeros((num_groups, n_dim), jnp.float32)) if rhs_sums else out
    cfg = (config or BlockConfig()).fit(num_rows, k_dim + rhs_sums, n_dim)
    if rhs_sums:
        extra = jnp.zeros((lhs.shape[0], 8), lhs.dtype).at[:, 0].set(1)
        lhs = jnp.concatenate([lhs, extra], axis=1)
    group_ends = _common.clamp_group_ends(group_sizes, num_rows)
    group_offsets = jnp.concatenate([jnp.zeros((1,), jnp.int32), group_ends])
    operands = [group_offsets]
    if gather:
        operands.append(lhs_row_index.astype(jnp.int32))
    if rhs_gather:
        operands.append(rhs_row_index.astype(jnp.int32))
    if rhs_row_scale is not None:
        operands.append(rhs_row_scale.astype(jnp.float32))
    operands += [lhs, rhs]
    aliases = {}
    if accumulate is not None:
        inits = [a for a in accumulate if a is not None]
        aliases = {len(operands) + i: i for i in range(len(inits))}
        operands += inits
    kernel = functools.partial(
        _tgmm_kernel,
        k_dim=k_dim,
        n_dim=n_dim,
        cfg=cfg,
        gather=gather,
        rhs_gather=rhs_gather,
        rhs_scale=rhs_row_scale is not None,
        rhs_sums=rhs_sums,
        compute_dtype=jnp.promote_types(lhs.dtype, rhs.dtype),
        row_skip=row_skip,
        accumulate=accumulate is not None,
    )
    out_shape = jax.ShapeDtypeStruct((num_groups, k_dim, n_dim), out_dtype)
    if rhs_sums:
        out_shape = (out_shape, jax.ShapeDtypeStruct((num_groups, n_dim), jnp.float32))
    return pl.pallas_call(
        kernel,
        out_shape=out_shape,
        grid=(
            pl.cdiv(pl.cdiv(n_dim, cfg.block_n), cfg.group_m),
            pl.cdiv(k_dim + rhs_sums, cfg.block_k),
            num_groups,
        ),
        input_output_aliases=aliases,
        compiler_params=plgpu.CompilerParams(num_warps=cfg.num_warps, num_stages=cfg.num_stages),
        interpret=_common.interpret_mode(),
        name="tgmm",
    )(*operands)
