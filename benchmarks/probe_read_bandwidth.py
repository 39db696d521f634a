"""Probe: the streaming-read bandwidth of a 4 GiB bf16 sum timed per blocking call and in bursts of 20
(1-D sum, column sums of [rows, 8192], row sums of [rows, 1024]), three rounds, then impls.read_bandwidth()."""
import time, functools, jax, jax.numpy as jnp
from benchmarks import impls
size = 1 << 31
x = jax.random.normal(jax.random.key(0), (size,), jnp.bfloat16)
f1 = jax.jit(lambda v: jnp.sum(v, dtype=jnp.float32))
f2 = jax.jit(lambda v: jnp.sum(v.reshape(-1, 8192), axis=0, dtype=jnp.float32))
f3 = jax.jit(lambda v: jnp.sum(v.reshape(-1, 1024), axis=1, dtype=jnp.float32))
def single(f):
    jax.block_until_ready(f(x)); ts=[]
    for _ in range(5):
        s=time.perf_counter(); jax.block_until_ready(f(x)); ts.append(time.perf_counter()-s)
    return x.nbytes/sorted(ts)[2]/1e12
def burst(f):
    jax.block_until_ready(f(x)); ts=[]
    for _ in range(5):
        s=time.perf_counter(); jax.block_until_ready([f(x) for _ in range(20)]); ts.append((time.perf_counter()-s)/20)
    return x.nbytes/sorted(ts)[2]/1e12
for r in range(3):
    print("round", r, "single f1 %.3f" % single(f1), "burst f1 %.3f f2 %.3f f3 %.3f" % (burst(f1), burst(f2), burst(f3)), flush=True)
print("read_bandwidth() %.3f" % (impls.read_bandwidth()/1e12))
