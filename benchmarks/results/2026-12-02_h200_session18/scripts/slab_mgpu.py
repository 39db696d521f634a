"""Probe: batched slab matmul out[g] = lhs[g]^T @ rhs[g] on Mosaic GPU (lhs [G,C,K], rhs [G,C,N]).
A persistent CTA owns items (group, n-strip): the rhs strip [C, bn] stays in shared memory while
the CTA walks the strip's k-tiles, each a [C, bk] lhs box through a TMA ring, one wgmma
(contraction C) and an asynchronous TMA store from one of two output buffers."""
import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from moe_pallas import _backend
from moe_pallas.kernels.gmm_mgpu import num_sms


@dataclasses.dataclass(frozen=True)
class Cfg:
    block_k: int = 64
    block_n: int = 192
    num_stages: int = 3
    ctas_per_sm: int = 1
    strip_buffers: int = 2


def _kernel(lhs_gmem, rhs_gmem, out_gmem, lhs_smem, rhs_smem, o_smem, lhs_bars, rhs_bars, *,
            cfg, num_ctas):
    num_groups, cap, k_dim = lhs_gmem.shape
    n_dim = rhs_gmem.shape[2]
    bk, bn, stages, nb = cfg.block_k, cfg.block_n, cfg.num_stages, cfg.strip_buffers
    n_tiles, k_tiles = n_dim // bn, k_dim // bk
    cta = jax.lax.axis_index("sm")
    items = jax.lax.div(num_groups * n_tiles - cta + num_ctas - 1, num_ctas)
    total = items * k_tiles

    def item(i):
        p = cta + i * num_ctas
        return jax.lax.div(p, n_tiles), jax.lax.rem(p, n_tiles)

    def issue_lhs(s):
        i, ki = jax.lax.div(s, k_tiles), jax.lax.rem(s, k_tiles)
        g, _ = item(i)
        slot = jax.lax.rem(s, stages)
        plgpu.copy_gmem_to_smem(
            lhs_gmem.at[g, :, pl.ds(ki * bk, bk)], lhs_smem.at[slot], lhs_bars.at[slot])

    def issue_rhs(i):
        g, ni = item(i)
        buf = jax.lax.rem(i, nb)
        plgpu.copy_gmem_to_smem(
            rhs_gmem.at[g, :, pl.ds(ni * bn, bn)], rhs_smem.at[buf], rhs_bars.at[buf])

    for s in range(stages):
        @pl.when(s < total)
        def _(s=s):
            issue_lhs(jnp.int32(s))
    for i in range(nb):
        @pl.when(i < items)
        def _(i=i):
            issue_rhs(jnp.int32(i))

    def step(s, carry):
        i, ki = jax.lax.div(s, k_tiles), jax.lax.rem(s, k_tiles)
        g, ni = item(i)
        slot, buf = jax.lax.rem(s, stages), jax.lax.rem(i, nb)

        @pl.when(ki == 0)
        def _():
            plgpu.barrier_wait(rhs_bars.at[buf])

        plgpu.barrier_wait(lhs_bars.at[slot])

        def product(acc_ref):
            plgpu.wgmma(acc_ref, lhs_smem.at[slot].T, rhs_smem.at[buf])
            return acc_ref[...]

        acc = pl.run_scoped(product, plgpu.ACC((bk, bn)))

        @pl.when(s + stages < total)
        def _():
            issue_lhs(s + stages)

        @pl.when((ki == k_tiles - 1) & (i + nb < items))
        def _():
            issue_rhs(i + nb)

        obuf = jax.lax.rem(s, 2)
        plgpu.wait_smem_to_gmem(1, wait_read_only=True)
        o_smem[obuf] = acc.astype(o_smem.dtype)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(
            o_smem.at[obuf], out_gmem.at[g, pl.ds(ki * bk, bk), pl.ds(ni * bn, bn)])
        return carry

    jax.lax.fori_loop(0, total, step, jnp.int32(0))
    plgpu.wait_smem_to_gmem(0, wait_read_only=True)


def slabmm_mgpu(lhs, rhs, cfg=Cfg(), out_dtype=jnp.bfloat16):
    g, cap, k = lhs.shape
    n = rhs.shape[2]
    assert k % cfg.block_k == 0 and n % cfg.block_n == 0 and cap % 8 == 0, (lhs.shape, rhs.shape, cfg)
    num_ctas = cfg.ctas_per_sm * num_sms()
    bits = 16
    swizzle = plgpu.find_swizzle(min(cfg.block_k, cfg.block_n) * bits)
    tr = (plgpu.TilingTransform((8, 8 * swizzle // bits)), plgpu.SwizzleTransform(swizzle))
    return plgpu.kernel(
        functools.partial(_kernel, cfg=cfg, num_ctas=num_ctas),
        out_type=jax.ShapeDtypeStruct((g, k, n), out_dtype),
        grid=(num_ctas,),
        grid_names=("sm",),
        scratch_types=[
            plgpu.SMEM((cfg.num_stages, cap, cfg.block_k), lhs.dtype, transforms=tr),
            plgpu.SMEM((cfg.strip_buffers, cap, cfg.block_n), rhs.dtype, transforms=tr),
            plgpu.SMEM((2, cfg.block_k, cfg.block_n), out_dtype),
            plgpu.Barrier(num_arrivals=1, num_barriers=cfg.num_stages),
            plgpu.Barrier(num_arrivals=1, num_barriers=cfg.strip_buffers),
        ],
        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
        interpret=plgpu.InterpretGPUParams() if _backend.interpret_mode() else None,
        kernel_name="slabmm_mgpu",
    )(lhs, rhs)


def _kernel2(lhs_gmem, rhs_gmem, out_gmem, lhs_smem, rhs_smem, o_smem, lhs_bars, rhs_bars, *,
             cfg, num_ctas):
    """Two accumulators: step s's wgmma runs while step s - 1's tile is converted and stored."""
    num_groups, cap, k_dim = lhs_gmem.shape
    n_dim = rhs_gmem.shape[2]
    bk, bn, stages = cfg.block_k, cfg.block_n, cfg.num_stages
    assert cfg.strip_buffers == 2
    n_tiles, k_tiles = n_dim // bn, k_dim // bk
    cta = jax.lax.axis_index("sm")
    items = jax.lax.div(num_groups * n_tiles - cta + num_ctas - 1, num_ctas)
    total = items * k_tiles

    def where(s):
        i, ki = jax.lax.div(s, k_tiles), jax.lax.rem(s, k_tiles)
        p = cta + i * num_ctas
        return i, ki, jax.lax.div(p, n_tiles), jax.lax.rem(p, n_tiles)

    def issue_lhs(s):
        _, ki, g, _ = where(s)
        slot = jax.lax.rem(s, stages)
        plgpu.copy_gmem_to_smem(
            lhs_gmem.at[g, :, pl.ds(ki * bk, bk)], lhs_smem.at[slot], lhs_bars.at[slot])

    def issue_rhs(i):
        p = cta + i * num_ctas
        g, ni = jax.lax.div(p, n_tiles), jax.lax.rem(p, n_tiles)
        buf = jax.lax.rem(i, 2)
        plgpu.copy_gmem_to_smem(
            rhs_gmem.at[g, :, pl.ds(ni * bn, bn)], rhs_smem.at[buf], rhs_bars.at[buf])

    for s in range(stages):
        @pl.when(s < total)
        def _(s=s):
            issue_lhs(jnp.int32(s))
    for i in range(2):
        @pl.when(i < items)
        def _(i=i):
            issue_rhs(jnp.int32(i))

    def step(s, acc_cur, acc_prev):
        live = s < total
        i, ki, g, ni = where(s)
        slot, buf = jax.lax.rem(s, stages), jax.lax.rem(i, 2)

        @pl.when(live & (ki == 0))
        def _():
            plgpu.barrier_wait(rhs_bars.at[buf])

        @pl.when(live)
        def _():
            plgpu.barrier_wait(lhs_bars.at[slot])

        acc_cur[...] = jnp.zeros((bk, bn), jnp.float32)
        plgpu.wgmma(acc_cur, lhs_smem.at[slot].T, rhs_smem.at[buf])
        prev = plgpu.wgmma_accumulator_load(acc_prev, wait_n=1)  # step s - 1's product
        t = s - 1
        pi, pki, pg, pni = where(t)

        @pl.when((s > 0) & (t < total))
        def _():
            @pl.when(t + stages < total)
            def _():
                issue_lhs(t + stages)

            @pl.when((pki == k_tiles - 1) & (pi + 2 < items))
            def _():
                issue_rhs(pi + 2)

            obuf = jax.lax.rem(t, 2)
            plgpu.wait_smem_to_gmem(1, wait_read_only=True)
            o_smem[obuf] = prev.astype(o_smem.dtype)
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(
                o_smem.at[obuf], out_gmem.at[pg, pl.ds(pki * bk, bk), pl.ds(pni * bn, bn)])

    def body(acc0, acc1):
        def pair(p, carry):
            step(2 * p, acc0, acc1)
            step(2 * p + 1, acc1, acc0)
            return carry

        # total + 1 steps: the last one only finishes step total - 1.
        jax.lax.fori_loop(0, jax.lax.div(total + 2, 2), pair, jnp.int32(0))

    pl.run_scoped(body, plgpu.ACC((bk, bn)), plgpu.ACC((bk, bn)))
    plgpu.wgmma_wait(0)
    plgpu.wait_smem_to_gmem(0, wait_read_only=True)


def slabmm_mgpu2(lhs, rhs, cfg=Cfg(), out_dtype=jnp.bfloat16):
    g, cap, k = lhs.shape
    n = rhs.shape[2]
    assert k % cfg.block_k == 0 and n % cfg.block_n == 0 and cap % 64 == 0, (lhs.shape, rhs.shape, cfg)
    num_ctas = cfg.ctas_per_sm * num_sms()
    swizzle = plgpu.find_swizzle(min(cfg.block_k, cfg.block_n) * 16)
    tr = (plgpu.TilingTransform((8, 8 * swizzle // 16)), plgpu.SwizzleTransform(swizzle))
    return plgpu.kernel(
        functools.partial(_kernel2, cfg=cfg, num_ctas=num_ctas),
        out_type=jax.ShapeDtypeStruct((g, k, n), out_dtype),
        grid=(num_ctas,),
        grid_names=("sm",),
        scratch_types=[
            plgpu.SMEM((cfg.num_stages, cap, cfg.block_k), lhs.dtype, transforms=tr),
            plgpu.SMEM((2, cap, cfg.block_n), rhs.dtype, transforms=tr),
            plgpu.SMEM((2, cfg.block_k, cfg.block_n), out_dtype),
            plgpu.Barrier(num_arrivals=1, num_barriers=cfg.num_stages),
            plgpu.Barrier(num_arrivals=1, num_barriers=2),
        ],
        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
        interpret=plgpu.InterpretGPUParams() if _backend.interpret_mode() else None,
        kernel_name="slabmm_mgpu2",
    )(lhs, rhs)
