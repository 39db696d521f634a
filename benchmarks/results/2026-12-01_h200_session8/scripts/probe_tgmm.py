"""Which part of tgmm limits it (gpt-oss d w_gate_up, T = 2048, [128, 2880, 5760] bf16 output)?
Variants of kernels/tgmm.py's loop (no gather, no bias column), same grid and tiles:
  full    the tgmm loop (loads, dot, store per tile)
  nostore loads + dot each tile, one store per program (the last tile)
  noload  a, b loaded once per program, dot + store each tile
  const   constants stored each tile
"""
import functools, sys, time, statistics
import jax, jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu
sys.path.insert(0, ".")
from benchmarks.bench_tgmm import time_calls
from moe_pallas import dispatch

E, K, N, T, TOPK = 128, 2880, 5760, 2048, 4

def kernel(off_ref, lhs_ref, rhs_ref, out_ref, *, bm, bk, bn, gm, mode):
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
    def ld(r0, n0):
        row_ok = (r0 + jnp.arange(bm, dtype=jnp.int32) < end)[:, None]
        a = plgpu.load(lhs_ref.at[pl.ds(r0, bm), pl.ds(k0, bk)], mask=row_ok & k_ok, other=0)
        ns = n0 + jnp.arange(bn, dtype=jnp.int32)
        b = plgpu.load(rhs_ref.at[pl.ds(r0, bm), pl.ds(n0, bn)], mask=row_ok & (ns < N)[None, :], other=0)
        return a, b
    if mode == "const":
        @pl.loop(0, num)
        def _(j):
            st(first + j, jnp.full((bk, bn), 1.0, jnp.float32) + j.astype(jnp.float32))
        return
    if mode == "noload":
        a, b = ld(start, first * bn)
        @pl.loop(0, num)
        def _(j):
            st(first + j, plgpu.dot(a, b, trans_a=True) + j.astype(jnp.float32))
        return
    def body(it, acc):
        j = jax.lax.div(it, steps)
        i = it - j * steps
        a, b = ld(start + i * bm, (first + j) * bn)
        acc = jnp.where(i == 0, 0.0, acc) + plgpu.dot(a, b, trans_a=True)
        if mode == "full":
            @pl.when(i == steps - 1)
            def _():
                st(first + j, acc)
        return acc
    acc = jax.lax.fori_loop(0, steps * num, body, jnp.zeros((bk, bn), jnp.float32))
    if mode == "nostore":
        st(first + num - 1, acc)

idx = jax.random.randint(jax.random.key(0), (T, TOPK), 0, E, jnp.int32)
d = dispatch.dispatch(idx, E)
M = T * TOPK
lhs = jax.random.normal(jax.random.key(1), (M, K), jnp.bfloat16)
rhs = jax.random.normal(jax.random.key(2), (M, N), jnp.bfloat16)
off = jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(d.group_sizes)]).astype(jnp.int32)
out_bytes = E * K * N * 2
for bm, bn, bk, gm, warps, stages in [(64, 128, 128, 8, 4, 3), (64, 256, 128, 8, 8, 3), (128, 128, 128, 8, 4, 3)]:
    for mode in ("full", "nostore", "noload", "const"):
        f = pl.pallas_call(functools.partial(kernel, bm=bm, bk=bk, bn=bn, gm=gm, mode=mode),
            out_shape=jax.ShapeDtypeStruct((E, K, N), jnp.bfloat16),
            grid=(pl.cdiv(pl.cdiv(N, bn), gm), pl.cdiv(K, bk), E),
            compiler_params=plgpu.CompilerParams(num_warps=warps, num_stages=stages))
        try:
            t = time_calls(jax.jit(f), off, lhs, rhs)
            print(f"probe bm={bm} bn={bn} bk={bk} gm={gm} w={warps} s={stages} {mode:8}: {t*1e3:.3f} ms {out_bytes/t/1e12:.2f} TB/s", flush=True)
        except Exception as e:
            print(f"probe bm={bm} bn={bn} bk={bk} {mode}: failed {str(e)[:150]}", flush=True)
