"""Grouped matmul out[m] = lhs[m] @ rhs[group(m)] for Hopper, Pallas Mosaic GPU (wgmma, TMA).

Math. Rows m in [0, M) are split into G contiguous groups by `group_sizes`; row m of the product is
`lhs[m] @ rhs[g]` (`rhs[g]` is `[K, N]`, or `[N, K]` with `transpose_rhs`), accumulated in float32
by wgmma; the epilogue adds `bias[g]`, applies the GLU `activation` (rhs has 2·N_out columns:
two accumulators per tile, gate and up, see `_kernel`) and multiplies by `row_scale[m]`, all in
float32. Rows past sum(group_sizes) are written as zeros. Same contract as `kernels.gmm.gmm`,
its row gather included: with `lhs_row_index`, row m reads lhs[lhs_row_index[m]], copied into the
kernel's own shared-memory ring by `kernels.row_gather_mgpu` (cp.async; Hopper's TMA cannot gather
rows) where the config allows (one consumer, 128-byte k-blocks), else from an XLA-gathered copy.
Exact, but on the H200 slower than the copy, so the layer passes the copy (`ops.gmm_on_backend`).

Schedule. A persistent kernel: one CTA per SM walks the (visit, n-tile) pairs of a tile schedule,
read as scalars from GMEM, so the grid does not depend on G (jax's `ragged_dot_mgpu` example
unrolls a Python loop over groups instead). Per pair, a TMA pipeline of `num_stages`
shared-memory slots streams [block_m, block_k] of lhs and [block_k, block_n] of rhs[g] into wgmma
with a [block_m, block_n] float32 accumulator; warp-specialised configs (consumers=2) have a
producer warpgroup stream a CTA tile of two such halves, side by side (split "n") or stacked
(split "m": a 2·block_m-row schedule, each consumer storing the visit's rows in its half). The
epilogue's operands (bias[g] for the tile's columns, row_scale for its rows) are TMA-loaded into
shared memory when the visit starts, so they land during the main loop.

Ragged rows. Mosaic GPU tiles the swizzled shared-memory buffers in 8-row units and issues the
TMA load of lhs in those units, so a box's first row must be a multiple of 8 (layout inference
rejects an arbitrary dynamic row). The schedule is therefore `dispatch.tile_schedule` with its
m-tiles started at the group's first row rounded down to a multiple of 8: a visit computes the
block_m rows from `8 * tile8` on and owns rows [row_start, row_end) of them (rows before
row_start belong to the previous group and are computed, not stored). A group of at most
block_m - 7 rows is still one visit. The box is clamped to end inside lhs (lhs is padded to a
multiple of 8 rows, and to block_m rows, when it is shorter). A visit's rows are written from a
shared-memory copy of the tile by a ladder of TMA stores of 2^i rows (one per set bit of the row
count, at most log2(block_m) + 1, as in jax's ragged_dot_mgpu example): no other row is touched,
so neighbouring visits never overwrite each other. Rows past sum(group_sizes) form a pseudo-group
G whose visits store zeros.

Configs. A call without one gets `default_config`: 128 x 128 tiles (GLU 128 x 64), and for decode
(at most 16 rows per group) 64-row tiles, 64 columns wide and deeper rings. Tiles are at least 64
columns (128 bytes of 16-bit values, the widest swizzle): on the H200, 32- and 16-column tiles
failed at run time with CUDA_ERROR_MISALIGNED_ADDRESS, in every layer call at decode shapes
(benchmarks/results/2026-12-01_h200_session7/), while interpret mode ran them.

Limits (ValueError, use the Triton backend instead): bf16/f16 operands of one dtype, block_n >= 64,
N a multiple of block_n and K of block_k (both workloads' dimensions are multiples of 64); a GLU
only with a non-transposed rhs and consumers=1, or SwiGLU with split "m".
"""

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from moe_pallas import _backend, dispatch
from moe_pallas.activations import glu
from moe_pallas.kernels import config as _config
from moe_pallas.kernels import row_gather_mgpu as _row_gather
from moe_pallas.kernels.gmm import check_int32_sizes, clamp_group_ends, grouped_dims

DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


def accepts(*operands: jax.Array) -> bool:
    """Whether wgmma takes these operands: one 16-bit floating dtype for all of them."""
    dtypes = {jnp.dtype(x.dtype) for x in operands}
    return len(dtypes) == 1 and dtypes.pop() in DTYPES


_INTERPRET_SMS = 2  # CTAs in interpret mode: enough to exercise the persistent loop's striding


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
    # the layout of jax's hopper_matmul_mgpu example at its best, 751 TFLOP/s on the H200).
    consumers: int = 1
    split: str = "n"

    @property
    def cta_m(self) -> int:
        """Rows of the CTA's tile: the schedule's tile height."""
        return 2 * self.block_m if self.consumers == 2 and self.split == "m" else self.block_m

    def fit(self, n: int, k: int) -> "MosaicConfig":
        """The largest block_n (block_k) of at most the configured size that divides N (K)."""
        if self.split not in ("n", "m"):
            raise ValueError(f'MosaicConfig.split={self.split!r} must be "n" or "m".')
        if self.block_n < MIN_BLOCK_N:
            raise ValueError(
                f"MosaicConfig.block_n={self.block_n} must be at least {MIN_BLOCK_N} (128 bytes of "
                "16-bit values): narrower tiles fail with a misaligned address on the H200."
            )
        # Two consumers split the tile's columns at a 64-column (128-byte swizzle) boundary.
        column_parts = 2 if self.consumers == 2 and self.split == "n" else 1
        unit = 128 if column_parts == 2 else 16
        cta_n = fit_block("gmm_mgpu", column_parts * self.block_n, n, "N", unit)
        return dataclasses.replace(
            self,
            block_n=cta_n // column_parts,
            block_k=fit_block("gmm_mgpu", self.block_k, k, "K", 16),
        )


# The shapes where implementation="auto" runs this kernel instead of Triton's on Hopper, each
# measured faster on the H200 by benchmarks/bench_gmm_mgpu.py: (rows class of
# `kernels.config.rows_class`, K, N) of a plain gmm (no row gather, no GLU, rhs not transposed)
# with a 16-bit output -> its config. Every other call, and every call off sm90, stays on Triton.
AUTO_TABLE: dict[tuple[str, int, int], MosaicConfig] = {
    # At 512 rows per expert (gpt-oss T = 16384), two consumers over 64-row halves of a 128-row
    # CTA tile, 192 (256 fitted) columns wide, 4 stages (benchmarks/results/
    # 2026-12-01_h200_session10/, calls 1-3): the down projection with the layer's bias and routing
    # weight 2.135 ms against 2.244 for the previous entry (128 x 256 tiles, one warpgroup) and
    # 2.273 for Triton; a plain gate_up (N = 5760) 4.024 / 4.236 ms in two calls against Triton's
    # 4.228 / 4.372. SwiGLU stays on Triton: its down 2.495 against Mosaic's best 2.634, its plain
    # gate_up 4.446 against 4.719 (at N = 4096 the tile keeps 256 columns, whose 4 stages exceed
    # shared memory; 3 stages are slower than Triton).
    ("large", 2880, 2880): MosaicConfig(64, 256, 64, num_stages=4, consumers=2, split="m"),
    ("large", 2880, 5760): MosaicConfig(64, 256, 64, num_stages=4, consumers=2, split="m"),
}


def auto_config(num_rows: int, num_groups: int, k: int, n: int, out_dtype) -> MosaicConfig | None:
    """AUTO_TABLE's config for a plain gmm of this shape, or None (Triton runs it). The entries
    were measured with 16-bit outputs; a float32 output doubles the tile's store buffer, which
    takes the 4-stage entries past the H200's shared memory, so it stays on Triton."""
    if jnp.dtype(out_dtype).itemsize != 2:
        return None
    return AUTO_TABLE.get((_config.rows_class(num_rows, num_groups), k, n))


def default_config(
    num_rows: int, num_groups: int, n_out: int, activation: str | None
) -> MosaicConfig:
    """The config of a call without one: 128 x 128 tiles (a GLU: 128 x 64 outputs, as its tile
    reads 2·block_n weight columns); for decode (`rows_class` "tiny", at most 16 rows per group)
    64-row tiles (one wgmma M), block_n narrowed by `config.spread_block_n` towards 4 (visit,
    n-tile) pairs per SM but not below MIN_BLOCK_N, and 8 stages, as each holds a few KiB, to keep
    more bytes in flight (6 for gpt-oss's GLU, whose split gate and up halves take shared memory
    too: 8 exceed the H200's 227 KiB)."""
    cfg = MosaicConfig(block_n=64 if activation else 128)
    if _config.rows_class(num_rows, num_groups) != "tiny":
        return cfg
    block_n = _config.spread_block_n(
        cfg.block_n, n_out, num_rows, num_groups, MIN_BLOCK_N, 4 * num_sms()
    )
    stages = 6 if activation == "gptoss" else 8
    return dataclasses.replace(cfg, block_m=64, block_n=block_n, num_stages=stages)


def num_sms() -> int:
    """CTAs of the persistent grid: one per SM of the target GPU."""
    device = jax.sharding.get_abstract_mesh().abstract_device
    if device is not None and device.platform == "gpu":
        return device.num_cores
    if jax.default_backend() == "gpu":
        return jax.devices()[0].core_count
    return _INTERPRET_SMS


class Schedule(NamedTuple):
    group: jax.Array  # [V] int32: group of each visit (G = the zero-filled tail rows)
    tile8: jax.Array  # [V] int32: first row of the visit's m-tile, divided by 8
    row_start: jax.Array  # [V] int32: first row the visit stores
    row_end: jax.Array  # [V] int32: one past its last row; row_start == row_end for unused visits


def schedule(group_ends: jax.Array, num_rows: int, block_m: int) -> Schedule:
    """Visits covering rows [0, num_rows) once each, in row order, with m-tiles starting at each
    group's first row rounded down to a multiple of 8; `group_ends` `[G]` are the groups' end rows
    (`gmm.clamp_group_ends`: non-decreasing, at most num_rows).

    A group of s rows takes cdiv(s + (start % 8), block_m) visits; summed over the at most
    min(G + 1, num_rows) non-empty groups (with the tail pseudo-group), the floor of
    (num_rows + groups * (block_m + 6)) / block_m visits always suffice.
    """
    num_groups = group_ends.shape[0]
    ends = jnp.concatenate([group_ends.astype(jnp.int32), jnp.array([num_rows], jnp.int32)])
    starts = jnp.concatenate([jnp.zeros((1,), jnp.int32), ends[:-1]])
    first8 = starts // 8
    tiles = jnp.where(ends > starts, (ends - 8 * first8 + block_m - 1) // block_m, 0)
    visit_end = dispatch.cumsum(tiles)
    groups = min(num_groups + 1, num_rows)
    v = jnp.arange((num_rows + groups * (block_m + 6)) // block_m, dtype=jnp.int32)
    group = dispatch.searchsorted(visit_end, v, side="right")
    used = group <= num_groups
    group = jnp.minimum(group, num_groups)
    tile8 = first8[group] + (v - (visit_end[group] - tiles[group])) * (block_m // 8)
    row_start = jnp.maximum(starts[group], 8 * tile8)
    row_end = jnp.where(used, jnp.minimum(ends[group], 8 * tile8 + block_m), row_start)
    return Schedule(group=group, tile8=tile8, row_start=row_start, row_end=row_end)


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
    it = iter(refs)
    bias_gmem = next(it) if has_bias else None
    row_scale_gmem = next(it) if has_row_scale else None
    out_gmem = next(it)
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
    def _scope(allocs, o_smem, bias_smem, row_scale_smem, bias_barriers, row_scale_barriers):
        wg = jax.lax.axis_index("wg")
        wg_cols = slice(None) if by_rows else pl.ds(wg * bn, bn)
        epilogue = _Epilogue(
            bias_gmem,
            row_scale_gmem,
            activation,
            bias_smem.at[wg],
            row_scale_smem.at[wg],
            bias_barriers.at[wg],
            row_scale_barriers.at[wg],
        )

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
    gather: bool,
):
    """One warpgroup per CTA issues the TMA loads and the wgmma of [block_m, block_n] tiles; with
    SwiGLU, two accumulators (gate and up) from the two contiguous column halves of rhs; with
    gpt-oss, rhs arrives as uint32 [G, K, N / 2] (a (gate, up) bf16 pair per word) and each step
    splits its slot into gate and up halves in shared memory (double-buffered by step parity).
    With `gather`, lhs rows come through the row index (`kernels.row_gather_mgpu`) into a ring of
    num_stages slots of its own, a step's rows started when the step num_stages - 1 before it has
    read its slot; rhs keeps the TMA pipeline."""
    it = iter(refs)
    row_index_gmem = next(it) if gather else None
    bias_gmem = next(it) if has_bias else None
    row_scale_gmem = next(it) if has_row_scale else None
    out_gmem = next(it)
    lhs_rows = row_index_gmem.shape[0] if gather else lhs_gmem.shape[0]
    k_dim = lhs_gmem.shape[1]
    n_dim = out_gmem.shape[1]
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    n_tiles = n_dim // bn  # of the output: N / 2 columns with a GLU
    k_steps, stages = k_dim // bk, cfg.num_stages
    parts = 2 if activation else 1
    interleaved = activation == "gptoss"
    scratch = {"halves_smem": plgpu.SMEM((2, 2, bk, bn), lhs_gmem.dtype)} if interleaved else {}
    if gather:
        scratch |= {
            "ring_smem": plgpu.SMEM(
                (stages, bm, bk), lhs_gmem.dtype, transforms=_row_gather.TRANSFORMS
            ),
            "row_index_smem": plgpu.SMEM((bm,), jnp.int32),
            "row_index_barrier": plgpu.Barrier(num_arrivals=1),
        }

    @functools.partial(pl.run_scoped, **_epilogue_scratch(1, parts, bm, bn), **scratch)
    def _scope(
        bias_smem,
        row_scale_smem,
        bias_barriers,
        row_scale_barriers,
        halves_smem=None,
        ring_smem=None,
        row_index_smem=None,
        row_index_barrier=None,
    ):
        epilogue = _Epilogue(
            bias_gmem,
            row_scale_gmem,
            activation,
            bias_smem.at[0],
            row_scale_smem.at[0],
            bias_barriers.at[0],
            row_scale_barriers.at[0],
        )

        @plgpu.nd_loop((num_visits * n_tiles,), collective_axes="sm")
        def _visit(info: plgpu.NDLoopInfo):
            v, ni = plgpu.planar_snake(info.index[0], (num_visits, n_tiles), 1, cfg.grid_tile_n)
            g = group_gmem[v]
            row_start = row_start_gmem[v]
            size = row_end_gmem[v] - row_start
            # The lhs box: 8-row aligned (see the module docstring), ending inside lhs.
            a0 = pl.multiple_of(jnp.minimum(tile8_gmem[v], (lhs_rows - bm) // 8) * 8, 8)

            def start_rows(step, slot):  # lhs rows a0.. of k-step `step` into ring slot `slot`
                _row_gather.start_rows(lhs_gmem, row_index_smem, ring_smem.at[slot], step * bk)

            def product(*acc_refs):
                def step(idx, *smems):
                    if gather:
                        kk = idx[0]
                        # step kk's rows: at most stages - 2 younger groups may still pend
                        _row_gather.wait_rows(stages - 2)
                        a_smem, b_smems = ring_smem.at[kk % stages], smems
                    else:
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
                    if gather:  # the previous step's lhs slot is free: refill it

                        @pl.when((kk >= 1) & (kk - 1 + stages < k_steps))
                        def _():
                            start_rows(kk - 1 + stages, (kk - 1) % stages)

                        _row_gather.commit_group()

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
                lhs_specs = [plgpu.BlockSpec((bm, bk), lambda kk: (0, kk), delay_release=1)]
                lhs_operands = [lhs_gmem.at[pl.ds(a0, bm)]]
                if gather:
                    lhs_specs, lhs_operands = [], []
                    plgpu.copy_gmem_to_smem(
                        row_index_gmem.at[pl.ds(a0, bm)], row_index_smem, row_index_barrier
                    )
                    plgpu.barrier_wait(row_index_barrier)
                    for s in range(stages):  # one commit group per slot, empty past K
                        if s < k_steps:
                            start_rows(s, s)
                        _row_gather.commit_group()
                plgpu.emit_pipeline(
                    step,
                    grid=(k_steps,),
                    in_specs=[*lhs_specs, *rhs_specs],
                    max_concurrent_steps=stages,
                )(*lhs_operands, *[rhs_g] * len(rhs_specs))
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
    lhs_row_index: jax.Array | None = None,
) -> jax.Array:
    """Grouped matmul (see the module docstring) with the Mosaic GPU backend.

    lhs `[M, K]`, rhs `[G, K, N]` (`[G, N, K]` if transpose_rhs), group_sizes `[G]` int32, bias
    `[G, N]` in rhs's column layout, activation None | "swiglu" | "gptoss" (then N = 2·N_out, in
    the activation's column layout, see `moe_pallas.activations`), row_scale `[≥M]` (bias and
    row_scale floating, applied in float32). With lhs_row_index `[M]` (integers in [0, T)), row m
    of the product reads lhs[lhs_row_index[m]] (lhs `[T, K]`; the module docstring says where the
    kernel gathers it itself). Returns `[M, N_out]` in out_dtype
    (default lhs.dtype). Off GPU (`_backend.interpret_mode()`) it runs in Mosaic GPU interpret
    mode: slow, for tests.
    """
    if lhs.ndim != 2 or rhs.ndim != 3:
        raise ValueError(f"gmm needs lhs [M, K] and rhs [G, K, N]; got {lhs.shape}, {rhs.shape}.")
    gather = lhs_row_index is not None
    if gather and (lhs_row_index.ndim != 1 or not jnp.issubdtype(lhs_row_index.dtype, jnp.integer)):
        raise ValueError(
            f"lhs_row_index must be a 1-D integer array of lhs rows, got {lhs_row_index.dtype}"
            f"{list(lhs_row_index.shape)}."
        )
    if lhs.dtype != rhs.dtype or lhs.dtype not in DTYPES:
        raise TypeError(
            f"gmm_mgpu needs bf16 or f16 lhs and rhs of one dtype (wgmma), got {lhs.dtype} and "
            f'{rhs.dtype}; cast them, or use implementation="pallas_triton".'
        )
    if activation not in (None, "swiglu", "gptoss"):
        raise ValueError(f"gmm_mgpu: activation={activation!r} must be None, 'swiglu' or 'gptoss'.")
    num_groups, k_dim, n_dim = grouped_dims(lhs, rhs, group_sizes, transpose_rhs)
    num_rows = lhs_row_index.shape[0] if gather else lhs.shape[0]
    ws = config is not None and config.consumers == 2
    ws_glu_ok = activation != "gptoss" and config is not None and config.split == "m"
    if activation and (transpose_rhs or n_dim % 2 or (ws and not ws_glu_ok)):
        raise ValueError(
            "gmm_mgpu: a GLU activation needs a non-transposed rhs with an even column count, and "
            'consumers=1 (or, for SwiGLU, split="m"): gpt-oss\'s interleaved pairs are split in '
            f"one warpgroup's shared memory; got transpose_rhs={transpose_rhs}, N={n_dim}, "
            f"config={config}."
        )
    if bias is not None and bias.shape != (num_groups, n_dim):
        raise ValueError(
            f"bias must be [{num_groups}, {n_dim}] (one row per group), got {bias.shape}."
        )
    if row_scale is not None and (row_scale.ndim != 1 or row_scale.shape[0] < num_rows):
        raise ValueError(
            f"row_scale must be 1-D with >= {num_rows} entries, got {row_scale.shape}."
        )
    parts = 2 if activation else 1
    n_out = n_dim // parts
    check_int32_sizes("gmm_mgpu", lhs=lhs.shape, rhs=rhs.shape, out=(num_rows, n_out))
    out_dtype = jnp.dtype(out_dtype or lhs.dtype)
    if num_rows == 0 or n_out == 0 or k_dim == 0:
        return jnp.zeros((num_rows, n_out), out_dtype)
    config = config or default_config(num_rows, num_groups, n_out, activation)
    cfg = config.fit(n_out, k_dim)
    # The kernel gathers rows itself with one consumer warpgroup (it issues the copies), two
    # stages or more, and 128-byte k-blocks; any other config reads an XLA-gathered copy.
    if gather and not (
        cfg.consumers == 1
        and cfg.num_stages >= 2
        and _row_gather.fits(cfg.block_m, cfg.block_k, lhs.dtype.itemsize)
    ):
        lhs, gather = lhs[lhs_row_index], False
    sched = schedule(clamp_group_ends(group_sizes, num_rows), num_rows, cfg.cta_m)
    # TMA boxes of cta_m rows at multiples of 8 must fit in lhs (or its row index): pad short or
    # ragged ones (a copy; M = T·k is a multiple of 8 for k = 8, and for k = 4 at even T).
    lhs_rows = max(-(-num_rows // 8) * 8, cfg.cta_m)
    if gather:  # padding rows read x's row 0: computed, never stored
        row_index = jnp.pad(lhs_row_index.astype(jnp.int32), (0, lhs_rows - num_rows))
    elif lhs_rows > num_rows:
        lhs = jnp.pad(lhs, ((0, lhs_rows - num_rows), (0, 0)))
    if activation == "gptoss":  # one uint32 word per interleaved (gate, up) pair: a free bitcast
        rhs = jax.lax.bitcast_convert_type(rhs.reshape(num_groups, k_dim, n_out, 2), jnp.uint32)
    operands = [*sched, lhs, rhs] + ([row_index] if gather else [])
    if bias is not None:  # [G, parts, N_out]: the gate and up halves (a small copy for gpt-oss)
        bias = bias.astype(jnp.float32)
        if activation == "gptoss":
            bias = jnp.swapaxes(bias.reshape(num_groups, n_out, 2), 1, 2)
        operands.append(bias.reshape(num_groups, parts, n_out))
    if row_scale is not None:  # read in the lhs box's rows
        row_scale = row_scale[:num_rows].astype(jnp.float32)
        operands.append(jnp.pad(row_scale, (0, lhs_rows - num_rows)))
    kernel = functools.partial(
        _kernel if cfg.consumers == 1 else _kernel_ws,
        activation=activation,
        num_groups=num_groups,
        num_visits=sched.group.shape[0],
        cfg=cfg,
        transpose_rhs=transpose_rhs,
        has_bias=bias is not None,
        has_row_scale=row_scale is not None,
        **({"gather": gather} if cfg.consumers == 1 else {}),
    )
    out = plgpu.kernel(
        kernel,
        out_type=jax.ShapeDtypeStruct((lhs_rows, n_out), out_dtype),
        grid=(num_sms(),),
        grid_names=("sm",),
        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
        interpret=plgpu.InterpretGPUParams() if _backend.interpret_mode() else None,
        num_threads=None if cfg.consumers == 1 else 3,
        thread_name=None if cfg.consumers == 1 else "wg",
        kernel_name="gmm_mgpu" + ("_t" if transpose_rhs else "") + ("_gather" if gather else ""),
    )(*operands)
    return out[:num_rows] if lhs_rows > num_rows else out
