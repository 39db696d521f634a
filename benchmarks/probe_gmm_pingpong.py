"""Probe: a ping-pong Mosaic GPU grouped matmul out[m] = lhs[m] @ rhs[group(m)] (#32).

The shipped warp-specialised kernel (`kernels.gmm_mgpu`, split "m") has both consumer warpgroups
work on halves of one CTA tile: they finish together, so the tensor cores idle while both run the
epilogue, and a group's last visit computes a whole 2·block_m-row tile however few rows it holds
(65536 routed rows: 1.14x the rows at gpt-oss, 1.30x at SwiGLU-256). Here each consumer takes
whole tiles of its own, alternate items of the CTA's (visit, n-tile) list, so one multiplies while
the other converts and stores (CUTLASS's "ping-pong"), and a visit of at most block_m / 2 rows
runs a half-height tile.

Ring. The producer warpgroup streams each item's k-steps into one ring of `num_stages` slots, in
item order; step s of the CTA (counted over active items) lands in slot s % S and signals
full[c, slot] for the item's consumer c, so every barrier phase has one waiter and Mosaic GPU's
implicit phase tracking stays exact; consumers release slots on empty[slot] after their wgmma
(kept one group in flight: the previous step's slot is released). Plain gmm only (no epilogue).

    python -m benchmarks.probe_gmm_pingpong            # CPU: interpret-mode self-check
    python -m benchmarks.probe_gmm_pingpong OUT.json   # GPU: check and time at 65536 rows
"""

import dataclasses
import functools
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from moe_pallas import dispatch
from moe_pallas.kernels import _common
from moe_pallas.kernels.gmm_mgpu import _store_rows


@dataclasses.dataclass(frozen=True)
class PPConfig:
    block_m: int = 128
    block_n: int = 128
    block_k: int = 64
    num_stages: int = 4
    grid_tile_n: int = 4
    half_tail: bool = True
    epi_n: int | None = None  # store the tile in [rows, epi_n] chunks through one buffer


def _kernel(
    group_gmem,
    tile8_gmem,
    row_start_gmem,
    row_end_gmem,
    lhs_gmem,
    rhs_gmem,
    out_gmem,
    *,
    num_groups,
    num_visits,
    num_ctas,
    cfg,
):
    lhs_rows, k_dim = lhs_gmem.shape
    n_dim = out_gmem.shape[1]
    bm, bn, bk, stages = cfg.block_m, cfg.block_n, cfg.block_k, cfg.num_stages
    hm = bm // 2
    epi_n = cfg.epi_n or bn
    n_tiles, k_steps = n_dim // bn, k_dim // bk
    cta = jax.lax.axis_index("sm")
    items = _common.div(num_visits * n_tiles - cta + num_ctas - 1, num_ctas)

    def item(i):
        v, ni = plgpu.planar_snake(cta + i * num_ctas, (num_visits, n_tiles), 1, cfg.grid_tile_n)
        g = group_gmem[v]
        row_start = row_start_gmem[v]
        size = row_end_gmem[v] - row_start
        a0 = pl.multiple_of(jnp.minimum(tile8_gmem[v], (lhs_rows - bm) // 8) * 8, 8)
        active = (size > 0) & (g < num_groups)
        half = (row_start + size - a0 <= hm) if cfg.half_tail else jnp.bool_(False)
        return g, row_start, size, a0, ni, active, half

    def body(lhs_smem, rhs_smem, o_smem, full, empty):
        wg = jax.lax.axis_index("wg")

        @pl.when(wg < 2)
        def _consumer():
            plgpu.set_max_registers(232, action="increase")

            def compute(s, row_start, size, a0, ni, rows):
                def run(acc_ref):
                    def step(kk, carry):
                        st = s + kk
                        slot = _common.rem(st, stages)
                        plgpu.barrier_wait(full.at[wg * stages + slot])
                        a = lhs_smem.at[slot] if rows == bm else lhs_smem.at[slot, pl.ds(0, rows)]
                        plgpu.wgmma(acc_ref, a, rhs_smem.at[slot])
                        plgpu.wgmma_wait(1)

                        @pl.when(kk > 0)
                        def _():
                            plgpu.barrier_arrive(empty.at[_common.rem(st + stages - 1, stages)])

                        return carry

                    jax.lax.fori_loop(0, k_steps, step, jnp.int32(0))
                    plgpu.wgmma_wait(0)
                    plgpu.barrier_arrive(empty.at[_common.rem(s + k_steps - 1, stages)])
                    return acc_ref[...]

                acc = pl.run_scoped(run, plgpu.ACC((rows, bn), jnp.float32))
                o = o_smem.at[wg] if rows == bm else o_smem.at[wg, pl.ds(0, rows)]
                for c in range(bn // epi_n):
                    o[...] = acc[:, c * epi_n : (c + 1) * epi_n].astype(o.dtype)
                    _store_rows(o, out_gmem, a0, row_start, size, ni * bn + c * epi_n)

            def per_item(i, s):
                g, row_start, size, a0, ni, active, half = item(i)
                mine = _common.rem(i, 2) == wg

                @pl.when(mine & active & ~half)
                def _():
                    compute(s, row_start, size, a0, ni, bm)

                @pl.when(mine & active & half)
                def _():
                    compute(s, row_start, size, a0, ni, hm)

                @pl.when(mine & (size > 0) & (g == num_groups))
                def _():
                    o_smem[wg] = jnp.zeros((bm, epi_n), o_smem.dtype)
                    for c in range(bn // epi_n):
                        _store_rows(
                            o_smem.at[wg], out_gmem, a0, row_start, size, ni * bn + c * epi_n
                        )

                return s + jnp.where(active, k_steps, 0)

            jax.lax.fori_loop(0, items, per_item, jnp.int32(0))

        @pl.when(wg == 2)
        def _producer():
            plgpu.set_max_registers(40, action="decrease")

            def per_item(i, s):
                g, _, _, a0, ni, active, _ = item(i)
                owner = _common.rem(i, 2)

                @pl.when(active)
                def _():
                    rhs_g = rhs_gmem.at[jnp.minimum(g, num_groups - 1)]

                    def kstep(kk, carry):
                        st = s + kk
                        slot = _common.rem(st, stages)

                        @pl.when(st >= stages)
                        def _():
                            plgpu.barrier_wait(empty.at[slot])

                        bar = full.at[owner * stages + slot]
                        plgpu.copy_gmem_to_smem(
                            lhs_gmem.at[pl.ds(a0, bm), pl.ds(kk * bk, bk)], lhs_smem.at[slot], bar
                        )
                        plgpu.copy_gmem_to_smem(
                            rhs_g.at[pl.ds(kk * bk, bk), pl.ds(ni * bn, bn)], rhs_smem.at[slot], bar
                        )
                        return carry

                    jax.lax.fori_loop(0, k_steps, kstep, jnp.int32(0))

                return s + jnp.where(active, k_steps, 0)

            total = jax.lax.fori_loop(0, items, per_item, jnp.int32(0))

            @pl.loop(jnp.maximum(total - stages, 0), total)
            def _(st):  # the last releases, so that every phase of `empty` is consumed
                plgpu.barrier_wait(empty.at[_common.rem(st, stages)])

    pl.run_scoped(
        body,
        plgpu.SMEM((stages, bm, bk), lhs_gmem.dtype),
        plgpu.SMEM((stages, bk, bn), rhs_gmem.dtype),
        plgpu.SMEM((2, bm, epi_n), out_gmem.dtype),
        plgpu.Barrier(num_arrivals=2, num_barriers=2 * stages),
        plgpu.Barrier(num_arrivals=1, num_barriers=stages),
        collective_axes="wg",
    )


def gmm_pp(lhs, rhs, group_sizes, cfg: PPConfig = PPConfig()):
    num_rows, k_dim = lhs.shape
    num_groups, _, n_dim = rhs.shape
    assert n_dim % cfg.block_n == 0 and k_dim % cfg.block_k == 0, (lhs.shape, rhs.shape, cfg)
    sched = dispatch.tile_schedule(
        _common.clamp_group_ends(group_sizes, num_rows), num_rows, cfg.block_m, align=8
    )
    lhs_rows = max(-(-num_rows // 8) * 8, cfg.block_m)
    if lhs_rows > num_rows:
        lhs = jnp.pad(lhs, ((0, lhs_rows - num_rows), (0, 0)))
    num_ctas = _common.num_sms()
    kernel = functools.partial(
        _kernel, num_groups=num_groups, num_visits=sched.group.shape[0], num_ctas=num_ctas, cfg=cfg
    )
    out = plgpu.kernel(
        kernel,
        out_type=jax.ShapeDtypeStruct((lhs_rows, n_dim), lhs.dtype),
        grid=(num_ctas,),
        grid_names=("sm",),
        num_threads=3,
        thread_name="wg",
        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
        interpret=plgpu.InterpretGPUParams() if _common.interpret_mode() else None,
        kernel_name="gmm_pingpong",
    )(sched.group, sched.m_start // 8, sched.row_start, sched.row_end, lhs, rhs)
    return out[:num_rows]


def _reference(lhs, rhs, sizes):
    ends = np.cumsum(np.asarray(sizes))
    g = np.searchsorted(ends, np.arange(lhs.shape[0]), side="right")
    lhs64 = np.asarray(lhs, np.float64)
    rhs64 = np.asarray(rhs, np.float64)
    out = np.zeros((lhs.shape[0], rhs.shape[2]))
    for e in range(rhs.shape[0]):
        rows = g == e
        out[rows] = lhs64[rows] @ rhs64[e]
    return out


def _rel(out, ref):
    return float(
        np.linalg.norm(np.asarray(out, np.float64) - ref) / max(np.linalg.norm(ref), 1e-30)
    )


def self_check():
    rng = np.random.default_rng(0)
    for m, k, n, sizes, cfg in [
        (200, 128, 128, [3, 0, 150, 40], PPConfig()),
        (300, 192, 256, [70, 64, 0, 100, 50], PPConfig(num_stages=2)),
        (96, 64, 128, [96], PPConfig(half_tail=False)),
        (130, 128, 128, [1, 1, 120], PPConfig(num_stages=3)),
        (200, 128, 256, [3, 0, 150, 40], PPConfig(epi_n=64, num_stages=6)),
    ]:
        lhs = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
        rhs = jnp.asarray(rng.standard_normal((len(sizes), k, n)), jnp.bfloat16)
        out = np.asarray(gmm_pp(lhs, rhs, jnp.asarray(sizes, jnp.int32), cfg), np.float64)
        ref = _reference(lhs, rhs, sizes)
        err = _rel(out, ref)
        tail_zero = bool(np.all(out[sum(sizes) :] == 0))
        print(f"M={m} K={k} N={n} sizes={sizes} {cfg}: rel err {err:.2e} tail zero {tail_zero}")
        assert err < 1e-2 and tail_zero, err


SHAPES = {  # name: (K, N, E, k)
    "gptoss gate_up": (2880, 5760, 128, 4),
    "gptoss down": (2880, 2880, 128, 4),
    "swiglu gate_up": (4096, 4096, 256, 8),
    "swiglu down": (2048, 4096, 256, 8),
}
CONFIGS = {
    "pp 128x128 s5": PPConfig(num_stages=5),
    "pp 128x128 s6 epi64": PPConfig(num_stages=6, epi_n=64),
    "pp 128x128 s5 epi64": PPConfig(num_stages=5, epi_n=64),
    "pp 128x192 s4 epi64": PPConfig(block_n=192, num_stages=4, epi_n=64),
}


def time_gpu(out_path, rows=65536):
    import moe_pallas
    from benchmarks.bench_gmm import time_op

    # the routed and equal cases compile the same programs: reuse them
    jax.config.update("jax_compilation_cache_dir", "/tmp/jax_cache_probe")
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

    results = []
    for name, (k_dim, n_dim, experts, top_k) in SHAPES.items():
        key = jax.random.key(0)
        k1, k2, k3 = jax.random.split(key, 3)
        lhs = jax.random.normal(k2, (rows, k_dim), jnp.bfloat16)
        rhs = (jax.random.normal(k3, (experts, k_dim, n_dim), jnp.float32) * k_dim**-0.5).astype(
            jnp.bfloat16
        )
        idx = jax.random.randint(k1, (rows // top_k, top_k), 0, experts, jnp.int32)
        routed = dispatch.dispatch(idx, experts).group_sizes
        equal = jnp.full((experts,), rows // experts, jnp.int32)
        flops = 2 * rows * k_dim * n_dim
        for routing, sizes in (("routed", routed), ("equal", equal)):
            row = {"shape": name, "routing": routing}
            ref = moe_pallas.ragged_dot(lhs, rhs, sizes, implementation="pallas_triton")
            impls = {
                "triton": lambda x, w, s: moe_pallas.ragged_dot(
                    x, w, s, implementation="pallas_triton"
                ),
                "mosaic table": lambda x, w, s: moe_pallas.ragged_dot(
                    x, w, s, implementation="mosaic_gpu"
                ),
            }
            for label, cfg in CONFIGS.items():
                impls[label] = lambda x, w, s, cfg=cfg: gmm_pp(x, w, s, cfg)
            if routing == "equal":
                g = experts
                impls["xla batched"] = lambda x, w, s: jnp.einsum(
                    "gmk,gkn->gmn", x.reshape(g, -1, x.shape[1]), w
                ).reshape(x.shape[0], -1)
            for label, fn in impls.items():
                try:
                    if label.startswith("pp"):
                        out = jax.jit(fn)(lhs, rhs, sizes)
                        err = float(
                            jnp.linalg.norm((out - ref).astype(jnp.float32))
                            / jnp.linalg.norm(ref.astype(jnp.float32))
                        )
                        row[label + " err"] = err
                    s = time_op(fn, lhs, rhs, sizes)
                    row[label] = flops / s / 1e12
                except Exception as e:  # noqa: BLE001 - probe: record and go on
                    row[label] = f"{type(e).__name__}: {str(e)[:300]}"
            print(json.dumps(row), flush=True)
            results.append(row)
    with open(out_path, "w") as f:
        json.dump(
            {"device": jax.devices()[0].device_kind, "rows": rows, "results": results}, f, indent=1
        )


def diagnose(out_path, rows=65536):
    """Where the routed rows lose against equal groups: group sizes with and without tails."""
    import moe_pallas
    from benchmarks.bench_gmm import time_op

    jax.config.update("jax_compilation_cache_dir", "/tmp/jax_cache_probe")
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    experts, top_k = 128, 4
    routed = np.asarray(
        dispatch.dispatch(
            jax.random.randint(jax.random.key(0), (rows // top_k, top_k), 0, experts, jnp.int32),
            experts,
        ).group_sizes
    )
    rounded = np.maximum(np.round(routed / 128).astype(int) * 128, 0)
    rounded[-1] += rows - rounded.sum()
    sizes = {
        "equal": np.full(experts, rows // experts),
        "routed": routed,
        "508/516": np.tile([508, 516], experts // 2),
        "504/520": np.tile([504, 520], experts // 2),
        "448/576": np.tile([448, 576], experts // 2),
        "routed rounded to 128": rounded,
        "routed sorted by size": np.sort(routed),
    }
    impls = {
        "mosaic table": lambda x, w, s: moe_pallas.ragged_dot(x, w, s, implementation="mosaic_gpu"),
        "triton": lambda x, w, s: moe_pallas.ragged_dot(x, w, s, implementation="pallas_triton"),
        "pp 128x192 s4 epi64": lambda x, w, s: gmm_pp(x, w, s, PPConfig(block_n=192, epi_n=64)),
        "pp 128x192 s4 epi64 full tail": lambda x, w, s: gmm_pp(
            x, w, s, PPConfig(block_n=192, epi_n=64, half_tail=False)
        ),
        "pp 128x128 s5 epi64": lambda x, w, s: gmm_pp(x, w, s, PPConfig(num_stages=5, epi_n=64)),
    }
    results = []
    for name in ("gptoss down", "gptoss gate_up"):
        k_dim, n_dim, _, _ = SHAPES[name]
        k2, k3 = jax.random.split(jax.random.key(1))
        lhs = jax.random.normal(k2, (rows, k_dim), jnp.bfloat16)
        rhs = (jax.random.normal(k3, (experts, k_dim, n_dim), jnp.float32) * k_dim**-0.5).astype(
            jnp.bfloat16
        )
        flops = 2 * rows * k_dim * n_dim
        for label, fn in impls.items():
            if name == "gptoss down" and label.startswith("pp 128x128"):
                continue
            row = {"shape": name, "impl": label}
            for routing, sz in sizes.items():
                assert sz.sum() == rows and (sz >= 0).all(), routing
                try:
                    row[routing] = flops / time_op(fn, lhs, rhs, jnp.asarray(sz, jnp.int32)) / 1e12
                except Exception as e:  # noqa: BLE001 - probe: record and go on
                    row[routing] = f"{type(e).__name__}: {str(e)[:200]}"
            print(json.dumps(row), flush=True)
            results.append(row)
    with open(out_path, "w") as f:
        json.dump({"device": jax.devices()[0].device_kind, "results": results}, f, indent=1)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "diagnose":
        diagnose(sys.argv[2])
    elif len(sys.argv) > 1:
        self_check()
        time_gpu(sys.argv[1])
    else:
        self_check()
