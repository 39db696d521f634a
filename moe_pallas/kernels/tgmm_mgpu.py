"""Transposed grouped matmul out[g] = lhs[rows of g]ᵀ @ rhs[rows of g] for Hopper, Pallas Mosaic GPU.

Math. Rows m in [0, M) are split into G contiguous groups by `group_sizes`; for each group g,
`out[g] = Σ_{m in g} lhs[m]ᵀ ⊗ rhs[m]` (`[K, N]`, float32 accumulation by wgmma). This is the weight
gradient of `gmm_mgpu.gmm`. Empty groups give exact zeros; rows past sum(group_sizes) contribute
nothing. Same contract as `kernels.tgmm.tgmm` without its row gather.

Schedule. At a few dozen rows per group (training at T = 2048) every output tile is one or two
row boxes of work, so the kernel is bound by writing [G, K, N] and by latency, not by arithmetic.
A persistent kernel (one CTA per SM) therefore runs one TMA pipeline over all of its work
instead of one per tile: CTA c owns the output tiles (k-tile, n-tile)
p = c, c + C, c + 2C, ... of every group, and walks groups in order, for each group its tiles, for
each tile the group's row boxes.
The ring of `num_stages` shared-memory slots is refilled across tile and group boundaries, and a
finished tile leaves through an asynchronous TMA store from one of two output buffers while the
next tile's boxes are multiplied. All CTAs walk the groups at the same pace, so the rows being
read are one group's, in L2. Correct, but slower than the Triton kernel and cuBLAS at the layer's
shapes (docs/decisions.md), so "auto" never picks it; `implementation="mosaic_gpu"` runs it.

Row boxes (`dispatch.row_boxes`). A box is block_m rows starting at a multiple of 8 (Mosaic GPU's
tiled shared memory and TMA need it): box r of group g starts at its first row rounded down to 8,
plus r·block_m. Rows of
a box outside the group (neighbours' rows, or rows an earlier box of the group covered, when the
box is moved back to end inside the array) are zeroed in both shared-memory slots before the wgmma
reads them, so other groups' values, NaN included, never reach this group. An empty group gets one
box with every row zeroed: its tiles are stored as exact zeros.

Limits (ValueError, use the Triton backend instead): bf16/f16 operands of one dtype, K a multiple
of 64 (the wgmma M of one warpgroup) and N of 16.
"""

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from moe_pallas import dispatch
from moe_pallas.kernels import _common
from moe_pallas.kernels.gmm_mgpu import DTYPES, fit_block


@dataclasses.dataclass(frozen=True)
class TgmmMosaicConfig:
    block_m: int = 64  # rows (the contraction) per box: 64 or 128
    block_k: int = 64  # output rows: the wgmma M of one warpgroup, 64
    block_n: int = 256  # output columns (the accumulator: block_k x block_n float32 registers)
    num_stages: int = 4  # shared-memory slots of the TMA ring, at least 2

    def fit(self, k: int, n: int) -> "TgmmMosaicConfig":
        """The largest block_k (block_n) of at most the configured size that divides K (N)."""
        if self.block_m not in (64, 128) or self.num_stages < 2:
            raise ValueError(
                f"tgmm_mgpu needs block_m in (64, 128) and num_stages >= 2, got {self}."
            )
        return dataclasses.replace(
            self,
            block_k=fit_block("tgmm_mgpu", self.block_k, k, "K", 64),
            block_n=fit_block("tgmm_mgpu", self.block_n, n, "N", 16),
        )


def _transforms(cfg: TgmmMosaicConfig, dtype) -> tuple:
    """Tiling and swizzle of the lhs and rhs slots: wgmma needs one swizzle for both, the widest
    that the narrower of their minor dimensions (block_k, block_n) allows."""
    bits = jnp.dtype(dtype).itemsize * 8
    swizzle = plgpu.find_swizzle(min(cfg.block_k, cfg.block_n) * bits)
    return plgpu.TilingTransform((8, 8 * swizzle // bits)), plgpu.SwizzleTransform(swizzle)


class _Cursor(NamedTuple):
    """A CTA's position in its work: group g, its j-th tile of the group, row box r."""

    g: jax.Array
    j: jax.Array
    r: jax.Array


def _kernel(
    total_boxes_gmem,
    group_start_gmem,
    group_end_gmem,
    group_boxes_gmem,
    lhs_gmem,
    rhs_gmem,
    out_gmem,
    lhs_smem,
    rhs_smem,
    o_smem,
    lhs_barriers,
    rhs_barriers,
    *,
    cfg: TgmmMosaicConfig,
    num_ctas: int,
):
    num_groups, k_dim, n_dim = out_gmem.shape
    bm, bk, bn, stages = cfg.block_m, cfg.block_k, cfg.block_n, cfg.num_stages
    n_tiles = n_dim // bn
    num_pairs = (k_dim // bk) * n_tiles
    last_box_row = lhs_gmem.shape[0] - bm  # a multiple of 8 (the rows are padded to one)
    cta = jax.lax.axis_index("sm")
    # Tiles of each group this CTA owns. Integer division and remainder of traced non-negative
    # values go through lax.div/rem (`_common.div`/`rem`, int32 under x64 too): with jnp's // and %
    # (jitted helpers) this kernel failed to lower in jax 0.11.2 ("Shaped arrays must be
    # represented by ir.Values").
    pairs = _common.div(num_pairs - cta + num_ctas - 1, num_ctas)
    total_steps = pairs * total_boxes_gmem[0]

    def advance(c: _Cursor) -> _Cursor:
        r = c.r + 1
        next_tile = r == group_boxes_gmem[jnp.minimum(c.g, num_groups - 1)]
        j = jnp.where(next_tile, c.j + 1, c.j)
        next_group = j == pairs
        return _Cursor(
            jnp.where(next_group, c.g + 1, c.g),
            jnp.where(next_group, 0, j),
            jnp.where(next_tile, 0, r),
        )

    def tile(j):
        """(k-tile, n-tile) of this CTA's j-th tile of a group."""
        p = cta + j * num_ctas
        return _common.div(p, n_tiles), _common.rem(p, n_tiles)

    def box(c: _Cursor):
        """(first row of the box, [lo, hi): the rows of it that this step adds)."""
        g = jnp.minimum(c.g, num_groups - 1)
        start, end = group_start_gmem[g], group_end_gmem[g]
        nominal = _common.div(start, 8) * 8 + c.r * bm
        a0 = pl.multiple_of(jnp.minimum(nominal, last_box_row), 8)
        return a0, jnp.maximum(start, nominal), jnp.minimum(end, nominal + bm)

    def issue(c: _Cursor, slot):
        ki, ni = tile(c.j)
        a0, _, _ = box(c)
        rows = pl.ds(a0, bm)
        plgpu.copy_gmem_to_smem(
            lhs_gmem.at[rows, pl.ds(ki * bk, bk)], lhs_smem.at[slot], lhs_barriers.at[slot]
        )
        plgpu.copy_gmem_to_smem(
            rhs_gmem.at[rows, pl.ds(ni * bn, bn)], rhs_smem.at[slot], rhs_barriers.at[slot]
        )

    def zero_outside(ref, a0, lo, hi):
        rows = a0 + plgpu.layout_cast(
            jax.lax.broadcasted_iota(jnp.int32, ref.shape, 0), plgpu.Layout.WGMMA
        )
        ref[...] = jnp.where((rows >= lo) & (rows < hi), ref[...], jnp.zeros_like(ref[...]))

    start = _Cursor(*(jnp.int32(0),) * 3)

    def consume(refill):
        """The consumer's walk over its tiles; refill(s, carry) -> carry runs after box s's wgmma
        was issued and box s - 1's is done (its slot is free)."""

        def tile_loop(t, carry):
            g, j = _common.div(t, pairs), _common.rem(t, pairs)

            def with_acc(acc_ref):
                def box_loop(r, carry):
                    s, rest = carry
                    slot = _common.rem(s, stages)
                    plgpu.barrier_wait(lhs_barriers.at[slot])
                    plgpu.barrier_wait(rhs_barriers.at[slot])
                    a0, lo, hi = box(_Cursor(g, j, r))

                    @pl.when((lo > a0) | (hi < a0 + bm))
                    def _mask():
                        zero_outside(lhs_smem.at[slot], a0, lo, hi)
                        zero_outside(rhs_smem.at[slot], a0, lo, hi)
                        plgpu.commit_smem()

                    plgpu.wgmma(acc_ref, lhs_smem.at[slot].T, rhs_smem.at[slot])
                    plgpu.wgmma_wait(1)
                    return s + 1, refill(s, rest)

                done = jax.lax.fori_loop(0, group_boxes_gmem[g], box_loop, carry)
                return done, acc_ref[...]  # waits for the last wgmma

            carry, acc = pl.run_scoped(with_acc, plgpu.ACC((bk, bn)))
            ki, ni = tile(j)
            buf = _common.rem(t, 2)
            plgpu.wait_smem_to_gmem(1, wait_read_only=True)  # buf's last store has read it
            o_smem[buf] = acc.astype(o_smem.dtype)
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(
                o_smem.at[buf], out_gmem.at[g, pl.ds(ki * bk, bk), pl.ds(ni * bn, bn)]
            )
            return carry

        return tile_loop

    producer = start  # the box the ring loads next
    for i in range(stages - 1):  # the ring's first stages - 1 boxes

        @pl.when(i < total_steps)
        def _(producer=producer, i=i):
            issue(producer, i)

        producer = advance(producer)

    def refill(s, producer):  # box s - 1's slot takes the box stages - 1 ahead
        @pl.when(s + stages - 1 < total_steps)
        def _():
            issue(producer, _common.rem(s + stages - 1, stages))

        return advance(producer)

    jax.lax.fori_loop(0, pairs * num_groups, consume(refill), (jnp.int32(0), producer))
    plgpu.wait_smem_to_gmem(0, wait_read_only=True)


def tgmm(
    lhs: jax.Array,
    rhs: jax.Array,
    group_sizes: jax.Array,
    *,
    out_dtype=None,
    config: TgmmMosaicConfig | None = None,
) -> jax.Array:
    """`[G, K, N]` per-group products `lhs[rows of g]ᵀ @ rhs[rows of g]` (module docstring), Mosaic
    GPU backend.

    lhs `[M, K]`, rhs `[M, N]`, group_sizes `[G]` int32. Returns `[G, K, N]` in out_dtype (default
    lhs.dtype). Off GPU it runs in Mosaic GPU interpret mode: slow, for tests.
    """
    if lhs.ndim != 2 or rhs.ndim != 2 or lhs.shape[0] != rhs.shape[0]:
        raise ValueError(
            f"tgmm needs lhs [M, K] and rhs [M, N] with the same rows; got {lhs.shape}, {rhs.shape}."
        )
    if lhs.dtype != rhs.dtype or lhs.dtype not in DTYPES:
        raise TypeError(
            f"tgmm_mgpu needs bf16 or f16 lhs and rhs of one dtype (wgmma), got {lhs.dtype} and "
            f'{rhs.dtype}; cast them, or use implementation="pallas_triton".'
        )
    if group_sizes.ndim != 1:
        raise ValueError(f"group_sizes must be 1-D [G], got shape {group_sizes.shape}.")
    (num_rows, k_dim), n_dim = lhs.shape, rhs.shape[1]
    num_groups = group_sizes.shape[0]
    _common.check_int32_sizes(
        "tgmm_mgpu", lhs=lhs.shape, rhs=rhs.shape, out=(num_groups, k_dim, n_dim)
    )
    out_dtype = jnp.dtype(out_dtype or lhs.dtype)
    if num_groups == 0 or k_dim == 0 or n_dim == 0 or num_rows == 0:
        return jnp.zeros((num_groups, k_dim, n_dim), out_dtype)
    cfg = (config or TgmmMosaicConfig()).fit(k_dim, n_dim)
    boxes = dispatch.row_boxes(_common.clamp_group_ends(group_sizes, num_rows), cfg.block_m)
    padded_rows = max(cfg.block_m, -(-num_rows // 8) * 8)  # boxes start at multiples of 8
    if padded_rows > num_rows:
        pad = ((0, padded_rows - num_rows), (0, 0))
        lhs, rhs = jnp.pad(lhs, pad), jnp.pad(rhs, pad)
    num_ctas = _common.num_sms()
    transforms = _transforms(cfg, lhs.dtype)
    bm, bk, bn, stages = cfg.block_m, cfg.block_k, cfg.block_n, cfg.num_stages
    return plgpu.kernel(
        functools.partial(_kernel, cfg=cfg, num_ctas=num_ctas),
        out_type=jax.ShapeDtypeStruct((num_groups, k_dim, n_dim), out_dtype),
        grid=(num_ctas,),
        grid_names=("sm",),
        scratch_types=[
            plgpu.SMEM((stages, bm, bk), lhs.dtype, transforms=transforms),
            plgpu.SMEM((stages, bm, bn), rhs.dtype, transforms=transforms),
            plgpu.SMEM((2, bk, bn), out_dtype),
            plgpu.Barrier(num_arrivals=1, num_barriers=stages),
            plgpu.Barrier(num_arrivals=1, num_barriers=stages),
        ],
        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
        interpret=plgpu.InterpretGPUParams() if _common.interpret_mode() else None,
        kernel_name="tgmm_mgpu",
    )(
        jnp.sum(boxes.boxes, keepdims=True),
        boxes.group_start,
        boxes.group_end,
        boxes.boxes,
        lhs,
        rhs,
    )
