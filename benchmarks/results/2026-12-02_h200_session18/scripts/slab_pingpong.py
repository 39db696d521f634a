"""Probe: batched slab matmul out[g] = lhs[g]^T @ rhs[g] (lhs [G, C, K], rhs [G, C, N]) on Mosaic
GPU with two consumer warpgroups in ping-pong and a producer warpgroup.

Session 13's one-warpgroup kernel (slab_mgpu.py) converts and stores a tile only after its wgmma,
so the SM's stores wait for the tensor cores and the reverse. Here consumer c takes the CTA's
steps s = c, c + 2, ... (a step: one [block_k, block_n] output tile, one wgmma contracting the C
rows), so while one converts and stores its tile the other multiplies. The producer issues the
TMA loads: a ring of `stages` lhs boxes [C, block_k] (stages even, so a slot is always read by
the same consumer) and `strips` rhs strips [C, block_n], each shared by both consumers for an
item (group, n-strip) and refilled once both have arrived on its "empty" barrier."""
import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from moe_pallas import _backend
from moe_pallas.kernels.gmm_mgpu import num_sms


@dataclasses.dataclass(frozen=True)
class PPCfg:
    block_k: int = 64
    block_n: int = 128
    stages: int = 4
    strips: int = 2
    out_buffers: int = 2  # per consumer
    producer_regs: int = 40


def _kernel(lhs_gmem, rhs_gmem, out_gmem, *, cfg, num_ctas):
    num_groups, cap, k_dim = lhs_gmem.shape
    n_dim = rhs_gmem.shape[2]
    bk, bn, stages, nb, ob = cfg.block_k, cfg.block_n, cfg.stages, cfg.strips, cfg.out_buffers
    n_tiles, k_tiles = n_dim // bn, k_dim // bk
    cta = jax.lax.axis_index("sm")
    items = jax.lax.div(num_groups * n_tiles - cta + num_ctas - 1, num_ctas)
    total = items * k_tiles
    strip_step = min(stages, k_tiles - 1)  # the step of item i that refills item i - 1's strip

    def where(s):
        i, ki = jax.lax.div(s, k_tiles), jax.lax.rem(s, k_tiles)
        p = cta + i * num_ctas
        return i, ki, jax.lax.div(p, n_tiles), jax.lax.rem(p, n_tiles)

    def body(lhs_smem, rhs_smem, o_smem, lhs_full, lhs_empty, strip_full, strip_empty):
        wg = jax.lax.axis_index("wg")

        @pl.when(wg < 2)
        def _consumer():
            plgpu.set_max_registers(232, action="increase")
            own = jax.lax.div(total - wg + 1, 2)

            def step(j, carry):
                s = wg + 2 * j
                i, ki, g, ni = where(s)
                slot, buf = jax.lax.rem(s, stages), jax.lax.rem(i, nb)

                @pl.when(ki < 2)  # this consumer's first step of item i
                def _():
                    plgpu.barrier_wait(strip_full.at[buf])

                plgpu.barrier_wait(lhs_full.at[slot])

                def product(acc_ref):
                    plgpu.wgmma(acc_ref, lhs_smem.at[slot].T, rhs_smem.at[buf])
                    return acc_ref[...]

                acc = pl.run_scoped(product, plgpu.ACC((bk, bn)))
                plgpu.barrier_arrive(lhs_empty.at[slot])

                @pl.when(ki >= k_tiles - 2)  # its last step of item i
                def _():
                    plgpu.barrier_arrive(strip_empty.at[buf])

                o = o_smem.at[wg, jax.lax.rem(j, ob)]
                plgpu.wait_smem_to_gmem(ob - 1, wait_read_only=True)
                o[...] = acc.astype(o.dtype)
                plgpu.commit_smem()
                plgpu.copy_smem_to_gmem(o, out_gmem.at[g, pl.ds(ki * bk, bk), pl.ds(ni * bn, bn)])
                return carry

            jax.lax.fori_loop(0, own, step, jnp.int32(0))
            plgpu.wait_smem_to_gmem(0, wait_read_only=True)

        @pl.when(wg == 2)
        def _producer():
            plgpu.set_max_registers(cfg.producer_regs, action="decrease")

            def issue_strip(i):
                p = cta + i * num_ctas
                g, ni = jax.lax.div(p, n_tiles), jax.lax.rem(p, n_tiles)
                buf = jax.lax.rem(i, nb)
                plgpu.copy_gmem_to_smem(
                    rhs_gmem.at[g, :, pl.ds(ni * bn, bn)], rhs_smem.at[buf], strip_full.at[buf]
                )

            for i in range(nb):

                @pl.when(i < items)
                def _(i=i):
                    issue_strip(jnp.int32(i))

            def produce(s, carry):
                i, ki, g, _ = where(s)
                slot = jax.lax.rem(s, stages)

                @pl.when(s >= stages)
                def _():
                    plgpu.barrier_wait(lhs_empty.at[slot])

                plgpu.copy_gmem_to_smem(
                    lhs_gmem.at[g, :, pl.ds(ki * bk, bk)], lhs_smem.at[slot], lhs_full.at[slot]
                )

                @pl.when((ki == strip_step) & (i >= 1) & (i + nb - 1 < items))
                def _():
                    plgpu.barrier_wait(strip_empty.at[jax.lax.rem(i - 1, nb)])
                    issue_strip(i + nb - 1)

                return carry

            jax.lax.fori_loop(0, total, produce, jnp.int32(0))

            # The arrivals not waited for above, so that every barrier phase is consumed.
            @pl.loop(jnp.maximum(total - stages, 0), total)
            def _(s):
                plgpu.barrier_wait(lhs_empty.at[jax.lax.rem(s, stages)])

            @pl.loop(jnp.maximum(items - nb, 0), items)
            def _(i):
                plgpu.barrier_wait(strip_empty.at[jax.lax.rem(i, nb)])

    bits = jnp.dtype(lhs_gmem.dtype).itemsize * 8
    swizzle = plgpu.find_swizzle(min(bk, bn) * bits)
    tr = (plgpu.TilingTransform((8, 8 * swizzle // bits)), plgpu.SwizzleTransform(swizzle))
    pl.run_scoped(
        body,
        plgpu.SMEM((stages, cap, bk), lhs_gmem.dtype, transforms=tr),
        plgpu.SMEM((nb, cap, bn), rhs_gmem.dtype, transforms=tr),
        plgpu.SMEM((2, ob, bk, bn), out_gmem.dtype),
        plgpu.Barrier(num_arrivals=1, num_barriers=stages),
        plgpu.Barrier(num_arrivals=1, num_barriers=stages),
        plgpu.Barrier(num_arrivals=1, num_barriers=nb),
        plgpu.Barrier(num_arrivals=2, num_barriers=nb),
        collective_axes="wg",
    )


def slabmm_pingpong(lhs, rhs, cfg=PPCfg(), out_dtype=jnp.bfloat16):
    g, cap, k = lhs.shape
    n = rhs.shape[2]
    assert cfg.stages % 2 == 0 and cfg.stages >= 2, cfg
    assert k % cfg.block_k == 0 and n % cfg.block_n == 0 and cap % 64 == 0, (lhs.shape, rhs.shape)
    assert k // cfg.block_k >= 2, "each consumer needs a step of every item"
    num_ctas = num_sms()
    return plgpu.kernel(
        functools.partial(_kernel, cfg=cfg, num_ctas=num_ctas),
        out_type=jax.ShapeDtypeStruct((g, k, n), out_dtype),
        grid=(num_ctas,),
        grid_names=("sm",),
        num_threads=3,
        thread_name="wg",
        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
        interpret=plgpu.InterpretGPUParams() if _backend.interpret_mode() else None,
        kernel_name="slabmm_pingpong",
    )(lhs, rhs)


if __name__ == "__main__":  # CPU (interpret mode) or GPU self-check on small random slabs
    for (g, cap, k, n), cfg in [
        ((3, 64, 128, 256), PPCfg()),
        ((5, 128, 192, 256), PPCfg(block_n=128, stages=2, out_buffers=1)),
        ((4, 64, 320, 384), PPCfg(block_n=192)),
    ]:
        ka, kb = jax.random.split(jax.random.key(g))
        a = jax.random.normal(ka, (g, cap, k), jnp.float32).astype(jnp.bfloat16)
        b = jax.random.normal(kb, (g, cap, n), jnp.float32).astype(jnp.bfloat16)
        ref = jnp.einsum("gck,gcn->gkn", a.astype(jnp.float32), b.astype(jnp.float32))
        out = slabmm_pingpong(a, b, cfg).astype(jnp.float32)
        err = float(jnp.linalg.norm(out - ref) / jnp.linalg.norm(ref))
        print((g, cap, k, n), cfg, "rel err", err, "finite", bool(jnp.isfinite(out).all()))
        assert err < 1e-2, err
