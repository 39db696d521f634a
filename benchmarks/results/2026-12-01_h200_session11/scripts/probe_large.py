"""Would the padded (cuBLAS) weight gradients also win at 256-512 rows per expert? The train
step at gpt-oss T = 16384 and SwiGLU T = 8192, "auto" with tgmm_padded.applies widened to the
large class, against the committed "auto" (Triton tgmm there), alternating rounds."""

import json
import os

import jax.numpy as jnp

from moe_pallas.kernels import config as _config
from moe_pallas.kernels import tgmm_padded
from probe_common import alternate, prepare_variants, train_inputs

real = tgmm_padded.applies


def wide(lhs, rhs, num_groups):
    big = _config.rows_class(rhs.shape[0], num_groups) in ("small", "large")
    return big and all(jnp.dtype(a.dtype).itemsize == 2 for a in (lhs, rhs))


out = []
for spec in os.environ.get("CASES", "gptoss:16384,swiglu256:8192").split(","):
    name, t = spec.split(":")
    t = int(t)
    case, inputs = train_inputs(name, t)
    preps = prepare_variants(
        case, inputs, tgmm_padded, "applies", {"committed": real, "padded_large": wide}
    )
    alternate(preps, out, int(os.environ.get("ROUNDS", "2")), workload=name, tokens=t)
    del preps, inputs

json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "large.json"), "w"), indent=1)
