"""Would the padded (cuBLAS) weight gradients also win at 256-512 rows per expert? The train
step at gpt-oss T = 16384 and SwiGLU T = 8192, "auto" with tgmm_padded.applies widened to the
large class, against the committed "auto" (Triton tgmm there), alternating rounds."""

import json
import os

import jax.numpy as jnp

from benchmarks import cases as _cases
from benchmarks import impls as _impls
from benchmarks import run as _run
from moe_pallas.kernels import config as _config
from moe_pallas.kernels import tgmm_padded
from probe_common import alternate

real = tgmm_padded.applies


def wide(lhs, rhs, num_groups):
    big = _config.rows_class(rhs.shape[0], num_groups) in ("small", "large")
    return big and all(jnp.dtype(a.dtype).itemsize == 2 for a in (lhs, rhs))


out = []
for spec in os.environ.get("CASES", "gptoss:16384,swiglu256:8192").split(","):
    name, t = spec.split(":")
    t = int(t)
    w = _cases.WORKLOADS[name]
    params = _cases.make_params(w)
    case = _cases.Case("train", w, t, "train")
    inputs = _run._inputs(case, params)
    preps = {}
    tgmm_padded.applies = real
    preps["committed"] = _impls._ours("auto")(case, inputs)
    tgmm_padded.applies = wide
    preps["padded_large"] = _impls._ours("auto")(case, inputs)
    tgmm_padded.applies = real
    alternate(preps, out, int(os.environ.get("ROUNDS", "2")), workload=name, tokens=t)
    del preps, params, inputs

json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "large.json"), "w"), indent=1)
