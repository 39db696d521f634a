"""Grouped e4m3 x e4m3 matmul with DeepSeek-V3's promotion on Mosaic GPU (a probe; the dense
question is `.probe/fp8_mgpu_probe.py`'s).

    out[m] = ((Σ_b sa[b, m] · s_w[g, b] · Σ_{k in block b} x[m, k] w[g, n, k]) · cs[g, n]
              + bias[g, n]) · row_scale[m]

x [M, K] float8_e4m3fn rows (quantised per row and 128 values of K, `quant.quantize_rows`, sa its
scales transposed [K/128, M]), w [G, N, K] float8_e4m3fn N-major (the stored weights), "fp8":
cs its column scales and s_w = 1; "fp8_block": s_w its [G, K/128, N/128] block scales (block_n
divides 128) and cs = 1. As gmm_mgpu's split "m": a producer warpgroup streams [2·bm, bk] of x,
[bn, bk] of w[g] and the rows' scales of the step's block; two consumer warpgroups of bm rows
share the weight tile, each step a wgmma into a zeroed partial accumulator, a wait on its own
wgmma only, and the partial times the rows' (and block's) scale added into a float32
accumulator, so one consumer promotes while the other's wgmma runs. Rows schedule, ragged
groups and stores as gmm_mgpu (`dispatch.tile_schedule(align=8)`, `_store_rows`).

Usage: python .probe/gmm_fp8_mgpu.py OUT.json  (CPU: interpret-mode checks on small shapes;
GPU: checks, then the layer's down call timed against Triton's FP8-activation gmm_quant and
bf16 at 64 rows per expert and the largest T, medians of 3 rounds)"""
import functools, json, sys, time
import numpy as np
import jax, jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from moe_pallas import dispatch, quant
from moe_pallas.kernels import _common
from moe_pallas.kernels.gmm_mgpu import _store_rows

ON_GPU = jax.default_backend() == "gpu"


def _kernel(group_gmem, tile8_gmem, row_start_gmem, row_end_gmem, x_gmem, sa_gmem, w_gmem,
            wscale_gmem, bias_gmem, rs_gmem, out_gmem, *, num_groups, num_visits, bm, bn, bk,
            stages, block_scales):
    rows_total, k_dim = x_gmem.shape
    n_dim = out_gmem.shape[1]
    cta_m, n_tiles, per_block = 2 * bm, n_dim // bn, 128 // bk
    swizzle = plgpu.find_swizzle(bk * 8)
    transforms = (plgpu.TilingTransform((8, swizzle)), plgpu.SwizzleTransform(swizzle))

    def pipeline(body, ctx):
        return plgpu.emit_pipeline_warp_specialized(
            body,
            grid=(k_dim // bk,),
            memory_registers=40,
            in_specs=[
                plgpu.BlockSpec((cta_m, bk), lambda kk: (0, kk), transforms=transforms,
                                memory_space=plgpu.SMEM),
                plgpu.BlockSpec((bn, bk), lambda kk: (0, kk), transforms=transforms,
                                memory_space=plgpu.SMEM),
                plgpu.BlockSpec((1, cta_m), lambda kk: (kk // per_block, 0), memory_space=plgpu.SMEM),
            ],
            wg_axis="wg",
            num_compute_wgs=2,
            max_concurrent_steps=stages,
            compute_context=ctx,
        )

    ignore = lambda *_, **__: None

    @functools.partial(
        pl.run_scoped,
        allocs=pipeline(ignore, ignore).get_allocations(
            x_gmem.at[pl.ds(0, cta_m)], w_gmem.at[0, pl.ds(0, bn)], sa_gmem.at[:, pl.ds(0, cta_m)]),
        o_smem=plgpu.SMEM((2, bm, bn), out_gmem.dtype),
        col_smem=plgpu.SMEM((2, 2, bn), jnp.float32),  # per consumer: column scale, bias
        rs_smem=plgpu.SMEM((2, bm), jnp.float32),
        barriers=plgpu.Barrier(num_arrivals=1, num_barriers=6),  # per consumer: cs, bias, rows
        collective_axes="wg",
    )
    def _scope(allocs, o_smem, col_smem, rs_smem, barriers):
        wg = lax.axis_index("wg")

        @plgpu.nd_loop((num_visits * n_tiles,), collective_axes="sm")
        def _visit(info):
            v, ni = plgpu.planar_snake(info.index[0], (num_visits, n_tiles), 1, 4)
            g = group_gmem[v]
            row_start = row_start_gmem[v]
            size = row_end_gmem[v] - row_start
            a0 = pl.multiple_of(jnp.minimum(tile8_gmem[v], (rows_total - cta_m) // 8) * 8, 8)
            col0 = ni * bn
            wg_a0 = a0 + wg * bm
            wg_start = jnp.clip(row_start, wg_a0, wg_a0 + bm)
            wg_size = jnp.clip(row_start + size, wg_a0, wg_a0 + bm) - wg_start

            def ctx(eval_pipeline):
                gs = jnp.minimum(g, num_groups - 1)
                bars = [barriers.at[wg * 3 + i] for i in range(3)]
                plgpu.copy_gmem_to_smem(wscale_gmem.at[gs, pl.ds(0, 1), pl.ds(col0, bn)] if not block_scales
                                        else bias_gmem.at[gs, pl.ds(0, 1), pl.ds(col0, bn)],
                                        col_smem.at[wg, pl.ds(0, 1)], bars[0])
                plgpu.copy_gmem_to_smem(bias_gmem.at[gs, pl.ds(0, 1), pl.ds(col0, bn)],
                                        col_smem.at[wg, pl.ds(1, 1)], bars[1])
                plgpu.copy_gmem_to_smem(rs_gmem.at[pl.ds(wg_a0, bm)], rs_smem.at[wg], bars[2])
                zero = plgpu.layout_cast(jnp.full((bm, bn), 0, jnp.float32), plgpu.Layout.WGMMA)
                acc = eval_pipeline(zero)
                for bar in bars:
                    plgpu.barrier_wait(bar)
                cols = lambda r: lax.broadcast_in_dim(col_smem[wg, r], acc.shape, (1,))
                out = acc if block_scales else acc * cols(0)
                out = (out + cols(1)) * lax.broadcast_in_dim(rs_smem[wg], acc.shape, (0,))
                o_smem[wg] = out.astype(o_smem.dtype)
                _store_rows(o_smem.at[wg], out_gmem, wg_a0, wg_start, wg_size, col0)

            def mma(idx, a_smem, w_smem, sa_smem, acc):
                def partial(part_ref):  # this K step's products, on a zeroed accumulator
                    plgpu.wgmma(part_ref, a_smem.at[pl.ds(wg * bm, bm)], w_smem.T)
                    plgpu.wgmma_wait(0)
                    return part_ref[...]

                part = pl.run_scoped(partial, plgpu.ACC((bm, bn)))
                s = sa_smem[0, pl.ds(wg * bm, bm)]
                if block_scales:
                    (kk,) = idx
                    s = s * wscale_gmem[jnp.minimum(g, num_groups - 1), kk // per_block, col0 // 128]
                return acc + part * lax.broadcast_in_dim(s, part.shape, (0,))

            @pl.when((size > 0) & (g < num_groups))
            def _grouped_rows():
                pipeline(mma, ctx)(x_gmem.at[pl.ds(a0, cta_m)], w_gmem.at[g, pl.ds(col0, bn)],
                                   sa_gmem.at[:, pl.ds(a0, cta_m)], allocations=allocs)

            @pl.when((size > 0) & (g == num_groups) & (wg < 2))
            def _tail_rows():
                o_smem[wg] = jnp.zeros((bm, bn), o_smem.dtype)
                _store_rows(o_smem.at[wg], out_gmem, wg_a0, wg_start, wg_size, col0)


def gmm_fp8(x_q, x_scales, w, group_sizes, bias, row_scale, *, bm=64, bn=128, bk=128, stages=4,
            num_sms=None, interpret=None):
    """x_q [M, K] e4m3 with x_scales [M, K/128] (`quant.quantize_rows`), w a QuantizedWeight
    ("fp8" or "fp8_block", logical [G, K, N]), bias [G, N], row_scale [M]: bf16 [M, N]."""
    m, k = x_q.shape
    g_count, n, _ = w.values.shape
    block_scales = w.fmt == "fp8_block"
    assert k % bk == 0 and 128 % bk == 0 and n % bn == 0 and (not block_scales or 128 % bn == 0)
    sched = dispatch.tile_schedule(_common.clamp_group_ends(group_sizes, m), m, 2 * bm, align=8)
    rows = max(-(-m // 8) * 8, 2 * bm)
    x_q = jnp.pad(x_q, ((0, rows - m), (0, 0)))
    sa = jnp.pad(x_scales.astype(jnp.float32), ((0, rows - m), (0, 0))).T
    rs = jnp.pad(row_scale.astype(jnp.float32), (0, rows - m))
    bias3 = bias.astype(jnp.float32).reshape(g_count, 1, n)
    wscale = w.scales.astype(jnp.float32)
    if not block_scales:
        wscale = wscale.reshape(g_count, 1, n)
    kernel = functools.partial(
        _kernel, num_groups=g_count, num_visits=sched.group.shape[0], bm=bm, bn=bn, bk=bk,
        stages=stages, block_scales=block_scales)
    interp = (not ON_GPU) if interpret is None else interpret
    out = plgpu.kernel(
        kernel,
        out_type=jax.ShapeDtypeStruct((rows, n), jnp.bfloat16),
        grid=(num_sms or (_common.num_sms() if ON_GPU else 2),),
        grid_names=("sm",),
        num_threads=3,
        thread_name="wg",
        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
        interpret=plgpu.InterpretGPUParams() if interp else None,
    )(sched.group, sched.m_start // 8, sched.row_start, sched.row_end, x_q, sa, w.values, wscale,
      bias3, rs)
    return out[:m]


def oracle(x_q, x_scales, w, group_sizes, bias, row_scale):
    xf = np.asarray(quant.dequantize_rows(x_q, x_scales, jnp.float32), np.float64)
    wf = np.asarray(w.dequantize(jnp.float32), np.float64)  # [G, K, N]
    out, r = np.zeros((xf.shape[0], wf.shape[2])), 0
    for g, size in enumerate(np.asarray(group_sizes)):
        out[r:r + size] = (xf[r:r + size] @ wf[g] + np.asarray(bias, np.float64)[g]) * np.asarray(
            row_scale, np.float64)[r:r + size, None]
        r += size
    return out


def check(fmt, k, n, sizes, bm=64, bn=128, bk=128):
    rng = np.random.default_rng(0)
    m = sum(sizes)
    w = quant.quantize_weight(jnp.asarray(rng.standard_normal((len(sizes), k, n)) / np.sqrt(k),
                                          jnp.bfloat16), fmt)
    x = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
    x_q, x_s = quant.quantize_rows(x)
    bias = jnp.asarray(rng.standard_normal((len(sizes), n)), jnp.float32)
    rs = jnp.asarray(rng.random(m) + 0.5, jnp.float32)
    gs = jnp.asarray(sizes, jnp.int32)
    got = np.asarray(gmm_fp8(x_q, x_s, w, gs, bias, rs, bm=bm, bn=bn, bk=bk), np.float64)
    want = oracle(x_q, x_s, w, gs, bias, rs)
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def main(out_path):
    res = {}
    if not ON_GPU:
        for fmt in ("fp8", "fp8_block"):
            for bk in (128, 64):
                res[f"{fmt} bk={bk}"] = check(fmt, 256, 128, [70, 0, 9, 49], bn=64 if fmt == "fp8_block" else 128, bk=bk)
                print(fmt, bk, res[f"{fmt} bk={bk}"], flush=True)
        json.dump(res, open(out_path, "w"), indent=1)
        return
    from benchmarks import cases as C
    from moe_pallas.kernels.gmm_quant import gmm_quant
    from moe_pallas.kernels.config import BlockConfig
    from moe_pallas.backends import pallas_triton as pt
    res["check"] = {f: check(f, 2880, 2880, [300, 0, 17, 700], bn=64, bk=64) for f in ("fp8", "fp8_block")}
    print(res["check"], flush=True)
    for wl, tokens in (("gptoss", (2048, 16384)), ("swiglu256", (2048, 8192))):
        W = C.WORKLOADS[wl]
        k, n, e = W.inter, W.hidden, W.experts
        key = jax.random.key(0)
        w16 = jax.random.normal(key, (e, k, n), jnp.bfloat16) * 0.02
        for T in tokens:
            m = T * W.top_k
            idx = jax.random.randint(jax.random.fold_in(key, T), (T, W.top_k), 0, e, jnp.int32)
            d = dispatch.dispatch(idx, e)
            a = jax.random.normal(jax.random.fold_in(key, 1), (m, k), jnp.bfloat16)
            bias = jnp.zeros((e, n), jnp.float32)
            rs = jnp.ones((m,), jnp.float32)
            row = {"case": f"{wl} down T={T}"}
            for fmt in ("fp8", "fp8_block"):
                w = quant.quantize_weight(w16, fmt)
                wa8 = quant.QuantizedWeight(w.values, w.scales, fmt, jnp.bfloat16, False, True)
                cfg = pt.config("gmm", jnp.float8_e4m3fn, m, e, k, n, fp8_activations=True)
                tri = jax.jit(lambda a, w, s, r, cfg=cfg: gmm_quant(
                    *quant.quantize_rows(a)[:1], w, s, bias=bias, row_scale=r, out_dtype=jnp.bfloat16,
                    lhs_scales=quant.quantize_rows(a)[1], config=cfg))
                variants = {"triton": tri}
                for bn_, bk_ in ((64, 64), (128, 64), (64, 128), (128, 128), (192, 64)):
                    if k % bk_ or n % bn_ or (fmt == "fp8_block" and 128 % bn_):
                        continue
                    variants[f"mgpu {bn_}x{bk_}"] = jax.jit(lambda a, w, s, r, bn_=bn_, bk_=bk_: gmm_fp8(
                        *quant.quantize_rows(a), w, s, bias, r, bn=bn_, bk=bk_))
                for name, f in variants.items():
                    try:
                        f(a, wa8, d.group_sizes, rs).block_until_ready()
                        ts = []
                        for _ in range(3):
                            t0 = time.perf_counter()
                            for _ in range(10):
                                o = f(a, wa8, d.group_sizes, rs)
                            o.block_until_ready()
                            ts.append((time.perf_counter() - t0) / 10 * 1e3)
                        row[f"{fmt} {name}"] = round(sorted(ts)[1], 4)
                    except Exception as err:
                        row[f"{fmt} {name}"] = f"{type(err).__name__}: {str(err)[:200]}"
            from moe_pallas import backends
            bf = jax.jit(lambda a, w, s, r: backends.gmm("auto", a, w, s, bias=bias.astype(jnp.bfloat16), row_scale=r))
            bf(a, w16, d.group_sizes, rs).block_until_ready()
            ts = []
            for _ in range(3):
                t0 = time.perf_counter()
                for _ in range(10):
                    o = bf(a, w16, d.group_sizes, rs)
                o.block_until_ready()
                ts.append((time.perf_counter() - t0) / 10 * 1e3)
            row["bf16 auto"] = round(sorted(ts)[1], 4)
            print(json.dumps(row), flush=True)
            res[row["case"]] = row
            json.dump(res, open(out_path, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
