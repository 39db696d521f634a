"""FP8 x FP8 grouped matmul for Hopper, Pallas Mosaic GPU: e4m3 activations (a scale per row and
128 values of K) against e4m3 expert weights as stored, on the FP8 tensor cores.

Math. Rows m in [0, M) fall into G contiguous groups by `group_sizes`; with b the K blocks of 128,

    acc[m, n] = Σ_b sx[m, b] · sw[g, b, n] · Σ_{k in b} x[m, k] · w[g, n, k]       (float32)
    out[m]    = glu((acc[m, :] · cs[g, :] + bias[g, :])) · row_scale[m]

x [M, K] float8_e4m3fn with sx [M, ⌈K/128⌉] (`quant.quantize_rows`), w a "fp8" or "fp8_block"
`quant.QuantizedWeight` (values [G, N, P] N-major, P ≥ K its row pitch): "fp8" has cs its column
scales and sw = 1, "fp8_block" sw its [G, ⌈K/128⌉, ⌈N/128⌉] block scales and cs = 1. The GLU
(optional) takes SwiGLU's gate and up halves of N, or gpt-oss's interleaved columns (gate 2j, up
2j + 1), as `activations.split_gate_up`. Rows past sum(group_sizes) are zeros. The value is
`kernels.gmm_quant`'s FP8-activation product (the same quantised operands), up to the tensor
core's sum within each 128-deep chain and the order of the float32 additions (on an H100 a
float32 output measured within 1.4e-4 of float64).

Why its own kernel. Each 128-deep block's products must be scaled in float32 before they join the
sum (DeepSeek-V3's promotion: the tensor core sums a chain of e4m3 products with fewer bits than
float32, so chains stay 128 deep). Triton's FP8-activation gmm waits on every block's dot before
scaling it, so its tensor cores idle during the promotion; here two consumer warpgroups share each
weight tile and wait only on their own wgmma, so one promotes while the other's wgmma runs. On an
H100 the SwiGLU-256 layer ran 1.33-2.11x faster than on Triton's FP8 products at 64-256 rows per
expert, but 7-16% slower at decode sizes, and on the H200 gpt-oss's 1.05-1.37x at 64-512
(docs/decisions.md), so "auto" takes it from 17 rows on; on an H100 gpt-oss's only above 128
rows per expert (1.31x at 512, no faster at 64-128).

Tiling. `gmm_mgpu`'s split "m": a persistent CTA per SM walks the (visit, n-tile) pairs of
`dispatch.tile_schedule(align=8)` at 2·64 rows; a producer warpgroup streams, per 128-deep K step,
[128, 128] of x, [block_n, 128] of w[g] (each GLU half), and the step's 128 row scales through a
TMA ring of `num_stages` slots; consumer c multiplies rows [64c, 64c + 64) into a zeroed [64,
block_n] accumulator (one wgmma chain of 128, a wait on it), adds it times its rows' (and the
block's) scale into the float32 sum (a carry of the pipeline), and at the end runs the epilogue
(column scale, bias, GLU, row scale; loaded by TMA while the K loop runs) and stores its rows
(`gmm_mgpu._store_rows`). Ragged groups as `gmm_mgpu` (a visit computes its 8-aligned box, stores
its own rows only). gpt-oss's GLU reads w's values as the free view [G, N/2, 2P], a gate row then
its up row, so each half's tile is a [block_n, 128] window at column 0 or P of that view.

Tails (gpt-oss's K = N = 2880 are 22.5 blocks). TMA fills a box's part past the array with zeros
and clips a store at its edge, so the last K step multiplies x's zero-filled columns (the weight
tile's columns there are its row padding, zeros as `quant.with_row_pitch` writes them, the next
half's first values in gpt-oss's view, or zero-filled: finite, so their products are zero), and
the last column tile computes columns past N that its stores drop. TMA's tiled boxes need the
GMEM rows a whole number of shared-memory tile rows: 128 bytes (128B swizzle) where K and P are
multiples of 128, else 64 (64B swizzle; gpt-oss's 2880 = 45 · 64).

Limits (ValueError; the pallas_triton backend takes every other call): K, P and N (a GLU's half)
multiples of 64 (the output's shared-memory tiles: 64 bf16 values a row), block_n = 128,
"fp8_block" scales in the block form, with a GLU only where each half is whole scale blocks (not
gpt-oss's interleaved columns, nor a half off 128), activation None, "swiglu" or "gptoss". No row
gather: the backend passes x's rows gathered (TMA cannot gather).
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from moe_pallas import dispatch
from moe_pallas.kernels import _common
from moe_pallas.kernels.gmm_mgpu import (
    MosaicConfig,
    _Epilogue,
    _epilogue_scratch,
    _optional_refs,
    _store_rows,
)

BLOCK = 128  # values of K per activation (and fp8_block weight) scale: one K step
BLOCK_M = 64  # rows per consumer warpgroup (one wgmma M)
# block_n: one fp8_block scale block wide. Weight tiles of other heights than x's 128 rows (64,
# 256) hang in Mosaic GPU's interpret mode, a pipeline barrier never completing (with no wgmma,
# epilogue or store in the kernel too), so the CPU tests could not cover them.
BLOCK_N = 128
# Shared-memory tiles of 128-byte rows (128B swizzle), or where K or the stored rows are not a
# multiple of 128, of 64-byte rows: TMA's tiled boxes need the GMEM rows a whole number of tiles.
# The output's tiles (128-byte rows: 64 bf16 values) need N_out a multiple of 64 likewise.
SWIZZLE_TAIL = 64
ACTIVATIONS = (None, "swiglu", "gptoss")


def default_config(activation: str | None) -> MosaicConfig:
    """2 x 64 rows x 128 columns, 128-deep steps; 4 ring slots (32 KiB each), 3 with SwiGLU
    (48 KiB: gate and up tiles), leaving the epilogue's 32 KiB within the H200's 227 KiB."""
    return MosaicConfig(
        block_m=BLOCK_M,
        block_n=BLOCK_N,
        block_k=BLOCK,
        num_stages=3 if activation else 4,
        consumers=2,
        split="m",
    )


def check(
    k: int,
    n_out: int,
    fmt: str,
    scales_shape,
    activation,
    config: MosaicConfig | None = None,
    pitch: int | None = None,
) -> str:
    """Why this kernel cannot run the call ('' when it can); scales_shape and pitch (the stored
    rows' length P) None: not checked."""
    if fmt not in ("fp8", "fp8_block"):
        return f"weights of format {fmt!r} (FP8 activations need 'fp8' or 'fp8_block')"
    if activation not in ACTIVATIONS:
        return f"activation={activation!r} (the kernel has {ACTIVATIONS})"
    if k % SWIZZLE_TAIL or n_out % SWIZZLE_TAIL:
        return f"K={k} or N={n_out} not a multiple of {SWIZZLE_TAIL} (TMA's tiled boxes)"
    if pitch is not None and pitch % SWIZZLE_TAIL:
        return f"stored rows of {pitch} bytes (TMA's tiled boxes: a multiple of {SWIZZLE_TAIL})"
    if fmt == "fp8_block" and activation == "gptoss":
        return "fp8_block with gpt-oss's interleaved GLU (a scale block holds gate and up columns)"
    if fmt == "fp8_block" and activation and n_out % BLOCK_N:
        return f"fp8_block with a GLU half of N={n_out} (its up half starts inside a scale block)"
    blocks = (-(-k // BLOCK), -(-n_out * (2 if activation else 1) // BLOCK_N))
    if fmt == "fp8_block" and scales_shape is not None and tuple(scales_shape[1:]) != blocks:
        return f"fp8_block scales {scales_shape} not one per 128 x 128 block"
    want = default_config(activation)
    config = config or want
    fixed = ("block_m", "block_n", "block_k", "consumers", "split")
    if any(getattr(config, f) != getattr(want, f) for f in fixed):
        return f"config {config} (fixed: {', '.join(f'{f}={getattr(want, f)}' for f in fixed)})"
    return ""


def _kernel(
    group_gmem,
    tile8_gmem,
    row_start_gmem,
    row_end_gmem,
    x_gmem,
    sx_gmem,
    w_gmem,
    sw_gmem,
    *refs,
    num_groups: int,
    num_visits: int,
    k_dim: int,
    cfg: MosaicConfig,
    block_scales: bool,
    has_bias: bool,
    has_row_scale: bool,
    activation: str | None,
    swizzle: int,
):
    """Warpgroups 0 and 1 consume, 2 produces (module docstring, Tiling). sw_gmem: "fp8"'s column
    scales [G, parts, N_out], TMA-loaded for the epilogue; "fp8_block"'s [G, K/128, N/128], read
    as one scalar per part and step."""
    bias_gmem, row_scale_gmem, out_gmem = _optional_refs(refs, has_bias, has_row_scale)
    rows_total = x_gmem.shape[0]
    n_out = out_gmem.shape[1]
    bm, bn, stages = cfg.block_m, cfg.block_n, cfg.num_stages
    cta_m, n_tiles, parts = 2 * bm, pl.cdiv(n_out, bn), 2 if activation else 1
    transforms = (plgpu.TilingTransform((8, swizzle)), plgpu.SwizzleTransform(swizzle))

    def pipeline(body, ctx):
        tile = lambda rows: plgpu.BlockSpec(
            (rows, BLOCK), lambda kk: (0, kk), transforms=transforms, memory_space=plgpu.SMEM
        )
        return plgpu.emit_pipeline_warp_specialized(
            body,
            grid=(pl.cdiv(k_dim, BLOCK),),
            memory_registers=40,
            in_specs=[
                tile(cta_m),
                *[tile(bn)] * parts,
                plgpu.BlockSpec((1, cta_m), lambda kk: (kk, 0), memory_space=plgpu.SMEM),
            ],
            wg_axis="wg",
            num_compute_wgs=2,
            max_concurrent_steps=stages,
            compute_context=ctx,
        )

    def w_windows(g, col0):
        w_g = w_gmem.at[jnp.minimum(g, num_groups - 1)]
        if activation == "gptoss":  # a row of w's view: a gate row, then its up row
            pitch = w_gmem.shape[2] // 2
            return [w_g.at[pl.ds(col0, bn), pl.ds(p * pitch, pitch)] for p in range(parts)]
        # SwiGLU's up half lies N_out rows of w below its gate half.
        return [w_g.at[pl.ds(col0 + p * n_out, bn)] for p in range(parts)]

    ignore = lambda *_, **__: None  # allocations do not depend on the bodies

    @functools.partial(
        pl.run_scoped,
        allocs=pipeline(ignore, ignore).get_allocations(
            x_gmem.at[pl.ds(0, cta_m)], *w_windows(0, 0), sx_gmem.at[:, pl.ds(0, cta_m)]
        ),
        o_smem=plgpu.SMEM((2, bm, bn), out_gmem.dtype),
        cs_smem=plgpu.SMEM((2, parts, bn), jnp.float32),
        cs_barriers=plgpu.Barrier(num_arrivals=1, num_barriers=2),
        **_epilogue_scratch(2, parts, bm, bn),
        collective_axes="wg",
    )
    def _scope(allocs, o_smem, cs_smem, cs_barriers, **epilogue_scratch):
        wg = jax.lax.axis_index("wg")
        epilogue = _Epilogue.of(bias_gmem, row_scale_gmem, activation, epilogue_scratch, wg)

        @plgpu.nd_loop((num_visits * n_tiles,), collective_axes="sm")
        def _visit(info: plgpu.NDLoopInfo):
            v, ni = plgpu.planar_snake(info.index[0], (num_visits, n_tiles), 1, cfg.grid_tile_n)
            g = group_gmem[v]
            gs = jnp.minimum(g, num_groups - 1)
            row_start = row_start_gmem[v]
            size = row_end_gmem[v] - row_start
            a0 = pl.multiple_of(jnp.minimum(tile8_gmem[v], (rows_total - cta_m) // 8) * 8, 8)
            col0 = ni * bn
            # This consumer's 64 rows of the box, and the visit's rows among them.
            wg_a0 = a0 + wg * bm
            wg_start = jnp.clip(row_start, wg_a0, wg_a0 + bm)
            wg_size = jnp.clip(row_start + size, wg_a0, wg_a0 + bm) - wg_start

            def compute_context(eval_pipeline):
                if not block_scales:
                    plgpu.copy_gmem_to_smem(
                        sw_gmem.at[gs, :, pl.ds(col0, bn)], cs_smem.at[wg], cs_barriers.at[wg]
                    )
                epilogue.start(g, wg_a0, col0)
                zero = plgpu.layout_cast(jnp.zeros((bm, bn), jnp.float32), plgpu.Layout.WGMMA)
                accs = eval_pipeline((zero,) * parts)
                if not block_scales:
                    plgpu.barrier_wait(cs_barriers.at[wg])
                    accs = [
                        acc * jax.lax.broadcast_in_dim(cs_smem[wg, p], acc.shape, (1,))
                        for p, acc in enumerate(accs)
                    ]
                o_smem[wg] = epilogue.apply(*accs).astype(o_smem.dtype)
                _store_rows(o_smem.at[wg], out_gmem, wg_a0, wg_start, wg_size, col0)

            def step(idx, x_smem, *rest):
                *w_smems, sx_smem, accs = rest
                x_rows = x_smem.at[pl.ds(wg * bm, bm)]
                sx = sx_smem[0, pl.ds(wg * bm, bm)]

                def block_product(w_smem, part_ref):  # one 128-deep chain on a zeroed acc
                    plgpu.wgmma(part_ref, x_rows, w_smem.T)
                    plgpu.wgmma_wait(0)
                    return part_ref[...]

                new = []
                for p, (acc, w_smem) in enumerate(zip(accs, w_smems)):
                    part = pl.run_scoped(
                        functools.partial(block_product, w_smem), plgpu.ACC((bm, bn))
                    )
                    s = sx
                    if block_scales:
                        s = s * sw_gmem[gs, idx[0], (col0 + p * n_out) // BLOCK_N]
                    new.append(acc + part * jax.lax.broadcast_in_dim(s, part.shape, (0,)))
                return tuple(new)

            @pl.when((size > 0) & (g < num_groups))
            def _grouped_rows():
                pipeline(step, compute_context)(
                    x_gmem.at[pl.ds(a0, cta_m)],
                    *w_windows(g, col0),
                    sx_gmem.at[:, pl.ds(a0, cta_m)],
                    allocations=allocs,
                )

            @pl.when((size > 0) & (g == num_groups) & (wg < 2))
            def _tail_rows():
                o_smem[wg] = jnp.zeros((bm, bn), o_smem.dtype)
                _store_rows(o_smem.at[wg], out_gmem, wg_a0, wg_start, wg_size, col0)


def gmm_fp8(
    x: jax.Array,
    x_scales: jax.Array,
    w,
    group_sizes: jax.Array,
    *,
    bias: jax.Array | None = None,
    activation: str | None = None,
    row_scale: jax.Array | None = None,
    out_dtype=jnp.bfloat16,
    config: MosaicConfig | None = None,
) -> jax.Array:
    """The FP8 grouped matmul of the module docstring.

    x `[M, K]` float8_e4m3fn and x_scales `[M, K/128]` float32 (`quant.quantize_rows`), w a "fp8"
    or "fp8_block" `quant.QuantizedWeight` (logical `[G, K, N]`), group_sizes `[G]` int32, bias
    `[G, N]`, row_scale `[≥M]`, activation None | "swiglu" (then N = 2·N_out). Returns `[M,
    N_out]` in out_dtype. Off GPU it runs in Mosaic GPU interpret mode: slow, for tests.
    """
    activation = activation or None
    config = config or default_config(activation)
    if x.ndim != 2 or x.dtype != jnp.float8_e4m3fn:
        raise TypeError(f"gmm_fp8: x must be float8_e4m3fn [M, K], got {x.dtype} {x.shape}.")
    num_rows, k_dim = x.shape
    num_groups, _, n_dim = w.shape
    if w.shape[1] != k_dim:
        raise ValueError(f"gmm_fp8: x has K={k_dim} columns but w contracts over K={w.shape[1]}.")
    if x_scales.shape != (num_rows, -(-k_dim // BLOCK)):
        raise ValueError(
            f"gmm_fp8: x_scales must be [{num_rows}, {-(-k_dim // BLOCK)}] (quant.quantize_rows), "
            f"got {x_scales.shape}."
        )
    if group_sizes.shape != (num_groups,):
        raise ValueError(f"group_sizes must be [{num_groups}], got {group_sizes.shape}.")
    parts = 2 if activation else 1
    n_out = n_dim // parts
    pitch = w.values.shape[2]
    why = check(k_dim, n_out, w.fmt, w.scales.shape, activation, config, pitch)
    if why:
        raise ValueError(f'gmm_fp8: {why}; use implementation="pallas_triton".')
    _common.check_epilogue(num_groups, n_dim, num_rows, bias, row_scale)
    _common.check_int32_sizes("gmm_fp8", x=x.shape, w=w.values.shape, out=(num_rows, n_out))
    out_dtype = jnp.dtype(out_dtype)
    if num_rows == 0 or n_out == 0:
        return jnp.zeros((num_rows, n_out), out_dtype)
    cta_m = 2 * config.block_m
    sched = dispatch.tile_schedule(
        _common.clamp_group_ends(group_sizes, num_rows), num_rows, cta_m, align=8
    )
    # TMA boxes of cta_m rows at multiples of 8 must fit in x: pad short or ragged ones.
    rows = max(-(-num_rows // 8) * 8, cta_m)
    pad = rows - num_rows
    x = jnp.pad(x, ((0, pad), (0, 0)))
    sx = jnp.pad(x_scales.astype(jnp.float32), ((0, pad), (0, 0))).T  # a step's scales: a row
    block_scales = w.fmt == "fp8_block"
    values, sw = w.values, w.scales.astype(jnp.float32)
    if activation == "gptoss":  # w's rows 2j (gate) and 2j + 1 (up) as one row of a free view
        values = values.reshape(num_groups, n_out, 2 * values.shape[2])

    def halves(columns):  # [G, N] in w's column order -> [G, parts, N_out]
        if activation == "gptoss":
            return columns.reshape(num_groups, n_out, 2).transpose(0, 2, 1)
        return columns.reshape(num_groups, parts, n_out)

    if not block_scales:
        sw = halves(sw)
    operands = [
        sched.group,
        sched.m_start // 8,
        sched.row_start,
        sched.row_end,
        x,
        sx,
        values,
        sw,
    ]
    if bias is not None:
        operands.append(halves(bias.astype(jnp.float32)))
    if row_scale is not None:
        operands.append(jnp.pad(row_scale[:num_rows].astype(jnp.float32), (0, pad)))
    kernel = functools.partial(
        _kernel,
        num_groups=num_groups,
        num_visits=sched.group.shape[0],
        k_dim=k_dim,
        cfg=config,
        block_scales=block_scales,
        has_bias=bias is not None,
        has_row_scale=row_scale is not None,
        activation=activation,
        swizzle=128 if k_dim % 128 == 0 and pitch % 128 == 0 else SWIZZLE_TAIL,
    )
    out = plgpu.kernel(
        kernel,
        out_type=jax.ShapeDtypeStruct((rows, n_out), out_dtype),
        grid=(_common.num_sms(),),
        grid_names=("sm",),
        num_threads=3,
        thread_name="wg",
        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
        interpret=plgpu.InterpretGPUParams() if _common.interpret_mode() else None,
        kernel_name="gmm_fp8_mgpu",
    )(*operands)
    return out[:num_rows] if pad else out
