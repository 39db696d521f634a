"""The train step with "auto"'s new weight gradients (kernels.tgmm_padded) against the Triton tgmm
(tgmm_padded.applies patched to False), alternating rounds in one process; gradients compared."""

import json
import os

import jax
import jax.numpy as jnp

from probe_common import alternate, prepare_variants, train_inputs
from moe_pallas.kernels import tgmm_padded

real = tgmm_padded.applies
out = []
CASES = [c.split(":") for c in os.environ.get("CASES", "gptoss:2048,gptoss:4096,swiglu256:2048").split(",")]
for name, t in ((n, int(t)) for n, t in CASES):
    case, inputs = train_inputs(name, t)
    w = case.workload
    preps = prepare_variants(
        case, inputs, tgmm_padded, "applies", {"triton": lambda *a: False, "padded": real}
    )
    if os.environ.get("DIFFS", "1") == "1":
        g0, g1 = (preps[k].call()[1] for k in ("triton", "padded"))
        diffs = [
            float(jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32)))
                  / (jnp.max(jnp.abs(a.astype(jnp.float32))) + 1e-30))
            for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1))
        ]
        print(name, t, "max rel diff per gradient leaf", [f"{d:.2e}" for d in diffs], flush=True)
        del g0, g1
    alternate(preps, out, int(os.environ.get("ROUNDS", "3")), workload=name, tokens=t)
    del preps, inputs

json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "train_ab.json"), "w"), indent=1)
