"""Transposed grouped matmul out[g] = lhs[rows of g]ᵀ @ rhs[rows of g] for Hopper, Pallas Mosaic GPU.

Math. Rows m in [0, M) are split into G contiguous groups by `group_sizes`; for each group g,
`out[g] = Σ_{m in g} lhs[m]ᵀ ⊗ rhs[m]` (`[K, N]`, float32 accumulation by wgmma). This is the weight
gradient of `gmm_mgpu.gmm`. Empty groups give exact zeros; rows past sum(group_sizes) contribute
nothing. Same contract as `kernels.tgmm.tgmm` without its row gather.

Schedule. At a few dozen rows per group (training at T = 2048) every output tile is one or two
row boxes of work, so the kernel is bound by writing [G, K, N] and by latency, not by arithmetic.
A persistent kernel (one CTA per SM; two with `ctas_per_sm=2`) therefore runs one TMA pipeline
over all of its work instead of one per tile: CTA c owns the output tiles (k-tile, n-tile)
p = c, c + C, c + 2C, ... of every group, and walks groups in order, for each group its tiles, for
each tile the group's row boxes.
The ring of `num_stages` shared-memory slots is refilled across tile and group boundaries, and a
finished tile leaves through an asynchronous TMA store from one of two output buffers while the
next tile's boxes are multiplied. All CTAs walk the groups at the same pace, so the rows being
read are one group's, in L2. On the H200 (2026-12-01, benchmarks/results/2026-12-01_h200_session7/)
this is correct but not yet fast: 1.4-1.8x the Triton kernel's time at T = 2048 (gpt-oss d
w_gate_up 2.886 against 1.681 ms) and 1.1x at T = 16384, as one warpgroup in turn waits for the
loads, masks, multiplies and issues the next loads. Two options help neither case on the H200
(session 8, gpt-oss T = 2048, d w_gate_up / d w_down against Triton's 1.674 / 0.843 ms):
`producer=True`, a warpgroup that walks the same boxes issuing the TMA loads, each slot handed
back by the consumer through an "empty" barrier (64 x 64 x 256, 4 stages: 3.120 / 1.672 ms, 2.962
/ 1.602 without); and `ctas_per_sm=2` (64 x 64 x 128, 3 stages: 2.336 / 1.891; with the producer
too 3.472 / 1.777).

Row boxes. A box is block_m rows starting at a multiple of 8 (Mosaic GPU's tiled shared memory and
TMA need it): box r of group g starts at its first row rounded down to 8, plus r·block_m. Rows of
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

from moe_pallas import _backend
from moe_pallas.kernels.gmm import check_int32_sizes, clamp_group_ends
from moe_pallas.kernels.gmm_mgpu import DTYPES, fit_block, num_sms


@dataclasses.dataclass(frozen=True)
class TgmmMosaicConfig:
    block_m: int = 64  # rows (the contraction) per box: 64 or 128
    block_k: int = 64  # output rows: the wgmma M of one warpgroup, 64
    block_n: int = 256  # output columns (the accumulator: block_k x block_n float32 registers)
    num_stages: int = 4  # shared-memory slots of the TMA ring, at least 2
    # CTAs per SM of the persistent grid: 2 lets a second CTA's loads and wgmma overlap one CTA's
    # masking and stores, if both fit in shared memory (each at most half of the 227 KiB).
    ctas_per_sm: int = 1
    # A producer warpgroup issues the TMA loads (slots handed back through "empty" barriers), so
    # the consumer warpgroup only waits, masks, multiplies and stores.
    producer: bool = False

    def fit(self, k: int, n: int) -> "TgmmMosaicConfig":
        """The largest block_k (block_n) of at most the configured size that divides K (N)."""
        if self.block_m not in (64, 128) or self.num_stages < 2 or self.ctas_per_sm not in (1, 2):
            raise ValueError(
                "tgmm_mgpu needs block_m in (64, 128), num_stages >= 2 and ctas_per_sm 1 or 2, "
                f"got {self}."
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
    empty_barriers,
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
    # values go through lax.div/rem: with jnp's // and % (jitted helpers) this kernel failed to
    # lower in jax 0.11.2 ("Shaped arrays must be represented by ir.Values").
    pairs = jax.lax.div(num_pairs - cta + num_ctas - 1, num_ctas)
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
        return jax.lax.div(p, n_tiles), jax.lax.rem(p, n_tiles)

    def box(c: _Cursor):
        """(first row of the box, [lo, hi): the rows of it that this step adds)."""
        g = jnp.minimum(c.g, num_groups - 1)
        start, end = group_start_gmem[g], group_end_gmem[g]
        nominal = jax.lax.div(start, 8) * 8 + c.r * bm
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
            g, j = jax.lax.div(t, pairs), jax.lax.rem(t, pairs)

            def with_acc(acc_ref):
                def box_loop(r, carry):
                    s, rest = carry
                    slot = jax.lax.rem(s, stages)
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
            buf = jax.lax.rem(t, 2)
            plgpu.wait_smem_to_gmem(1, wait_read_only=True)  # buf's last store has read it
            o_smem[buf] = acc.astype(o_smem.dtype)
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(
                o_smem.at[buf], out_gmem.at[g, pl.ds(ki * bk, bk), pl.ds(ni * bn, bn)]
            )
            return carry

        return tile_loop

    if not cfg.producer:
        producer = start  # the box the ring loads next
        for i in range(stages - 1):  # the ring's first stages - 1 boxes

            @pl.when(i < total_steps)
            def _(producer=producer, i=i):
                issue(producer, i)

            producer = advance(producer)

        def refill(s, producer):  # box s - 1's slot takes the box stages - 1 ahead
            @pl.when(s + stages - 1 < total_steps)
            def _():
                issue(producer, jax.lax.rem(s + stages - 1, stages))

            return advance(producer)

        jax.lax.fori_loop(0, pairs * num_groups, consume(refill), (jnp.int32(0), producer))
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)
        return

    wg = jax.lax.axis_index("wg")

    @pl.when(wg == 1)
    def _producer():
        def load(s, cursor):
            slot = jax.lax.rem(s, stages)

            @pl.when(s >= stages)
            def _():  # the consumer has finished with this slot's previous box
                plgpu.barrier_wait(empty_barriers.at[slot])

            issue(cursor, slot)
            return advance(cursor)

        jax.lax.fori_loop(0, total_steps, load, start)

    @pl.when(wg == 0)
    def _consumer():
        def hand_back(s, rest):  # box s - 1's slot is free, for box s + stages - 1 if there is one
            @pl.when((s > 0) & (s + stages - 1 < total_steps))
            def _():
                plgpu.barrier_arrive(empty_barriers.at[jax.lax.rem(s + stages - 1, stages)])

            return rest

        jax.lax.fori_loop(0, pairs * num_groups, consume(hand_back), (jnp.int32(0), jnp.int32(0)))
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
    lhs.dtype). Off GPU (`_backend.interpret_mode()`) it runs in Mosaic GPU interpret mode: slow,
    for tests.
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
    check_int32_sizes("tgmm_mgpu", lhs=lhs.shape, rhs=rhs.shape, out=(num_groups, k_dim, n_dim))
    out_dtype = jnp.dtype(out_dtype or lhs.dtype)
    if num_groups == 0 or k_dim == 0 or n_dim == 0 or num_rows == 0:
        return jnp.zeros((num_groups, k_dim, n_dim), out_dtype)
    cfg = (config or TgmmMosaicConfig()).fit(k_dim, n_dim)
    group_end = clamp_group_ends(group_sizes, num_rows)
    group_start = jnp.concatenate([jnp.zeros((1,), jnp.int32), group_end[:-1]])
    group_boxes = jnp.where(
        group_end > group_start, -(-(group_end - (group_start // 8) * 8) // cfg.block_m), 1
    ).astype(jnp.int32)
    padded_rows = max(cfg.block_m, -(-num_rows // 8) * 8)  # boxes start at multiples of 8
    if padded_rows > num_rows:
        pad = ((0, padded_rows - num_rows), (0, 0))
        lhs, rhs = jnp.pad(lhs, pad), jnp.pad(rhs, pad)
    num_ctas = cfg.ctas_per_sm * num_sms()
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
            plgpu.Barrier(num_arrivals=1, num_barriers=stages),  # empty slots (producer only)
        ],
        **({"num_threads": 2, "thread_name": "wg"} if cfg.producer else {}),
        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
        interpret=plgpu.InterpretGPUParams() if _backend.interpret_mode() else None,
        kernel_name="tgmm_mgpu",
    )(jnp.sum(group_boxes, keepdims=True), group_start, group_end, group_boxes, lhs, rhs)
