"""glu_backward block variants at the train step's shapes (gpt-oss T = 2048 / 4096, SwiGLU
T = 2048): wall time of back-to-back calls, every output materialised; outputs compared."""

import functools
import json
import os

import jax
import jax.numpy as jnp

from probe_common import wall_time
from moe_pallas.kernels.glu_bwd import glu_backward

SHAPES = {"gptoss_2048": (8192, 2880, "gptoss"), "gptoss_4096": (16384, 2880, "gptoss"),
          "swiglu_2048": (16384, 2048, "swiglu")}
VARIANTS = [(16, 128, 4, 3), (32, 128, 4, 3), (8, 128, 4, 3), (16, 64, 4, 3), (32, 64, 8, 3),
            (64, 64, 8, 2), (16, 256, 8, 3), (32, 128, 8, 3)]
out = []
for name, (m, i, act) in SHAPES.items():
    k = jax.random.split(jax.random.key(0), 3)
    h = jax.random.normal(k[0], (m, 2 * i), jnp.bfloat16) * 3
    g = jax.random.normal(k[1], (m, i), jnp.float32)
    w = jax.random.uniform(k[2], (m,), jnp.float32)
    ref = None
    for bm, bi, nw, ns in VARIANTS:
        fn = functools.partial(glu_backward, activation=act, block_m=bm, block_i=bi,
                               num_warps=nw, num_stages=ns)
        res = jax.jit(fn)(h, g, w)
        same = None if ref is None else all(bool(jnp.array_equal(a, b)) for a, b in zip(res, ref))
        ref = ref or res
        ms = wall_time(fn, h, g, w, calls=50) * 1e3
        gb = (h.size * 2 * 2 + g.size * 4 + g.size * 2 + m * 8) / 1e9
        row = dict(shape=name, bm=bm, bi=bi, warps=nw, stages=ns, ms=ms, tbs=gb / ms, same=same)
        print(json.dumps(row), flush=True)
        out.append(row)
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "glu.json"), "w"), indent=1)
