"""Write ceiling of Triton tile stores at tgmm's output shape [E, K, N] bf16 (gpt-oss d w_gate_up):
the tgmm grid and tiles with the loads and dots removed, each program storing constants."""
import functools, sys, jax, jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu
sys.path.insert(0, ".")
from benchmarks.bench_tgmm import time_calls

E, K, N = 128, 2880, 5760

def kernel(c_ref, out_ref, *, bk, bn, gm, evict):
    n_tiles = pl.cdiv(N, bn)
    first = pl.program_id(0) * gm
    num = jnp.minimum(gm, n_tiles - first)
    k0 = pl.program_id(1) * bk
    g = pl.program_id(2)
    ks = k0 + jnp.arange(bk, dtype=jnp.int32)
    val = jnp.full((bk, bn), 1.0, jnp.float32) * c_ref[0]
    @pl.loop(0, num)
    def _(j):
        ns = (first + j) * bn + jnp.arange(bn, dtype=jnp.int32)
        mask = (ks < K)[:, None] & (ns < N)[None, :]
        plgpu.store(out_ref.at[g, pl.ds(k0, bk), pl.ds((first + j) * bn, bn)], (val + j).astype(out_ref.dtype), mask=mask, eviction_policy=evict)

for bk, bn, gm, warps, evict in [(128,128,8,4,None),(128,128,1,4,None),(128,256,8,4,None),(128,256,8,8,None),(64,256,8,4,None),(256,128,8,8,None),(64,128,8,4,None),(128,128,8,4,"evict_first"),(32,512,8,4,None)]:
    f = pl.pallas_call(functools.partial(kernel, bk=bk, bn=bn, gm=gm, evict=evict),
        out_shape=jax.ShapeDtypeStruct((E, K, N), jnp.bfloat16),
        grid=(pl.cdiv(pl.cdiv(N, bn), gm), pl.cdiv(K, bk), E),
        compiler_params=plgpu.CompilerParams(num_warps=warps, num_stages=1))
    t = time_calls(jax.jit(f), jnp.ones((1,), jnp.float32))
    print(f"store bk={bk} bn={bn} group_m={gm} warps={warps} {evict}: {t*1e3:.3f} ms {E*K*N*2/t/1e12:.2f} TB/s", flush=True)
