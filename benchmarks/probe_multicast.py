"""Probe: the ping-pong gmm with its rhs block multicast to a cluster of two CTAs (#32).

The two CTAs of a cluster take the two visits 2p and 2p + 1 of one pair item (same group, same
n-tile, adjacent m-tiles) and each loads its own lhs rows, while the [block_k, block_n] rhs block
of every k-step is one TMA multicast into both CTAs' shared memory: each CTA streams half the rhs
bytes. A ring slot is free once both CTAs' consumers released it (a cluster barrier). Only for
groups whose visit count is even (equal groups of a multiple of 2·block_m rows): a probe of what
a half-height tile costs when its rhs stream is shared, against the unicast product kernel.

    python -m benchmarks.probe_multicast OUT_DIR      (on CPU: a small self-check)
"""

import functools
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from moe_pallas import dispatch
from moe_pallas.kernels import _common, gmm_mgpu


def _kernel(
    group_gmem,
    tile8_gmem,
    lhs_gmem,
    rhs_gmem,
    out_gmem,
    *,
    num_pairs,
    num_clusters,
    bm,
    bn,
    bk,
    stages,
):
    k_dim = lhs_gmem.shape[1]
    n_tiles, k_steps = out_gmem.shape[1] // bn, k_dim // bk
    cluster = jax.lax.axis_index("cluster_grid")
    cta = jax.lax.axis_index("cluster")
    items = _common.div(num_pairs * n_tiles - cluster + num_clusters - 1, num_clusters)

    def item(i):
        p, ni = plgpu.planar_snake(cluster + i * num_clusters, (num_pairs, n_tiles), 1, 4)
        v = 2 * p + cta
        return group_gmem[v], pl.multiple_of(tile8_gmem[v] * 8, 8), ni

    def body(lhs_smem, rhs_smem, o_smem, full, empty):
        wg = jax.lax.axis_index("wg")

        @pl.when(wg < 2)
        def _consumer():
            plgpu.set_max_registers(232, action="increase")

            def product(s, acc_ref):
                def step(kk, carry):
                    slot = _common.rem(s + kk, stages)
                    plgpu.barrier_wait(full.at[wg * stages + slot])
                    plgpu.wgmma(acc_ref, lhs_smem.at[slot], rhs_smem.at[slot])
                    plgpu.wgmma_wait(1)

                    @pl.when(kk > 0)
                    def _():
                        plgpu.barrier_arrive(empty.at[_common.rem(s + kk + stages - 1, stages)])

                    return carry

                jax.lax.fori_loop(0, k_steps, step, jnp.int32(0))
                plgpu.wgmma_wait(0)
                plgpu.barrier_arrive(empty.at[_common.rem(s + k_steps - 1, stages)])
                return acc_ref[...]

            def per_item(i, s):
                _, a0, ni = item(i)

                @pl.when(_common.rem(i, 2) == wg)
                def _():
                    acc = pl.run_scoped(functools.partial(product, s), plgpu.ACC((bm, bn)))
                    for c in range(bn // 64):
                        o_smem.at[wg][...] = acc[:, c * 64 : (c + 1) * 64].astype(o_smem.dtype)
                        plgpu.commit_smem()
                        plgpu.copy_smem_to_gmem(
                            o_smem.at[wg], out_gmem.at[pl.ds(a0, bm), pl.ds(ni * bn + c * 64, 64)]
                        )
                        plgpu.wait_smem_to_gmem(0, wait_read_only=True)

                return s + k_steps

            jax.lax.fori_loop(0, items, per_item, jnp.int32(0))

        @pl.when(wg == 2)
        def _producer():
            plgpu.set_max_registers(40, action="decrease")

            def per_item(i, s):
                g, a0, ni = item(i)
                consumer = _common.rem(i, 2)

                def step(kk, carry):
                    slot = _common.rem(s + kk, stages)

                    @pl.when(s + kk >= stages)
                    def _():
                        plgpu.barrier_wait(empty.at[slot])

                    ks = pl.ds(kk * bk, bk)
                    barrier = full.at[consumer * stages + slot]
                    plgpu.copy_gmem_to_smem(
                        lhs_gmem.at[pl.ds(a0, bm), ks], lhs_smem.at[slot], barrier
                    )
                    plgpu.copy_gmem_to_smem(
                        rhs_gmem.at[g, ks, pl.ds(ni * bn, bn)],
                        rhs_smem.at[slot],
                        barrier,
                        collective_axes="cluster",
                    )
                    return carry

                jax.lax.fori_loop(0, k_steps, step, jnp.int32(0))
                return s + k_steps

            steps = jax.lax.fori_loop(0, items, per_item, jnp.int32(0))

            @pl.loop(jnp.maximum(steps - stages, 0), steps)
            def _(s):
                plgpu.barrier_wait(empty.at[_common.rem(s, stages)])

    pl.run_scoped(
        body,
        plgpu.SMEM((stages, bm, bk), lhs_gmem.dtype),
        plgpu.SMEM((stages, bk, bn), rhs_gmem.dtype),
        plgpu.SMEM((2, bm, 64), out_gmem.dtype),
        plgpu.Barrier(num_arrivals=2, num_barriers=2 * stages),
        plgpu.ClusterBarrier(collective_axes=("cluster",), num_arrivals=1, num_barriers=stages),
        collective_axes="wg",
    )


def gmm_multicast(lhs, rhs, group_sizes, bm=64, bn=192, bk=64, stages=4):
    """lhs [M, K] @ rhs[g] for groups of a multiple of 2·bm rows each (no ragged rows)."""
    num_rows = lhs.shape[0]
    num_groups = rhs.shape[0]
    sched = dispatch.tile_schedule(
        _common.clamp_group_ends(group_sizes, num_rows), num_rows, bm, align=8
    )
    num_pairs = num_rows // (2 * bm)
    num_clusters = _common.num_sms() // 2
    kernel = functools.partial(
        _kernel,
        num_pairs=num_pairs,
        num_clusters=num_clusters,
        bm=bm,
        bn=bn,
        bk=bk,
        stages=stages,
    )
    return plgpu.kernel(
        kernel,
        out_type=jax.ShapeDtypeStruct((num_rows, rhs.shape[2]), lhs.dtype),
        grid=(num_clusters,),
        grid_names=("cluster_grid",),
        cluster=(2,),
        cluster_names=("cluster",),
        num_threads=3,
        thread_name="wg",
        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
        interpret=plgpu.InterpretGPUParams() if _common.interpret_mode() else None,
        kernel_name="gmm_multicast",
    )(jnp.minimum(sched.group, num_groups - 1), sched.m_start // 8, lhs, rhs)


def _check(rows, groups, k, n, **cfg):
    rng = np.random.default_rng(0)
    lhs = jnp.asarray(rng.standard_normal((rows, k)), jnp.bfloat16)
    rhs = jnp.asarray(rng.standard_normal((groups, k, n)) / np.sqrt(k), jnp.bfloat16)
    sizes = jnp.full((groups,), rows // groups, jnp.int32)
    out = np.asarray(gmm_multicast(lhs, rhs, sizes, **cfg), np.float64)
    x, w = np.asarray(lhs, np.float64), np.asarray(rhs, np.float64)
    ref = np.concatenate(
        [x[i * rows // groups : (i + 1) * rows // groups] @ w[i] for i in range(groups)]
    )
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


def main(out_dir):
    if jax.devices()[0].platform != "gpu":
        print("rel err", _check(256, 2, 128, 128, bm=64, bn=64, bk=32, stages=2))
        return
    from benchmarks.bench_gmm import time_op

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows, experts = 65536, 128
    k2, k3 = jax.random.split(jax.random.key(1))
    lhs = jax.random.normal(k2, (rows, 2880), jnp.bfloat16)
    rhs = (jax.random.normal(k3, (experts, 2880, 2880), jnp.float32) * 2880**-0.5).astype(
        jnp.bfloat16
    )
    sizes = jnp.full((experts,), rows // experts, jnp.int32)
    flops = 2 * rows * 2880 * 2880
    row = {"what": "gpt-oss down, equal groups, TFLOP/s", "check": _check(4096, 4, 2880, 2880)}
    ref = jax.jit(lambda x, w, s: gmm_mgpu.gmm(x, w, s))(lhs, rhs, sizes)
    for label, fn in {
        "unicast pp 128x192 s4": lambda x, w, s: gmm_mgpu.gmm(
            x,
            w,
            s,
            config=gmm_mgpu.MosaicConfig(128, 192, 64, 4, consumers=2, split="pingpong", epi_n=64),
        ),
        "unicast pp 64x192 s4": lambda x, w, s: gmm_mgpu.gmm(
            x,
            w,
            s,
            config=gmm_mgpu.MosaicConfig(64, 192, 64, 4, consumers=2, split="pingpong", epi_n=64),
        ),
        "multicast 64x192 s4": lambda x, w, s: gmm_multicast(x, w, s, 64, 192, 64, 4),
        "multicast 64x192 s6": lambda x, w, s: gmm_multicast(x, w, s, 64, 192, 64, 6),
        "multicast 64x256 s4": lambda x, w, s: gmm_multicast(x, w, s, 64, 256, 64, 4),
        "multicast 128x192 s4": lambda x, w, s: gmm_multicast(x, w, s, 128, 192, 64, 4),
    }.items():
        try:
            out = jax.jit(fn)(lhs, rhs, sizes)
            err = jnp.linalg.norm((out - ref).astype(jnp.float32)) / jnp.linalg.norm(
                ref.astype(jnp.float32)
            )
            row[label + " err"] = float(err)
            row[label] = round(flops / time_op(fn, lhs, rhs, sizes) / 1e12, 1)
        except Exception as e:  # noqa: BLE001 - probe: record and go on
            row[label] = f"{type(e).__name__}: {str(e)[:400]}"
        print(json.dumps(row), flush=True)
    (out_dir / "multicast.json").write_text(json.dumps(row, indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:])
