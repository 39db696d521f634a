"""Can a Hopper Mosaic GPU matmul gather its lhs rows in the kernel as fast as it reads an
XLA-gathered copy? One hand-pipelined kernel, two lhs loaders:

  box:  lhs_sorted = x[row_index] made by XLA, then one [BM, BK] TMA box per k-step (what
        kernels/gmm_mgpu.py does today);
  rows: one [1, BK] TMA per row per k-step from x itself, through the row index, into the same
        128-byte-swizzled shared memory (a (1, 64)-tiled view of the wgmma operand's buffer:
        both tilings put row r at byte 128·r, and the swizzle is a function of the address);
  cpasync: each of the warpgroup's 128 threads copies its row's 128 bytes with eight 16-byte
        cp.async (Ampere's per-thread async copy) to their swizzled places, one commit group per
        step; before a step's wgmma, cp.async.wait_group, a proxy fence and a warpgroup barrier.

out[m] = x[row_index[m]] @ w, M = T·k rows, w [K, N]. Times: median of 5 bursts (probe_common).
Run: python probe_row_gather.py [--small] ; prints JSON lines. Environment: PROBE_BN_STAGES="bn,stages"
(default 128,4), PROBE_VARIANTS (default box,rows,cpasync; also wscp, a
producer warpgroup issuing the cp.async rows), PROBE_SHORT=1 (two shapes), and two
diagnostics: PROBE_ROWS=sequential (row m reads x[m // k]), PROBE_NO_FENCE=1 (cp.async without
the proxy fence before wgmma: not a correct kernel, its time shows the fence's share).
"""

import functools
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.mosaic.gpu import utils as mgpu_utils
from jax.experimental.pallas import mosaic_gpu as plgpu
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import arith, llvm, memref, nvvm

from probe_common import wall_time

BM, BK = 128, 64
BN, STAGES = (int(v) for v in os.environ.get("PROBE_BN_STAGES", "128,4").split(","))
SW = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))
SW_ROWS = (plgpu.TilingTransform((1, 64)), plgpu.SwizzleTransform(128))


@plgpu.inline_mgpu(arg_types=(plgpu.RefType(), plgpu.RefType(), plgpu.RefType(SW)))
def _cp_async_rows(ctx, x_cols, idx_smem, a_slot):
    """Thread t of the warpgroup: row t of the tile, x_cols[idx[t], :64] -> a_slot row t."""
    del ctx
    i32, i64, index = ir.IntegerType.get_signless(32), ir.IntegerType.get_signless(64), ir.IndexType.get()
    t = arith.remui(mgpu_utils.thread_idx(), mgpu_utils.c(128, i32))
    src_row = memref.load(idx_smem, [arith.index_cast(index, t)])
    row_stride = ir.MemRefType(x_cols.type).get_strides_and_offset()[0][0]
    gmem = llvm.addrspacecast(llvm.PointerType.get(address_space=1), mgpu_utils.memref_ptr(x_cols))
    gmem = mgpu_utils.getelementptr(
        gmem, [arith.extui(i64, arith.muli(src_row, mgpu_utils.c(row_stride * 2, i32)))], ir.IntegerType.get_signless(8))
    smem = mgpu_utils.memref_ptr(a_slot)
    swz = arith.andi(t, mgpu_utils.c(7, i32))
    for c in range(8):
        dst = arith.addi(arith.muli(t, mgpu_utils.c(128, i32)),
                         arith.muli(arith.xori(swz, mgpu_utils.c(c, i32)), mgpu_utils.c(16, i32)))
        nvvm.cp_async_shared_global(
            mgpu_utils.getelementptr(smem, [dst], ir.IntegerType.get_signless(8)),
            mgpu_utils.getelementptr(gmem, [c * 16], ir.IntegerType.get_signless(8)),
            16, nvvm.LoadCacheModifierKind.CG)


@plgpu.inline_mgpu()
def _cp_async_commit(ctx):
    del ctx
    nvvm.cp_async_commit_group()


def _cp_async_wait(n):
    @plgpu.inline_mgpu()
    def wait(ctx):
        del ctx
        nvvm.cp_async_wait_group(n)
    wait()


@plgpu.inline_mgpu()
def _warpgroup_barrier(ctx):
    del ctx
    mgpu_utils.warpgroup_barrier()


LAG = 2  # wscp: the producer signals step j's rows after issuing step j + LAG (LAG < STAGES)


def _kernel_ws(idx_gmem, lhs_gmem, w_gmem, out_gmem):
    """wscp: warpgroup 1 issues the rows (cp.async) and rhs (TMA) of each step into a ring
    slot, and marks the slot full once its rows landed (LAG steps later); warpgroup 0 waits for
    full slots, runs wgmma and hands each slot back through an "empty" barrier."""
    k_steps = lhs_gmem.shape[1] // BK
    mi, ni = jax.lax.axis_index("m"), jax.lax.axis_index("n")
    m0, n0 = mi * BM, ni * BN
    wg = jax.lax.axis_index("wg")

    @functools.partial(
        pl.run_scoped,
        a=plgpu.SMEM((STAGES, BM, BK), jnp.bfloat16, transforms=SW),
        b=plgpu.SMEM((STAGES, BK, BN), jnp.bfloat16, transforms=SW),
        o=plgpu.SMEM((BM, BN), jnp.bfloat16),
        idx=plgpu.SMEM((BM,), jnp.int32),
        idx_bar=plgpu.Barrier(num_arrivals=1),
        full=plgpu.Barrier(num_arrivals=2, num_barriers=STAGES),
        empty=plgpu.Barrier(num_arrivals=1, num_barriers=STAGES),
        collective_axes="wg",
    )
    def _(a, b, o, idx, idx_bar, full, empty):
        @pl.when(wg == 1)
        def _producer():
            plgpu.copy_gmem_to_smem(idx_gmem.at[pl.ds(m0, BM)], idx, idx_bar)
            plgpu.barrier_wait(idx_bar)

            def issue(j, _):
                slot = j % STAGES

                @pl.when(j >= STAGES)
                def _():
                    plgpu.barrier_wait(empty.at[slot])

                _cp_async_rows(lhs_gmem.at[:, pl.ds(j * BK, BK)], idx, a.at[slot])
                _cp_async_commit()
                plgpu.copy_gmem_to_smem(
                    w_gmem.at[pl.ds(j * BK, BK), pl.ds(n0, BN)], b.at[slot], full.at[slot]
                )

                @pl.when(j >= LAG)
                def _():
                    _cp_async_wait(LAG)
                    plgpu.commit_smem()  # every thread's rows landed and fenced
                    plgpu.barrier_arrive(full.at[(j - LAG) % STAGES])

            jax.lax.fori_loop(0, k_steps, issue, None)
            _cp_async_wait(0)
            plgpu.commit_smem()
            for i in range(LAG):
                plgpu.barrier_arrive(full.at[(k_steps - LAG + i) % STAGES])

        @pl.when(wg == 0)
        def _consumer():
            def product(acc):
                def step(kk, _):
                    slot = kk % STAGES
                    plgpu.barrier_wait(full.at[slot])
                    plgpu.wgmma(acc, a.at[slot], b.at[slot])
                    plgpu.wgmma_wait(1)

                    @pl.when(kk >= 1)
                    def _():
                        plgpu.barrier_arrive(empty.at[(kk - 1) % STAGES])

                jax.lax.fori_loop(0, k_steps, step, None)
                plgpu.wgmma_wait(0)
                return acc[...]

            o[...] = pl.run_scoped(product, plgpu.ACC((BM, BN))).astype(o.dtype)
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(o, out_gmem.at[pl.ds(m0, BM), pl.ds(n0, BN)])
            plgpu.wait_smem_to_gmem(0)


def _kernel(idx_gmem, lhs_gmem, w_gmem, out_gmem, *, gather):
    k_steps = lhs_gmem.shape[1] // BK
    mi, ni = jax.lax.axis_index("m"), jax.lax.axis_index("n")
    m0, n0 = mi * BM, ni * BN
    a_spec = plgpu.SMEM((STAGES, BM, BK), jnp.bfloat16, transforms=SW)
    a_alloc = (
        plgpu.RefUnion(plgpu.SMEM((STAGES, BM, BK), jnp.bfloat16, transforms=SW_ROWS), a_spec)
        if gather == "rows"
        else a_spec
    )
    tma_copies = {"box": 2, "rows": BM + 1, "cpasync": 1}[gather]

    @functools.partial(
        pl.run_scoped,
        a=a_alloc,
        b=plgpu.SMEM((STAGES, BK, BN), jnp.bfloat16, transforms=SW),
        o=plgpu.SMEM((BM, BN), jnp.bfloat16),
        idx=plgpu.SMEM((BM,), jnp.int32),
        idx_bar=plgpu.Barrier(num_arrivals=1),
        bars=plgpu.Barrier(num_arrivals=tma_copies, num_barriers=STAGES),
        acc=plgpu.ACC((BM, BN)),
    )
    def _(a, b, o, idx, idx_bar, bars, acc):
        a_rows, a_mma = a if gather == "rows" else (None, a)
        if gather != "box":
            plgpu.copy_gmem_to_smem(idx_gmem.at[pl.ds(m0, BM)], idx, idx_bar)
            plgpu.barrier_wait(idx_bar)

        def load(step, slot):
            k0 = step * BK
            if gather == "cpasync":
                _cp_async_rows(lhs_gmem.at[:, pl.ds(k0, BK)], idx, a_mma.at[slot])
            elif gather == "rows":
                def row(r, _):
                    plgpu.copy_gmem_to_smem(
                        lhs_gmem.at[pl.ds(idx[r], 1), pl.ds(k0, BK)],
                        a_rows.at[slot, pl.ds(r, 1)],
                        bars.at[slot],
                    )
                jax.lax.fori_loop(0, BM, row, None, unroll=8)
            else:
                plgpu.copy_gmem_to_smem(
                    lhs_gmem.at[pl.ds(m0, BM), pl.ds(k0, BK)], a_mma.at[slot], bars.at[slot]
                )
            plgpu.copy_gmem_to_smem(
                w_gmem.at[pl.ds(k0, BK), pl.ds(n0, BN)], b.at[slot], bars.at[slot]
            )

        for s in range(STAGES):
            load(s, s)
            if gather == "cpasync":
                _cp_async_commit()

        def step(kk, _):
            slot = kk % STAGES
            plgpu.barrier_wait(bars.at[slot])
            if gather == "cpasync":  # step kk's group is done when at most STAGES - 2 are not
                _cp_async_wait(STAGES - 2)
                if os.environ.get("PROBE_NO_FENCE"):  # diagnostic only: no proxy fence
                    _warpgroup_barrier()
                else:
                    plgpu.commit_smem()
            plgpu.wgmma(acc, a_mma.at[slot], b.at[slot])
            plgpu.wgmma_wait(1)  # step kk - 1's wgmma is done: its slot may be refilled

            @pl.when((kk >= 1) & (kk - 1 + STAGES < k_steps))
            def _():
                load(kk - 1 + STAGES, (kk - 1) % STAGES)

            if gather == "cpasync":  # a group every step (empty past the end) keeps the count
                _cp_async_commit()

        jax.lax.fori_loop(0, k_steps, step, None)
        plgpu.wgmma_wait(0)
        o[...] = acc[...].astype(o.dtype)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(o, out_gmem.at[pl.ds(m0, BM), pl.ds(n0, BN)])
        plgpu.wait_smem_to_gmem(0)


def matmul(x, row_index, w, gather):
    m, (k, n) = row_index.shape[0], w.shape
    lhs = x[row_index] if gather == "box" else x
    ws = gather == "wscp"
    return plgpu.kernel(
        _kernel_ws if ws else functools.partial(_kernel, gather=gather),
        out_type=jax.ShapeDtypeStruct((m, n), jnp.bfloat16),
        grid=(m // BM, n // BN),
        grid_names=("m", "n"),
        num_threads=2 if ws else None,
        thread_name="wg" if ws else None,
        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
    )(row_index, lhs, w)


def main():
    small = "--small" in sys.argv
    shapes = [(512, 4, 256, 256)] if small else [
        (16384, 4, 2880, 2816),
        (2048, 4, 2880, 5760),
    ] if os.environ.get("PROBE_SHORT") else [
        (16384, 4, 2880, 5760),  # gpt-oss gate_up at T = 16384 (Mosaic's AUTO_TABLE case)
        (16384, 4, 2880, 2816),  # gpt-oss down-like (N a multiple of 128)
        (2048, 4, 2880, 5760),  # gpt-oss gate_up rows at T = 2048 (as one group)
    ]
    for t, top_k, k, n in shapes:
        kx, kw, ki = jax.random.split(jax.random.key(0), 3)
        x = jax.random.normal(kx, (t, k), jnp.bfloat16)
        w = (jax.random.normal(kw, (k, n), jnp.float32) / np.sqrt(k)).astype(jnp.bfloat16)
        row_index = jax.random.randint(ki, (t * top_k,), 0, t, jnp.int32)
        if os.environ.get("PROBE_ROWS") == "sequential":  # diagnostic: rows in order, x[m // k]
            row_index = jnp.arange(t * top_k, dtype=jnp.int32) // top_k
        ref = jnp.dot(x[row_index], w, preferred_element_type=jnp.float32)
        row = dict(T=t, k=top_k, K=k, N=n, M=t * top_k, BN=BN, STAGES=STAGES)
        for gather in os.environ.get("PROBE_VARIANTS", "box,rows,cpasync").split(","):
            f = jax.jit(functools.partial(matmul, gather=gather))
            out = f(x, row_index, w).astype(jnp.float32)
            err = float(jnp.max(jnp.abs(out - ref)) / jnp.max(jnp.abs(ref)))
            ms = wall_time(f, x, row_index, w) * 1e3
            flops = 2 * t * top_k * k * n
            row |= {gather + "_ms": ms, gather + "_tflops": flops / ms / 1e9, gather + "_err": err}
        row["xla_gather_ms"] = wall_time(lambda x, i: x[i], x, row_index) * 1e3
        row["xla_dot_ms"] = wall_time(
            lambda x, i, w: jnp.dot(x[i], w), x, row_index, w) * 1e3
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
