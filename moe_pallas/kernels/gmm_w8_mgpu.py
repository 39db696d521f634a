"""Grouped matmul on fp8 expert weights converted in registers, for Hopper: Pallas Mosaic GPU, the
weights as wgmma's register operand and the tokens as its N.

Math. Rows m in [0, M) fall into G contiguous groups by `group_sizes`; x's rows enter as float16
times a power of two per row (`gmm_quant.rows_as_f16`: x[m] = x16[m] · p[m], exact for bf16
rows); w is an "fp8" `quant.QuantizedWeight` (e4m3 values [G, N, P] N-major, column scales cs
[G, N]):

    accᵀ[n, m] = Σ_k w[g, n, k] · x16[m, k]                    (float32)
    out[m]     = glu(accᵀ[:, m] · cs[g, :] · p[m] + bias[g, :]) · row_scale[m]

with SwiGLU's gate and up halves of N, or gpt-oss's interleaved columns, as
`activations.split_gate_up`. e4m3 values are float16s, so every product is exact: the result is
`kernels.gmm_quant`'s "fp8" product up to the order of the float32 additions. Rows past
sum(group_sizes) are zeros.

Why its own kernel. A tile converts each weight value once for all its rows, so what a weight
value costs is its conversion and its trip to the tensor core. Triton's fp8 tiles pass the
converted weights through shared memory as the dot's second operand, and its tiles that made them
the first (register) operand raced (docs/decisions.md). Here a consumer warpgroup loads its
[64, block_k] e4m3 slice from the pipelined shared-memory tile into registers, converts it there
(one conversion a pair of values) and issues wgmma with it as the register operand A and the
box's tokens as B, block_m of them (wgmma's N: any multiple of 8), so the converted weights are
never stored. On an H100 its probe (uniform groups, `65fd863`) ran 1.4-1.6x faster than Triton's
fp8 tiles at 32-64 rows per expert and level at 16.

Tiling. A persistent CTA per SM walks the (visit, n-tile) pairs of `dispatch.tile_schedule(align=
8)` at block_m rows; a producer warpgroup streams per K step the [128, block_k] e4m3 tile of w[g]
(each GLU half's) and the box's [block_m, block_k] float16 rows through a TMA ring of num_stages
slots; consumer c takes weight rows [64c, 64c + 64) (output columns col0 + 64c..) into its
[64, block_m] float32 accumulator, waiting on each wgmma (the slot goes back to the producer when
the step's body returns). At the end it runs the epilogue on accᵀ (its columns' scales and
bias along its rows, its tokens' powers and row scales along its columns, the GLU), stores it
transposed into the [block_m, 64] output tile in shared memory and stores the visit's own rows
from there (`gmm_mgpu._store_rows`). A visit's box may hold other groups' rows; they are multiplied and not
stored. K's tail: TMA zero-fills x's columns past K, and the weight columns there are row padding
(zeros), the next GLU half's first values in gpt-oss's view, or zero-filled: finite, times zero.
gpt-oss's GLU reads w's values as the free view [G, N/2, 2P] (a gate row, then its up row).

Limits (`check`; the pallas_triton backend takes every other call): "fp8" weights, K, P and N
(each GLU half) multiples of 64 (TMA's tiled boxes: 64-byte rows of e4m3, 128-byte rows of
float16; the output's 64-column tiles), activation None, "swiglu" or "gptoss". No row gather: the
backend passes x's rows gathered (TMA cannot gather). Off GPU it runs in Mosaic GPU's interpret
mode, whose wgmma takes shared-memory operands only: there the converted slice goes through a
shared-memory buffer first (the same values).
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from moe_pallas import dispatch
from moe_pallas.kernels import _common
from moe_pallas.kernels.gmm_mgpu import _Epilogue, _epilogue_scratch, _optional_refs, _store_rows

WG_ROWS = 64  # weight rows per consumer warpgroup (wgmma's M)
BLOCK_N = 2 * WG_ROWS  # output columns per CTA: two consumers
TILE = 64  # K, P and N must be multiples of this (module docstring, Limits)
ACTIVATIONS = (None, "swiglu", "gptoss")
BLOCK_MS = (16, 32, 64, 128)  # tokens per box (wgmma's N)
SIDE_SLOT = 32  # float32 values: 128 bytes, TMA's shared-memory alignment


@dataclasses.dataclass(frozen=True)
class W8Config:
    """block_m: tokens per box (wgmma's N); block_k: K values per step; num_stages: TMA ring slots."""

    block_m: int = 64
    block_k: int = 128
    num_stages: int = 4


def default_config(num_rows: int, num_groups: int, activation: str | None) -> W8Config:
    """Boxes of the mean group's rows rounded up to a power of two in BLOCK_MS (fewer multiplied
    rows of other groups at decode sizes); 3 ring slots for a GLU (two weight tiles a step)."""
    mean = num_rows / max(num_groups, 1)
    block_m = next((b for b in BLOCK_MS if mean <= b), 64)
    return W8Config(block_m=block_m, num_stages=3 if activation else 4)


def check(k: int, n_out: int, fmt: str, activation, pitch: int | None = None) -> str:
    """Why this kernel cannot run the call ('' when it can); pitch (the stored rows' length P)
    None: not checked."""
    if fmt != "fp8":
        return f"weights of format {fmt!r} (this kernel takes 'fp8')"
    if activation not in ACTIVATIONS:
        return f"activation={activation!r} (the kernel has {ACTIVATIONS})"
    if k % TILE or n_out % TILE:
        return f"K={k} or N={n_out} not a multiple of {TILE} (TMA's tiled boxes)"
    if pitch is not None and pitch % TILE:
        return f"stored rows of {pitch} bytes (TMA's tiled boxes: a multiple of {TILE})"
    return ""


def _kernel(
    group_gmem,
    tile8_gmem,
    row_start_gmem,
    row_end_gmem,
    x_gmem,
    power_gmem,
    w_gmem,
    cs_gmem,
    *refs,
    num_groups: int,
    num_visits: int,
    k_dim: int,
    cfg: W8Config,
    has_bias: bool,
    has_row_scale: bool,
    activation: str | None,
    w_swizzle: int,
    interpret: bool,
):
    """Warpgroups 0 and 1 consume, 2 produces (module docstring, Tiling)."""
    bias_gmem, row_scale_gmem, out_gmem = _optional_refs(refs, has_bias, has_row_scale)
    rows_total = x_gmem.shape[0]
    n_out = out_gmem.shape[1]
    bm, bk, parts = cfg.block_m, cfg.block_k, 2 if activation else 1
    n_tiles = pl.cdiv(n_out, BLOCK_N)
    w_tiles = (plgpu.TilingTransform((8, w_swizzle)), plgpu.SwizzleTransform(w_swizzle))
    x_swizzle = min(2 * bk, 128)
    x_tiles = (plgpu.TilingTransform((8, x_swizzle // 2)), plgpu.SwizzleTransform(x_swizzle))

    def pipeline(body, ctx):
        return plgpu.emit_pipeline_warp_specialized(
            body,
            grid=(pl.cdiv(k_dim, bk),),
            memory_registers=40,
            in_specs=[
                plgpu.BlockSpec(
                    (bm, bk), lambda kk: (0, kk), transforms=x_tiles, memory_space=plgpu.SMEM
                ),
                *[
                    plgpu.BlockSpec(
                        (BLOCK_N, bk),
                        lambda kk: (0, kk),
                        transforms=w_tiles,
                        memory_space=plgpu.SMEM,
                    )
                ]
                * parts,
            ],
            wg_axis="wg",
            num_compute_wgs=2,
            max_concurrent_steps=cfg.num_stages,
            compute_context=ctx,
        )

    def w_windows(g, col0):
        w_g = w_gmem.at[jnp.minimum(g, num_groups - 1)]
        if activation == "gptoss":  # a row of w's view: a gate row, then its up row
            pitch = w_gmem.shape[2] // 2
            return [w_g.at[pl.ds(col0, BLOCK_N), pl.ds(p * pitch, pitch)] for p in range(parts)]
        # SwiGLU's up half lies N_out rows of w below its gate half.
        return [w_g.at[pl.ds(col0 + p * n_out, BLOCK_N)] for p in range(parts)]

    ignore = lambda *_, **__: None  # allocations do not depend on the bodies
    # A TMA copy lands at a 128-byte aligned address: each consumer's float32 row values (row
    # powers, row scales) get a slot of at least 32, of which the box's bm are read.
    slot = max(bm, SIDE_SLOT)
    scratch = dict(
        o_smem=plgpu.SMEM((2, bm, WG_ROWS), out_gmem.dtype),
        cs_smem=plgpu.SMEM((2, parts, WG_ROWS), jnp.float32),
        p_smem=plgpu.SMEM((2, slot), jnp.float32),
        side_barriers=plgpu.Barrier(num_arrivals=1, num_barriers=4),
        **_epilogue_scratch(2, parts, slot, WG_ROWS),
    )
    if interpret:  # interpret mode's wgmma reads A from shared memory (module docstring)
        scratch["a_smem"] = plgpu.SMEM((2, parts, WG_ROWS, bk), jnp.float16)

    @functools.partial(
        pl.run_scoped,
        allocs=pipeline(ignore, ignore).get_allocations(x_gmem.at[pl.ds(0, bm)], *w_windows(0, 0)),
        **scratch,
        collective_axes="wg",
    )
    def _scope(allocs, o_smem, cs_smem, p_smem, side_barriers, **rest):
        a_smem = rest.pop("a_smem", None)
        wg = jax.lax.axis_index("wg")
        epilogue = _Epilogue(
            bias_gmem,
            row_scale_gmem,
            activation,
            rest["bias_smem"].at[wg],
            rest["row_scale_smem"].at[wg, pl.ds(0, bm)],
            rest["bias_barriers"].at[wg],
            rest["row_scale_barriers"].at[wg],
        )
        p_slot = p_smem.at[wg, pl.ds(0, bm)]

        @plgpu.nd_loop((num_visits * n_tiles,), collective_axes="sm")
        def _visit(info: plgpu.NDLoopInfo):
            v, ni = plgpu.planar_snake(info.index[0], (num_visits, n_tiles), 1, 1)
            g = group_gmem[v]
            gs = jnp.minimum(g, num_groups - 1)
            row_start = row_start_gmem[v]
            size = row_end_gmem[v] - row_start
            a0 = pl.multiple_of(jnp.minimum(tile8_gmem[v], (rows_total - bm) // 8) * 8, 8)
            col0 = ni * BLOCK_N + wg * WG_ROWS  # this consumer's output columns

            def compute_context(eval_pipeline):
                plgpu.copy_gmem_to_smem(
                    cs_gmem.at[gs, :, pl.ds(col0, WG_ROWS)], cs_smem.at[wg], side_barriers.at[wg]
                )
                plgpu.copy_gmem_to_smem(
                    power_gmem.at[pl.ds(a0, bm)], p_slot, side_barriers.at[2 + wg]
                )
                epilogue.start(g, a0, col0)

                zero = plgpu.layout_cast(jnp.zeros((WG_ROWS, bm), jnp.float32), plgpu.Layout.WGMMA)
                accs = eval_pipeline((zero,) * parts)
                plgpu.barrier_wait(side_barriers.at[wg])
                plgpu.barrier_wait(side_barriers.at[2 + wg])
                p_rows = jax.lax.broadcast_in_dim(p_slot[...], accs[0].shape, (1,))
                accs = [
                    acc * jax.lax.broadcast_in_dim(cs_smem[wg, p], acc.shape, (0,)) * p_rows
                    for p, acc in enumerate(accs)
                ]
                out_t = epilogue.apply(*accs, rows_axis=1).astype(o_smem.dtype)  # [64, bm]
                plgpu.transpose_ref(o_smem.at[wg], (1, 0))[...] = out_t
                _store_rows(o_smem.at[wg], out_gmem, a0, row_start, size, col0)

            def step(_, x_smem, *rest):
                *w_smems, accs = rest
                x_t = plgpu.transpose_ref(x_smem, (1, 0))  # [bk, bm]: wgmma's B, tokens as N

                def product(p, w_smem, part_ref):  # the step's product on a zeroed accumulator
                    a = w_smem[pl.ds(wg * WG_ROWS, WG_ROWS)].astype(jnp.float16)
                    if a_smem is not None:
                        a_smem[wg, p] = a
                        a = a_smem.at[wg, p]
                    plgpu.wgmma(part_ref, a, x_t)
                    plgpu.wgmma_wait(0)  # the slot is refilled once the body returns
                    return part_ref[...]

                return tuple(
                    acc
                    + pl.run_scoped(functools.partial(product, p, w_smem), plgpu.ACC((WG_ROWS, bm)))
                    for p, (w_smem, acc) in enumerate(zip(w_smems, accs))
                )

            @pl.when((size > 0) & (g < num_groups))
            def _grouped_rows():
                pipeline(step, compute_context)(
                    x_gmem.at[pl.ds(a0, bm)], *w_windows(g, ni * BLOCK_N), allocations=allocs
                )

            @pl.when((size > 0) & (g == num_groups) & (wg < 2))  # consumers only
            def _tail_rows():
                o_smem[wg] = jnp.zeros((bm, WG_ROWS), o_smem.dtype)
                _store_rows(o_smem.at[wg], out_gmem, a0, row_start, size, col0)


def gmm_w8(
    x: jax.Array,
    w,
    group_sizes: jax.Array,
    *,
    bias: jax.Array | None = None,
    activation: str | None = None,
    row_scale: jax.Array | None = None,
    out_dtype=jnp.bfloat16,
    config: W8Config | None = None,
) -> jax.Array:
    """The grouped matmul of the module docstring.

    x `[M, K]` bf16 or float16 (rows gathered), w an "fp8" `quant.QuantizedWeight` (logical
    `[G, K, N]`), group_sizes `[G]` int32, bias `[G, N]`, row_scale `[>=M]`, activation None |
    "swiglu" | "gptoss" (then N = 2·N_out). Returns `[M, N_out]` in out_dtype. Off GPU it runs in
    Mosaic GPU interpret mode: slow, for tests.
    """
    from moe_pallas.kernels.gmm_quant import rows_as_f16

    activation = activation or None
    if x.ndim != 2 or x.dtype not in (jnp.bfloat16, jnp.float16):
        raise TypeError(f"gmm_w8: x must be bf16 or float16 [M, K], got {x.dtype} {x.shape}.")
    num_rows, k_dim = x.shape
    num_groups, _, n_dim = w.shape
    if w.shape[1] != k_dim:
        raise ValueError(f"gmm_w8: x has K={k_dim} columns but w contracts over K={w.shape[1]}.")
    if group_sizes.shape != (num_groups,):
        raise ValueError(f"group_sizes must be [{num_groups}], got {group_sizes.shape}.")
    parts = 2 if activation else 1
    n_out = n_dim // parts
    pitch = w.values.shape[2]
    why = check(k_dim, n_out, w.fmt, activation, pitch)
    if why:
        raise ValueError(f'gmm_w8: {why}; use implementation="pallas_triton".')
    config = config or default_config(num_rows, num_groups, activation)
    if config.block_m not in BLOCK_MS:
        raise ValueError(f"gmm_w8: block_m={config.block_m} (the kernel has {BLOCK_MS}).")
    _common.check_epilogue(num_groups, n_dim, num_rows, bias, row_scale)
    _common.check_int32_sizes("gmm_w8", x=x.shape, w=w.values.shape, out=(num_rows, n_out))
    out_dtype = jnp.dtype(out_dtype)
    if num_rows == 0 or n_out == 0:
        return jnp.zeros((num_rows, n_out), out_dtype)
    bm = config.block_m
    sched = dispatch.tile_schedule(
        _common.clamp_group_ends(group_sizes, num_rows), num_rows, bm, align=8
    )
    # TMA boxes of bm rows at multiples of 8 must fit in x: pad short or ragged ones.
    rows = max(-(-num_rows // 8) * 8, bm)
    pad = rows - num_rows
    x16, power = rows_as_f16(x)
    x16 = jnp.pad(x16, ((0, pad), (0, 0)))
    power = jnp.pad(power, (0, pad))
    values = w.values
    if activation == "gptoss":  # w's rows 2j (gate) and 2j + 1 (up) as one row of a free view
        values = values.reshape(num_groups, n_out, 2 * values.shape[2])

    def halves(columns):  # [G, N] in w's column order -> [G, parts, N_out]
        if activation == "gptoss":
            return columns.reshape(num_groups, n_out, 2).transpose(0, 2, 1)
        return columns.reshape(num_groups, parts, n_out)

    operands = [
        sched.group,
        sched.m_start // 8,
        sched.row_start,
        sched.row_end,
        x16,
        power,
        values,
        halves(w.scales.astype(jnp.float32)),
    ]
    if bias is not None:
        operands.append(halves(bias.astype(jnp.float32)))
    if row_scale is not None:
        operands.append(jnp.pad(row_scale[:num_rows].astype(jnp.float32), (0, pad)))
    interpret = _common.interpret_mode()
    kernel = functools.partial(
        _kernel,
        num_groups=num_groups,
        num_visits=sched.group.shape[0],
        k_dim=k_dim,
        cfg=config,
        has_bias=bias is not None,
        has_row_scale=row_scale is not None,
        activation=activation,
        w_swizzle=min(config.block_k, 128 if k_dim % 128 == 0 and pitch % 128 == 0 else TILE),
        interpret=interpret,
    )
    out = plgpu.kernel(
        kernel,
        out_type=jax.ShapeDtypeStruct((rows, n_out), out_dtype),
        grid=(_common.num_sms(),),
        grid_names=("sm",),
        num_threads=3,
        thread_name="wg",
        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
        interpret=plgpu.InterpretGPUParams() if interpret else None,
        kernel_name="gmm_w8_mgpu",
    )(*operands)
    return out[:num_rows] if pad else out
