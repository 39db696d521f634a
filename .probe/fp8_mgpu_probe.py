"""Can Mosaic GPU run e4m3 x e4m3 products with DeepSeek-V3's promotion (a float32 sum per 128
values of K, scaled by the rows' activation scales) faster than bf16? Triton cannot overlap a
step's promotion with a wgmma inside a program (it waits on every fp8 dot), so this dense probe
has two consumer warpgroups, 64 rows each of a 128-row CTA tile sharing the weight tile, each
waiting only on its own wgmma: one promotes while the other's wgmma runs.

    out[m, n] = col_scale[n] * Σ_b sa[b, m] * Σ_{k in block b} a[m, k] * w[n, k]

a [M, K] and w [N, K] (N-major, as the stored weights) float8_e4m3fn, sa [K/128, M] float32,
col_scale [N] float32 (applied in XLA here), out bf16. Per K step (tile_k values, one scale
block): wgmma into a zeroed partial accumulator, wait for it, add it times the rows' scales into
the float32 accumulator (a second wgmma accumulator).

Usage: python .probe/fp8_mgpu_probe.py OUT.json   (CPU: interpret mode on small shapes, checks;
GPU: checks and times against bf16 jnp.dot (cuBLAS) and jax's hopper_matmul_mgpu at the same
shape, medians of 3 rounds, TFLOP/s)"""
import functools, json, sys, time
import numpy as np
import jax, jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

ON_GPU = jax.default_backend() == "gpu"
LOWER = "--lower" in sys.argv  # lower for an abstract H200 on this machine (no GPU), then stop


def fp8_matmul(a, w, sa, *, tile_m=64, tile_n=128, tile_k=128, stages=4, num_sms=None,
               promote=True):
    """promote=False: the ceiling, one wgmma chain over all of K (the tensor core's own sum, no
    scales: not the product; timing only)."""
    m, k = a.shape
    n = w.shape[0]
    cta_m = 2 * tile_m
    assert m % cta_m == 0 and n % tile_n == 0 and k % tile_k == 0 and 128 % tile_k == 0
    m_iters, n_iters, k_iters = m // cta_m, n // tile_n, k // tile_k
    swizzle = plgpu.find_swizzle(tile_k * 8)
    transforms = (plgpu.TilingTransform((8, swizzle)), plgpu.SwizzleTransform(swizzle))
    per_block = 128 // tile_k

    def body_kernel(a_gmem, w_gmem, sa_gmem, out_gmem):
        def pipeline(body, ctx):
            return plgpu.emit_pipeline_warp_specialized(
                body,
                grid=(k_iters,),
                memory_registers=40,
                in_specs=[
                    plgpu.BlockSpec((cta_m, tile_k), lambda kk: (0, kk), transforms=transforms,
                                    memory_space=plgpu.SMEM),
                    plgpu.BlockSpec((tile_n, tile_k), lambda kk: (0, kk), transforms=transforms,
                                    memory_space=plgpu.SMEM),
                    plgpu.BlockSpec((1, cta_m), lambda kk: (kk // per_block, 0),
                                    memory_space=plgpu.SMEM),
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
                a_gmem.at[pl.ds(0, cta_m)], w_gmem.at[pl.ds(0, tile_n)], sa_gmem.at[:, pl.ds(0, cta_m)]),
            o_smem=plgpu.SMEM((2, tile_m, tile_n), jnp.bfloat16),
            collective_axes="wg",
        )
        def _scope(allocs, o_smem):
            wg = lax.axis_index("wg")

            @plgpu.nd_loop((m_iters * n_iters,), collective_axes="sm")
            def _tile(info):
                mi, ni = plgpu.planar_snake(info.index[0], (m_iters, n_iters), 1, 4)
                rows = pl.ds(mi * cta_m, cta_m)
                cols = pl.ds(ni * tile_n, tile_n)

                def ctx_chain(eval_pipeline):
                    def _(acc_ref):
                        eval_pipeline(acc_ref)
                        o_smem[wg] = acc_ref[...].astype(jnp.bfloat16)
                        plgpu.commit_smem()
                        plgpu.copy_smem_to_gmem(
                            o_smem.at[wg],
                            out_gmem.at[pl.ds(mi * cta_m + wg * tile_m, tile_m), cols])
                        plgpu.wait_smem_to_gmem(0, wait_read_only=True)

                    pl.run_scoped(_, plgpu.ACC((tile_m, tile_n)))

                def mma_chain(idx, a_smem, w_smem, sa_smem, acc_ref):
                    plgpu.wgmma(acc_ref, a_smem.at[pl.ds(wg * tile_m, tile_m)], w_smem.T)
                    plgpu.wgmma_wait(0)
                    return acc_ref

                def ctx(eval_pipeline):
                    zero = plgpu.layout_cast(
                        jnp.full((tile_m, tile_n), 0, jnp.float32), plgpu.Layout.WGMMA)
                    acc = eval_pipeline(zero)
                    o_smem[wg] = acc.astype(jnp.bfloat16)
                    plgpu.commit_smem()
                    plgpu.copy_smem_to_gmem(
                        o_smem.at[wg], out_gmem.at[pl.ds(mi * cta_m + wg * tile_m, tile_m), cols])
                    plgpu.wait_smem_to_gmem(0, wait_read_only=True)

                def mma(idx, a_smem, w_smem, sa_smem, acc):
                    def partial(part_ref):  # a zeroed accumulator for this K step's products
                        plgpu.wgmma(part_ref, a_smem.at[pl.ds(wg * tile_m, tile_m)], w_smem.T)
                        plgpu.wgmma_wait(0)
                        return part_ref[...]

                    part = pl.run_scoped(partial, plgpu.ACC((tile_m, tile_n)))
                    s = sa_smem[0, pl.ds(wg * tile_m, tile_m)]
                    return acc + part * lax.broadcast_in_dim(s, part.shape, (0,))

                pipeline(*((mma, ctx) if promote else (mma_chain, ctx_chain)))(a_gmem.at[rows], w_gmem.at[cols], sa_gmem.at[:, rows],
                                   allocations=allocs)

    sms = num_sms or (jax.devices()[0].core_count if ON_GPU else 2)
    return plgpu.kernel(
        body_kernel,
        out_type=jax.ShapeDtypeStruct((m, n), jnp.bfloat16),
        grid=(sms,),
        grid_names=("sm",),
        num_threads=3,
        thread_name="wg",
        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
        interpret=None if ON_GPU or LOWER else plgpu.InterpretGPUParams(),
    )(a, w, sa)


def quantize_rows(x):  # per row and 128 values of K: e4m3 values, float32 scales [K/128, M]
    m, k = x.shape
    blocks = x.astype(jnp.float32).reshape(m, k // 128, 128)
    s = jnp.maximum(jnp.max(jnp.abs(blocks), axis=2), 1e-12) / 448.0
    q = (blocks / s[:, :, None]).astype(jnp.float8_e4m3fn).reshape(m, k)
    return q, s.T


def oracle(q, sa, w):
    m, k = q.shape
    qa = np.asarray(q, np.float64).reshape(m, k // 128, 128) * np.asarray(sa, np.float64).T[:, :, None]
    return qa.reshape(m, k) @ np.asarray(w, np.float64).T


def timed(f, *args, rounds=3, reps=20):
    f(*args).block_until_ready()
    ts = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(reps):
            out = f(*args)
        out.block_until_ready()
        ts.append((time.perf_counter() - t0) / reps)
    return sorted(ts)[len(ts) // 2]


def main(out_path):
    shapes = [(256, 256, 512)] if not ON_GPU else [(8192, 5760, 2816), (8192, 4096, 4096), (16384, 6144, 4096)]
    configs = [dict(), dict(promote=False)] if not ON_GPU else [
        dict(tile_n=128, stages=4), dict(tile_n=128, tile_k=64, stages=6), dict(tile_n=192, stages=4),
        dict(tile_n=64, stages=6), dict(tile_n=128, stages=4, promote=False)]
    rows = []
    for m, n, k in shapes:
        key = jax.random.key(m + n + k)
        x = jax.random.normal(key, (m, k), jnp.float32)
        w = (jax.random.normal(jax.random.fold_in(key, 1), (n, k), jnp.float32) * 8).astype(jnp.float8_e4m3fn)
        q, sa = quantize_rows(x)
        want = oracle(q, sa, w) if m * n * k <= 2**31 else None
        row = {"shape": [m, n, k]}
        flops = 2 * m * n * k
        for cfg in configs:
            name = "fp8 " + ",".join(f"{a}={b}" for a, b in cfg.items())
            try:
                f = jax.jit(functools.partial(fp8_matmul, **cfg))
                out = np.asarray(f(q, w, sa), np.float64)
                err = None if want is None or not cfg.get("promote", True) else float(np.linalg.norm(out - want) / np.linalg.norm(want))
                t = timed(f, q, w, sa) if ON_GPU else None
                row[name] = {"rel_err": err, "ms": t and t * 1e3, "tflops": t and flops / t / 1e12}
            except Exception as e:  # a config that does not compile: report, go on
                row[name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            print(json.dumps({k2: v for k2, v in row.items() if k2 in ("shape", name)}), flush=True)
        if ON_GPU:
            xb, wb = x.astype(jnp.bfloat16), w.astype(jnp.bfloat16)
            dot = jax.jit(lambda a, b: jnp.dot(a, b.T, preferred_element_type=jnp.float32).astype(jnp.bfloat16))
            t = timed(dot, xb, wb)
            row["bf16 cublas"] = {"ms": t * 1e3, "tflops": flops / t / 1e12}
            try:
                from jax.experimental.pallas.ops.gpu import hopper_matmul_mgpu as hm
                cfg = hm.TuningConfig(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=4,
                                      epi_tile_n=64, epi_tile_m=64, grid_minor_dim=hm.MatmulDimension.N,
                                      grid_tile_width=4, wg_dimension=hm.MatmulDimension.N)
                wt = wb.T
                mm = jax.jit(lambda a, b: hm.matmul(a, b, None, cfg))
                t = timed(mm, xb, wt)
                row["bf16 hopper_matmul_mgpu"] = {"ms": t * 1e3, "tflops": flops / t / 1e12}
            except Exception as e:
                row["bf16 hopper_matmul_mgpu"] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        print(json.dumps(row), flush=True)
        rows.append(row)
        json.dump(rows, open(out_path, "w"), indent=1)


def lower():
    sys.path.insert(0, ".")
    from tests.test_lowering import SDS, lower_for_h200
    for m, n, k, cfg in ((8192, 5760, 2816, {}), (8192, 4096, 4096, dict(tile_k=64, stages=6)),
                         (8192, 6144, 4096, dict(tile_n=192))):
        f = functools.partial(fp8_matmul, num_sms=132, **cfg)
        text = lower_for_h200(f, SDS((m, k), jnp.float8_e4m3fn), SDS((n, k), jnp.float8_e4m3fn),
                              SDS((k // 128, m), jnp.float32))
        print(m, n, k, cfg, "mosaic_gpu calls:", text.count("mosaic_gpu"), flush=True)


if __name__ == "__main__":
    lower() if LOWER else main(sys.argv[1])
