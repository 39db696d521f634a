"""Transposed grouped matmul out[g] = lhs[rows of g]ᵀ @ rhs[rows of g] for Hopper, Pallas Mosaic GPU.

Math. Rows m in [0, M) are split into G contiguous groups by `group_sizes`; for each group g,
`out[g] = Σ_{m in g} lhs[m]ᵀ ⊗ rhs[m]` (`[K, N]`, float32 accumulation by wgmma). This is the weight
gradient of `gmm_mgpu.gmm`. Empty groups give exact zeros; rows past sum(group_sizes) contribute
nothing. Same contract as `kernels.tgmm.tgmm` without its row gather.

Schedule. A persistent kernel (one CTA per SM) walks the (group, k-tile, n-tile) triples, n-tiles
in planar-snake bands. Per triple a TMA pipeline of `num_stages` shared-memory slots streams
[block_m, block_k] of lhs and [block_m, block_n] of rhs over the group's rows into wgmma (lhs read
transposed from shared memory) with a [block_k, block_n] float32 accumulator, stored by one TMA box.
The row blocks are aligned to block_m (as in jax's `transposed_ragged_dot_mgpu` example): the first
and last block of a group may hold rows of its neighbours, which are zeroed in the lhs slot before
the wgmma reads it (so rhs values of other groups meet exact zeros). lhs and rhs are padded with
zero rows to a multiple of block_m when M is not one (a copy), so no TMA box leaves them.

Limits (ValueError, use the Triton backend instead): bf16/f16 operands of one dtype, K a multiple
of 64 (the wgmma M of one warpgroup) and N a multiple of 16.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from moe_pallas import _backend
from moe_pallas.kernels.gmm import check_int32_sizes, clamp_group_sizes
from moe_pallas.kernels.gmm_mgpu import DTYPES, fit_block, num_sms


@dataclasses.dataclass(frozen=True)
class TgmmMosaicConfig:
    block_m: int = 64  # rows (the contraction) per pipeline step: 64 or 128
    block_k: int = 128  # output rows: wgmma M, a multiple of 64
    block_n: int = 128
    num_stages: int = 4  # shared-memory slots of the TMA ring, at least 2
    grid_tile_n: int = 4  # planar-snake band width over n-tiles

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


def _kernel(
    group_start_gmem,
    group_end_gmem,
    lhs_gmem,
    rhs_gmem,
    out_gmem,
    *,
    cfg: TgmmMosaicConfig,
):
    num_groups, k_dim, n_dim = out_gmem.shape
    bm, bk, bn = cfg.block_m, cfg.block_k, cfg.block_n
    k_tiles, n_tiles = k_dim // bk, n_dim // bn

    @plgpu.nd_loop((num_groups, k_tiles * n_tiles), collective_axes="sm")
    def _visit(info: plgpu.NDLoopInfo):
        g = info.index[0]
        ki, ni = plgpu.planar_snake(info.index[1], (k_tiles, n_tiles), 1, cfg.grid_tile_n)
        start, end = group_start_gmem[g], group_end_gmem[g]
        first_block = start // bm
        num_blocks = (end + bm - 1) // bm - first_block

        def step(idx, lhs_smem, rhs_smem, acc_ref):
            r = idx[0]

            # Rows of the neighbouring groups share the first and last block: zero them.
            @pl.when((r == 0) | (r == num_blocks - 1))
            def _mask():
                rows = (first_block + r) * bm + plgpu.layout_cast(
                    jax.lax.broadcasted_iota(jnp.int32, (bm, bk), 0), plgpu.Layout.WGMMA
                )
                keep = ((rows >= start) & (rows < end)).astype(lhs_smem.dtype)
                lhs_smem[...] = lhs_smem[...] * keep
                plgpu.commit_smem()

            plgpu.wgmma(acc_ref, lhs_smem.T, rhs_smem)
            # This step's wgmma stays in flight; the previous step's has read its slots before
            # the pipeline refills them (delay_release=1).
            plgpu.wgmma_wait(1)

        def product(acc_ref):
            @pl.when(end > start)
            def _():
                plgpu.emit_pipeline(
                    lambda idx, a, b: step(idx, a, b, acc_ref),
                    grid=(num_blocks,),
                    in_specs=[
                        plgpu.BlockSpec(
                            (bm, bk),
                            lambda r: (first_block + r, ki),
                            delay_release=1,
                            transforms=_transforms(cfg, lhs_gmem.dtype),
                        ),
                        plgpu.BlockSpec(
                            (bm, bn),
                            lambda r: (first_block + r, ni),
                            delay_release=1,
                            transforms=_transforms(cfg, rhs_gmem.dtype),
                        ),
                    ],
                    max_concurrent_steps=cfg.num_stages,
                )(lhs_gmem, rhs_gmem)

            return acc_ref[...]  # zeros for an empty group

        acc = pl.run_scoped(product, plgpu.ACC((bk, bn)))

        @functools.partial(pl.run_scoped, o_smem=plgpu.SMEM((bk, bn), out_gmem.dtype))
        def _store(o_smem):
            o_smem[...] = acc.astype(o_smem.dtype)
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(o_smem, out_gmem.at[g, pl.ds(ki * bk, bk), pl.ds(ni * bn, bn)])
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
    group_end = jnp.cumsum(clamp_group_sizes(group_sizes, num_rows).astype(jnp.int32))
    group_start = jnp.concatenate([jnp.zeros((1,), jnp.int32), group_end[:-1]])
    padded_rows = -(-num_rows // cfg.block_m) * cfg.block_m
    if padded_rows > num_rows:
        pad = ((0, padded_rows - num_rows), (0, 0))
        lhs, rhs = jnp.pad(lhs, pad), jnp.pad(rhs, pad)
    return plgpu.kernel(
        functools.partial(_kernel, cfg=cfg),
        out_type=jax.ShapeDtypeStruct((num_groups, k_dim, n_dim), out_dtype),
        grid=(num_sms(),),
        grid_names=("sm",),
        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
        interpret=plgpu.InterpretGPUParams() if _backend.interpret_mode() else None,
        kernel_name="tgmm_mgpu",
    )(group_start, group_end, lhs, rhs)
