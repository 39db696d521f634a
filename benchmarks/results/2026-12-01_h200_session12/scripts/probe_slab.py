"""Train step: tgmm_padded with the Triton slab kernel (slabs + bias sums, no ones column in the
overflow call) against HEAD~'s XLA slabs (old_padded.tgmm), alternating; gradients compared;
slab block variants."""

import functools
import json
import os

import jax
import jax.numpy as jnp

from probe_common import alternate, prepare_variants, train_inputs
import old_padded
from moe_pallas.kernels import slab as _slab
from moe_pallas.kernels import tgmm_padded

real_tgmm, real_slab = tgmm_padded.tgmm, _slab.slab
VARIANTS = {"old": old_padded.tgmm, "new": real_tgmm}
BLOCKS = os.environ.get("BLOCKS", "")  # e.g. "512:4,256:8,128:4"


def with_slab(bd, warps):
    def tgmm(*a, **kw):
        _slab.slab = functools.partial(real_slab, block_d=bd, num_warps=warps)
        try:
            return real_tgmm(*a, **kw)
        finally:
            _slab.slab = real_slab
    return tgmm


for spec in (b for b in BLOCKS.split(",") if b):
    bd, w = map(int, spec.split(":"))
    VARIANTS[f"new_bd{bd}_w{w}"] = with_slab(bd, w)

out = []
CASES = [c.split(":") for c in os.environ.get("CASES", "gptoss:2048,gptoss:4096,swiglu256:2048").split(",")]
for name, t in ((n, int(t)) for n, t in CASES):
    case, inputs = train_inputs(name, t)
    preps = prepare_variants(case, inputs, tgmm_padded, "tgmm", VARIANTS)
    g0, g1 = (preps[k].call()[1] for k in ("old", "new"))
    diffs = [
        float(jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32)))
              / (jnp.max(jnp.abs(a.astype(jnp.float32))) + 1e-30))
        for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1))
    ]
    print(name, t, "max rel diff per gradient leaf (old vs new)", [f"{d:.2e}" for d in diffs], flush=True)
    del g0, g1
    alternate(preps, out, int(os.environ.get("ROUNDS", "3")), workload=name, tokens=t)
    del preps, inputs

json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "slab_ab.json"), "w"), indent=1)
