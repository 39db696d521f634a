"""Small int32 cumsums (the tile schedules' [E + 1]) on the GPU: jnp.cumsum vs alternatives."""
import sys
sys.path.insert(0, ".")
import jax, jax.numpy as jnp
from benchmarks.bench_gmm import time_op

def tri(x):
    i = jnp.arange(x.shape[0])
    return jnp.sum(jnp.where(i[:, None] >= i[None, :], x[None, :], 0), axis=1, dtype=x.dtype)

def dot(x):
    i = jnp.arange(x.shape[0])
    return jnp.dot((i[:, None] >= i[None, :]).astype(jnp.float32), x.astype(jnp.float32), precision="highest").astype(x.dtype)

for n in (129, 257):
    x = jax.random.randint(jax.random.key(0), (n,), 0, 64, jnp.int32)
    want = jnp.cumsum(x)
    for name, f in (("cumsum", jnp.cumsum), ("assoc", lambda x: jax.lax.associative_scan(jnp.add, x)), ("tri", tri), ("dot", dot)):
        assert bool(jnp.array_equal(f(x), want)), name
        t = time_op(lambda c, f=f: f(x + c[0]), jnp.zeros((1,), jnp.int32))
        print(f"n={n} {name:7}: {t*1e6:6.2f} us", flush=True)
    t = time_op(lambda c: x + c[0], jnp.zeros((1,), jnp.int32))
    print(f"n={n} add only: {t*1e6:6.2f} us", flush=True)
