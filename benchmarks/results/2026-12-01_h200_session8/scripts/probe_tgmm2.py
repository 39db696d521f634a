"""tgmm loop variants at gpt-oss d w_gate_up / d w_down, T = 2048 (bf16, [128, K, N] output):
  full   kernels/tgmm.py's loop (no gather/bias column): a and b loaded for every tile
  ca     full with a loaded through L1 (cache_modifier=".ca")
  hoist  groups of at most block_m rows (one row step) load a once per program and loop over
         the n-tiles loading only b; larger groups run the full loop
"""
import functools, sys
import jax, jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu
sys.path.insert(0, ".")
from benchmarks.bench_tgmm import time_calls
from moe_pallas import dispatch

def kernel(off_ref, lhs_ref, rhs_ref, out_ref, *, K, N, bm, bk, bn, gm, mode):
    n_tiles = pl.cdiv(N, bn)
    first = pl.program_id(0) * gm
    num = jnp.minimum(gm, n_tiles - first)
    k0 = pl.program_id(1) * bk
    g = pl.program_id(2)
    start, end = off_ref[g], off_ref[g + 1]
    steps = jnp.maximum(pl.cdiv(end - start, bm), 1)
    ks = k0 + jnp.arange(bk, dtype=jnp.int32)
    k_ok = (ks < K)[None, :]
    def st(tile, acc):
        ns = tile * bn + jnp.arange(bn, dtype=jnp.int32)
        mask = (ks < K)[:, None] & (ns < N)[None, :]
        plgpu.store(out_ref.at[g, pl.ds(k0, bk), pl.ds(tile * bn, bn)], acc.astype(out_ref.dtype), mask=mask)
    def row_ok(r0):
        return (r0 + jnp.arange(bm, dtype=jnp.int32) < end)[:, None]
    def ld_a(r0, cm=None):
        return plgpu.load(lhs_ref.at[pl.ds(r0, bm), pl.ds(k0, bk)], mask=row_ok(r0) & k_ok, other=0, cache_modifier=cm)
    def ld_b(r0, n0):
        ns = n0 + jnp.arange(bn, dtype=jnp.int32)
        return plgpu.load(rhs_ref.at[pl.ds(r0, bm), pl.ds(n0, bn)], mask=row_ok(r0) & (ns < N)[None, :], other=0)
    def full(cm=None):
        def body(it, acc):
            j = jax.lax.div(it, steps)
            i = it - j * steps
            r0 = start + i * bm
            a, b = ld_a(r0, cm), ld_b(r0, (first + j) * bn)
            acc = jnp.where(i == 0, 0.0, acc) + plgpu.dot(a, b, trans_a=True)
            @pl.when(i == steps - 1)
            def _():
                st(first + j, acc)
            return acc
        jax.lax.fori_loop(0, steps * num, body, jnp.zeros((bk, bn), jnp.float32))
    if mode == "hoist":
        @pl.when(steps == 1)
        def _one():
            a = ld_a(start)
            @pl.loop(0, num)
            def _(j):
                st(first + j, plgpu.dot(a, ld_b(start, (first + j) * bn), trans_a=True))
        @pl.when(steps > 1)
        def _many():
            full()
    elif mode == "hoist2":
        @pl.when(steps == 1)
        def _one():
            a = ld_a(start)
            @pl.loop(0, num)
            def _(j):
                st(first + j, plgpu.dot(a, ld_b(start, (first + j) * bn), trans_a=True))
        @pl.when(steps == 2)
        def _two():
            a0, a1 = ld_a(start), ld_a(start + bm)
            @pl.loop(0, num)
            def _(j):
                n0 = (first + j) * bn
                acc = plgpu.dot(a0, ld_b(start, n0), trans_a=True)
                st(first + j, acc + plgpu.dot(a1, ld_b(start + bm, n0), trans_a=True))
        @pl.when(steps > 2)
        def _many():
            full()
    else:
        full(".ca" if mode == "ca" else None)

T, E, TOPK = 2048, 128, 4
idx = jax.random.randint(jax.random.key(0), (T, TOPK), 0, E, jnp.int32)
d = dispatch.dispatch(idx, E)
M = T * TOPK
off = jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(d.group_sizes)]).astype(jnp.int32)
print("rows per group: max", int(d.group_sizes.max()), "groups > 64:", int((d.group_sizes > 64).sum()), "> 128:", int((d.group_sizes > 128).sum()))
for name, K, N in (("gate_up", 2880, 5760), ("down", 2880, 2880)):
    lhs = jax.random.normal(jax.random.key(1), (M, K), jnp.bfloat16)
    rhs = jax.random.normal(jax.random.key(2), (M, N), jnp.bfloat16)
    out_bytes = E * K * N * 2
    ref = None
    for bm, bn, bk, gm, warps, stages, mode in [
        (64, 128, 128, 8, 4, 3, "full"), (64, 128, 128, 8, 4, 3, "hoist"),
        (64, 128, 128, 8, 4, 3, "hoist2"), (64, 128, 128, 16, 4, 3, "hoist2"),
        (64, 128, 128, 8, 4, 2, "hoist2"), (32, 128, 128, 8, 4, 3, "hoist2"),
        (64, 128, 128, 4, 4, 3, "hoist2")]:
        f = jax.jit(pl.pallas_call(functools.partial(kernel, K=K, N=N, bm=bm, bk=bk, bn=bn, gm=gm, mode=mode),
            out_shape=jax.ShapeDtypeStruct((E, K, N), jnp.bfloat16),
            grid=(pl.cdiv(pl.cdiv(N, bn), gm), pl.cdiv(K, bk), E),
            compiler_params=plgpu.CompilerParams(num_warps=warps, num_stages=stages)))
        try:
            out = f(off, lhs, rhs)
            if ref is None:
                ref = out.astype(jnp.float32)
                err = 0.0
            else:
                err = float(jnp.max(jnp.abs(out.astype(jnp.float32) - ref)))
            del out
            t = time_calls(f, off, lhs, rhs)
            print(f"{name:7} bm={bm:3} bn={bn} bk={bk} gm={gm:2} w={warps} s={stages} {mode:5}: {t*1e3:.3f} ms {out_bytes/t/1e12:.2f} TB/s  max|diff| {err:.3g}", flush=True)
        except Exception as e:
            print(f"{name} bm={bm} bn={bn} bk={bk} {mode}: failed {str(e)[:150]}", flush=True)
    del lhs, rhs, ref
