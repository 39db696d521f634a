"""Grouped matmul out[m] = lhs[m] @ rhs[group(m)] for Hopper, Pallas Mosaic GPU (wgmma, TMA).

Math. Rows m in [0, M) are split into G contiguous groups by `group_sizes`; row m of the product is
`lhs[m] @ rhs[g]` (`rhs[g]` is `[K, N]`, or `[N, K]` with `transpose_rhs`), accumulated in float32
by wgmma; the epilogue adds `bias[g]`, applies the GLU `activation` (rhs has 2·N_out columns:
two accumulators per tile, gate and up, see `_kernel`) and multiplies by `row_scale[m]`, all in
float32. Rows past sum(group_sizes) are written as zeros. Same contract as `kernels.gmm.gmm`
without its row gather: Hopper's TMA cannot gather rows, so the mosaic_gpu backend passes an
XLA-gathered copy of lhs (`moe_pallas.backends.mosaic_gpu`; an in-kernel cp.async gather was
exact but slower, docs/decisions.md).

Schedule. A persistent kernel: one CTA per SM walks the (visit, n-tile) pairs of a tile schedule
(`dispatch.tile_schedule` with align=8, see Ragged rows), read as scalars from GMEM, so the grid
does not depend on G (jax's `ragged_dot_mgpu` example unrolls a Python loop over groups instead).
Per pair, a TMA pipeline of `num_stages`
shared-memory slots streams [block_m, block_k] of lhs and [block_k, block_n] of rhs[g] into wgmma
with a [block_m, block_n] float32 accumulator; warp-specialised configs (consumers=2) have a
producer warpgroup stream a CTA tile of two such halves, side by side (split "n") or stacked
(split "m": a 2·block_m-row schedule, each consumer storing the visit's rows in its half), or
take alternate (visit, n-tile) pairs whole (split "pingpong", `_kernel_pingpong`: one consumer's
epilogue runs while the other multiplies, and a visit costs one block_m-row tile). The
epilogue's operands (bias[g] for the tile's columns, row_scale for its rows) are TMA-loaded into
shared memory when the visit starts, so they land during the main loop.

Ragged rows. Mosaic GPU tiles the swizzled shared-memory buffers in 8-row units and issues the
TMA load of lhs in those units, so a box's first row must be a multiple of 8 (layout inference
rejects an arbitrary dynamic row). The schedule therefore starts m-tiles at the group's first
row rounded down to a multiple of 8: a visit computes the block_m rows from `m_start` on and owns
rows [row_start, row_end) of them (rows before row_start belong to the previous group and are
computed, not stored). A group of at most
block_m - 7 rows is still one visit. The box is clamped to end inside lhs (lhs is padded to a
multiple of 8 rows, and to block_m rows, when it is shorter). A visit's rows are written from a
shared-memory copy of the tile by a ladder of TMA stores of 2^i rows (one per set bit of the row
count, at most log2(block_m) + 1, as in jax's ragged_dot_mgpu example): no other row is touched,
so neighbouring visits never overwrite each other. Rows past sum(group_sizes) form a pseudo-group
G whose visits store zeros.

Configs. `MosaicConfig`; the mosaic_gpu backend picks one per shape (the tuning table's, else its
default rule). Tiles are at least 64 columns (128 bytes of 16-bit values, the widest swizzle): on
the H200, 32- and 16-column tiles failed at run time with CUDA_ERROR_MISALIGNED_ADDRESS, while
interpret mode ran them.

The H200's table runs gpt-oss's 2880 x 2880 products on 128 x 192 ping-pong tiles, which match
XLA's batched dot on equal groups; a group's last visit computes a whole tile, as a half-height
tile for a short last visit is slower there, and two short visits sharing one tile (two weight
blocks a k-step) stall the ring (docs/decisions.md).

Limits (ValueError, use the Triton backend instead): bf16/f16 operands of one dtype, block_n >= 64,
N a multiple of block_n and K of block_k (both workloads' dimensions are multiples of 64); a GLU
only with a non-transposed rhs and consumers=1, or SwiGLU with split "m" (ping-pong has none).
"""

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from moe_pallas import dispatch
from moe_pallas.activations import glu
from moe_pallas.kernels import _common

DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


def accepts(*operands: jax.Array) -> bool:
    """Whether wgmma takes these operands: one 16-bit floating dtype for all of them."""
    dtypes = {jnp.dtype(x.dtype) for x in operands}
    return len(dtypes) == 1 and dtypes.pop() in DTYPES


def fit_block(kernel: str, block: int, dim: int, name: str, unit: int) -> int:
    """The largest block of at most `block` elements, a multiple of `unit`, that divides `dim`."""
    for b in (block, 512, 384, 256, 192, 128, 64, 32, 16):
        if b <= block and b % unit == 0 and dim % b == 0:
            return b
    raise ValueError(
        f"{kernel}: {name}={dim} is not a multiple of {unit}, which this Mosaic GPU config needs "
        '(TMA boxes, wgmma); use implementation="pallas_triton", which masks tails.'
    )


MIN_BLOCK_N = 64  # module docstring, Configs


@dataclasses.dataclass(frozen=True)
class MosaicConfig:
    block_m: int = 128  # wgmma M: a multiple of 64 (one warpgroup)
    block_n: int = 128
    block_k: int = 64  # 64 bf16 = 128 bytes: the widest TMA swizzle
    num_stages: int = 4  # shared-memory slots of the TMA ring
    grid_tile_n: int = 4  # planar-snake band width over n-tiles (L2 reuse of lhs and rhs)
    # 1: one warpgroup issues TMA and wgmma; 2: warp-specialised, a producer warpgroup feeds two
    # consumer warpgroups that each own a [block_m, block_n] half of the CTA's tile: its columns
    # (split "n": a [block_m, 2 * block_n] tile) or its rows (split "m": [2 * block_m, block_n],
    # the layout of jax's hopper_matmul_mgpu example at its fastest on the H200); or, split
    # "pingpong", whole [block_m, block_n] tiles of their own, alternately (`_kernel_pingpong`).
    consumers: int = 1
    split: str = "n"
    # pingpong: the epilogue stores its tile in [block_m, epi_n] column chunks through one
    # shared-memory buffer per consumer (None: the whole tile), leaving room for ring slots.
    epi_n: int | None = None

    @property
    def cta_m(self) -> int:
        """Rows of the CTA's tile: the schedule's tile height."""
        return 2 * self.block_m if self.consumers == 2 and self.split == "m" else self.block_m

    def fit(self, n: int, k: int) -> "MosaicConfig":
        """The largest block_n (block_k) of at most the configured size that divides N (K)."""
        if self.split not in ("n", "m", "pingpong"):
            raise ValueError(f'MosaicConfig.split={self.split!r} must be "n", "m" or "pingpong".')
        if self.split == "pingpong" and self.consumers != 2:
            raise ValueError(
                f'MosaicConfig(split="pingpong") needs consumers=2, got {self.consumers}.'
            )
        if self.epi_n is not None and (
            self.split != "pingpong" or self.epi_n < MIN_BLOCK_N or self.epi_n % MIN_BLOCK_N
        ):
            raise ValueError(
                f'MosaicConfig.epi_n={self.epi_n} needs split="pingpong" and a multiple of '
                f"{MIN_BLOCK_N} columns (the epilogue's shared-memory copies), or None."
            )
        if self.block_n < MIN_BLOCK_N:
            raise ValueError(
                f"MosaicConfig.block_n={self.block_n} must be at least {MIN_BLOCK_N} (128 bytes of "
                "16-bit values): narrower tiles fail with a misaligned address on the H200."
            )
        # Two consumers split the tile's columns at a 64-column (128-byte swizzle) boundary.
        column_parts = 2 if self.consumers == 2 and self.split == "n" else 1
        unit = 128 if column_parts == 2 else 16
        cta_n = fit_block("gmm_mgpu", column_parts * self.block_n, n, "N", unit)
        if cta_n // column_parts < MIN_BLOCK_N:
            raise ValueError(
                f"gmm_mgpu: N={n} has no tile width of {MIN_BLOCK_N} to {self.block_n} columns "
                "that divides it (narrower tiles misalign the epilogue's shared-memory copies); "
                'use implementation="pallas_triton", which masks tails.'
            )
        block_n = cta_n // column_parts
        epi_n = self.epi_n
        if epi_n is not None and block_n % epi_n:
            epi_n = block_n  # a tile fitted to N that the chunks do not divide is stored whole
        return dataclasses.replace(
            self,
            block_n=block_n,
            block_k=fit_block("gmm_mgpu", self.block_k, k, "K", 16),
            epi_n=epi_n,
        )


class _Epilogue(NamedTuple):
    """GMEM operands of the epilogue (None when absent) and their shared-memory landing slots.

    bias is read as `[G, parts, N / parts]`: parts = 2 for SwiGLU (gate and up halves), else 1.
    """

    bias_gmem: object  # [G, parts, N / parts] float32
    row_scale_gmem: object  # [lhs_rows] float32
    activation: str | None
    bias_smem: object  # [parts, block_n] float32
    row_scale_smem: object  # [block_m] float32
    bias_barrier: object
    row_scale_barrier: object

    @classmethod
    def of(cls, bias_gmem, row_scale_gmem, activation, scratch: dict, copy) -> "_Epilogue":
        """The epilogue in slot `copy` of `_epilogue_scratch`'s shared memory (one per consumer
        warpgroup)."""
        names = ("bias_smem", "row_scale_smem", "bias_barriers", "row_scale_barriers")
        return cls(bias_gmem, row_scale_gmem, activation, *(scratch[n].at[copy] for n in names))

    def start(self, g, a0, col0):
        """Issue the TMA loads of bias[g, :, col0:col0+bn] and row_scale[a0:a0+bm]."""
        if self.bias_gmem is not None:
            bn = self.bias_smem.shape[1]
            plgpu.copy_gmem_to_smem(
                self.bias_gmem.at[g, :, pl.ds(col0, bn)], self.bias_smem, self.bias_barrier
            )
        if self.row_scale_gmem is not None:
            bm = self.row_scale_smem.shape[0]
            plgpu.copy_gmem_to_smem(
                self.row_scale_gmem.at[pl.ds(a0, bm)], self.row_scale_smem, self.row_scale_barrier
            )

    def apply(self, *accs):
        """glu(acc + bias[None, :]) * row_scale[:, None] in float32 (one acc per part); waits for
        `start`'s loads."""
        if self.bias_gmem is not None:
            plgpu.barrier_wait(self.bias_barrier)
            accs = [
                acc + jax.lax.broadcast_in_dim(self.bias_smem[p], acc.shape, (1,))
                for p, acc in enumerate(accs)
            ]
        out = glu(*accs, self.activation) if self.activation else accs[0]
        if self.row_scale_gmem is not None:
            plgpu.barrier_wait(self.row_scale_barrier)
            out = out * jax.lax.broadcast_in_dim(self.row_scale_smem[...], out.shape, (0,))
        return out


def _epilogue_scratch(copies: int, parts: int, bm: int, bn: int) -> dict:
    """Shared memory for `copies` epilogues (one per consumer warpgroup)."""
    return {
        "bias_smem": plgpu.SMEM((copies, parts, bn), jnp.float32),
        "row_scale_smem": plgpu.SMEM((copies, bm), jnp.float32),
        "bias_barriers": plgpu.Barrier(num_arrivals=1, num_barriers=copies),
        "row_scale_barriers": plgpu.Barrier(num_arrivals=1, num_barriers=copies),
    }


def _optional_refs(refs, has_bias: bool, has_row_scale: bool) -> tuple:
    """(bias, row_scale, out) from a kernel's trailing refs, the absent operands as None."""
    it = iter(refs)
    bias = next(it) if has_bias else None
    row_scale = next(it) if has_row_scale else None
    return bias, row_scale, next(it)


def _store_rows(o_smem, out_gmem, a0, row_start, size, col0):
    """Store rows [row_start, row_start + size) of the tile o_smem (whose row 0 is lhs row a0) to
    out_gmem at columns [col0, col0 + width): one TMA box per set bit of size."""
    plgpu.commit_smem()
    bm, width = o_smem.shape
    offset = row_start - a0
    rows = bm
    while rows:

        @pl.when(size & rows != 0)
        def _(offset=offset, rows=rows):  # traced at once; defaults for lint
            plgpu.copy_smem_to_gmem(
                o_smem.at[pl.ds(offset, rows)],
                out_gmem.at[pl.ds(a0 + offset, rows), pl.ds(col0, width)],
            )

        offset += size & rows
        rows //= 2
    plgpu.wait_smem_to_gmem(0, wait_read_only=True)


def _kernel_ws(
    group_gmem,
    tile8_gmem,
    row_start_gmem,
    row_end_gmem,
    lhs_gmem,
    rhs_gmem,
    *refs,
    num_groups: int,
    num_visits: int,
    cfg: MosaicConfig,
    transpose_rhs: bool,
    has_bias: bool,
    has_row_scale: bool,
    activation: str | None,
):
    """Warp-specialised `_kernel`: warpgroup 2 issues the TMA loads of the CTA's tile
    ([block_m, 2 * block_n], or [2 * block_m, block_n] with split "m"), warpgroups 0 and 1 run
    wgmma on its two column (row) halves and store the rows of the visit that fall in theirs.
    SwiGLU (split "m" only) reads the gate and the up block per step, as `_kernel` does, into two
    accumulators per consumer."""
    bias_gmem, row_scale_gmem, out_gmem = _optional_refs(refs, has_bias, has_row_scale)
    lhs_rows, k_dim = lhs_gmem.shape
    n_dim = out_gmem.shape[1]  # of the output: N / 2 columns with a GLU
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    by_rows = cfg.split == "m"
    cta_m, cta_n = (2 * bm, bn) if by_rows else (bm, 2 * bn)
    n_tiles = n_dim // cta_n
    parts = 2 if activation else 1  # rhs blocks and accumulators: SwiGLU's gate and up

    def pipeline(body, compute_context):
        rhs_spec = plgpu.BlockSpec(
            (cta_n, bk) if transpose_rhs else (bk, cta_n),
            (lambda kk: (0, kk)) if transpose_rhs else (lambda kk: (kk, 0)),
            memory_space=plgpu.SMEM,
        )
        return plgpu.emit_pipeline_warp_specialized(
            body,
            grid=(k_dim // bk,),
            memory_registers=40,
            in_specs=[
                plgpu.BlockSpec((cta_m, bk), lambda kk: (0, kk), memory_space=plgpu.SMEM),
                *[rhs_spec] * parts,
            ],
            wg_axis="wg",
            num_compute_wgs=2,
            max_concurrent_steps=cfg.num_stages,
            compute_context=compute_context,
        )

    def rhs_windows(g, col0):  # SwiGLU's up block lies N_out columns right of its gate block
        rhs_g = rhs_gmem.at[jnp.minimum(g, num_groups - 1)]
        cols = [pl.ds(col0 + p * n_dim, cta_n) for p in range(parts)]
        return [rhs_g.at[c] if transpose_rhs else rhs_g.at[:, c] for c in cols]

    ignore = lambda *_, **__: None  # allocations do not depend on the bodies

    @functools.partial(
        pl.run_scoped,
        allocs=pipeline(ignore, ignore).get_allocations(
            lhs_gmem.at[pl.ds(0, cta_m)], *rhs_windows(0, 0)
        ),
        o_smem=plgpu.SMEM((2, bm, bn), out_gmem.dtype),
        **_epilogue_scratch(2, parts, bm, bn),
        collective_axes="wg",
    )
    def _scope(allocs, o_smem, **epilogue_scratch):
        wg = jax.lax.axis_index("wg")
        wg_cols = slice(None) if by_rows else pl.ds(wg * bn, bn)
        epilogue = _Epilogue.of(bias_gmem, row_scale_gmem, activation, epilogue_scratch, wg)

        @plgpu.nd_loop((num_visits * n_tiles,), collective_axes="sm")
        def _visit(info: plgpu.NDLoopInfo):
            v, ni = plgpu.planar_snake(info.index[0], (num_visits, n_tiles), 1, cfg.grid_tile_n)
            g = group_gmem[v]
            row_start = row_start_gmem[v]
            size = row_end_gmem[v] - row_start
            a0 = pl.multiple_of(jnp.minimum(tile8_gmem[v], (lhs_rows - cta_m) // 8) * 8, 8)
            col0 = ni * cta_n
            # This warpgroup's [bm, bn] part: rows from wg_a0, columns from wg_col0, and the
            # visit's rows [wg_start, wg_start + wg_size) inside it.
            if by_rows:
                wg_a0, wg_col0 = a0 + wg * bm, col0
                wg_start = jnp.clip(row_start, wg_a0, wg_a0 + bm)
                wg_size = jnp.clip(row_start + size, wg_a0, wg_a0 + bm) - wg_start
            else:
                wg_a0, wg_col0, wg_start, wg_size = a0, col0 + wg * bn, row_start, size

            def compute_context(eval_pipeline):
                def _(*acc_refs):
                    epilogue.start(g, wg_a0, wg_col0)
                    eval_pipeline(acc_refs)
                    out = epilogue.apply(*(acc_ref[...] for acc_ref in acc_refs))
                    o_smem[wg] = out.astype(o_smem.dtype)
                    _store_rows(o_smem.at[wg], out_gmem, wg_a0, wg_start, wg_size, wg_col0)

                pl.run_scoped(_, *[plgpu.ACC((bm, bn), jnp.float32)] * parts)

            def mma(_, a_smem, *rest):
                *b_smems, acc_refs = rest
                a = a_smem.at[pl.ds(wg * bm, bm)] if by_rows else a_smem
                for acc_ref, b_smem in zip(acc_refs, b_smems):
                    plgpu.wgmma(
                        acc_ref, a, b_smem.at[wg_cols].T if transpose_rhs else b_smem.at[:, wg_cols]
                    )
                plgpu.wgmma_wait(0)
                return acc_refs

            @pl.when((size > 0) & (g < num_groups))
            def _grouped_rows():
                pipeline(mma, compute_context)(
                    lhs_gmem.at[pl.ds(a0, cta_m)], *rhs_windows(g, col0), allocations=allocs
                )

            @pl.when((size > 0) & (g == num_groups) & (wg < 2))
            def _tail_rows():
                o_smem[wg] = jnp.zeros((bm, bn), o_smem.dtype)
                _store_rows(o_smem.at[wg], out_gmem, wg_a0, wg_start, wg_size, wg_col0)


def _kernel_pingpong(
    group_gmem,
    tile8_gmem,
    row_start_gmem,
    row_end_gmem,
    lhs_gmem,
    rhs_gmem,
    *refs,
    num_groups: int,
    num_visits: int,
    num_ctas: int,
    cfg: MosaicConfig,
    transpose_rhs: bool,
    has_bias: bool,
    has_row_scale: bool,
    activation: str | None,
):
    """Split "pingpong": consumer warpgroup c in {0, 1} takes the CTA's items (a visit's
    [block_m, block_n] tile) i with i % 2 == c, whole, so one multiplies while the other runs its
    epilogue, and a visit costs one tile (split "m" computes two block_m halves however few rows the
    visit holds). Warpgroup 2 streams every item's k-steps, in item order, into one ring of
    `num_stages` slots: the CTA's step s (counted over the items that multiply) lands in slot
    s % num_stages and completes full[c, slot] for the item's consumer c, so each barrier has one
    waiter and Mosaic GPU's implicit phase tracking holds; the consumer releases a slot on
    empty[slot] once the wgmma reading it is done (one wgmma group kept in flight)."""
    del activation  # refused by `gmm`
    bias_gmem, row_scale_gmem, out_gmem = _optional_refs(refs, has_bias, has_row_scale)
    lhs_rows, k_dim = lhs_gmem.shape
    n_dim = out_gmem.shape[1]
    bm, bn, bk, stages = cfg.block_m, cfg.block_n, cfg.block_k, cfg.num_stages
    epi_n = cfg.epi_n or bn
    n_tiles, k_steps = n_dim // bn, k_dim // bk
    cta = jax.lax.axis_index("sm")
    items = _common.div(num_visits * n_tiles - cta + num_ctas - 1, num_ctas)

    def item(i):
        """(group, first owned row, owned rows, the lhs box's first row, n-tile, multiplies)."""
        v, ni = plgpu.planar_snake(cta + i * num_ctas, (num_visits, n_tiles), 1, cfg.grid_tile_n)
        g = group_gmem[v]
        row_start = row_start_gmem[v]
        size = row_end_gmem[v] - row_start
        a0 = pl.multiple_of(jnp.minimum(tile8_gmem[v], (lhs_rows - bm) // 8) * 8, 8)
        return g, row_start, size, a0, ni, (size > 0) & (g < num_groups)

    def store(o_smem, tile, a0, row_start, size, col0):
        for c in range(bn // epi_n):
            o_smem[...] = tile(c).astype(o_smem.dtype)
            _store_rows(o_smem, out_gmem, a0, row_start, size, col0 + c * epi_n)

    def body(lhs_smem, rhs_smem, o_smem, full, empty, epi):
        wg = jax.lax.axis_index("wg")

        @pl.when(wg < 2)
        def _consumer():
            plgpu.set_max_registers(232, action="increase")
            epilogue = _Epilogue.of(bias_gmem, row_scale_gmem, None, epi, wg)

            def product(s, acc_ref):
                def step(kk, carry):
                    slot = _common.rem(s + kk, stages)
                    plgpu.barrier_wait(full.at[wg * stages + slot])
                    b = rhs_smem.at[slot]
                    plgpu.wgmma(acc_ref, lhs_smem.at[slot], b.T if transpose_rhs else b)
                    plgpu.wgmma_wait(1)

                    @pl.when(kk > 0)  # the previous step's wgmma is done: release its slot
                    def _():
                        plgpu.barrier_arrive(empty.at[_common.rem(s + kk + stages - 1, stages)])

                    return carry

                jax.lax.fori_loop(0, k_steps, step, jnp.int32(0))
                plgpu.wgmma_wait(0)
                plgpu.barrier_arrive(empty.at[_common.rem(s + k_steps - 1, stages)])
                return acc_ref[...]

            def per_item(i, s):
                g, row_start, size, a0, ni, multiplies = item(i)
                mine = _common.rem(i, 2) == wg

                @pl.when(mine & multiplies)
                def _grouped_rows():
                    epilogue.start(g, a0, ni * bn)
                    acc = pl.run_scoped(functools.partial(product, s), plgpu.ACC((bm, bn)))
                    out = epilogue.apply(acc)
                    chunk = lambda c: out[:, c * epi_n : (c + 1) * epi_n]
                    store(o_smem.at[wg], chunk, a0, row_start, size, ni * bn)

                @pl.when(mine & (size > 0) & (g == num_groups))
                def _tail_rows():
                    zeros = lambda c: jnp.zeros((bm, epi_n), jnp.float32)
                    store(o_smem.at[wg], zeros, a0, row_start, size, ni * bn)

                return s + jnp.where(multiplies, k_steps, 0)

            jax.lax.fori_loop(0, items, per_item, jnp.int32(0))

        @pl.when(wg == 2)
        def _producer():
            plgpu.set_max_registers(40, action="decrease")

            def per_item(i, s):
                g, _, _, a0, ni, multiplies = item(i)
                consumer = _common.rem(i, 2)

                @pl.when(multiplies)
                def _():
                    rhs_g = rhs_gmem.at[jnp.minimum(g, num_groups - 1)]

                    def step(kk, carry):
                        slot = _common.rem(s + kk, stages)

                        @pl.when(s + kk >= stages)
                        def _():
                            plgpu.barrier_wait(empty.at[slot])

                        cols, ks = pl.ds(ni * bn, bn), pl.ds(kk * bk, bk)
                        barrier = full.at[consumer * stages + slot]
                        plgpu.copy_gmem_to_smem(
                            lhs_gmem.at[pl.ds(a0, bm), ks], lhs_smem.at[slot], barrier
                        )
                        plgpu.copy_gmem_to_smem(
                            rhs_g.at[cols, ks] if transpose_rhs else rhs_g.at[ks, cols],
                            rhs_smem.at[slot],
                            barrier,
                        )
                        return carry

                    jax.lax.fori_loop(0, k_steps, step, jnp.int32(0))

                return s + jnp.where(multiplies, k_steps, 0)

            steps = jax.lax.fori_loop(0, items, per_item, jnp.int32(0))

            @pl.loop(jnp.maximum(steps - stages, 0), steps)
            def _(s):  # the last releases, so that every phase of `empty` is consumed
                plgpu.barrier_wait(empty.at[_common.rem(s, stages)])

    pl.run_scoped(
        body,
        plgpu.SMEM((stages, bm, bk), lhs_gmem.dtype),
        plgpu.SMEM((stages, bn, bk) if transpose_rhs else (stages, bk, bn), rhs_gmem.dtype),
        plgpu.SMEM((2, bm, epi_n), out_gmem.dtype),
        plgpu.Barrier(num_arrivals=2, num_barriers=2 * stages),  # full[consumer, slot]
        plgpu.Barrier(num_arrivals=1, num_barriers=stages),  # empty[slot]
        _epilogue_scratch(2, 1, bm, bn),
        collective_axes="wg",
    )


def _kernel(
    group_gmem,
    tile8_gmem,
    row_start_gmem,
    row_end_gmem,
    lhs_gmem,
    rhs_gmem,
    *refs,
    num_groups: int,
    num_visits: int,
    cfg: MosaicConfig,
    transpose_rhs: bool,
    has_bias: bool,
    has_row_scale: bool,
    activation: str | None,
):
    """One warpgroup per CTA issues the TMA loads and the wgmma of [block_m, block_n] tiles; with
    SwiGLU, two accumulators (gate and up) from the two contiguous column halves of rhs; with
    gpt-oss, rhs arrives as uint32 [G, K, N / 2] (a (gate, up) bf16 pair per word) and each step
    splits its slot into gate and up halves in shared memory (double-buffered by step parity)."""
    bias_gmem, row_scale_gmem, out_gmem = _optional_refs(refs, has_bias, has_row_scale)
    lhs_rows, k_dim = lhs_gmem.shape
    n_dim = out_gmem.shape[1]
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    n_tiles = n_dim // bn  # of the output: N / 2 columns with a GLU
    k_steps, stages = k_dim // bk, cfg.num_stages
    parts = 2 if activation else 1
    interleaved = activation == "gptoss"
    scratch = {"halves_smem": plgpu.SMEM((2, 2, bk, bn), lhs_gmem.dtype)} if interleaved else {}

    @functools.partial(pl.run_scoped, **_epilogue_scratch(1, parts, bm, bn), **scratch)
    def _scope(halves_smem=None, **epilogue_scratch):
        epilogue = _Epilogue.of(bias_gmem, row_scale_gmem, activation, epilogue_scratch, 0)

        @plgpu.nd_loop((num_visits * n_tiles,), collective_axes="sm")
        def _visit(info: plgpu.NDLoopInfo):
            v, ni = plgpu.planar_snake(info.index[0], (num_visits, n_tiles), 1, cfg.grid_tile_n)
            g = group_gmem[v]
            row_start = row_start_gmem[v]
            size = row_end_gmem[v] - row_start
            # The lhs box: 8-row aligned (see the module docstring), ending inside lhs.
            a0 = pl.multiple_of(jnp.minimum(tile8_gmem[v], (lhs_rows - bm) // 8) * 8, 8)

            def product(*acc_refs):
                def step(idx, *smems):
                    a_smem, *b_smems = smems
                    if interleaved:
                        # The low 16 bits of a word are the gate (the even column), the high the up.
                        words = b_smems[0][...]
                        slot = halves_smem.at[idx[0] % 2]
                        for p, bits in enumerate((words & 0xFFFF, words >> 16)):
                            slot[p] = jax.lax.bitcast_convert_type(
                                bits.astype(jnp.uint16), slot.dtype
                            )
                        plgpu.commit_smem()
                        b_smems = (slot.at[0], slot.at[1])
                    for acc_ref, b_smem in zip(acc_refs, b_smems):
                        plgpu.wgmma(acc_ref, a_smem, b_smem.T if transpose_rhs else b_smem)
                    # This step's wgmma groups stay in flight; the previous step's have read
                    # their slots before the pipeline (or the next split) refills them.
                    plgpu.wgmma_wait(parts)

                # Column tile of part p: ni + p * n_tiles (SwiGLU's up half follows the gate).
                rhs_specs = [
                    plgpu.BlockSpec(
                        (bn, bk) if transpose_rhs else (bk, bn),
                        (lambda kk, c=ni + p * n_tiles: (c, kk))
                        if transpose_rhs
                        else (lambda kk, c=ni + p * n_tiles: (kk, c)),
                        delay_release=1,
                    )
                    for p in range(1 if interleaved else parts)
                ]
                rhs_g = rhs_gmem.at[jnp.minimum(g, num_groups - 1)]
                lhs_spec = plgpu.BlockSpec((bm, bk), lambda kk: (0, kk), delay_release=1)
                plgpu.emit_pipeline(
                    step,
                    grid=(k_steps,),
                    in_specs=[lhs_spec, *rhs_specs],
                    max_concurrent_steps=stages,
                )(lhs_gmem.at[pl.ds(a0, bm)], *[rhs_g] * len(rhs_specs))
                return tuple(acc_ref[...] for acc_ref in acc_refs)

            @pl.when(size > 0)
            def _store():
                @functools.partial(pl.run_scoped, o_smem=plgpu.SMEM((bm, bn), out_gmem.dtype))
                def _(o_smem):
                    @pl.when(g < num_groups)
                    def _grouped_rows():
                        epilogue.start(g, a0, ni * bn)
                        accs = pl.run_scoped(product, *[plgpu.ACC((bm, bn))] * parts)
                        o_smem[...] = epilogue.apply(*accs).astype(o_smem.dtype)

                    @pl.when(g == num_groups)
                    def _tail_rows():
                        o_smem[...] = jnp.zeros((bm, bn), o_smem.dtype)

                    _store_rows(o_smem, out_gmem, a0, row_start, size, ni * bn)


def gmm(
    lhs: jax.Array,
    rhs: jax.Array,
    group_sizes: jax.Array,
    *,
    transpose_rhs: bool = False,
    bias: jax.Array | None = None,
    activation: str | None = None,
    row_scale: jax.Array | None = None,
    out_dtype=None,
    config: MosaicConfig | None = None,
) -> jax.Array:
    """Grouped matmul (see the module docstring) with the Mosaic GPU backend.

    lhs `[M, K]`, rhs `[G, K, N]` (`[G, N, K]` if transpose_rhs), group_sizes `[G]` int32, bias
    `[G, N]` in rhs's column layout, activation None | "swiglu" | "gptoss" (then N = 2·N_out, in
    the activation's column layout, see `moe_pallas.activations`), row_scale `[≥M]` (bias and
    row_scale floating, applied in float32), config (default 128 x 128 tiles, a GLU's 128 x 64).
    Returns
    `[M, N_out]` in out_dtype (default lhs.dtype). Off GPU it runs in Mosaic GPU interpret mode:
    slow, for tests.
    """
    if lhs.ndim != 2 or rhs.ndim != 3:
        raise ValueError(f"gmm needs lhs [M, K] and rhs [G, K, N]; got {lhs.shape}, {rhs.shape}.")
    if lhs.dtype != rhs.dtype or lhs.dtype not in DTYPES:
        raise TypeError(
            f"gmm_mgpu needs bf16 or f16 lhs and rhs of one dtype (wgmma), got {lhs.dtype} and "
            f'{rhs.dtype}; cast them, or use implementation="pallas_triton".'
        )
    if activation not in (None, "swiglu", "gptoss"):
        raise ValueError(f"gmm_mgpu: activation={activation!r} must be None, 'swiglu' or 'gptoss'.")
    num_groups, k_dim, n_dim = _common.grouped_dims(lhs, rhs, group_sizes, transpose_rhs)
    num_rows = lhs.shape[0]
    # A GLU tile reads 2·block_n weight columns: half the output columns keep its ring in SMEM.
    config = config or MosaicConfig(block_n=64 if activation else 128)
    ws = config.consumers == 2
    ws_glu_ok = activation != "gptoss" and config.split == "m"
    if activation and (transpose_rhs or n_dim % 2 or (ws and not ws_glu_ok)):
        raise ValueError(
            "gmm_mgpu: a GLU activation needs a non-transposed rhs with an even column count, and "
            'consumers=1 (or, for SwiGLU, split="m"): gpt-oss\'s interleaved pairs are split in '
            'one warpgroup\'s shared memory, and split="pingpong" has no GLU epilogue; got '
            f"transpose_rhs={transpose_rhs}, N={n_dim}, config={config}."
        )
    _common.check_epilogue(num_groups, n_dim, num_rows, bias, row_scale)
    parts = 2 if activation else 1
    n_out = n_dim // parts
    _common.check_int32_sizes("gmm_mgpu", lhs=lhs.shape, rhs=rhs.shape, out=(num_rows, n_out))
    out_dtype = jnp.dtype(out_dtype or lhs.dtype)
    if num_rows == 0 or n_out == 0 or k_dim == 0:
        return jnp.zeros((num_rows, n_out), out_dtype)
    cfg = config.fit(n_out, k_dim)
    sched = dispatch.tile_schedule(
        _common.clamp_group_ends(group_sizes, num_rows), num_rows, cfg.cta_m, align=8
    )
    # TMA boxes of cta_m rows at multiples of 8 must fit in lhs: pad short or ragged ones (a copy;
    # M = T·k is a multiple of 8 for k = 8, and for k = 4 at even T).
    lhs_rows = max(-(-num_rows // 8) * 8, cfg.cta_m)
    if lhs_rows > num_rows:
        lhs = jnp.pad(lhs, ((0, lhs_rows - num_rows), (0, 0)))
    if activation == "gptoss":  # one uint32 word per interleaved (gate, up) pair: a free bitcast
        rhs = jax.lax.bitcast_convert_type(rhs.reshape(num_groups, k_dim, n_out, 2), jnp.uint32)
    operands = [sched.group, sched.m_start // 8, sched.row_start, sched.row_end, lhs, rhs]
    if bias is not None:  # [G, parts, N_out]: the gate and up halves (a small copy for gpt-oss)
        bias = bias.astype(jnp.float32)
        if activation == "gptoss":
            bias = jnp.swapaxes(bias.reshape(num_groups, n_out, 2), 1, 2)
        operands.append(bias.reshape(num_groups, parts, n_out))
    if row_scale is not None:  # read in the lhs box's rows
        row_scale = row_scale[:num_rows].astype(jnp.float32)
        operands.append(jnp.pad(row_scale, (0, lhs_rows - num_rows)))
    if cfg.split == "pingpong":
        body = functools.partial(_kernel_pingpong, num_ctas=_common.num_sms())
    else:
        body = _kernel if cfg.consumers == 1 else _kernel_ws
    kernel = functools.partial(
        body,
        activation=activation,
        num_groups=num_groups,
        num_visits=sched.group.shape[0],
        cfg=cfg,
        transpose_rhs=transpose_rhs,
        has_bias=bias is not None,
        has_row_scale=row_scale is not None,
    )
    out = plgpu.kernel(
        kernel,
        out_type=jax.ShapeDtypeStruct((lhs_rows, n_out), out_dtype),
        grid=(_common.num_sms(),),
        grid_names=("sm",),
        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
        interpret=plgpu.InterpretGPUParams() if _common.interpret_mode() else None,
        num_threads=None if cfg.consumers == 1 else 3,
        thread_name=None if cfg.consumers == 1 else "wg",
        kernel_name="gmm_mgpu" + ("_t" if transpose_rhs else ""),
    )(*operands)
    return out[:num_rows] if lhs_rows > num_rows else out
